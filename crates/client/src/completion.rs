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

use crate::error::{ClientError, Result};

/// Where each shard's fragment ops run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ShardPlacement {
    /// The share of shards the server reduces (the rest are the client's: a split). Shards
    /// are dealt out evenly by their position in the reader's sequence (epoch × endpoints +
    /// endpoint), and the client's go to the server after all while the consumer is not
    /// waiting (see [`Completion::set_consumer_waiting`]).
    pub server_fraction: f64,
    /// Adapted at run time (`server_fraction` is then unused): each shard goes, when it is
    /// requested, to the end expected to finish it first at the rates both have delivered
    /// (see `Control`); while this client has room (fewer un-reduced streams in flight than
    /// two per core) the server's shards are asked `IfBusy`, so a server whose cores are
    /// taken leaves them here at once.
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
    /// Un-reduced streams being completed here now.
    active: std::sync::atomic::AtomicUsize,
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
    control: std::sync::Mutex<Control>,
    /// Whether the consumer has been waiting for batches lately (see
    /// [`Completion::set_consumer_waiting`]): a static split's shards are the client's only
    /// then. Until told otherwise, it is.
    consumer_waiting: std::sync::atomic::AtomicBool,
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

/// Which end a shard stream's ops run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    Server = 0,
    Client = 1,
}

/// The run-time split: each shard goes, when it is requested, to the end expected to finish
/// it first — the one whose shards in flight, plus this one, take the least time at the rate
/// it has delivered shards while it had any in flight. A server shared with other trainers
/// (or slowed by anything) delivers fewer shards a second to this client and gets fewer;
/// a client whose cores are taken gets fewer. Until both ends have finished a shard they
/// take turns.
#[derive(Debug, Default)]
struct Control {
    sides: [SideLoad; 2],
}

/// One end's shards in flight and what it has delivered.
#[derive(Debug, Default)]
struct SideLoad {
    in_flight: u64,
    done: u64,
    /// Time with shards in flight: closed periods, and the open one.
    busy: std::time::Duration,
    busy_since: Option<Instant>,
}

impl SideLoad {
    fn start(&mut self, now: Instant) {
        if self.in_flight == 0 {
            self.busy_since = Some(now);
        }
        self.in_flight += 1;
    }

    fn end(&mut self, now: Instant, done: bool) {
        self.in_flight = self.in_flight.saturating_sub(1);
        self.done += u64::from(done);
        if self.in_flight == 0
            && let Some(since) = self.busy_since.take()
        {
            self.busy += now.duration_since(since);
        }
    }

    /// Shards a second while it had any in flight; none until it has finished one.
    fn rate(&self, now: Instant) -> Option<f64> {
        let busy = self.busy
            + self
                .busy_since
                .map_or_else(Default::default, |s| now.duration_since(s));
        (self.done > 0).then(|| self.done as f64 / busy.as_secs_f64().max(1e-6))
    }

    /// When a shard given now would be done.
    fn finish(&self, rate: f64) -> f64 {
        (self.in_flight + 1) as f64 / rate
    }
}

impl Control {
    fn deal(&mut self, now: Instant) -> Side {
        let [server, client] = &self.sides;
        let side = match (server.rate(now), client.rate(now)) {
            (Some(rs), Some(rc)) if server.finish(rs) > client.finish(rc) => Side::Client,
            (Some(_), Some(_)) => Side::Server,
            _ if server.in_flight > client.in_flight => Side::Client,
            _ => Side::Server,
        };
        self.sides[side as usize].start(now);
        side
    }
}

/// A shard dealt to one end by [`Control`]: counted in flight there until it ends (moved to
/// the client when the server leaves it un-reduced).
pub(crate) struct Dealt {
    completion: Arc<Completion>,
    side: Side,
    done: bool,
}

impl Dealt {
    /// The server left the shard to this client.
    pub(crate) fn left_to_client(&mut self) {
        if self.side == Side::Server {
            let now = Instant::now();
            let mut control = self.completion.control();
            control.sides[Side::Server as usize].end(now, false);
            control.sides[Side::Client as usize].start(now);
            self.side = Side::Client;
        }
    }

    /// Every row of the shard was delivered.
    pub(crate) fn finished(&mut self) {
        self.done = true;
    }
}

impl Drop for Dealt {
    fn drop(&mut self) {
        let now = Instant::now();
        self.completion.control().sides[self.side as usize].end(now, self.done);
    }
}

/// Where a shard request's ops run: what to ask the server, and the guards that count it.
pub(crate) struct Placed {
    pub deferral: Deferral,
    /// Counts the stream against the client's room while it may arrive un-reduced.
    pub tentative: Option<Active>,
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
            active: Default::default(),
            ops,
            schema,
            resources,
            rows: AtomicU64::new(0),
            busy_ns: AtomicU64::new(0),
            streams: AtomicU64::new(0),
            cores: Arc::new(tokio::sync::Semaphore::new(placement.cores.max(1))),
            control: Default::default(),
            consumer_waiting: std::sync::atomic::AtomicBool::new(true),
        }
    }

    /// Tells the split whether the consumer has been waiting for batches lately. A static
    /// split ([`ShardPlacement::server_fraction`] below 1) takes its shards onto this
    /// client's cores to deliver more than the servers can; while the consumer does not wait
    /// that buys nothing and costs the trainer's CPU, so its shards go to the servers until
    /// the consumer waits again. Which end runs a shard's ops never changes its rows. The
    /// [`crate::Loader`] tells the planner's split (not one its options force).
    pub fn set_consumer_waiting(&self, waiting: bool) {
        self.consumer_waiting.store(waiting, Ordering::Relaxed);
    }

    fn control(&self) -> std::sync::MutexGuard<'_, Control> {
        self.control.lock().unwrap_or_else(|p| p.into_inner())
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
                ClientError::Invalid(format!("bad `{DEFERRED_FROM_KEY}` in a stream's schema: {v:?}"))
            }),
        }
    }

    /// What to ask of the server for the shard at `position`: the deferral, a guard that
    /// counts the shard against this client's room while it may arrive un-reduced (until
    /// its stream shows it did not, or, when it did, until it ends), and, when adapting, the
    /// split's account of it.
    pub(crate) fn deferral_for(self: &Arc<Self>, position: u64) -> Placed {
        if self.ops.is_empty() {
            return Placed {
                deferral: Deferral::Never,
                tentative: None,
                dealt: None,
            };
        }
        // Two streams per core: one being completed, one arriving behind it.
        let room = self.active.load(Ordering::Relaxed) < 2 * self.placement.cores.max(1);
        let dealt = self.placement.adaptive.then(|| Dealt {
            completion: Arc::clone(self),
            side: self.control().deal(Instant::now()),
            done: false,
        });
        let clients = match &dealt {
            Some(d) => d.side == Side::Client,
            None => self.placement.is_clients(position) && self.consumer_waiting.load(Ordering::Relaxed),
        };
        let deferral = match (clients, self.placement.adaptive, room) {
            (true, ..) => Deferral::Always { from: 0 },
            // Adapted: the server's shards come here while this client has room and the
            // server's cores are taken.
            (false, true, true) => Deferral::IfBusy { from: 0 },
            (false, ..) => Deferral::Never,
        };
        let tentative = (deferral != Deferral::Never).then(|| {
            self.active.fetch_add(1, Ordering::Relaxed);
            Active(Arc::clone(self))
        });
        Placed {
            deferral,
            tentative,
            dealt,
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
            ClientError::Invalid(format!(
                "a server left ops {from}.. to this client, but the fragment has {}",
                self.ops.len()
            ))
        })?;
        let rows = batch.num_rows() as u64;
        // The stream's schema metadata is the server's note, not part of the rows.
        let plain = Arc::new(batch.schema().as_ref().clone().with_metadata(Default::default()));
        let batch = RecordBatch::try_new_with_options(
            plain,
            batch.columns().to_vec(),
            &arrow::record_batch::RecordBatchOptions::new().with_row_count(Some(batch.num_rows())),
        )?;
        let bound = Calls::bind(calls, batch.schema())?;
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
                    ClientError::Invalid(format!(
                        "a deferred stream's rows lack column `{}` after its ops ran",
                        f.name()
                    ))
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

/// A stream that may arrive, or arrives, un-reduced (see [`Completion::deferral_for`]).
pub(crate) struct Active(Arc<Completion>);

impl Drop for Active {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::time::Duration;

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

    #[test]
    fn a_split_runs_its_shards_here_only_while_the_consumer_waits() {
        let completion = Arc::new(Completion::new(
            ShardPlacement {
                server_fraction: 0.5,
                adaptive: false,
                cores: 1,
            },
            vec![Call::new("hash_bucket", "k", vec![], "k")],
            Arc::new(arrow::datatypes::Schema::empty()),
            Arc::new(pushdown_ops::NoResources),
        ));
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

    /// Two ends serving shards one at a time in the order dealt, `server` and `client` apart;
    /// `window` shards in flight; returns the share of the second half of `shards` dealt to
    /// the server (once the rates are known).
    fn simulate(server: Duration, client: Duration, window: usize, shards: usize) -> f64 {
        let start = Instant::now();
        let mut control = Control::default();
        let service = [server, client];
        // Each end's queue: when the shard at its head is done.
        let mut queues: [VecDeque<()>; 2] = Default::default();
        let mut busy_until = [start; 2];
        let mut now = start;
        let (mut dealt, mut late_server) = (0, 0);
        while dealt < shards || queues.iter().any(|q| !q.is_empty()) {
            while dealt < shards && queues.iter().map(VecDeque::len).sum::<usize>() < window {
                let side = control.deal(now);
                if queues[side as usize].is_empty() {
                    busy_until[side as usize] = now + service[side as usize];
                }
                queues[side as usize].push_back(());
                dealt += 1;
                if side == Side::Server && dealt > shards / 2 {
                    late_server += 1;
                }
            }
            // The next end to finish a shard.
            let side = (0..2)
                .filter(|&s| !queues[s].is_empty())
                .min_by_key(|&s| busy_until[s])
                .expect("a shard in flight");
            now = busy_until[side];
            queues[side].pop_front();
            control.sides[side].end(now, true);
            busy_until[side] = now + service[side];
        }
        late_server as f64 / (shards - shards / 2) as f64
    }

    #[test]
    fn adapting_deals_shards_by_the_rate_each_end_delivers() {
        let ms = Duration::from_millis;
        // Equal ends: half each.
        let late = simulate(ms(10), ms(10), 16, 400);
        assert!((late - 0.5).abs() < 0.05, "equal ends: {late}");
        // A server twice as fast (or a trainer's cores half taken): two thirds to the server.
        let late = simulate(ms(10), ms(20), 16, 400);
        assert!((late - 2.0 / 3.0).abs() < 0.05, "server twice as fast: {late}");
        // A server shared by three trainers delivers a third as fast: a quarter to it.
        let late = simulate(ms(30), ms(10), 16, 400);
        assert!((late - 0.25).abs() < 0.05, "a shared server: {late}");
    }

    #[test]
    fn until_both_ends_finish_a_shard_they_take_turns() {
        let mut control = Control::default();
        let now = Instant::now();
        let sides: Vec<Side> = (0..6).map(|_| control.deal(now)).collect();
        assert_eq!(
            sides,
            [
                Side::Server,
                Side::Client,
                Side::Server,
                Side::Client,
                Side::Server,
                Side::Client
            ]
        );
        assert_eq!(control.sides[0].in_flight, 3);
        // A shard that did not finish (a failed stream) is no rate.
        control.sides[0].end(now + Duration::from_millis(5), false);
        assert_eq!(control.sides[0].rate(now + Duration::from_millis(5)), None);
    }
}
