//! The adaptive split's control loop: which end runs a shard's fragment ops, decided when
//! the shard is requested. Pure: the caller passes the time; no I/O, no runtime.
//!
//! A server is shared. Its cores go round the streams it reduces (a shard at a time each,
//! about in the order they became ready; the un-reduced ones on threads of their own), so a shard's time there grows with every stream
//! any trainer keeps on it, and a trainer consumes shards in order: one slow server shard at the head
//! holds every shard behind it. The first version dealt each shard to the end whose rate
//! promised to finish it first; on a server shared by three trainers each piled shards
//! there as fast as the server's rate seemed to allow, every server shard slowed down, and
//! the trainers' own cores idled behind them (measured: well short of the best static
//! placement, on 2 cores and on 16).
//!
//! The rule now: each shard goes to the end expected to finish it first, with each end's
//! time measured as what it is, not as a rate:
//! * **The server in rounds of [`SERVER_SHARDS`].** A shard there takes the latency the
//!   server's shards have had lately (request to last row: it already counts every other
//!   trainer's streams), once for each round of two shards this trainer has there ahead of
//!   it. Two are enough to keep a server busy (one being reduced, one behind it; a lone
//!   stream decodes on every free core), and every shard beyond them costs this trainer a
//!   whole round, so a trainer keeps about two there while its own cores are as fast, and
//!   a server's cores are divided about equally among the trainers sharing it, with no
//!   trainer reacting to the others' rates. A server that measured slow (shared widely)
//!   gets fewer; a fast one more.
//! * **This client in order.** Its cores complete un-reduced shards in arrival order: the
//!   shards it has in flight and this one, at the rate it has delivered them.
//! * **A probe** where the server has none of this trainer's shards: one goes there, so its
//!   latency stays measured, but not where it would come over [`PROBE_SLACK`] times later
//!   than this client's queue: the consumer would wait on it at the head of a burst (six
//!   and eight trainers opening whole epochs on a slow server fell far short of the best
//!   static placement in the simulation, and came closer waiting for a queue here:
//!   `a_probe_waits_where_it_would_hold_up_the_consumer`).
//!   It goes anyway once the server has been without this trainer's shards for as long as
//!   its latency.
//! * **Starting**, until both are measured: the server's first round, then this client.
//!
//! The latency is a shard's whole wait, its own trainer's shards ahead of it included,
//! unless the server's trailer says no other client's stream ran on its reducing cores
//! beside the shard (`StreamStats::reduced_alone`). A server serves streams about in turn (a
//! 512-row shard is one batch, reduced in one go, the streams in the order they became
//! ready): a burst of one trainer's shards is served back to back, ahead of the shards the
//! other trainers request after it. Taken per round of the burst, that latency reads as a
//! server as fast as if this trainer had it alone; each trainer then opened its next epoch's
//! burst there and left the others waiting (in the simulation, three trainers fell from
//! above the best static placement to well under it:
//! `a_server_serving_in_turn_is_shared_not_raced_for`). Taken whole, a trainer that opens a
//! burst at once overestimates the server by about the burst's rounds and keeps fewer shards
//! there than it could: alone, reading whole epochs at once, it trailed the best static split
//! in the simulation (by far against a server of four cores) and the costed plan on 2 cores
//! and on 16. A shard that ran alone waited only behind this trainer's own, and no other
//! trainer's can be behind its burst: its latency is taken per round of this trainer's
//! shards it was dealt into, as the rule predicts it (in the simulation close to the best
//! static split, `a_trainer_alone_on_the_server_keeps_there_what_it_finishes_in_time`; on 2
//! cores level with the costed plan). A shard that had company is taken whole, as before.
//!
//! Many trainers on one server core need the server's part: were its un-reduced streams
//! (the shards each trainer completes itself) served in turn with the reduced ones, they
//! would wait behind them, and every shard a trainer keeps there (the probe included) would
//! delay its own cores' work too (in the simulation, six and eight trainers fell far short of
//! the best static placement, everything on the trainers). The server serves them on
//! threads of their own (`Node::unreduced` in the engine), and those threads go first where
//! both want the cores (`ServerConfig::reducing_nice`): with the cores divided as CFS
//! divides them (`Service::Lanes`), eight simulated trainers come close to the best static
//! placement, and fall well short of it at equal priority, where any shard reduced there, a
//! probe enough, took half a core from the reads every trainer's own cores wait on
//! (`a_server_with_a_lane_for_unreduced_streams_keeps_many_trainers_fed`).
//!
//! The figures of each case, simulated and measured, are in `benches/RESULTS.md`, "One
//! server core shared by 3 trainers" and "Split placement: one op on both ends";
//! `placement_matrix` (`crates/client/src/control/tests.rs`, ignored) prints the
//! simulation's.
//!
//! Which end runs a shard never changes its rows: the sequence is the fault-free static one.

use std::time::{Duration, Instant};

/// Shards a server is given per round (see the module docs).
pub const SERVER_SHARDS: u64 = 2;

/// A probe (see [`Reason::Probe`]) waits until this client's queue and the shard would take
/// at least the server's latency over this: the consumer then has this client's shards to take
/// while the probe is on the server, rather than waiting on it at the head of a burst.
const PROBE_SLACK: f64 = 2.0;

/// Weight of the newest server latency in its running average: it follows load changes
/// (trainers joining, leaving) within a few shards, while one slow shard moves it a third.
const LATENCY_WEIGHT: f64 = 0.3;

/// Which end a shard stream's ops run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    Server = 0,
    Client = 1,
}

/// A shard as dealt: the end, when, and (on the server) the rounds of this trainer's shards
/// there it was dealt into, itself included.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deal {
    pub(crate) side: Side,
    pub(crate) at: Instant,
    rounds: u64,
}

/// How a dealt shard left its side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    /// Not delivered whole (a failed stream).
    Failed,
    /// Delivered whole.
    Delivered,
    /// Delivered whole, and the server ran it with no other client's stream alongside.
    DeliveredAlone,
}

/// The run-time split (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct Control {
    pub(crate) sides: [SideLoad; 2],
    /// Running average of how long a server shard took, from request to last row.
    server_latency: Option<Duration>,
}

/// One end's shards in flight and what it has delivered.
#[derive(Debug, Default)]
pub(crate) struct SideLoad {
    pub(crate) in_flight: u64,
    pub(crate) done: u64,
    /// Time with shards in flight: closed periods, and the open one.
    busy: Duration,
    busy_since: Option<Instant>,
    /// When its last shard in flight ended (none in flight since).
    idle_since: Option<Instant>,
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
            self.idle_since = Some(now);
        }
    }

    /// Shards a second while it had any in flight; none until it has finished one.
    pub(crate) fn rate(&self, now: Instant) -> Option<f64> {
        let busy = self.busy
            + self
                .busy_since
                .map_or_else(Default::default, |s| now.duration_since(s));
        (self.done > 0).then(|| self.done as f64 / busy.as_secs_f64().max(1e-6))
    }

    /// Seconds from now until a shard given now would be done, its queue served in order.
    fn finish(&self, rate: f64) -> f64 {
        (self.in_flight + 1) as f64 / rate
    }
}

/// Why [`Control::deal`] chose a side: for the trace.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Reason {
    /// The server had none of this trainer's shards: one goes there, so its latency stays
    /// measured (a server once slow is not left idle for good), unless [`Reason::ProbeLater`].
    Probe,
    /// The server has none of this trainer's shards, but one given now would come long after
    /// this client's queue (over [`PROBE_SLACK`] times as long) and hold up the consumer:
    /// the probe waits for a longer queue here, or for the server to have been without this
    /// trainer's shards for as long as its latency.
    ProbeLater { server_s: f64, client_s: f64 },
    /// Before both ends are measured: the server's first round, then this client.
    Starting,
    /// The consumer is not waiting for batches: this client's cores are left to it, and
    /// every shard goes to the server until it waits again.
    ConsumerAhead,
    /// Expected to finish first there: seconds from now on the server (its recent latency
    /// for each round of [`SERVER_SHARDS`] ahead of the shard) and here (this client's queue
    /// and the shard at its rate).
    Sooner { server_s: f64, client_s: f64 },
}

/// Whether a server with none of this trainer's shards (`server`) gets the next one: unless it
/// would come over [`PROBE_SLACK`] times later than this client's queue (`client_s`), and the
/// server has been without them for less than its `latency` (a server once slow is measured
/// again, whatever this client's queue).
fn probe_due(server: &SideLoad, now: Instant, latency: Duration, client_s: f64) -> bool {
    latency.as_secs_f64() <= PROBE_SLACK * client_s
        || server
            .idle_since
            .is_none_or(|idle| now.duration_since(idle) >= latency)
}

impl Control {
    /// The end the next shard goes to, counted in flight there from `now`; while the
    /// consumer is not `waiting`, the server.
    pub(crate) fn deal(&mut self, now: Instant, waiting: bool) -> (Deal, Reason) {
        let [server, client] = &self.sides;
        let rounds = (server.in_flight + 1).div_ceil(SERVER_SHARDS);
        let (side, reason) = match (self.server_latency, client.rate(now)) {
            _ if !waiting => (Side::Server, Reason::ConsumerAhead),
            // One shard on the server: its share, and a latency kept current; but not one
            // the consumer would wait on long after this client's queue.
            (Some(latency), Some(rate))
                if server.in_flight == 0 && !probe_due(server, now, latency, client.finish(rate)) =>
            {
                (
                    Side::Client,
                    Reason::ProbeLater {
                        server_s: latency.as_secs_f64(),
                        client_s: client.finish(rate),
                    },
                )
            }
            _ if server.in_flight == 0 => (Side::Server, Reason::Probe),
            (Some(latency), Some(rate)) => {
                let (server_s, client_s) = (latency.as_secs_f64() * rounds as f64, client.finish(rate));
                let side = if server_s <= client_s {
                    Side::Server
                } else {
                    Side::Client
                };
                (side, Reason::Sooner { server_s, client_s })
            }
            _ if server.in_flight < SERVER_SHARDS => (Side::Server, Reason::Starting),
            _ => (Side::Client, Reason::Starting),
        };
        self.sides[side as usize].start(now);
        (
            Deal {
                side,
                at: now,
                rounds,
            },
            reason,
        )
    }

    /// A shard `deal`t left its side at `now`, as `ended`. A server shard's latency is its
    /// whole wait, or its wait per round where it ran alone there (see the module docs).
    pub(crate) fn end(&mut self, deal: &Deal, now: Instant, ended: Ended) {
        self.sides[deal.side as usize].end(now, ended != Ended::Failed);
        if deal.side == Side::Server && ended != Ended::Failed {
            let wait = now.duration_since(deal.at);
            let latency = match ended {
                Ended::DeliveredAlone => wait / u32::try_from(deal.rounds.max(1)).unwrap_or(u32::MAX),
                _ => wait,
            };
            self.server_latency = Some(match self.server_latency {
                None => latency,
                Some(avg) => avg.mul_f64(1.0 - LATENCY_WEIGHT) + latency.mul_f64(LATENCY_WEIGHT),
            });
        }
    }

    /// A shard dealt to the server came back un-reduced: this client completes it.
    pub(crate) fn moved_to_client(&mut self, deal: &mut Deal, now: Instant) {
        if deal.side == Side::Server {
            self.sides[Side::Server as usize].end(now, false);
            self.sides[Side::Client as usize].start(now);
            deal.side = Side::Client;
        }
    }

    /// The server latency the rule compares against, when one was measured.
    pub(crate) fn server_latency(&self) -> Option<Duration> {
        self.server_latency
    }
}

#[cfg(test)]
mod tests;
