//! A `DoGet` stream's stages on the front end's side, after the engine's [`TicketStream`]
//! (which serves the cache or computes and tees to it, applies the placement and
//! `skip_rows`):
//!
//! ```text
//!  TicketStream ──▶ FlightSink ──────────────────────▶ channel (2) ──▶ tonic ──▶ client
//!   batches         IPC encode, codec by the governor,
//!                   bytes counted, waits timed
//!        └── stats ──▶ trailer (when the ticket asks)
//!  Outcome: the stream counted and its failure (or panic) sent, however it ends
//! ```
//!
//! The stages run as one task on the CPU runtime (a stream that reduces nothing here, on
//! the runtime of its own, `Node::unreduced`), owned by the response stream: a client that
//! goes away drops the stream and so aborts the query.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;

use arrow::array::RecordBatch;
use arrow_flight::FlightData;
use futures::FutureExt;
use futures::stream::{BoxStream, StreamExt};
use pushdown_engine::{Metrics, OpenedStream, Result, ServerError, TicketStream};
use pushdown_protocol::{Compression, StreamStats};
use pushdown_task::panic_message;
use tokio::sync::mpsc;
use tonic::Status;
use tracing::Instrument;

use crate::codec::{Encoder, Governor, LinkMemory, addressed_bytes};
use crate::state::State;

/// Peers whose links adaptive streams remember (see [`LinkMemory`]).
const MAX_PEERS_REMEMBERED: usize = 4096;

type Sender = mpsc::Sender<Result<FlightData, Status>>;

/// An opened `DoGet`: the stream the engine opened (holding its stream slot until it ends),
/// the codec its ticket asked for, whether it asked for the trailer, and the client's
/// connection.
pub(crate) struct DoGet {
    pub(crate) state: Arc<State>,
    pub(crate) opened: OpenedStream,
    pub(crate) codec: Compression,
    pub(crate) stats: bool,
    pub(crate) peer: Option<SocketAddr>,
}

impl DoGet {
    /// Starts the stream's task on the CPU runtime, in `span`; `shard` names the shard in a
    /// panic's message. The returned stream owns the task.
    pub(crate) fn spawn(
        self,
        span: tracing::Span,
        shard: String,
    ) -> BoxStream<'static, Result<FlightData, Status>> {
        let (tx, rx) = mpsc::channel(2);
        let metrics = Arc::clone(self.state.node.metrics());
        metrics.record_stream_codec(self.codec);
        let outcome = Outcome::start(metrics);
        let DoGet {
            state,
            opened,
            codec,
            stats,
            peer,
        } = self;
        // On the runtime the engine placed the stream on.
        let guard = opened.spawn(move |opened| {
            let run = Self::run(state, opened, (codec, stats, peer), tx.clone());
            outcome.watch(run, shard, tx).instrument(span)
        });
        tokio_stream::wrappers::ReceiverStream::new(rx)
            .map(move |item| {
                // The stream owns the task: dropping it (client gone) aborts the query.
                let _owner = &guard;
                item
            })
            .boxed()
    }

    /// Streams the opened stream's batches to `tx` within the request deadline, then its
    /// trailer (`stats`) in `codec` (adaptive: as the governor chooses) to `peer`. Returns
    /// whether the client took the whole stream.
    async fn run(
        state: Arc<State>,
        opened: OpenedStream,
        (codec, stats, peer): (Compression, bool, Option<SocketAddr>),
        tx: Sender,
    ) -> Result<bool> {
        let config = state.node.config();
        let deadline = config.request_timeout;
        let peer = peer.map(|p| p.ip());
        // An adaptive stream starts from what the last one to this peer learnt of the link.
        let learnt = peer.and_then(|p| state.links.lock().get(&p).copied());
        let governor = Governor::resume(codec, learnt);
        let encoder =
            Encoder::new(config.max_flight_data_bytes).map_err(ServerError::encode("IPC options"))?;
        let mut sink = FlightSink {
            tx,
            encoder,
            governor,
            metrics: Arc::clone(state.node.metrics()),
            bytes_sent: 0,
        };
        let streamed = async {
            let mut batches = opened.batches().await?;
            let completed = sink.send_all(&mut batches).await?;
            Ok::<_, ServerError>((completed, batches))
        };
        let ended = tokio::select! {
            ended = tokio::time::timeout(deadline, streamed) => ended,
            // A shutdown's drain deadline passed: the client is told, never left with a
            // stream that just stops (it would look complete).
            () = state.streams_end() => return Err(ServerError::ShuttingDown),
        };
        if let (Some(peer), Some(memory)) = (peer, sink.governor.memory()) {
            remember(&state, peer, memory);
        }
        let (completed, batches) = ended.map_err(|_| ServerError::Deadline(deadline))??;
        let finished = batches.finish(completed, sink.bytes_sent);
        tracing::debug!(stats = ?finished, link_bytes_per_s = ?sink.governor.link(), "stream finished");
        if completed && stats {
            sink.trailer(&finished).await;
        }
        Ok(completed)
    }
}

/// What an adaptive stream learnt of `peer`'s link, kept for the next stream to it. Bounded:
/// a server with too many peers forgets them all and learns again.
fn remember(state: &State, peer: IpAddr, memory: LinkMemory) {
    let mut links = state.links.lock();
    if links.len() >= MAX_PEERS_REMEMBERED && !links.contains_key(&peer) {
        links.clear();
    }
    links.insert(peer, memory);
}

/// The encoding stage: each batch as Flight data in the codec its governor chooses, sent
/// to the response channel, with the bytes put on the wire counted and the time the client
/// held the stream back reported to the governor (and to the ticket stream, whose cores go
/// to other streams meanwhile).
struct FlightSink {
    tx: Sender,
    encoder: Encoder,
    governor: Governor,
    metrics: Arc<Metrics>,
    bytes_sent: u64,
}

impl FlightSink {
    /// Sends the schema and every batch of `batches`. `false`: the client went away.
    async fn send_all(&mut self, batches: &mut TicketStream) -> Result<bool> {
        let schema = self.encoder.schema(batches.schema());
        if !self.send(schema).await {
            return Ok(false);
        }
        while let Some(batch) = batches.next().await {
            if !self.batch(&batch?, batches).await? {
                tracing::debug!("client went away; stopping the stream");
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Encodes and sends one batch; `batches` waits for the client meanwhile.
    async fn batch(&mut self, batch: &RecordBatch, batches: &mut TicketStream) -> Result<bool> {
        let codec = self.governor.codec();
        let messages = self
            .encoder
            .batch(batch, codec)
            .map_err(ServerError::encode("encoding a batch"))?;
        let producing = batches.wait_for_client();
        let wire: u64 = messages.iter().map(wire_bytes).sum();
        // What the batch would have been uncompressed (its buffers: what IPC copies).
        let raw = match codec {
            Compression::None => wire,
            _ => addressed_bytes(batch) as u64,
        };
        let sending_since = Instant::now();
        for data in messages {
            if !self.send(data).await {
                return Ok(false);
            }
        }
        batches.resume();
        self.governor
            .observe(producing, sending_since.elapsed(), raw, wire);
        self.metrics.record_batch(codec);
        Ok(true)
    }

    /// The statistics trailer: a message with no data, the stats as its metadata.
    async fn trailer(&mut self, stats: &StreamStats) {
        self.send(FlightData::new().with_app_metadata(stats.encode()))
            .await;
    }

    /// Sends one message, counting its bytes. `false`: the client went away.
    async fn send(&mut self, data: FlightData) -> bool {
        self.bytes_sent += wire_bytes(&data);
        self.tx.send(Ok(data)).await.is_ok()
    }
}

fn wire_bytes(data: &FlightData) -> u64 {
    (data.data_header.len() + data.data_body.len()) as u64
}

/// Accounts for one DoGet stream however it ends: finished, failed, or dropped mid-way
/// (a client that went away aborts the task, so only a drop guard sees that).
struct Outcome {
    metrics: Arc<Metrics>,
    outcome: &'static str,
}

impl Outcome {
    fn start(metrics: Arc<Metrics>) -> Self {
        metrics.active_streams.inc();
        Self {
            metrics,
            outcome: "cancelled",
        }
    }

    /// Runs the stream to its end, recording how it ended; a failure (or a panic, named with
    /// `shard`) is sent to the client as the stream's last item.
    async fn watch(mut self, stream: impl Future<Output = Result<bool>>, shard: String, tx: Sender) {
        // A panic in a kernel or decoder must end this stream with an error, never
        // silently: a stream that just stopped would look complete to the client.
        let result = std::panic::AssertUnwindSafe(stream).catch_unwind().await;
        let error = match result {
            Ok(Ok(completed)) => {
                self.outcome = if completed { "ok" } else { "cancelled" };
                return;
            }
            Ok(Err(e)) => e,
            Err(panic) => {
                self.metrics.panics_contained.inc();
                let what = panic_message(panic.as_ref());
                ServerError::Internal(format!("stream{shard} panicked: {what}"))
            }
        };
        self.outcome = match &error {
            ServerError::Deadline(_) => "deadline",
            ServerError::ShuttingDown => "shutting_down",
            _ => "error",
        };
        let status = crate::status::status(error);
        // The receiver may be gone (client disconnected): nothing to tell then.
        let _ = tx.send(Err(status)).await;
    }
}

impl Drop for Outcome {
    fn drop(&mut self) {
        // The outcome first: whoever sees the gauge drop also sees how the stream ended.
        self.metrics.record_request("do_get", self.outcome);
        self.metrics.active_streams.dec();
    }
}
