//! One way from a ticket to its batches, for every caller: the Flight `DoGet`, the endpoint
//! read ahead for a lone reader, and in-process runs (`Server::run_ticket`, the baselines).
//!
//! ```text
//!  ShardTicket ─place─▶ (deferral decided) ─open─▶ Opened ─batches─▶ TicketStream
//!                                          (or the one read ahead)   cache hit, or computed
//!                                                                    and teed to the cache;
//!                                                                    skip_rows applied
//! ```
//!
//! The front end only encodes what a [`TicketStream`] yields and tells it when it waits for
//! its client ([`TicketStream::wait_for_client`], [`TicketStream::resume`]): that time is not
//! computing, so the stream's cores go to the others meanwhile and the cache does not weigh
//! it as the cost of the shard.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use datafusion::physical_plan::ExecutionPlan;
use futures::StreamExt;
use futures::stream::BoxStream;
use pushdown_protocol::{DEFERRED_FROM_KEY, Deferral, Query, Shard, ShardTicket, StreamStats};
use pushdown_task::Task;

use crate::allow::CheckedQuery;
use crate::auth::{Caller, Grant};
use crate::cache::{CacheMode, Cacheable, Claim, Lookup, Tee};
use crate::company::{ClientId, Seat};
use crate::error::{Result, ServerError};
use crate::node::Node;
use crate::prefetch::{HELD_FOR, Pickup};
use crate::query::{Opened, Started, ordered_stream, scan_stats};
use crate::requests::Slot;
use crate::runtime::CpuRuntime;

/// Whether a stream may be served from (and offered to) the fragment cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheUse {
    /// As a `DoGet`: a stored shard is served, a computed one offered.
    Read,
    /// Always computed, never offered: what a trainer reading the files itself does.
    Bypass,
}

/// Where a stream's fragment ops run: the first `on_server` here, the rest (from
/// `deferred_from`) on the client.
#[derive(Debug, Default)]
pub(crate) struct StreamSplit {
    ops: Vec<String>,
    on_server: usize,
    deferred_from: Option<usize>,
    reducing: Option<Counted>,
}

impl StreamSplit {
    /// Whether the stream's fragment has ops and this server left every one to the client:
    /// it reads and sends, reducing nothing (see [`Node::runtime_for`]).
    pub(crate) fn reduces_nothing(&self) -> bool {
        !self.ops.is_empty() && self.on_server == 0
    }

    /// The schema a stream of `schema` is sent with: one whose ops were left to the client
    /// says from which.
    fn sent_schema(&self, schema: &SchemaRef) -> SchemaRef {
        match self.deferred_from {
            Some(from) => {
                let mut metadata = schema.metadata().clone();
                metadata.insert(DEFERRED_FROM_KEY.to_owned(), from.to_string());
                Arc::new(schema.as_ref().clone().with_metadata(metadata))
            }
            None => Arc::clone(schema),
        }
    }

    /// The stream waits for its client (`true`) or computes again.
    fn waiting(&mut self, waiting: bool) {
        if let Some(r) = &mut self.reducing {
            r.set(!waiting);
        }
    }
}

/// One stream in a count of streams (those computing, those running fragment ops here):
/// counted while it computes (not while its client holds it back), until it ends.
#[derive(Debug)]
struct Counted {
    count: Arc<AtomicUsize>,
    counted: bool,
}

impl Counted {
    fn new(count: Arc<AtomicUsize>) -> Self {
        let mut r = Self {
            count,
            counted: false,
        };
        r.set(true);
        r
    }

    fn set(&mut self, counted: bool) {
        if counted != self.counted {
            if counted {
                self.count.fetch_add(1, Ordering::Relaxed);
            } else {
                self.count.fetch_sub(1, Ordering::Relaxed);
            }
            self.counted = counted;
        }
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.set(false);
    }
}

impl Node {
    /// The CPU threads (and reads in flight, for a remote store) one stream may use at most.
    pub(crate) fn cores(&self) -> usize {
        self.config.cpu_threads.max(self.config.store_reads_in_flight)
    }

    /// The cores a stream opened now decodes on, with `running` streams admitted: shared
    /// among the streams computing now. A lone reader (pyarrow taking endpoints one by one)
    /// decodes its shard on every core; many readers one core each. Streams their readers
    /// hold back (a loader prefetching shards it will read in order) leave their cores to
    /// this one: counting them starved the shard being read while the cores idled.
    pub(crate) fn stream_parallelism(&self, running: usize) -> usize {
        let computing = self.computing.load(Ordering::Relaxed);
        (self.cores() / (computing + 1).min(running.max(1))).max(1)
    }

    /// Where this stream's fragment ops run. A ticket that lets the server leave ops `from..`
    /// to the client gets them left when it says `Always` (a split placement), or `IfBusy`
    /// and as many streams as CPU threads run ops here now; the ticket's fragment is then
    /// [`pushdown_protocol::Fragment::deferred`]. A stream that runs ops here counts as
    /// reducing while it computes: one waiting for its client leaves the cores to others.
    pub(crate) fn place(&self, mut ticket: ShardTicket) -> (ShardTicket, StreamSplit) {
        let Query::Fragment(fragment) = &ticket.request.query else {
            return (ticket, StreamSplit::default());
        };
        let ops: Vec<String> = fragment.ops.iter().map(|c| c.op.clone()).collect();
        let from = match ticket.request.deferral {
            Deferral::Never => None,
            Deferral::Always { from } => Some(from as usize),
            Deferral::IfBusy { from } => {
                let room = self
                    .config
                    .reducing_streams
                    .unwrap_or(self.config.cpu_threads.max(1));
                (self.reducing.load(Ordering::Relaxed) >= room).then_some(from as usize)
            }
        }
        .filter(|&from| from < ops.len());
        let on_server = from.unwrap_or(ops.len());
        if let Some(from) = from {
            let deferred = fragment.deferred(from);
            ticket.request.query = Query::Fragment(deferred);
            self.metrics.deferred_streams.inc();
        }
        let reducing = (on_server > 0).then(|| Counted::new(Arc::clone(&self.reducing)));
        let placement = StreamSplit {
            ops,
            on_server,
            deferred_from: from,
            reducing,
        };
        (ticket, placement)
    }

    /// The runtime a stream placed so runs on: [`Node::unreduced`] for one that reduces
    /// nothing here, else [`Node::cpu`].
    pub(crate) fn runtime_for(&self, placement: &StreamSplit) -> &CpuRuntime {
        if placement.reduces_nothing() {
            &self.unreduced
        } else {
            &self.cpu
        }
    }

    /// Runs `work` on the CPU runtime, off the I/O threads, and waits for it.
    pub(crate) async fn on_cpu<T: Send + 'static>(
        &self,
        what: &str,
        work: impl Future<Output = Result<T>> + Send + 'static,
    ) -> Result<T> {
        Self::on(&self.cpu, what, work).await
    }

    /// Runs short control work (planning a request, its schema, counting a shard's rows) off
    /// the I/O threads and off the reducing ones: on [`Node::unreduced`], at the server's own
    /// priority. On the CPU runtime a plan queued behind every shard being reduced there
    /// (each a batch decoded in one go), so a busy server answered a trainer's next epoch,
    /// or a plain client's `GetFlightInfo`, only after them, and its other cores idled.
    pub(crate) async fn on_control<T: Send + 'static>(
        &self,
        what: &str,
        work: impl Future<Output = Result<T>> + Send + 'static,
    ) -> Result<T> {
        Self::on(&self.unreduced, what, work).await
    }

    /// Runs `work` on `runtime`, off the I/O threads, and waits for it.
    async fn on<T: Send + 'static>(
        runtime: &CpuRuntime,
        what: &str,
        work: impl Future<Output = Result<T>> + Send + 'static,
    ) -> Result<T> {
        runtime.spawn(work).await.map_err(|source| ServerError::Task {
            what: what.to_owned(),
            cause: source,
        })?
    }

    /// Opens `ticket` (as `placement`d, its query `checked` by
    /// [`crate::query::Engine::authorize`] for `caller`) on `parallelism` cores: what was
    /// opened ahead for this caller when it is the same ticket (`raw`, the bytes the caller
    /// sent, unchanged by placement) over an unchanged file, else afresh on the stream's
    /// runtime ([`Node::runtime_for`]).
    pub(crate) async fn open_ticket(
        self: &Arc<Self>,
        raw: &[u8],
        (ticket, placement): (&ShardTicket, &StreamSplit),
        checked: CheckedQuery,
        caller: &Caller,
        parallelism: usize,
    ) -> Result<Opened> {
        let ahead = match self.prefetch.pick_up(&caller.principal, raw) {
            Pickup::None => None,
            Pickup::Dropped => {
                self.metrics.read_ahead("dropped");
                None
            }
            Pickup::Taken(opened) => {
                let unchanged =
                    *ticket.encode() == *raw && self.engine.still_current(ticket).await.unwrap_or(false);
                self.metrics.read_ahead(if unchanged { "taken" } else { "stale" });
                unchanged.then_some(opened)
            }
        };
        match ahead {
            Some(opened) => Ok(opened),
            None => {
                let (node, ticket, grant) = (Arc::clone(self), ticket.clone(), Arc::clone(&caller.grant));
                Self::on(self.runtime_for(placement), "opening a stream", async move {
                    node.engine
                        .open_checked(&ticket, &checked, parallelism, &grant)
                        .await
                })
                .await
            }
        }
    }

    /// Opens the endpoint planned after `raw` for `caller` and starts its partitions
    /// decoding, to be taken by the caller's next `DoGet` (see `prefetch`). Failures are
    /// the next `DoGet`'s to report: here they only mean nothing is held.
    pub(crate) fn read_ahead(self: &Arc<Self>, raw: &[u8], caller: &Caller) {
        let Some(next) = self.prefetch.successor(raw) else {
            return;
        };
        let Ok(decoded) = ShardTicket::decode(&next) else {
            return;
        };
        let generation = self.prefetch.begin();
        let (node, grant, principal) = (
            Arc::clone(self),
            Arc::clone(&caller.grant),
            Arc::clone(&caller.principal),
        );
        let work = async move {
            let cores = node.cores();
            let mut opened = node.engine.open(&decoded, cores, &grant).await?;
            // A shard the cache holds is served from it: nothing to read ahead.
            if let Some(c) = &opened.cacheable
                && c.mode != CacheMode::Off
                && node.cache.holds(c.key)
            {
                return Ok(());
            }
            let since = Instant::now();
            let stream = ordered_stream(Arc::clone(&opened.plan), opened.ctx.task_ctx(), cores)?;
            opened.started = Some(Started { stream, since });
            if node.prefetch.hold(generation, principal, next, opened) {
                // Waiting must not keep a stopped server alive.
                let weak = Arc::downgrade(&node);
                drop(node);
                tokio::time::sleep(HELD_FOR).await;
                if let Some(node) = weak.upgrade()
                    && node.prefetch.expire(generation)
                {
                    node.metrics.read_ahead("expired");
                }
            }
            Ok::<_, ServerError>(())
        };
        // It ends by itself: stale, taken, or expired.
        self.cpu.spawn_detached(async move {
            if let Err(e) = work.await {
                tracing::debug!(error = %e, "reading ahead");
            }
        });
    }

    /// The batches of an opened ticket: from the fragment cache when it holds the shard
    /// (after waiting for a stream computing it now), else computed and, with
    /// [`CacheUse::Read`], offered to the cache once whole; the ticket's `skip_rows` left out.
    pub(crate) async fn batches(
        self: &Arc<Self>,
        ticket: &ShardTicket,
        mut opened: Opened,
        placement: StreamSplit,
        grant: &Grant,
        cache: CacheUse,
    ) -> Result<TicketStream> {
        let start = Instant::now();
        let plan = Arc::clone(&opened.plan);
        let schema = plan.schema();
        let sent_schema = placement.sent_schema(&schema);
        // Counted as computing but while it waits for its client.
        let computing = Counted::new(Arc::clone(&self.computing));
        let (lookup, part) = self
            .cache_lookup(
                ticket,
                opened.skipped,
                opened.cacheable.as_ref(),
                &schema,
                grant,
                cache,
            )
            .await?;
        let started = opened.started.take();
        // A stream decoded ahead had its head start to compute in: counted as producing (an
        // upper bound: it may have waited for its budget), so the cache weighs it fully.
        let head_start = started.as_ref().map(|s| s.since.elapsed());
        let computed = |started: Option<Started>| match started {
            Some(started) => Ok(started.stream.boxed()),
            None => ordered_stream(Arc::clone(&plan), opened.ctx.task_ctx(), opened.parallelism)
                .map(StreamExt::boxed)
                .map_err(ServerError::from),
        };
        let (mut claim, mut hit_bytes, mut producing) = (None, None, Duration::ZERO);
        // The output row the stream's first batch starts at.
        let mut first = opened.skipped.unwrap_or(0);
        let batches = match lookup {
            Lookup::Hit(hit) => {
                // What was decoded ahead is not needed: dropping it stops its partitions.
                drop(started);
                first = 0;
                // A part's read says nothing of the rate a whole entry reads at.
                hit_bytes = (!part).then(|| hit.bytes());
                futures::stream::iter(hit.batches().into_iter().map(Ok)).boxed()
            }
            Lookup::Compute(c, tee) => {
                claim = Some((c, tee));
                producing += head_start.unwrap_or_default();
                computed(started)?
            }
            Lookup::Bypass => computed(started)?,
        };
        Ok(TicketStream {
            node: Arc::clone(self),
            schema: sent_schema,
            plan,
            row_groups: opened.row_groups,
            shard: ticket.shard.clone(),
            batches,
            skip: ticket.skip_rows.saturating_sub(first),
            take: ticket.take_rows,
            output: first,
            rows_sent: 0,
            producing,
            copying: Duration::ZERO,
            ready_since: Instant::now(),
            start,
            claim,
            hit_bytes,
            placement,
            computing,
            prescan: opened.prescan,
            seat: None,
            _slot: None,
        })
    }

    /// What the fragment cache does for `ticket`, and whether it asks for a part of its shard.
    /// A part is served from a stored whole. It is computed into one only where the cache is
    /// `on` (the stream then computes the rest of the shard for the cache after its part is
    /// sent): a part read as a row selection never is.
    async fn cache_lookup(
        &self,
        ticket: &ShardTicket,
        skipped: Option<u64>,
        cacheable: Option<&Cacheable>,
        schema: &SchemaRef,
        grant: &Grant,
        cache: CacheUse,
    ) -> Result<(Lookup, bool)> {
        let part = skipped.is_some()
            || (ticket.take_rows.is_some() && cacheable.is_none_or(|c| c.mode != CacheMode::On));
        let lookup = match (cacheable, cache) {
            (Some(cacheable), CacheUse::Read) if part => match self.cache.peek(cacheable, schema, grant)? {
                Some(hit) => Lookup::Hit(hit),
                None => Lookup::Bypass,
            },
            (Some(cacheable), CacheUse::Read) => self.cache.lookup(cacheable, schema, grant).await?,
            _ => Lookup::Bypass,
        };
        Ok((lookup, part))
    }

    /// Opens the ticket a client sent (`raw`) for `caller`, as `DoGet` does: decoded and its
    /// query checked once (a caller the ticket is not for is refused before it takes a
    /// stream slot or drops a stream opened ahead for someone else), admitted
    /// ([`Node::admit`]), placed, and opened on its share of the cores; the endpoint after
    /// it is opened ahead for a lone reader. `client` tells the stream whether another
    /// client's reduced beside it.
    pub async fn open_stream(
        self: &Arc<Self>,
        raw: &[u8],
        caller: &Caller,
        client: ClientId,
    ) -> Result<OpenedStream> {
        let ticket = ShardTicket::decode(raw).map_err(ServerError::BadTicket)?;
        let checked = self.engine.authorize(&ticket, &caller.grant)?;
        let slot = self.admit().await?;
        let (ticket, placement) = self.place(ticket);
        let running = self.admitted();
        let opened = self
            .open_ticket(
                raw,
                (&ticket, &placement),
                checked,
                caller,
                self.stream_parallelism(running),
            )
            .await?;
        if self.config.read_ahead && running <= 1 {
            self.read_ahead(raw, caller);
        }
        Ok(OpenedStream {
            node: Arc::clone(self),
            ticket,
            opened,
            placement,
            grant: Arc::clone(&caller.grant),
            client,
            slot,
        })
    }

    /// Runs `ticket` in this process as its `DoGet` does — the same checks, placement,
    /// physical plan and `skip_rows` — with no Flight, IPC or socket in between.
    pub async fn run_ticket(
        self: &Arc<Self>,
        ticket: &ShardTicket,
        grant: &Arc<Grant>,
        cache: CacheUse,
    ) -> Result<TicketStream> {
        let (ticket, placement) = self.place(ticket.clone());
        // Never what was read ahead: that is held for a Flight reader.
        let opened = self.engine.open(&ticket, self.cores(), grant).await?;
        self.batches(&ticket, opened, placement, grant, cache).await
    }
}

/// A ticket opened for a client ([`Node::open_stream`]), holding its stream slot: run it
/// with [`OpenedStream::spawn`], read it with [`OpenedStream::batches`].
pub struct OpenedStream {
    node: Arc<Node>,
    ticket: ShardTicket,
    opened: Opened,
    placement: StreamSplit,
    grant: Arc<Grant>,
    client: ClientId,
    slot: Slot,
}

impl std::fmt::Debug for OpenedStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenedStream")
            .field("ticket", &self.ticket)
            .field("placement", &self.placement)
            .finish_non_exhaustive()
    }
}

impl OpenedStream {
    /// The ticket as placed (a fragment whose ops were left to the client says so).
    pub fn ticket(&self) -> &ShardTicket {
        &self.ticket
    }

    /// Runs `task` (given this stream) on the runtime its placement chose: the reducing
    /// cores, or for a stream that reduces nothing here the threads of its own
    /// (`Node::runtime_for`). Dropping the returned task aborts it.
    pub fn spawn<F>(self, task: impl FnOnce(OpenedStream) -> F) -> Task<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let node = Arc::clone(&self.node);
        let runtime = node.runtime_for(&self.placement);
        runtime.spawn(task(self))
    }

    /// The stream's batches (`Node::batches`, the fragment cache read and offered); the
    /// stream slot is held until they drop.
    pub async fn batches(self) -> Result<TicketStream> {
        let seat = (!self.placement.reduces_nothing()).then(|| self.node.company.join(self.client));
        let mut stream = self
            .node
            .batches(
                &self.ticket,
                self.opened,
                self.placement,
                &self.grant,
                CacheUse::Read,
            )
            .await?;
        stream.seat = seat;
        stream._slot = Some(self.slot);
        Ok(stream)
    }
}

/// A ticket's batches, and what the node accounts for them once the stream ends
/// ([`TicketStream::finish`]).
pub struct TicketStream {
    node: Arc<Node>,
    /// The schema as sent: a stream whose ops were left to the client says from which.
    schema: SchemaRef,
    plan: Arc<dyn ExecutionPlan>,
    row_groups: u64,
    shard: Option<Shard>,
    batches: BoxStream<'static, datafusion::error::Result<RecordBatch>>,
    skip: u64,
    /// Rows still to send (`take_rows` less those sent); `None`: to the end.
    take: Option<u64>,
    /// Output rows of the query so far, skipped ones included: where a failing value is,
    /// and where the stream ended in the shard's output (its whole output, without
    /// `take_rows`).
    output: u64,
    rows_sent: u64,
    /// Time spent producing batches (scan, ops, the front end's encoding), not waiting for
    /// the client: what the cache weighs a computed shard by, and a hit's read cost.
    producing: Duration,
    copying: Duration,
    ready_since: Instant,
    start: Instant,
    claim: Option<(Claim, Box<Tee>)>,
    hit_bytes: Option<u64>,
    placement: StreamSplit,
    computing: Counted,
    /// What finding a filtered part's rows read before the plan ran.
    prescan: Option<StreamStats>,
    /// On the reducing cores: whether another client's stream ran there beside this one.
    seat: Option<Seat>,
    /// The stream slot an opened stream holds until it ends.
    _slot: Option<Slot>,
}

impl std::fmt::Debug for TicketStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TicketStream")
            .field("shard", &self.shard)
            .field("output", &self.output)
            .field("rows_sent", &self.rows_sent)
            .finish_non_exhaustive()
    }
}

impl TicketStream {
    /// The plan's next batch, its error named as the scan's ([`ServerError::from_scan`]).
    /// A panic while producing it (Arrow's Parquet decoder slices past a page that claims
    /// more bytes than its column chunk holds: found by the `parquet` fuzz target) ends the
    /// stream as the same data would end it on any retry: the shard's file unreadable
    /// (`DataLoss`, never retried), the panic's message said and counted.
    async fn next_computed(&mut self) -> Option<Result<RecordBatch>> {
        use futures::FutureExt;
        match std::panic::AssertUnwindSafe(self.batches.next())
            .catch_unwind()
            .await
        {
            Ok(item) => Some(item?.map_err(|e| ServerError::from_scan(e, self.shard.as_ref()))),
            Err(panic) => {
                self.node.metrics.panics_contained.inc();
                // The plan is in no state to go on.
                self.batches = futures::stream::empty().boxed();
                let reason = format!(
                    "reading it panicked: {} (a damaged file, or a bug its bytes reach; the same \
                     on every retry)",
                    pushdown_task::panic_message(panic.as_ref())
                );
                tracing::warn!(%reason, shard = ?self.shard, "a scan panicked");
                Some(Err(match &self.shard {
                    Some(shard) => ServerError::CorruptFile {
                        dataset: shard.dataset.clone(),
                        file: shard.file.clone(),
                        reason,
                    },
                    None => ServerError::CorruptData(reason),
                }))
            }
        }
    }

    /// The schema of the batches, as a client receives it.
    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// The next batch past `skip_rows` (up to `take_rows`), or the error that ends the
    /// stream (a scan's error names its shard and row).
    pub async fn next(&mut self) -> Option<Result<RecordBatch>> {
        loop {
            if self.take == Some(0) {
                self.fill_cache();
                return None;
            }
            let batch = match self.next_computed().await? {
                Ok(batch) => batch,
                Err(e) => return Some(Err(e.after_rows(self.output))),
            };
            if let Some((_, tee)) = &mut self.claim {
                // Copying into the cache is not computing: its time is left out.
                let copying = Instant::now();
                let so_far = (self.producing + self.ready_since.elapsed()).saturating_sub(self.copying);
                tee.push(&batch, so_far);
                self.copying += copying.elapsed();
            }
            let n = batch.num_rows() as u64;
            let skip = self.skip.min(n);
            self.skip -= skip;
            let len = self.take.map_or(n - skip, |t| t.min(n - skip));
            self.output += skip + len;
            if len == 0 {
                continue;
            }
            if let Some(t) = &mut self.take {
                *t -= len;
            }
            let batch = if len == n {
                batch
            } else {
                batch.slice(skip as usize, len as usize)
            };
            self.rows_sent += len;
            // Batches say what their stream's schema says (a deferral).
            let batch = match self.placement.deferred_from {
                Some(_) => match batch.with_schema(Arc::clone(&self.schema)) {
                    Ok(batch) => batch,
                    Err(e) => return Some(Err(ServerError::encode("a deferred batch")(e))),
                },
                None => batch,
            };
            return Some(Ok(batch));
        }
    }

    /// A part sent (`take_rows`) of a shard computed for the cache: the rest of the shard's
    /// output is computed for the cache alone, on a task of its own, so the stream ends (and
    /// its client gets the trailer) at the part's end, not the shard's. The claim stays held
    /// until the entry is whole: a request for the shard meanwhile waits for it, then hits.
    /// A failure there drops the claim; the part sent is not affected.
    fn fill_cache(&mut self) {
        let Some((claim, mut tee)) = self.claim.take() else {
            return;
        };
        let mut rest = std::mem::replace(&mut self.batches, futures::stream::empty().boxed());
        let before = (self.producing + self.ready_since.elapsed()).saturating_sub(self.copying);
        self.node.cpu.spawn_detached(async move {
            let start = Instant::now();
            while let Some(batch) = rest.next().await {
                match batch {
                    Ok(batch) => tee.push(&batch, before + start.elapsed()),
                    Err(e) => {
                        tracing::debug!(error = %e, "computing the rest of a shard for the cache");
                        return;
                    }
                }
            }
            let decision = claim.finish(*tee, before + start.elapsed());
            tracing::debug!(%decision, "fragment cache, a shard completed after its part");
        });
    }

    /// The front end waits for its client from now on: not computing (the stream's cores
    /// go to the others, its ops stop counting against the server's) until [`Self::resume`].
    /// Returns how long it produced since it last resumed.
    pub fn wait_for_client(&mut self) -> Duration {
        let producing = self.ready_since.elapsed();
        self.producing += producing;
        self.placement.waiting(true);
        self.computing.set(false);
        if let Some((claim, _)) = &self.claim {
            claim.held_back(true);
        }
        producing
    }

    /// The client took what was sent: the stream computes again.
    pub fn resume(&mut self) {
        self.placement.waiting(false);
        self.computing.set(true);
        if let Some((claim, _)) = &self.claim {
            claim.held_back(false);
        }
        self.ready_since = Instant::now();
    }

    /// Ends the stream: a whole output (`completed`) is offered to the cache (a claim
    /// dropped unfinished lets the next request compute it); the node's metrics count it.
    /// `bytes_sent`: what the front end put on the wire. Returns the stream's statistics.
    pub fn finish(mut self, completed: bool, bytes_sent: u64) -> StreamStats {
        self.producing += self.ready_since.elapsed();
        if completed {
            if let Some((claim, tee)) = self.claim.take() {
                let decision = claim.finish(*tee, self.producing.saturating_sub(self.copying));
                tracing::debug!(%decision, "fragment cache");
            }
            if let Some(bytes) = self.hit_bytes {
                self.node.cache.observe_read(bytes, self.producing);
            }
        }
        let mut stats = scan_stats(&self.plan);
        if let Some(prescan) = &self.prescan {
            // Bytes both read; rows of storage counted once: the prescan's account of the
            // part's rows (the plan read a subset of them again).
            stats.bytes_scanned += prescan.bytes_scanned;
            stats.rows_scanned = prescan.rows_scanned;
        }
        stats.rows_sent = self.rows_sent;
        stats.rows_output = self.output;
        stats.bytes_sent = bytes_sent;
        stats.row_groups = self.row_groups;
        stats.elapsed_ns = self.start.elapsed().as_nanos() as u64;
        stats.reduced_alone = u64::from(self.seat.as_ref().is_some_and(Seat::alone));
        let metrics = &self.node.metrics;
        metrics.record_stream(&stats);
        metrics.record_op_rows(&self.placement.ops, self.placement.on_server, self.output);
        stats
    }

    /// The batches as a stream, for callers in this process; the node accounts for them
    /// when the last one is read.
    pub fn into_stream(self) -> BoxStream<'static, Result<RecordBatch>> {
        futures::stream::unfold(Some(self), |state| async move {
            let mut stream = state?;
            match stream.next().await {
                Some(Ok(batch)) => Some((Ok(batch), Some(stream))),
                Some(Err(e)) => Some((Err(e), None)),
                None => {
                    stream.finish(true, 0);
                    None
                }
            }
        })
        .boxed()
    }
}
