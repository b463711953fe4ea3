//! Fan-out over a FlightInfo's endpoints with bounded concurrency and a deterministic order.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use arrow_flight::decode::{DecodedPayload, FlightDataDecoder};
use arrow_flight::error::FlightError;
use arrow_flight::{FlightData, FlightInfo, Ticket};
use futures::{Stream, StreamExt};
use parking_lot::{Mutex, MutexGuard};
use pushdown_protocol::{Deferral, ShardTicket, StreamStats};
use pushdown_task::Task;
use tokio::sync::mpsc;

use crate::completion::Completion;
use crate::error::{ClientError, Result};
use crate::fleet::{Fleet, Member};
use crate::retry::{Attempts, Failure, Policy, Verdict};
use tracing::Instrument;

/// How a [`ShardStream`] fans out.
#[derive(Debug, Clone)]
pub struct StreamOptions {
    /// Shard streams in flight at once; with [`Order::Sequential`], where the tuning starts.
    pub concurrency: usize,
    /// With [`Order::Sequential`], the most streams in flight the stream tunes itself up to
    /// (see `tune.rs`: more while the consumer waits and each step raises the rate, fewer
    /// while it never waits), bounded also by [`READ_AHEAD_BYTES`] of read-ahead in all. At
    /// or below `concurrency`: `concurrency`, fixed. Round-robin order never tunes (its
    /// sequence depends on the count).
    pub max_concurrency: usize,
    /// Bytes (in Arrow memory) each in-flight stream may read ahead of the consumer before
    /// it waits (back-pressure); at least one batch. With [`Order::Sequential`] only the
    /// head shard is being consumed: the others keep their servers and links busy only as
    /// far as this lets them run ahead.
    pub buffered_bytes: usize,
    /// Times a shard's stream is resumed after transient failures (on any of its servers)
    /// before its error is returned.
    pub max_retries: usize,
    /// Wait before the first retry; doubles after each, with jitter. A failed server also
    /// rests this long (doubling per consecutive failure) while others can serve.
    pub retry_backoff: Duration,
    /// A stream that receives nothing for this long is cancelled and resumed, on another
    /// server if one holds the shard.
    pub stall_timeout: Duration,
    /// How batches of in-flight shards are merged.
    pub order: Order,
}

/// The merge order of a [`ShardStream`]; either way a function of the shards alone.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Order {
    /// One batch from each in-flight shard in turn: mixes shards, but the sequence depends
    /// on `concurrency`.
    #[default]
    RoundRobin,
    /// Shard after shard: `concurrency` only prefetches, the sequence never changes.
    Sequential,
}

/// A part of one endpoint: skip its first `skip` rows, then deliver `take` rows (all when
/// `None`).
#[derive(Debug, Clone)]
pub struct Segment {
    pub endpoint: arrow_flight::FlightEndpoint,
    /// The endpoint's position in its FlightInfo, for errors.
    pub index: usize,
    pub skip: u64,
    pub take: Option<u64>,
    /// What a split placement assigns the segment's side by (see
    /// [`crate::ShardPlacement::is_clients`]): its endpoint's position counted on over
    /// epochs (epoch × endpoints + index), so a fraction one epoch's endpoints cannot
    /// express (7 of 16) is met over epochs.
    pub position: u64,
}

impl Default for StreamOptions {
    fn default() -> Self {
        Self {
            concurrency: 4,
            max_concurrency: 32,
            buffered_bytes: 32 << 20,
            max_retries: 3,
            retry_backoff: Duration::from_millis(100),
            stall_timeout: Duration::from_secs(30),
            order: Order::RoundRobin,
        }
    }
}

/// What the streams in flight of one [`ShardStream`] may hold ahead of its consumer in all
/// (each its `buffered_bytes` and its HTTP/2 window): the bound on tuned concurrency.
pub const READ_AHEAD_BYTES: usize = 1 << 30;

impl StreamOptions {
    /// The streams in flight are tuned ([`Order::Sequential`] and room above `concurrency`).
    pub fn tuned(&self) -> bool {
        self.order == Order::Sequential && self.tuned_max() > self.concurrency.max(1)
    }

    /// The most streams in flight tuning may reach: `max_concurrency`, within
    /// [`READ_AHEAD_BYTES`].
    fn tuned_max(&self) -> usize {
        let per_stream = self.buffered_bytes.max(1) + crate::fleet::STREAM_WINDOW as usize;
        self.max_concurrency.min(READ_AHEAD_BYTES / per_stream).max(1)
    }
}

/// What a stream has received so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StreamTotals {
    /// Bytes of Flight messages received (IPC headers and bodies, as sent).
    pub bytes_received: u64,
    pub rows: u64,
    pub batches: u64,
    pub retries: u64,
    /// The servers' own accounting, summed from stream trailers (when requested).
    pub server: StreamStats,
    /// The most streams in flight at once (tuned, or as set).
    pub peak_streams: u64,
}

impl std::ops::AddAssign for StreamTotals {
    fn add_assign(&mut self, o: Self) {
        self.bytes_received += o.bytes_received;
        self.rows += o.rows;
        self.batches += o.batches;
        self.retries += o.retries;
        self.server += o.server;
        self.peak_streams = self.peak_streams.max(o.peak_streams);
    }
}

/// The [`StreamTotals`] several streams add to, shared with whoever reports them (cheap to
/// clone: one `Arc`).
#[derive(Debug, Clone, Default)]
pub struct SharedTotals(Arc<Mutex<StreamTotals>>);

impl SharedTotals {
    /// The totals so far.
    pub fn get(&self) -> StreamTotals {
        *self.0.lock()
    }

    /// The totals, to add to.
    pub(crate) fn lock(&self) -> MutexGuard<'_, StreamTotals> {
        self.0.lock()
    }
}

struct Active {
    rx: mpsc::UnboundedReceiver<Result<Held>>,
    /// Set when the shard's stream has ended (everything it delivers is read ahead).
    finished: Arc<AtomicBool>,
    /// Aborted when the shard's stream is dropped.
    _task: Task<()>,
}

/// A batch read ahead, holding its share of its stream's read-ahead budget until consumed.
struct Held {
    batch: RecordBatch,
    _budget: tokio::sync::OwnedSemaphorePermit,
}

/// One stream's side of its read-ahead: batches wait for room in a byte budget (KiB
/// permits), so a stream runs ahead of the consumer by bytes, not by batches of any size.
#[derive(Clone)]
struct Buffer {
    tx: mpsc::UnboundedSender<Result<Held>>,
    budget: Arc<tokio::sync::Semaphore>,
    kib: u32,
}

impl Buffer {
    fn new(bytes: usize) -> (Self, mpsc::UnboundedReceiver<Result<Held>>) {
        let kib = u32::try_from(bytes.div_ceil(1024)).unwrap_or(u32::MAX).max(1);
        let (tx, rx) = mpsc::unbounded_channel();
        let budget = Arc::new(tokio::sync::Semaphore::new(kib as usize));
        (Self { tx, budget, kib }, rx)
    }

    /// Waits for room, then hands `batch` over; `false` once the consumer is gone.
    async fn push(&self, batch: RecordBatch) -> bool {
        let need = u32::try_from(batch.get_array_memory_size().div_ceil(1024))
            .unwrap_or(u32::MAX)
            .clamp(1, self.kib);
        let Ok(permit) = Arc::clone(&self.budget).acquire_many_owned(need).await else {
            return false;
        };
        self.tx
            .send(Ok(Held {
                batch,
                _budget: permit,
            }))
            .is_ok()
    }

    fn fail(&self, e: ClientError) {
        let _ = self.tx.send(Err(e));
    }
}

/// The record batches of every endpoint of a FlightInfo.
///
/// At most `concurrency` shards stream at once, each reading up to `buffered_bytes` ahead;
/// the consumer takes one batch from each in-flight shard in turn (in endpoint order), or
/// shard after shard, so the output order is a function of the shards' contents alone.
/// Dropping the stream aborts every request in flight.
pub struct ShardStream {
    fleet: Arc<Fleet>,
    schema: SchemaRef,
    pending: VecDeque<Segment>,
    active: VecDeque<Active>,
    options: StreamOptions,
    totals: SharedTotals,
    failed: bool,
    /// Runs the ops a server left to this client; none: a stream that arrives un-reduced
    /// is an error.
    completion: Option<Arc<Completion>>,
    /// Set once every segment's stream has started (see [`ShardStream::signal_all_started`]).
    all_started: Arc<AtomicBool>,
    /// Woken when a shard's stream ends, to start the next behind a head still streaming.
    ended: Arc<futures::task::AtomicWaker>,
    /// Sizes `options.concurrency` from the consumer's waits, when tuned.
    tuner: Option<crate::tune::Tuner>,
    /// Since when the consumer has been waiting for the next batch.
    waiting_since: Option<std::time::Instant>,
}

impl std::fmt::Debug for ShardStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardStream")
            .field("pending", &self.pending.len())
            .field("active", &self.active.len())
            .finish_non_exhaustive()
    }
}

impl ShardStream {
    pub(crate) fn start(fleet: Arc<Fleet>, info: &FlightInfo, options: StreamOptions) -> Result<Self> {
        let segments = info
            .endpoint
            .iter()
            .cloned()
            .enumerate()
            .map(|(index, endpoint)| Segment {
                endpoint,
                index,
                skip: 0,
                take: None,
                position: index as u64,
            })
            .collect();
        Self::segments(fleet, info, segments, options)
    }

    /// Streams `segments` (parts of `info`'s endpoints) in the given order.
    pub(crate) fn segments(
        fleet: Arc<Fleet>,
        info: &FlightInfo,
        segments: Vec<Segment>,
        options: StreamOptions,
    ) -> Result<Self> {
        let schema = Arc::new(info.clone().try_decode_schema()?);
        let all_started = Arc::new(AtomicBool::new(segments.is_empty()));
        let tuner = options
            .tuned()
            .then(|| crate::tune::Tuner::new(options.concurrency, options.tuned_max()));
        Ok(Self {
            fleet,
            schema,
            pending: segments.into(),
            active: VecDeque::new(),
            options,
            totals: SharedTotals::default(),
            failed: false,
            completion: None,
            all_started,
            ended: Arc::default(),
            tuner,
            waiting_since: None,
        })
    }

    /// Finishes shards that arrive un-reduced with `completion`.
    pub fn with_completion(mut self, completion: Option<Arc<Completion>>) -> Self {
        self.completion = completion;
        self
    }

    pub fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    /// Sets `flag` once every segment's stream has started: from then on the stream's tail
    /// leaves servers and this client's cores idle, so a reader of several queries in a row
    /// (the next epoch) starts the next one.
    pub fn signal_all_started(mut self, flag: Arc<AtomicBool>) -> Self {
        if self.pending.is_empty() {
            flag.store(true, Ordering::Release);
        }
        self.all_started = flag;
        self
    }

    /// Whether another shard's stream may start. Round-robin: while fewer than
    /// `concurrency` shards are held (their count shapes the sequence). Sequential: while
    /// fewer than `concurrency` are still streaming, and fewer than twice that are held,
    /// so shards that finished behind a slow head do not keep servers and this client's
    /// cores idle (each end runs ahead of the other by up to `concurrency` shards).
    fn may_start(&self) -> bool {
        let concurrency = self.options.concurrency.max(1);
        if self.pending.is_empty() {
            return false;
        }
        match self.options.order {
            Order::RoundRobin => self.active.len() < concurrency,
            Order::Sequential => {
                let streaming = self
                    .active
                    .iter()
                    .filter(|a| !a.finished.load(Ordering::Acquire))
                    .count();
                streaming < concurrency && self.active.len() < 2 * concurrency
            }
        }
    }

    pub fn totals(&self) -> StreamTotals {
        *self.totals.lock()
    }

    /// A handle to the totals that stays valid after the stream is consumed.
    pub fn totals_handle(&self) -> SharedTotals {
        self.totals.clone()
    }

    fn start_next(&mut self) {
        let Some(segment) = self.pending.pop_front() else {
            return;
        };
        let (tx, rx) = Buffer::new(self.options.buffered_bytes);
        let finished = Arc::new(AtomicBool::new(false));
        let run = run_endpoint(
            Arc::clone(&self.fleet),
            segment,
            tx,
            self.options.clone(),
            self.totals.clone(),
            self.completion.clone(),
        );
        let (done, ended) = (Arc::clone(&finished), Arc::clone(&self.ended));
        let task = Task::spawn(async move {
            run.await;
            done.store(true, Ordering::Release);
            ended.wake();
        });
        self.active.push_back(Active {
            rx,
            finished,
            _task: task,
        });
        if self.pending.is_empty() {
            self.all_started.store(true, Ordering::Release);
        }
    }
}

impl Stream for ShardStream {
    type Item = Result<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.failed {
            return Poll::Ready(None);
        }
        self.ended.register(cx.waker());
        loop {
            while self.may_start() {
                self.start_next();
            }
            let Some(front) = self.active.front_mut() else {
                return Poll::Ready(None);
            };
            match front.rx.poll_recv(cx) {
                Poll::Ready(Some(Ok(held))) => {
                    let batch = held.batch;
                    let now = std::time::Instant::now();
                    let waited = self.waiting_since.take().map(|t| now - t).unwrap_or_default();
                    let streams = self
                        .active
                        .iter()
                        .filter(|a| !a.finished.load(Ordering::Acquire))
                        .count() as u64;
                    let rows = batch.num_rows() as u64;
                    if let Some(level) = self.tuner.as_mut().map(|t| t.observe(now, waited, rows)) {
                        self.options.concurrency = level;
                    }
                    // Round-robin: this shard goes to the back of the line.
                    if self.options.order == Order::RoundRobin
                        && let Some(a) = self.active.pop_front()
                    {
                        self.active.push_back(a);
                    }
                    let mut totals = self.totals.lock();
                    totals.rows += rows;
                    totals.batches += 1;
                    totals.peak_streams = totals.peak_streams.max(streams);
                    return Poll::Ready(Some(Ok(batch)));
                }
                Poll::Ready(Some(Err(e))) => {
                    self.failed = true;
                    self.active.clear();
                    self.pending.clear();
                    return Poll::Ready(Some(Err(e)));
                }
                Poll::Ready(None) => {
                    self.active.pop_front();
                }
                Poll::Pending => {
                    self.waiting_since.get_or_insert_with(std::time::Instant::now);
                    return Poll::Pending;
                }
            }
        }
    }
}

/// Streams one endpoint into `tx`: on the least busy server holding it, moving to another
/// holder after a failure and resuming from the first undelivered row. Transient failures
/// are retried up to `max_retries` times with jittered backoff; a server that refuses the
/// shard (no such file, another version of it) is not asked again; a bad value or corrupt
/// data ends the stream with its error at once.
async fn run_endpoint(
    fleet: Arc<Fleet>,
    segment: Segment,
    tx: Buffer,
    options: StreamOptions,
    totals: SharedTotals,
    completion: Option<Arc<Completion>>,
) {
    let index = segment.index;
    let Some(ticket) = segment.endpoint.ticket.clone() else {
        return tx.fail(ClientError::reply(
            "planning",
            format!("endpoint {index} has no ticket"),
        ));
    };
    let holders = match fleet.holders(&segment.endpoint) {
        Ok(h) if !h.is_empty() => h,
        Ok(_) => {
            return tx.fail(ClientError::reply(
                "planning",
                format!("endpoint {index} has no server"),
            ));
        }
        Err(e) => return tx.fail(e),
    };
    let decoded = ShardTicket::decode(&ticket.ticket).ok();
    let (shard, expect_trailer) = match &decoded {
        Some(t) => (
            t.shard
                .as_ref()
                .map_or_else(|| "the whole query".to_owned(), |s| s.label()),
            t.request.stats,
        ),
        None => (format!("endpoint {index}"), false),
    };
    // A row-wise shard is resumed from its first undelivered row on any holder; a whole query
    // (or a ticket of another server) only runs again from the start, while nothing was
    // delivered.
    let resumable = decoded.filter(|t| t.shard.is_some());
    // The retry loop's warnings name the shard through this span.
    let span = tracing::info_span!("shard", endpoint = index, shard = %shard);
    EndpointRun {
        index,
        position: segment.position,
        ticket,
        attempts: Attempts::new(
            holders,
            index,
            Policy {
                max_retries: options.max_retries,
                backoff: options.retry_backoff,
                pass_elsewhere: true,
                once: false,
                rest_each_failure: true,
            },
        ),
        tx,
        totals,
        completion,
        shard,
        expect_trailer,
        resumable,
        delivered: segment.skip,
        end: segment.take.map(|t| segment.skip + t),
        options,
    }
    .run()
    .instrument(span)
    .await
}

/// One endpoint's stream as [`run_endpoint`] runs it: what it asks for, of which servers, and
/// how far it got over its attempts.
struct EndpointRun {
    index: usize,
    /// The segment's [`Segment::position`]: where its ops run.
    position: u64,
    ticket: Ticket,
    /// The holders asked, and how the failures went.
    attempts: Attempts,
    tx: Buffer,
    totals: SharedTotals,
    completion: Option<Arc<Completion>>,
    /// The shard, as errors and logs name it.
    shard: String,
    expect_trailer: bool,
    /// The decoded ticket, when the stream resumes from its first undelivered row.
    resumable: Option<ShardTicket>,
    /// Rows of the endpoint delivered (or skipped) so far.
    delivered: u64,
    /// Where to stop.
    end: Option<u64>,
    options: StreamOptions,
}

impl EndpointRun {
    /// Asks the holders in turn until the shard is delivered, its error is sent, or the
    /// consumer is gone.
    async fn run(mut self) {
        loop {
            let Some(node) = self.attempts.next() else {
                return self.tx.fail(ClientError::NoServer {
                    endpoint: self.index,
                    shard: self.shard.clone(),
                    refusals: self.attempts.refusals(),
                });
            };
            // Where this shard's ops run is asked anew on each request (a resumed stream too).
            let (deferral, mut dealt) = match &self.completion {
                Some(c) => {
                    let placed = c.deferral_for(self.position);
                    (Some(placed.deferral), placed.dealt)
                }
                None => (None, None),
            };
            let bytes = self.request(deferral);
            let before = self.delivered;
            let outcome = self.fetch_from(&node, bytes, dealt.as_mut()).await;
            let status = match outcome {
                Ok(()) => return self.ended_cleanly(&node, dealt.as_mut()),
                Err(Fetch::ConsumerGone) => return,
                Err(Fetch::Failed(e)) => return self.tx.fail(e),
                Err(Fetch::Status(status)) => status,
            };
            // `dealt` stays held through any backoff: it is dropped as this iteration ends.
            if !self.after_failure(&node, status, before).await {
                return;
            }
        }
    }

    /// The ticket to send: the decoded one told the rows to skip and where the ops run, when
    /// either matters; else the endpoint's own.
    fn request(&self, deferral: Option<Deferral>) -> bytes::Bytes {
        match &self.resumable {
            Some(t)
                if self.delivered > 0
                    || self.end.is_some()
                    || deferral.is_some_and(|d| d != Deferral::Never) =>
            {
                let mut t = t.clone();
                t.skip_rows += self.delivered;
                // The server stops there (and reads only the part, for a query with no filter).
                t.take_rows = self.end.map(|e| e.saturating_sub(self.delivered));
                if let Some(deferral) = deferral {
                    t.request.deferral = deferral;
                }
                t.encode()
            }
            _ => self.ticket.ticket.clone(),
        }
    }

    /// One request to `node`, counted as a stream in flight on it while it runs.
    async fn fetch_from(
        &mut self,
        node: &Arc<Member>,
        bytes: bytes::Bytes,
        dealt: Option<&mut crate::completion::Dealt>,
    ) -> Result<(), Fetch> {
        let _busy = node.busy();
        // With the shard span: which server each stream ran on, from when to when (a fleet's
        // idle gaps read from these).
        tracing::debug!(server = %node.url, from_row = self.delivered, "stream opened");
        let fetched = fetch(
            node,
            self.index,
            bytes,
            &self.tx,
            &self.totals,
            Progress {
                delivered: &mut self.delivered,
                end: self.end,
                told_end: self.resumable.is_some(),
                expect_trailer: self.expect_trailer,
                stall: self.options.stall_timeout,
                completion: self.completion.as_ref(),
                dealt,
            },
        )
        .await;
        tracing::debug!(server = %node.url, rows = self.delivered, "stream closed");
        fetched
    }

    /// The stream from `node` ended without an error: the shard is done, or short of its count.
    fn ended_cleanly(&self, node: &Member, dealt: Option<&mut crate::completion::Dealt>) {
        node.succeeded();
        if let Some(d) = dealt {
            d.finished();
        }
        if let Some(planned) = self.end.filter(|e| self.delivered < *e) {
            // Ended cleanly, short of its count: never a short epoch.
            self.tx.fail(ClientError::ShortShard {
                endpoint: self.index,
                shard: self.shard.clone(),
                delivered: self.delivered,
                planned,
            });
        }
    }

    /// Ends the shard with `status`, naming the attempts made and the servers asked.
    fn give_up(&mut self, status: tonic::Status) {
        self.tx.fail(ClientError::Stream {
            endpoint: self.index,
            shard: self.shard.clone(),
            attempts: self.attempts.retries() + 1,
            servers: self.attempts.take_tried(),
            status: Box::new(status),
        });
    }

    /// After `node` failed with `status` (`before`: the rows delivered when it was asked):
    /// what the retry policy says, and whether the stream can resume. `false` when the
    /// shard's error was sent instead (final, not resumable, or out of retries).
    async fn after_failure(&mut self, node: &Member, status: tonic::Status, before: u64) -> bool {
        if Failure::of(status.code()) == Failure::Transient && self.resumable.is_none() && self.delivered > 0
        {
            node.failed(self.options.retry_backoff);
            self.tx.fail(ClientError::NotResumable {
                delivered: self.delivered,
                status: Box::new(status),
            });
            return false;
        }
        if Failure::of(status.code()) == Failure::Transient && self.delivered > before {
            // Progress was made: the retry budget is for consecutive failures.
            self.attempts.progressed();
        }
        match self.attempts.failed(node, status).await {
            Verdict::Fail(status) => {
                self.give_up(status);
                false
            }
            Verdict::Next => true,
            Verdict::Retry => {
                self.totals.lock().retries += 1;
                tracing::debug!(
                    shard = self.shard,
                    delivered = self.delivered,
                    "resuming the stream"
                );
                true
            }
        }
    }
}

/// Runs the ops the server at `url` left to this client on `batch`, on a blocking thread.
async fn complete(
    completion: Option<&Arc<Completion>>,
    batch: RecordBatch,
    from: usize,
    index: usize,
    url: &str,
) -> Result<RecordBatch, Fetch> {
    let Some(completion) = completion else {
        return Err(Fetch::Failed(ClientError::Decode {
            endpoint: index,
            reason: format!("{url} left ops to this client, which cannot run them"),
        }));
    };
    let completion = Arc::clone(completion);
    let core = completion.core().await;
    match tokio::task::spawn_blocking(move || {
        let _core = core;
        completion.complete(batch, from)
    })
    .await
    {
        Ok(done) => done.map_err(Fetch::Failed),
        Err(source) => Err(Fetch::Failed(ClientError::Task {
            what: "completing a deferred batch",
            cause: source,
        })),
    }
}

/// Rows of an endpoint delivered so far (counting skipped ones), where to stop, and what the
/// stream must show to be complete.
struct Progress<'a> {
    delivered: &'a mut u64,
    end: Option<u64>,
    /// The request told the server where to stop (`take_rows`): at `end` the stream ends, so
    /// its trailer is read.
    told_end: bool,
    /// The request asked for a trailing stats message: a stream without one was cut.
    expect_trailer: bool,
    /// Longest wait for the next message.
    stall: Duration,
    completion: Option<&'a Arc<Completion>>,
    /// The adapted split's account of the shard.
    dealt: Option<&'a mut crate::completion::Dealt>,
}

enum Fetch {
    ConsumerGone,
    Status(tonic::Status),
    Failed(ClientError),
}

/// One DoGet on `node`: decodes the stream into `tx`, counting bytes and delivered rows.
async fn fetch(
    node: &Member,
    index: usize,
    ticket: bytes::Bytes,
    tx: &Buffer,
    totals: &SharedTotals,
    mut progress: Progress<'_>,
) -> Result<(), Fetch> {
    if progress.done() {
        return Ok(());
    }
    let stall = progress.stall;
    let stalled = |what: &str| {
        // A plan does not wait for it either, while the others can do without it.
        node.fell_silent();
        Fetch::Status(tonic::Status::deadline_exceeded(format!(
            "{what} from {} for {stall:?}: stream cancelled",
            node.url
        )))
    };
    let mut request = tonic::Request::new(Ticket::new(ticket));
    if let Some(c) = progress.completion {
        request
            .metadata_mut()
            .insert(pushdown_protocol::READER_HEADER, c.reader().into());
    }
    let response = tokio::time::timeout(stall, node.flight.clone().do_get(request))
        .await
        .map_err(|_| stalled("no answer"))?
        .map_err(Fetch::Status)?;
    let counter = totals.clone();
    let trailer: Arc<Mutex<Option<StreamStats>>> = Arc::default();
    let seen = Arc::clone(&trailer);
    let raw = response
        .into_inner()
        .filter_map(move |item| futures::future::ready(count_message(item, &counter, &seen)));
    let mut decoder = FlightDataDecoder::new(raw);
    // Whether a batch has shown where the stream's ops run.
    let mut placed = false;
    let mut received = 0u64;
    loop {
        let item = match tokio::time::timeout(stall, crate::ipc::next_decoded(&mut decoder)).await {
            Ok(Some(item)) => item,
            Ok(None) => break,
            Err(_) => return Err(stalled("no data")),
        };
        let decoded = match item {
            Ok(d) => d,
            Err(FlightError::Tonic(status)) => return Err(Fetch::Status(*status)),
            Err(other) => {
                return Err(Fetch::Failed(ClientError::Decode {
                    endpoint: index,
                    reason: format!("from {}: {other}", node.url),
                }));
            }
        };
        match decoded.payload {
            DecodedPayload::RecordBatch(batch) => {
                received += batch.num_rows() as u64;
                let cut = progress.deliver(batch, !placed, node, index, tx).await?;
                placed = true;
                if progress.done() && (cut || !progress.told_end) {
                    // The rest of the shard is not ours: dropping the response cancels it.
                    return Ok(());
                }
            }
            DecodedPayload::None | DecodedPayload::Schema(_) => {}
        }
    }
    let trailer = trailer.lock().take();
    progress.check_trailer(trailer, received, node, index, totals)
}

/// Counts a Flight message's bytes into `totals`; a metadata-only one goes to `trailer`
/// instead of the IPC decoder, and any other is checked for it ([`crate::ipc`]).
fn count_message(
    item: Result<FlightData, tonic::Status>,
    totals: &SharedTotals,
    trailer: &Mutex<Option<StreamStats>>,
) -> Option<Result<FlightData, FlightError>> {
    match item {
        Ok(data) => {
            let n = data.data_header.len() + data.data_body.len() + data.app_metadata.len();
            let mut totals = totals.lock();
            totals.bytes_received += n as u64;
            if data.data_header.is_empty() {
                // A metadata-only message (empty IPC header, as Arrow C++ sends them):
                // the server's trailing stats, not for the IPC decoder.
                if let Ok(stats) = StreamStats::decode(&data.app_metadata) {
                    *trailer.lock() = Some(stats);
                }
                None
            } else {
                // Checked before Arrow's decoder allocates what a compressed buffer claims.
                Some(
                    crate::ipc::check_message(&data)
                        .map(|()| data)
                        .map_err(FlightError::DecodeError),
                )
            }
        }
        Err(status) => Some(Err(FlightError::Tonic(Box::new(status)))),
    }
}

impl Progress<'_> {
    /// Every row up to `end` is delivered.
    fn done(&self) -> bool {
        self.end.is_some_and(|e| *self.delivered >= e)
    }

    /// Hands `batch` (of the stream from `node`) to the consumer: cut at `end`, with the ops
    /// the server left to this client run on it; `first`: the stream's first batch, which
    /// shows where its ops run. Returns whether it was cut: the server sends past `end`.
    async fn deliver(
        &mut self,
        mut batch: RecordBatch,
        first: bool,
        node: &Member,
        index: usize,
        tx: &Buffer,
    ) -> Result<bool, Fetch> {
        let mut cut = false;
        if let Some(end) = self.end {
            let left = end.saturating_sub(*self.delivered);
            if (batch.num_rows() as u64) > left {
                batch = batch.slice(0, left as usize);
                cut = true;
            }
        }
        let from = Completion::deferred_from(&batch).map_err(Fetch::Failed)?;
        if first {
            self.account_placement(from);
        }
        if let Some(from) = from {
            batch = complete(self.completion, batch, from, index, &node.url).await?;
        }
        let rows = batch.num_rows() as u64;
        if !tx.push(batch).await {
            return Err(Fetch::ConsumerGone);
        }
        *self.delivered += rows;
        Ok(cut)
    }

    /// Accounts for where the stream's ops run (`from`: the first it left to this client).
    fn account_placement(&mut self, from: Option<usize>) {
        if let (Some(_), Some(c)) = (from, self.completion) {
            c.stream_started();
            if let Some(d) = self.dealt.as_deref_mut() {
                d.left_to_client();
            }
        }
    }

    /// Checks the ended stream from `node` (`received` rows in all) against its trailer,
    /// adding the server's stats to `totals`.
    fn check_trailer(
        &mut self,
        trailer: Option<StreamStats>,
        received: u64,
        node: &Member,
        index: usize,
        totals: &SharedTotals,
    ) -> Result<(), Fetch> {
        match trailer {
            Some(stats) => {
                // The shard's whole output against the rows held of it: a resume that skipped
                // too few or too many, or rows lost on the way, cannot pass.
                if stats.rows_sent != received || stats.rows_output != *self.delivered {
                    return Err(Fetch::Failed(ClientError::Miscount {
                        endpoint: index,
                        server: node.url.clone(),
                        delivered: *self.delivered,
                        output: stats.rows_output,
                        sent: stats.rows_sent,
                        received,
                    }));
                }
                totals.lock().server += stats;
                if let (Some(d), 1..) = (self.dealt.as_deref_mut(), stats.reduced_alone) {
                    d.ran_alone();
                }
            }
            // Every complete stream of a request with stats ends with them: this one was cut.
            None if self.expect_trailer => {
                return Err(Fetch::Status(tonic::Status::unavailable(format!(
                    "the stream from {} ended without its trailer",
                    node.url
                ))));
            }
            None => {}
        }
        Ok(())
    }
}
