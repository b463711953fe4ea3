//! The one epoch-ahead policy, shared by `pushdown run` and the [`super::Loader`]: when the
//! next epoch starts, how it is planned, and when it is taken.
//!
//! * **When**: once every shard of the current epoch is in flight, or the current epoch is
//!   all produced ([`EpochSignal::next_due`]). From then on the current epoch's streams
//!   leave servers idle (fewer shards left than streams), so the next epoch's take up the
//!   slack, and filling its first shuffle window overlaps this epoch's tail instead of
//!   stalling the consumer at every boundary.
//! * **How**: planned again on what the servers list when it starts (files added join it),
//!   then produced into a channel of its own ([`EpochAhead::start`]).
//! * **Taken**: when the consumer reaches it, if it is that epoch with that echo, on the
//!   shards the servers list then ([`EpochAhead::begin`]); otherwise dropped and the epoch
//!   planned afresh, so an epoch always reads what the servers list when it begins.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use arrow::array::RecordBatch;
use pushdown_task::Task;
use tokio::sync::{mpsc, oneshot};

use super::prepared::{Prepared, Shards, Shared};
use super::producer::{EpochWatch, Producer};
use crate::error::Result;
use crate::stream::SharedTotals;

/// What a running epoch's producer tells about its progress.
#[derive(Debug, Clone, Default)]
pub(crate) struct EpochSignal {
    /// Set once every shard of the epoch is in flight.
    all_started: Arc<AtomicBool>,
}

impl EpochSignal {
    /// The watch a producer of this epoch sets, its streams' costs added to `totals`.
    pub(super) fn watch(&self, totals: SharedTotals) -> EpochWatch {
        EpochWatch {
            totals,
            all_started: Arc::clone(&self.all_started),
        }
    }

    /// Whether every shard of the epoch is in flight.
    pub(crate) fn all_started(&self) -> bool {
        self.all_started.load(Ordering::Acquire)
    }

    /// Whether the next epoch should start now, the current one `produced` whole or not:
    /// the policy's one rule.
    pub(crate) fn next_due(&self, produced: bool) -> bool {
        produced || self.all_started()
    }
}

/// One epoch's producer: its batches, in order, on a channel; dropping it stops it.
#[derive(Debug)]
pub(crate) struct Produced<T> {
    pub(crate) rx: mpsc::Receiver<Result<T>>,
    pub(crate) producer: Task<()>,
    pub(crate) signal: EpochSignal,
}

impl<T> Produced<T> {
    /// Whether the next epoch should start now ([`EpochSignal::next_due`]).
    pub(crate) fn next_due(&self) -> bool {
        self.signal.next_due(self.rx.is_closed())
    }
}

/// How an epoch's batches are produced: from which batch, how many times each sample
/// repeats, over how many partitions, into which totals, finished how.
#[derive(Clone, Copy)]
pub(crate) struct EpochSpec<T> {
    pub(crate) epoch: u64,
    pub(crate) echo: u64,
    pub(crate) first: u64,
    /// `None`: the options' own.
    pub(crate) partitions: Option<u64>,
    pub(crate) finish: fn(RecordBatch, u64, u64) -> Result<T>,
}

impl<T: Send + 'static> EpochSpec<T> {
    /// Starts producing this epoch of `prepared` on `handle`.
    pub(crate) fn start(
        self,
        prepared: &Prepared,
        totals: SharedTotals,
        handle: &tokio::runtime::Handle,
    ) -> Produced<T> {
        let (tx, rx) = mpsc::channel(prepared.shared.options.prefetch.max(1));
        let (shared, shards) = (Arc::clone(&prepared.shared), Arc::clone(&prepared.shards));
        let signal = EpochSignal::default();
        let watch = signal.watch(totals);
        let producer = Task::spawn_on(handle, self.produce(shared, shards, tx, watch));
        Produced { rx, producer, signal }
    }

    /// Produces this epoch of (`shared`, `shards`) into `tx`; a failure is its last item.
    async fn produce(
        self,
        shared: Arc<Shared>,
        shards: Arc<Shards>,
        tx: mpsc::Sender<Result<T>>,
        watch: EpochWatch,
    ) {
        let mut producer = Producer::new(shared, shards, self.epoch, self.echo, self.first);
        if let Some(p) = self.partitions {
            producer = producer.with_partitions(p);
        }
        if let Err(e) = producer.run(tx.clone(), self.finish, watch).await {
            let _ = tx.send(Err(e)).await;
        }
    }
}

/// The next epoch, started before the consumer reaches it.
#[derive(Debug)]
pub(crate) struct EpochAhead<T> {
    pub(crate) epoch: u64,
    echo: u64,
    produced: Produced<T>,
    prepared: oneshot::Receiver<Prepared>,
}

/// What [`EpochAhead::begin`] gives: the epoch as planned ahead, or nothing to take.
pub(crate) enum Begun<T> {
    Taken(Prepared, Produced<T>),
    /// Its planning failed: the error waits in its channel, the epoch's to report.
    Failed(Produced<T>),
    /// Another epoch or echo, or the servers list other shards now: plan afresh.
    Dropped,
}

impl<T: Send + 'static> EpochAhead<T> {
    /// Plans `spec`'s epoch again from `base` (what the servers list now) and starts
    /// producing it, on `handle`.
    pub(crate) fn start(
        base: &Prepared,
        spec: EpochSpec<T>,
        totals: SharedTotals,
        handle: &tokio::runtime::Handle,
    ) -> Self {
        let (tx, rx) = mpsc::channel(base.shared.options.prefetch.max(1));
        let (planned, prepared) = oneshot::channel();
        let base = base.clone();
        let signal = EpochSignal::default();
        let watch = signal.watch(totals);
        let (epoch, echo) = (spec.epoch, spec.echo);
        let producer = Task::spawn_on(handle, async move {
            let next = match base.replan().await {
                Ok(next) => next,
                Err(e) => {
                    let _ = tx.send(Err(e)).await;
                    return;
                }
            };
            let (shared, shards) = (Arc::clone(&next.shared), Arc::clone(&next.shards));
            let _ = planned.send(next);
            spec.produce(shared, shards, tx, watch).await;
        });
        Self {
            epoch,
            echo,
            produced: Produced { rx, producer, signal },
            prepared,
        }
    }

    /// Takes this epoch for the consumer now at `epoch` with `echo`, none of its batches
    /// given yet (`fresh`), if it is that epoch and the servers still list the shards it was
    /// planned on. Planning it now failing is the epoch's error (planned again, it would
    /// wait the same deadlines to fail the same way).
    pub(crate) async fn begin(self, epoch: u64, echo: u64, fresh: bool) -> Result<Begun<T>> {
        if self.epoch != epoch || self.echo != echo || !fresh {
            return Ok(Begun::Dropped);
        }
        let Ok(prepared) = self.prepared.await else {
            return Ok(Begun::Failed(self.produced));
        };
        let shared = Arc::clone(&prepared.shared);
        let current = shared.client.plan(&shared.request).await?;
        if Shards::new(current, None).version == prepared.version() {
            Ok(Begun::Taken(prepared, self.produced))
        } else {
            Ok(Begun::Dropped)
        }
    }
}

impl Prepared {
    /// How `pushdown run` produces `epoch` of this query from batch `first`: record batches,
    /// the options' partitions, and no automatic echo (`run` has no consumer to measure).
    pub(crate) fn records(&self, epoch: u64, first: u64) -> EpochSpec<RecordBatch> {
        EpochSpec {
            epoch,
            echo: self.shared.options.echo.factor(None),
            first,
            partitions: None,
            finish: |batch, _, _| Ok(batch),
        }
    }

    /// Batches `first..` of `epoch`, in order, with the client steps applied on `workers`
    /// blocking threads. `totals` receives what the streams cost when the epoch ends.
    pub fn epoch(&self, epoch: u64, first: u64, totals: SharedTotals) -> EpochBatches {
        let handle = tokio::runtime::Handle::current();
        EpochBatches(self.records(epoch, first).start(self, totals, &handle))
    }
}

/// The record batches of one epoch of a [`Prepared`] query, in order; dropping them stops
/// their producer.
#[derive(Debug)]
pub struct EpochBatches(pub(crate) Produced<RecordBatch>);

impl EpochBatches {
    /// Whether every shard of the epoch is in flight: from then on its tail leaves cores
    /// idle, and the next epoch may start.
    pub fn all_started(&self) -> bool {
        self.0.signal.all_started()
    }
}

impl futures::Stream for EpochBatches {
    type Item = Result<RecordBatch>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        self.0.rx.poll_recv(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_epoch_is_due_once_every_shard_is_in_flight_or_all_is_produced() {
        let signal = EpochSignal::default();
        assert!(!signal.next_due(false), "shards still to start");
        assert!(signal.next_due(true), "all produced");
        let watch = signal.watch(SharedTotals::default());
        watch.all_started.store(true, Ordering::Release);
        assert!(signal.next_due(false), "the producer's watch is the signal's");
    }
}
