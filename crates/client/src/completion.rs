//! Finishing shards a server left un-reduced.
//!
//! A ticket may let the server leave a fragment's ops `from..` to the client (a split
//! placement, or a server whose cores are taken): the stream then carries the rows before
//! those ops and says so in its schema ([`DEFERRED_FROM_KEY`]). [`Completion`] runs the same
//! kernels here and selects the stream's planned columns, so what the consumer receives is
//! the batch the server would have sent, bit for bit.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use pushdown_ops::{Call, Calls, Context, Resources};
use pushdown_protocol::{DEFERRED_FROM_KEY, Deferral};

use crate::control::{Control, Deal, Ended, Side};
use crate::error::{ClientError, Result};

/// Where each shard's fragment ops run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ShardPlacement {
    /// The share of shards the server reduces (the rest are the client's: a split). Shards
    /// are dealt out evenly by their position in the reader's sequence (epoch × endpoints +
    /// endpoint), and the client's go to the server after all while the consumer is not
    /// waiting (see [`Completion::set_consumer_waiting`]).
    pub server_fraction: f64,
    /// Adapted at run time (`server_fraction` is then unused): each shard is placed when it
    /// is requested, to the end expected to finish it first: the server's recent latency
    /// once per round of two shards this client keeps there, against this client's queue
    /// at its rate (the control loop in `control.rs`).
    pub adaptive: bool,
    /// The client's cores for running deferred ops.
    pub cores: usize,
}

impl ShardPlacement {
    /// Every shard reduced by the server, never deferred.
    pub const SERVER: Self = Self {
        server_fraction: 1.0,
        adaptive: false,
        cores: 1,
    };

    /// Whether the shard at `position` (see [`crate::Segment::position`]) is the client's
    /// under the split: positions are dealt out evenly, so any run of them holds the
    /// client's share, to within one.
    pub fn is_clients(&self, position: u64) -> bool {
        let client = (1.0 - self.server_fraction).clamp(0.0, 1.0);
        ((position + 1) as f64 * client).floor() > (position as f64 * client).floor()
    }
}

/// The ops a shard stream's fragment runs, and what is needed to run them here.
pub struct Completion {
    placement: ShardPlacement,
    ops: Vec<Call>,
    /// The stream's planned schema: what a completed batch must be.
    schema: SchemaRef,
    resources: Arc<dyn Resources>,
    rows: AtomicU64,
    busy_ns: AtomicU64,
    streams: AtomicU64,
    /// One permit per core: batches are completed a core's worth at a time, in the order
    /// they arrived, so the shard the consumer waits for is not slowed by every other.
    cores: Arc<tokio::sync::Semaphore>,
    /// The adapted split, when [`ShardPlacement::adaptive`].
    control: parking_lot::Mutex<Control>,
    /// Whether the consumer has been waiting for batches lately (see
    /// [`Completion::set_consumer_waiting`]): a static split's shards are the client's only
    /// then. Until told otherwise, it is.
    consumer_waiting: std::sync::atomic::AtomicBool,
    /// Names this loader's streams to the servers (`READER_HEADER`): their trailers then say
    /// whether another reader's streams ran beside them, however the loader connects.
    reader: u64,
}

impl std::fmt::Debug for Completion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Completion")
            .field("ops", &self.ops.len())
            .field("rows", &self.rows.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// What a client did of its fragment's ops.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CompletionTotals {
    /// Rows whose deferred ops ran here.
    pub rows: u64,
    /// Shard streams that arrived un-reduced.
    pub streams: u64,
    /// CPU seconds spent running them.
    pub seconds: f64,
}

/// A shard dealt to one end by [`Control`]: counted in flight there until it ends (moved to
/// the client when the server leaves it un-reduced).
pub(crate) struct Dealt {
    completion: Arc<Completion>,
    deal: Deal,
    done: bool,
    /// The server's trailer said no other client's stream ran beside this one there.
    alone: bool,
}

impl Dealt {
    /// The server left the shard to this client (a server that defers whatever it is asked).
    pub(crate) fn left_to_client(&mut self) {
        self.completion
            .control()
            .moved_to_client(&mut self.deal, Instant::now());
    }

    /// Every row of the shard was delivered.
    pub(crate) fn finished(&mut self) {
        self.done = true;
    }

    /// The server's trailer says no other client's stream ran beside this one there.
    pub(crate) fn ran_alone(&mut self) {
        self.alone = true;
    }
}

impl Drop for Dealt {
    fn drop(&mut self) {
        let now = Instant::now();
        let ended = match (self.done, self.alone) {
            (false, _) => Ended::Failed,
            (true, false) => Ended::Delivered,
            (true, true) => Ended::DeliveredAlone,
        };
        self.completion.control().end(&self.deal, now, ended);
        tracing::debug!(
            side = ?self.deal.side,
            seconds = now.duration_since(self.deal.at).as_secs_f64(),
            ?ended,
            "shard ended"
        );
    }
}

/// Where a shard request's ops run: what to ask the server, and the guards that count it.
pub(crate) struct Placed {
    pub deferral: Deferral,
    /// The adapted split's account of the shard.
    pub dealt: Option<Dealt>,
}

impl Completion {
    pub fn new(
        placement: ShardPlacement,
        ops: Vec<Call>,
        schema: SchemaRef,
        resources: Arc<dyn Resources>,
    ) -> Self {
        Self {
            placement,
            ops,
            schema,
            resources,
            rows: AtomicU64::new(0),
            busy_ns: AtomicU64::new(0),
            streams: AtomicU64::new(0),
            cores: Arc::new(tokio::sync::Semaphore::new(placement.cores.max(1))),
            control: Default::default(),
            consumer_waiting: std::sync::atomic::AtomicBool::new(true),
            reader: rand::random(),
        }
    }

    /// Tells the split whether the consumer has been waiting for batches lately. A static
    /// split ([`ShardPlacement::server_fraction`] below 1) or the adapted one takes shards
    /// onto this client's cores to deliver more than the servers can; while the consumer
    /// does not wait that buys nothing and costs the trainer's CPU, so its shards go to the
    /// servers until the consumer waits again. Which end runs a shard's ops never changes
    /// its rows. The [`crate::Loader`] tells the planner's split and the adapted one (not a
    /// split its options force).
    pub fn set_consumer_waiting(&self, waiting: bool) {
        self.consumer_waiting.store(waiting, Ordering::Relaxed);
    }

    /// The reader this loader's stream requests name (`READER_HEADER`).
    pub(crate) fn reader(&self) -> u64 {
        self.reader
    }

    fn control(&self) -> parking_lot::MutexGuard<'_, Control> {
        self.control.lock()
    }

    /// Waits for a core to complete a batch on (first come, first served).
    pub(crate) async fn core(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        Arc::clone(&self.cores).acquire_owned().await.ok()
    }

    /// Where a received batch's ops were left off, if they were.
    pub fn deferred_from(batch: &RecordBatch) -> Result<Option<usize>> {
        match batch.schema_ref().metadata().get(DEFERRED_FROM_KEY) {
            None => Ok(None),
            Some(v) => v.parse().map(Some).map_err(|_| {
                ClientError::reply(
                    "a deferred stream",
                    format!("bad `{DEFERRED_FROM_KEY}` in its schema: {v:?}"),
                )
            }),
        }
    }

    /// What to ask of the server for the shard at `position`: the deferral and, when
    /// adapting, the split's account of it.
    pub(crate) fn deferral_for(self: &Arc<Self>, position: u64) -> Placed {
        if self.ops.is_empty() {
            return Placed {
                deferral: Deferral::Never,
                dealt: None,
            };
        }
        let dealt = self.placement.adaptive.then(|| self.deal(position));
        let clients = match &dealt {
            Some(d) => d.deal.side == Side::Client,
            None => self.placement.is_clients(position) && self.consumer_waiting.load(Ordering::Relaxed),
        };
        let deferral = if clients {
            Deferral::Always { from: 0 }
        } else {
            Deferral::Never
        };
        Placed { deferral, dealt }
    }

    /// The adapted split's choice for the shard at `position`, traced with its reason.
    fn deal(self: &Arc<Self>, position: u64) -> Dealt {
        let now = Instant::now();
        let mut control = self.control();
        let (deal, reason) = control.deal(now, self.consumer_waiting.load(Ordering::Relaxed));
        tracing::debug!(
            position,
            side = ?deal.side,
            ?reason,
            server_in_flight = control.sides[Side::Server as usize].in_flight,
            client_in_flight = control.sides[Side::Client as usize].in_flight,
            server_latency_s = control.server_latency().map(|l| l.as_secs_f64()),
            "shard dealt"
        );
        Dealt {
            completion: Arc::clone(self),
            deal,
            done: false,
            alone: false,
        }
    }

    /// A stream arrived un-reduced.
    pub(crate) fn stream_started(&self) {
        self.streams.fetch_add(1, Ordering::Relaxed);
    }

    /// Runs ops `from..` on `batch` and selects the planned columns.
    pub fn complete(&self, batch: RecordBatch, from: usize) -> Result<RecordBatch> {
        let start = Instant::now();
        let calls = self.ops.get(from..).ok_or_else(|| {
            ClientError::reply(
                "a deferred stream",
                format!(
                    "the server left ops {from}.. to this client, but the fragment has {}",
                    self.ops.len()
                ),
            )
        })?;
        let rows = batch.num_rows() as u64;
        // The stream's schema metadata is the server's note, not part of the rows.
        let plain = Arc::new(batch.schema().as_ref().clone().with_metadata(Default::default()));
        let batch = RecordBatch::try_new_with_options(
            plain,
            batch.columns().to_vec(),
            &arrow::record_batch::RecordBatchOptions::new().with_row_count(Some(batch.num_rows())),
        )?;
        let bound = Calls::bind(calls, batch.schema(), self.resources.as_ref())?;
        let out = bound.apply(
            batch,
            &Context {
                seed: 0,
                resources: self.resources.as_ref(),
            },
        )?;
        let columns = self
            .schema
            .fields()
            .iter()
            .map(|f| {
                out.column_by_name(f.name()).cloned().ok_or_else(|| {
                    ClientError::reply(
                        "a deferred stream",
                        format!("its rows lack column `{}` after its ops ran", f.name()),
                    )
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let done = RecordBatch::try_new(Arc::clone(&self.schema), columns)?;
        self.rows.fetch_add(rows, Ordering::Relaxed);
        self.busy_ns
            .fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        Ok(done)
    }

    pub fn totals(&self) -> CompletionTotals {
        CompletionTotals {
            rows: self.rows.load(Ordering::Relaxed),
            streams: self.streams.load(Ordering::Relaxed),
            seconds: self.busy_ns.load(Ordering::Relaxed) as f64 / 1e9,
        }
    }
}

#[cfg(test)]
mod tests {

    use super::*;

    #[test]
    fn a_split_deals_each_run_of_positions_its_share() {
        let placement = ShardPlacement {
            server_fraction: 0.45,
            adaptive: false,
            cores: 1,
        };
        let clients = |range: std::ops::Range<u64>| range.filter(|&p| placement.is_clients(p)).count();
        // 55% of any run of positions, to within one: across epochs too (7 of 16 shards is
        // not 45%, but 7 and 8 alternate).
        for start in [0, 5, 16, 100] {
            for len in [16u64, 20, 48] {
                let expected = 0.55 * len as f64;
                let got = clients(start..start + len) as f64;
                assert!(
                    (got - expected).abs() <= 1.0,
                    "{start}+{len}: {got} vs {expected}"
                );
            }
        }
        assert_eq!(clients(0..100), 55);
        assert_eq!(
            (0..50).filter(|&p| ShardPlacement::SERVER.is_clients(p)).count(),
            0
        );
    }

    /// A completion of one op (`hash_bucket`) on one core.
    fn one_op_completion(server_fraction: f64, adaptive: bool) -> Arc<Completion> {
        Arc::new(Completion::new(
            ShardPlacement {
                server_fraction,
                adaptive,
                cores: 1,
            },
            vec![Call::new("hash_bucket", "k", vec![], "k")],
            Arc::new(arrow::datatypes::Schema::empty()),
            Arc::new(pushdown_ops::NoResources),
        ))
    }

    #[test]
    fn a_split_runs_its_shards_here_only_while_the_consumer_waits() {
        let completion = one_op_completion(0.5, false);
        let deferred = |completion: &Arc<Completion>| {
            (0..20)
                .filter(|&p| completion.deferral_for(p).deferral != Deferral::Never)
                .count()
        };
        assert_eq!(deferred(&completion), 10, "waiting (the start): the split's half");
        completion.set_consumer_waiting(false);
        assert_eq!(deferred(&completion), 0, "not waiting: every shard on the server");
        completion.set_consumer_waiting(true);
        assert_eq!(deferred(&completion), 10, "waiting again: the split's half");
    }

    #[test]
    fn the_adapted_split_leaves_the_cores_to_a_consumer_that_does_not_wait() {
        let completion = one_op_completion(0.0, true);
        // Held, as the streams in flight hold them: each counted on its side until dropped.
        let place = |n: u64| -> (usize, Vec<Placed>) {
            let placed: Vec<Placed> = (0..n).map(|p| completion.deferral_for(p)).collect();
            let deferred = placed.iter().filter(|p| p.deferral != Deferral::Never).count();
            (deferred, placed)
        };
        let (deferred, held) = place(6);
        assert_eq!(
            deferred, 4,
            "starting: the server's first round, then this client"
        );
        drop(held);
        completion.set_consumer_waiting(false);
        let (deferred, held) = place(6);
        assert_eq!(deferred, 0, "not waiting: every shard on the server");
        drop(held);
        completion.set_consumer_waiting(true);
        assert_eq!(place(6).0, 4, "waiting again: dealt as before");
    }
}
