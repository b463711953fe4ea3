//! Fan-out over a FlightInfo's endpoints with bounded concurrency and a deterministic order.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use arrow_flight::decode::{DecodedPayload, FlightDataDecoder};
use arrow_flight::error::FlightError;
use arrow_flight::{FlightInfo, Ticket};
use futures::{Stream, StreamExt};
use pushdown_protocol::{Deferral, ShardTicket, StreamStats};
use tokio::sync::mpsc;

use crate::completion::Completion;
use crate::fleet::{Failure, Fleet, Node};
use crate::{ClientError, PushdownClient, Result};

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

struct Active {
    rx: mpsc::UnboundedReceiver<Result<Held>>,
    /// Set when the shard's stream has ended (everything it delivers is read ahead).
    finished: Arc<AtomicBool>,
    _task: AbortOnDrop,
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

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The record batches of every endpoint of a FlightInfo.
///
/// At most `concurrency` shards stream at once, each reading up to `buffered_bytes` ahead;
/// the consumer takes one batch from each in-flight shard in turn (in endpoint order), or
/// shard after shard, so the output order is a function of the shards' contents alone.
/// Dropping the stream aborts every request in flight.
pub struct ShardStream {
    client: PushdownClient,
    schema: SchemaRef,
    pending: VecDeque<Segment>,
    active: VecDeque<Active>,
    options: StreamOptions,
    totals: Arc<Mutex<StreamTotals>>,
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
    pub(crate) fn start(client: PushdownClient, info: &FlightInfo, options: StreamOptions) -> Result<Self> {
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
        Self::segments(client, info, segments, options)
    }

    /// Streams `segments` (parts of `info`'s endpoints) in the given order.
    pub(crate) fn segments(
        client: PushdownClient,
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
            client,
            schema,
            pending: segments.into(),
            active: VecDeque::new(),
            options,
            totals: Arc::default(),
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
        *self.totals.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A handle to the totals that stays valid after the stream is consumed.
    pub fn totals_handle(&self) -> Arc<Mutex<StreamTotals>> {
        Arc::clone(&self.totals)
    }

    fn start_next(&mut self) {
        let Some(segment) = self.pending.pop_front() else {
            return;
        };
        let (tx, rx) = Buffer::new(self.options.buffered_bytes);
        let finished = Arc::new(AtomicBool::new(false));
        let run = run_endpoint(
            self.client.clone(),
            segment,
            tx,
            self.options.clone(),
            Arc::clone(&self.totals),
            self.completion.clone(),
        );
        let (done, ended) = (Arc::clone(&finished), Arc::clone(&self.ended));
        let task = tokio::spawn(async move {
            run.await;
            done.store(true, Ordering::Release);
            ended.wake();
        });
        self.active.push_back(Active {
            rx,
            finished,
            _task: AbortOnDrop(task),
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
                    let mut totals = self.totals.lock().unwrap_or_else(|p| p.into_inner());
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
    client: PushdownClient,
    segment: Segment,
    tx: Buffer,
    options: StreamOptions,
    totals: Arc<Mutex<StreamTotals>>,
    completion: Option<Arc<Completion>>,
) {
    let index = segment.index;
    let fail = |e: ClientError| {
        let tx = tx.clone();
        async move { tx.fail(e) }
    };
    let Some(ticket) = segment.endpoint.ticket.clone() else {
        return fail(ClientError::Invalid(format!("endpoint {index} has no ticket"))).await;
    };
    let holders = match client.fleet().holders(&segment.endpoint) {
        Ok(h) if !h.is_empty() => h,
        Ok(_) => return fail(ClientError::Invalid(format!("endpoint {index} has no server"))).await,
        Err(e) => return fail(e).await,
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
    let give_up = |status: tonic::Status, attempts: usize, servers: Vec<String>| ClientError::Stream {
        endpoint: index,
        shard: shard.clone(),
        attempts,
        servers,
        status: Box::new(status),
    };
    // Rows of the endpoint delivered (or skipped) so far, and where to stop.
    let mut delivered = segment.skip;
    let end = segment.take.map(|t| segment.skip + t);
    let mut attempts = 0usize;
    // The servers asked, each once, in the order first asked.
    let mut tried: Vec<String> = Vec::new();
    // Servers that refused this shard, and why: never asked again for it.
    let mut refused: Vec<(String, String)> = Vec::new();
    let mut backoff = options.retry_backoff;
    loop {
        let candidates: Vec<_> = Fleet::ranked(&holders, index)
            .into_iter()
            .filter(|n| !refused.iter().any(|(url, _)| *url == n.url))
            .collect();
        let Some(node) = candidates.first().cloned() else {
            return fail(ClientError::NoServer {
                endpoint: index,
                shard: shard.clone(),
                refusals: refused.iter().map(|(u, why)| format!("{u}: {why}")).collect(),
            })
            .await;
        };
        // Where this shard's ops run is asked anew on each request (a resumed stream too).
        let (deferral, tentative, mut dealt) = match &completion {
            Some(c) => {
                let placed = c.deferral_for(segment.position);
                (Some(placed.deferral), placed.tentative, placed.dealt)
            }
            None => (None, None, None),
        };
        let bytes = match &resumable {
            Some(t) if delivered > 0 || deferral.is_some_and(|d| d != Deferral::Never) => {
                let mut t = t.clone();
                t.skip_rows += delivered;
                if let Some(deferral) = deferral {
                    t.request.deferral = deferral;
                }
                t.encode()
            }
            _ => ticket.ticket.clone(),
        };
        if !tried.contains(&node.url) {
            tried.push(node.url.clone());
        }
        let before = delivered;
        let outcome = {
            let _busy = node.busy();
            fetch(
                &node,
                index,
                bytes,
                &tx,
                &totals,
                Progress {
                    delivered: &mut delivered,
                    end,
                    expect_trailer,
                    stall: options.stall_timeout,
                    completion: completion.as_ref(),
                    tentative,
                    dealt: dealt.as_mut(),
                },
            )
            .await
        };
        let status = match outcome {
            Ok(()) => {
                node.succeeded();
                if let Some(d) = dealt.as_mut() {
                    d.finished();
                }
                if let Some(planned) = end.filter(|e| delivered < *e) {
                    // Ended cleanly, short of its count: never a short epoch.
                    return fail(ClientError::ShortShard {
                        endpoint: index,
                        shard: shard.clone(),
                        delivered,
                        planned,
                    })
                    .await;
                }
                return;
            }
            Err(Fetch::ConsumerGone) => return,
            Err(Fetch::Failed(e)) => return fail(e).await,
            Err(Fetch::Status(status)) => status,
        };
        match Failure::of(status.code()) {
            Failure::Final => return fail(give_up(status, attempts + 1, tried)).await,
            Failure::Elsewhere => {
                tracing::warn!(shard, server = %node.url, %status, "server cannot serve the shard; asking another");
                refused.push((node.url.clone(), status.message().to_owned()));
                continue;
            }
            Failure::Transient => {}
        }
        node.failed(options.retry_backoff);
        if resumable.is_none() && delivered > 0 {
            return fail(ClientError::NotResumable {
                delivered,
                status: Box::new(status),
            })
            .await;
        }
        if delivered > before {
            // Progress was made: the budget is for consecutive failures.
            attempts = 0;
            backoff = options.retry_backoff;
        }
        if attempts >= options.max_retries {
            return fail(give_up(status, attempts + 1, tried)).await;
        }
        attempts += 1;
        totals.lock().unwrap_or_else(|p| p.into_inner()).retries += 1;
        tracing::warn!(shard, server = %node.url, attempt = attempts, delivered, %status, "stream failed; resuming");
        // Straight to another working holder; wait only when every holder has failed lately.
        let another = Fleet::ranked(&holders, index)
            .first()
            .is_some_and(|n| n.url != node.url && !refused.iter().any(|(u, _)| *u == n.url));
        if !another || attempts > holders.len() {
            tokio::time::sleep(jittered(backoff)).await;
            backoff = backoff.saturating_mul(2);
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
        Err(e) => Err(Fetch::Failed(ClientError::Invalid(format!(
            "completing a deferred batch: {e}"
        )))),
    }
}

/// A wait in [d/2, d]: retries of many streams do not arrive together.
fn jittered(d: Duration) -> Duration {
    use rand::Rng;
    d.mul_f64(rand::rng().random_range(0.5..=1.0))
}

/// Rows of an endpoint delivered so far (counting skipped ones), where to stop, and what the
/// stream must show to be complete.
struct Progress<'a> {
    delivered: &'a mut u64,
    end: Option<u64>,
    /// The request asked for a trailing stats message: a stream without one was cut.
    expect_trailer: bool,
    /// Longest wait for the next message.
    stall: Duration,
    completion: Option<&'a Arc<Completion>>,
    /// Counts this stream against the client's room while it may arrive un-reduced.
    tentative: Option<crate::completion::Active>,
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
    node: &Node,
    index: usize,
    ticket: bytes::Bytes,
    tx: &Buffer,
    totals: &Arc<Mutex<StreamTotals>>,
    progress: Progress<'_>,
) -> Result<(), Fetch> {
    let Progress {
        delivered,
        end,
        expect_trailer,
        stall,
        completion,
        tentative,
        mut dealt,
    } = progress;
    // Held while this stream may arrive, or arrives, un-reduced: the client's room for more.
    let mut deferred = tentative;
    let mut placed = false;
    if end.is_some_and(|e| *delivered >= e) {
        return Ok(());
    }
    let stalled = |what: &str| {
        Fetch::Status(tonic::Status::deadline_exceeded(format!(
            "{what} from {} for {stall:?}: stream cancelled",
            node.url
        )))
    };
    let response = tokio::time::timeout(stall, node.flight.clone().do_get(Ticket::new(ticket)))
        .await
        .map_err(|_| stalled("no answer"))?
        .map_err(Fetch::Status)?;
    let counter = Arc::clone(totals);
    let trailer: Arc<Mutex<Option<StreamStats>>> = Arc::default();
    let seen = Arc::clone(&trailer);
    let raw = response.into_inner().filter_map(move |item| {
        let out = match item {
            Ok(data) => {
                let n = data.data_header.len() + data.data_body.len() + data.app_metadata.len();
                let mut totals = counter.lock().unwrap_or_else(|p| p.into_inner());
                totals.bytes_received += n as u64;
                if data.data_header.is_empty() {
                    // A metadata-only message (empty IPC header, as Arrow C++ sends them):
                    // the server's trailing stats, not for the IPC decoder.
                    if let Ok(stats) = StreamStats::decode(&data.app_metadata) {
                        *seen.lock().unwrap_or_else(|p| p.into_inner()) = Some(stats);
                    }
                    None
                } else {
                    Some(Ok(data))
                }
            }
            Err(status) => Some(Err(FlightError::Tonic(Box::new(status)))),
        };
        futures::future::ready(out)
    });
    let mut decoder = FlightDataDecoder::new(raw);
    let mut received = 0u64;
    loop {
        let item = match tokio::time::timeout(stall, decoder.next()).await {
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
            DecodedPayload::RecordBatch(mut batch) => {
                received += batch.num_rows() as u64;
                if let Some(end) = end {
                    let left = end - *delivered;
                    if (batch.num_rows() as u64) > left {
                        batch = batch.slice(0, left as usize);
                    }
                }
                let from = Completion::deferred_from(&batch).map_err(Fetch::Failed)?;
                if !placed {
                    placed = true;
                    match (from, completion) {
                        (None, _) => drop(deferred.take()),
                        (Some(_), Some(c)) => {
                            c.stream_started();
                            if let Some(d) = dealt.as_deref_mut() {
                                d.left_to_client();
                            }
                        }
                        (Some(_), None) => {}
                    }
                }
                if let Some(from) = from {
                    batch = complete(completion, batch, from, index, &node.url).await?;
                }
                let rows = batch.num_rows() as u64;
                if !tx.push(batch).await {
                    return Err(Fetch::ConsumerGone);
                }
                *delivered += rows;
                if end.is_some_and(|e| *delivered >= e) {
                    // The rest of the shard is not ours: dropping the response cancels it.
                    return Ok(());
                }
            }
            DecodedPayload::None | DecodedPayload::Schema(_) => {}
        }
    }
    let trailer = trailer.lock().unwrap_or_else(|p| p.into_inner()).take();
    match trailer {
        Some(stats) => {
            // The shard's whole output against the rows held of it: a resume that skipped
            // too few or too many, or rows lost on the way, cannot pass.
            if stats.rows_sent != received || stats.rows_output != *delivered {
                return Err(Fetch::Failed(ClientError::Miscount {
                    endpoint: index,
                    server: node.url.clone(),
                    delivered: *delivered,
                    output: stats.rows_output,
                    sent: stats.rows_sent,
                    received,
                }));
            }
            totals.lock().unwrap_or_else(|p| p.into_inner()).server += stats;
        }
        // Every complete stream of a request with stats ends with them: this one was cut.
        None if expect_trailer => {
            return Err(Fetch::Status(tonic::Status::unavailable(format!(
                "the stream from {} ended without its trailer",
                node.url
            ))));
        }
        None => {}
    }
    Ok(())
}
