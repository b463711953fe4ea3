//! Fan-out over a FlightInfo's endpoints with bounded concurrency and a deterministic order.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use arrow_flight::decode::{DecodedPayload, FlightDataDecoder};
use arrow_flight::error::FlightError;
use arrow_flight::{FlightInfo, Ticket};
use futures::{Stream, StreamExt};
use pushdown_protocol::{ShardTicket, StreamStats};
use tokio::sync::mpsc;
use tonic::Code;

use crate::{ClientError, PushdownClient, Result};

/// How a [`ShardStream`] fans out.
#[derive(Debug, Clone)]
pub struct StreamOptions {
    /// Shard streams in flight at once.
    pub concurrency: usize,
    /// Batches buffered per in-flight stream before it waits (back-pressure).
    pub buffered_batches: usize,
    /// Times a failed stream is resumed before its error is returned.
    pub max_retries: usize,
    /// Wait before the first retry; doubles after each.
    pub retry_backoff: Duration,
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
}

impl Default for StreamOptions {
    fn default() -> Self {
        Self {
            concurrency: 4,
            buffered_batches: 2,
            max_retries: 3,
            retry_backoff: Duration::from_millis(100),
            order: Order::RoundRobin,
        }
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
}

impl std::ops::AddAssign for StreamTotals {
    fn add_assign(&mut self, o: Self) {
        self.bytes_received += o.bytes_received;
        self.rows += o.rows;
        self.batches += o.batches;
        self.retries += o.retries;
        self.server += o.server;
    }
}

struct Active {
    rx: mpsc::Receiver<Result<RecordBatch>>,
    _task: AbortOnDrop,
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The record batches of every endpoint of a FlightInfo.
///
/// At most `concurrency` shards stream at once, each into a channel of
/// `buffered_batches`; the consumer takes one batch from each in-flight shard in turn (in
/// endpoint order), so the output order is a function of the shards' contents alone.
/// Dropping the stream aborts every request in flight.
pub struct ShardStream {
    client: PushdownClient,
    schema: SchemaRef,
    pending: VecDeque<Segment>,
    active: VecDeque<Active>,
    options: StreamOptions,
    totals: Arc<Mutex<StreamTotals>>,
    failed: bool,
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
        Ok(Self {
            client,
            schema,
            pending: segments.into(),
            active: VecDeque::new(),
            options,
            totals: Arc::default(),
            failed: false,
        })
    }

    pub fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
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
        let (tx, rx) = mpsc::channel(self.options.buffered_batches.max(1));
        let task = tokio::spawn(run_endpoint(
            self.client.clone(),
            segment,
            tx,
            self.options.clone(),
            Arc::clone(&self.totals),
        ));
        self.active.push_back(Active {
            rx,
            _task: AbortOnDrop(task),
        });
    }
}

impl Stream for ShardStream {
    type Item = Result<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.failed {
            return Poll::Ready(None);
        }
        loop {
            while self.active.len() < self.options.concurrency.max(1) && !self.pending.is_empty() {
                self.start_next();
            }
            let Some(front) = self.active.front_mut() else {
                return Poll::Ready(None);
            };
            match front.rx.poll_recv(cx) {
                Poll::Ready(Some(Ok(batch))) => {
                    // Round-robin: this shard goes to the back of the line.
                    if self.options.order == Order::RoundRobin
                        && let Some(a) = self.active.pop_front()
                    {
                        self.active.push_back(a);
                    }
                    let mut totals = self.totals.lock().unwrap_or_else(|p| p.into_inner());
                    totals.rows += batch.num_rows() as u64;
                    totals.batches += 1;
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
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

fn retryable(code: Code) -> bool {
    match code {
        Code::Unavailable
        | Code::Unknown
        | Code::Cancelled
        | Code::ResourceExhausted
        | Code::Aborted
        | Code::DeadlineExceeded
        | Code::Internal => true,
        Code::Ok
        | Code::InvalidArgument
        | Code::NotFound
        | Code::AlreadyExists
        | Code::PermissionDenied
        | Code::FailedPrecondition
        | Code::OutOfRange
        | Code::Unimplemented
        | Code::DataLoss
        | Code::Unauthenticated => false,
    }
}

/// Streams one endpoint into `tx`, resuming after failures from the last delivered row.
async fn run_endpoint(
    client: PushdownClient,
    segment: Segment,
    tx: mpsc::Sender<Result<RecordBatch>>,
    options: StreamOptions,
    totals: Arc<Mutex<StreamTotals>>,
) {
    let index = segment.index;
    let Some(ticket) = segment.endpoint.ticket else {
        let _ = tx
            .send(Err(ClientError::Invalid(format!(
                "endpoint {index} has no ticket"
            ))))
            .await;
        return;
    };
    // Rows of the endpoint delivered (or skipped) so far, and where to stop.
    let mut delivered = segment.skip;
    let end = segment.take.map(|t| segment.skip + t);
    let mut attempt = 0usize;
    let mut backoff = options.retry_backoff;
    loop {
        // A resumed stream skips what was already delivered; only our own tickets can be
        // re-addressed, foreign ones are replayed only from the start.
        let bytes = if delivered == 0 {
            ticket.ticket.clone()
        } else {
            match ShardTicket::decode(&ticket.ticket) {
                Ok(mut t) => {
                    t.skip_rows += delivered;
                    t.encode()
                }
                Err(e) => {
                    let _ = tx
                        .send(Err(ClientError::Invalid(format!(
                            "cannot resume endpoint {index}: {e}"
                        ))))
                        .await;
                    return;
                }
            }
        };
        match fetch(
            &client,
            index,
            index + attempt,
            bytes,
            &tx,
            &totals,
            Progress {
                delivered: &mut delivered,
                end,
            },
        )
        .await
        {
            Ok(()) => return,
            Err(Fetch::ConsumerGone) => return,
            Err(Fetch::Failed(e)) => {
                let _ = tx.send(Err(e)).await;
                return;
            }
            Err(Fetch::Status(status)) => {
                if attempt >= options.max_retries || !retryable(status.code()) {
                    let _ = tx
                        .send(Err(ClientError::Stream {
                            endpoint: index,
                            attempts: attempt + 1,
                            status: Box::new(status),
                        }))
                        .await;
                    return;
                }
                tracing::warn!(endpoint = index, attempt, delivered, %status, "stream failed; resuming");
                totals.lock().unwrap_or_else(|p| p.into_inner()).retries += 1;
                tokio::time::sleep(backoff).await;
                backoff *= 2;
                attempt += 1;
            }
        }
    }
}

/// Rows of an endpoint delivered so far (counting skipped ones), and where to stop.
struct Progress<'a> {
    delivered: &'a mut u64,
    end: Option<u64>,
}

enum Fetch {
    ConsumerGone,
    Status(tonic::Status),
    Failed(ClientError),
}

/// One DoGet: decodes the stream into `tx`, counting bytes and delivered rows.
async fn fetch(
    client: &PushdownClient,
    index: usize,
    server: usize,
    ticket: bytes::Bytes,
    tx: &mpsc::Sender<Result<RecordBatch>>,
    totals: &Arc<Mutex<StreamTotals>>,
    progress: Progress<'_>,
) -> Result<(), Fetch> {
    let Progress { delivered, end } = progress;
    if end.is_some_and(|e| *delivered >= e) {
        return Ok(());
    }
    let (_, flight) = client.server(server);
    let response = flight
        .clone()
        .do_get(Ticket::new(ticket))
        .await
        .map_err(Fetch::Status)?;
    let counter = Arc::clone(totals);
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
                        totals.server += stats;
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
    while let Some(item) = decoder.next().await {
        let decoded = match item {
            Ok(d) => d,
            Err(FlightError::Tonic(status)) => return Err(Fetch::Status(*status)),
            Err(other) => {
                return Err(Fetch::Failed(ClientError::Decode {
                    endpoint: index,
                    reason: other.to_string(),
                }));
            }
        };
        match decoded.payload {
            DecodedPayload::RecordBatch(mut batch) => {
                if let Some(end) = end {
                    let left = end - *delivered;
                    if (batch.num_rows() as u64) > left {
                        batch = batch.slice(0, left as usize);
                    }
                }
                let rows = batch.num_rows() as u64;
                if tx.send(Ok(batch)).await.is_err() {
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
    Ok(())
}
