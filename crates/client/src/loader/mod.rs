//! The trainer's loader: a reproducible, resumable, rank-partitioned sequence of batches.
//!
//! ```text
//!  shards (endpoints) ── count action: exact rows after the filter, per shard
//!     │ epoch e: shards permuted by (seed, e); their rows concatenated: N rows
//!     │ rank r of W: rows [r·L, (r+1)·L), L = ⌊N/W⌋ (drop_last) or ⌈N/W⌉ (wrapping pad)
//!     ▼
//!  ShardStream (Sequential: prefetches `concurrency` shards, never reorders)
//!     │ windows of S rows, each permuted by (seed, e, r, window)
//!     │ batches of B rows; batch b's random ops draw from (seed, e, r, b) and the row
//!     ▼
//!  `workers` blocking threads: client ops + tensors ── bounded queue of `prefetch` ──▶ next()
//! ```
//!
//! Every choice is a function of (dataset version, seed, epoch, rank, world size): never of
//! timing, the number of streams in flight, or which server answered. So the state to resume
//! from is just (epoch, batches delivered, the version the epoch was planned on): a restored
//! loader seeks to the window holding its next row (one window is re-read), permutes it the
//! same way, and carries on.
//!
//! Datasets grow and shrink while a job trains. Each epoch is planned when it starts: its
//! shards pin the files and file versions the servers listed then, so an epoch never mixes
//! versions (a file replaced under a running epoch fails it by name; a file added joins the
//! next epoch), and the next epoch sees what the servers list by then.
//!
//! [`Prepared`] is that preparation and that sequence without the trainer's threads: `pushdown
//! run` streams a [`Prepared`] as record batches, so one pipeline and seed give one sample
//! sequence whether it is read by `run` or by a [`Loader`] of world size 1.
//!
//! Column types are fixed by the schema, never by a batch's contents: a column of an
//! integer or float type, or a `FixedSizeList` of them (a tensor op's output), arrives as a
//! [`Column::Tensor`], whether the schema calls it nullable or not; a null in it is an error
//! naming the column and row. Every other column arrives as [`Column::Arrow`] with its nulls.

mod ahead;
mod mixed;
mod options;
mod prepared;
mod producer;
mod tensors;

pub use ahead::EpochBatches;
pub(crate) use ahead::{Begun, EpochAhead};
use ahead::{EpochSignal, EpochSpec};
use mixed::{MixProducer, Mixture};
pub use options::{LoaderOptions, LoaderSource, MixtureSource, Push};
pub use prepared::Prepared;
use prepared::*;
pub use tensors::{Column, TensorBatch};

use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use tokio::sync::mpsc;

use crate::bucket::BucketBy;
use crate::client::PushdownClient;
use crate::completion::CompletionTotals;
use crate::error::{ClientError, Result};
use crate::mixture::Taken;
use crate::order::PartPos;
use crate::order::{Echo, LoaderState, Shape, check_world, rank_partitions};
use crate::pack::Pack;
use crate::stream::SharedTotals;
use pushdown_planner::Step;
use pushdown_task::Task;

/// What the consumer experienced.
#[derive(Debug, Clone, Copy, Default)]
pub struct LoaderStats {
    pub batches: u64,
    /// Samples delivered (each echo counted).
    pub rows: u64,
    /// Distinct samples read from the servers (rows of the shuffle windows filled; for a
    /// mixture, every source's rows read so far, windows re-read counted again).
    pub distinct_rows: u64,
    /// Times the current epoch repeats each sample.
    pub echo: u64,
    /// The fragment ops this loader ran on shards the servers left un-reduced.
    pub completed: CompletionTotals,
    /// Time spent inside `next` waiting for a batch.
    pub waited: Duration,
    /// Time since the first `next`.
    pub elapsed: Duration,
    /// The most shard streams in flight at once (tuned unless `concurrency` was set), over
    /// the epochs finished.
    pub peak_streams: u64,
    /// Bytes received from the servers in the epochs finished.
    pub bytes_received: u64,
    /// Epochs begun with the one started ahead of them: the epoch before's tail overlapped
    /// their start (see `pushdown run`'s, which follows the same policy).
    pub epochs_ahead: u64,
}

impl LoaderStats {
    /// The fraction of the consumer's time spent waiting for data.
    pub fn wait_fraction(&self) -> f64 {
        self.waited.as_secs_f64() / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// Batches for one rank, epoch after epoch. Iterating blocks the calling thread only while
/// no prepared batch is ready; the network and client ops run on the loader's own threads.
pub struct Loader {
    runtime: Option<tokio::runtime::Runtime>,
    /// The query as planned for epoch `planned_epoch` (when that epoch started).
    prepared: Prepared,
    planned_epoch: u64,
    epoch: u64,
    batches: u64,
    /// Iteration ends before this epoch (the options' `epochs`, or the pass [`Self::begin`]
    /// set).
    end: u64,
    /// Passes were asked for ([`Self::begin`]): how many epochs follow is not known, so the
    /// next epoch is started ahead whatever `end` says.
    passes: bool,
    rx: Option<mpsc::Receiver<Result<TensorBatch>>>,
    producer: Option<Task<()>>,
    /// What the current epoch's producer tells of its progress: when the next may start.
    signal: EpochSignal,
    stats: LoaderStats,
    started: Option<Instant>,
    failed: bool,
    /// Repeats of each sample in the current epoch (data echoing).
    echo: u64,
    /// When the current epoch's first batch was asked for, and the wait counted by then: the
    /// next epoch's automatic echo is chosen from this epoch's share of waiting.
    epoch_start: Option<(Instant, Duration)>,
    /// The share of the last whole epoch the consumer waited.
    last_wait: Option<f64>,
    /// Since when, and the wait counted by then, the consumer's wait is being watched for the
    /// split (see [`Completion::set_consumer_waiting`]).
    appetite: Option<(Instant, Duration)>,
    /// Tells the loaders apart in the servers' scaling signal.
    client_id: u64,
    /// When the last report was sent, and the wait and rows counted by then.
    reported: Option<(Instant, Duration, u64)>,
    /// The next epoch, started once this one's last shards are in flight (see `ahead`).
    ahead: Option<EpochAhead<TensorBatch>>,
    /// The order's partitions: the options' (or their default), or a restored state's.
    partitions: u64,
    /// What the finished epochs' streams cost (bytes, retries, streams in flight).
    streams: SharedTotals,
    /// A mixture of sources (`prepared` is then its first source's), and where the consumer
    /// is in it.
    mixture: Option<(Arc<Mixture>, Taken)>,
    /// A packed or bucketed loader (a mixture of one source, regrouped): where each
    /// partition's packer or bucketer is after the batches given, known for this rank's
    /// partitions (all, before the first).
    parts: Vec<Option<PartPos>>,
}

/// How long the consumer's wait is watched before the split is told whether it waits, and
/// the share of that time above which it does: long enough to span a shuffle window's
/// batches (waits come at window boundaries when the servers are the bottleneck).
const APPETITE_WINDOW: Duration = Duration::from_secs(2);
const APPETITE_WAIT: f64 = 0.02;

/// A batch as the [`Loader`] hands it out.
fn to_tensors(batch: RecordBatch, epoch: u64, index: u64) -> Result<TensorBatch> {
    TensorBatch::from_record_batch(&batch, epoch, index)
}

impl std::fmt::Debug for Loader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loader")
            .field("epoch", &self.epoch)
            .field("batches", &self.batches)
            .finish_non_exhaustive()
    }
}

impl Loader {
    /// Connects, plans, and counts each shard's rows. Blocks; call from a plain thread. A
    /// pipeline with a `pack` or `bucket_by` step is [`Self::packed`] or [`Self::bucketed`]
    /// over the steps before it.
    pub fn new<S: AsRef<str>>(servers: &[S], source: LoaderSource, options: LoaderOptions) -> Result<Self> {
        if let LoaderSource::Pipeline(pipeline) = &source
            && let (rest, Some(step)) = pipeline.without_regroup()
        {
            let rest = LoaderSource::Pipeline(rest);
            return match step {
                Step::Pack(s) => Self::packed(servers, rest, Pack::from(s), options),
                Step::BucketBy(s) => Self::bucketed(servers, rest, BucketBy::from(s), options),
                other => Err(ClientError::Invalid(format!(
                    "`{other}` is not a regrouping step"
                ))),
            };
        }
        let (runtime, options) = loader_runtime(options)?;
        let servers: Vec<String> = servers.iter().map(|s| s.as_ref().to_owned()).collect();
        let (shared, shards) = runtime.block_on(async move {
            let client = PushdownClient::connect_with(&servers, options.connect.clone()).await?;
            prepare(client, source, options, true).await
        })?;
        if shards.counts.is_none() {
            return Err(ClientError::Invalid(
                "the loader needs a row-wise query (projection and filter over one dataset): \
                 it shuffles and resumes by shard"
                    .into(),
            ));
        }
        let partitions = shared.order.partitions;
        check_world(partitions, shared.options.world_size as u64)?;
        let prepared = Prepared {
            shared: Arc::new(shared),
            shards: Arc::new(shards),
        };
        Ok(Self::assemble(runtime, prepared, partitions))
    }

    /// Batches of a mixture of sources, each global batch holding rows of every source in
    /// proportion to its weight (see [`crate::mixture`] for the schedule, and the README's
    /// "Mixtures"): each source a row-wise query or pipeline of its own, on its own servers
    /// or `servers`, all with the same columns. A source that runs out begins its own next
    /// epoch; the mixture's epoch is `⌊Σ rows / G⌋` global batches (`G = batch_size ×
    /// world_size`), every batch whole (`drop_last` has nothing to drop). The sources are
    /// planned once, when the loader is made: a file replaced under it fails its stream by
    /// name, and files added join when the loader is made again. Elastic as one source is:
    /// any world size dividing the partitions sees the same global batches, and a state
    /// continues at any of them.
    pub fn mixture<S: AsRef<str>>(
        servers: &[S],
        sources: Vec<MixtureSource>,
        options: LoaderOptions,
    ) -> Result<Self> {
        let (runtime, options) = loader_runtime(options)?;
        let servers: Vec<String> = servers.iter().map(|s| s.as_ref().to_owned()).collect();
        let mixture = runtime.block_on(Mixture::prepare(&servers, sources, &options))?;
        let partitions = mixture.order.partitions;
        check_world(partitions, options.world_size as u64)?;
        let prepared = mixture.sources[0].clone();
        let taken = Taken::start(mixture.sources.len(), partitions);
        let mut loader = Self::assemble(runtime, prepared, partitions);
        loader.mixture = Some((Arc::new(mixture), taken));
        Ok(loader)
    }

    /// Blocks of `pack.length` tokens packed from the documents of `source` (its
    /// `pack.column` holding each document's token ids), `batch_size` blocks per rank per
    /// batch, each with its `position_ids` (see [`crate::pack`]). Documents are read as a
    /// mixture's one source is: by partition, in the order's shuffle, each partition packed
    /// on its own, so any world size dividing the partitions sees the same global batches.
    /// The stream runs on through the source's epochs; a loader epoch is as many global
    /// batches as a pass over the documents fills (estimated from the first documents of
    /// partition 0). Each rank's state holds its own partitions' packers: restore from every
    /// rank's states merged ([`LoaderState::merge`]).
    pub fn packed<S: AsRef<str>>(
        servers: &[S],
        source: LoaderSource,
        pack: Pack,
        options: LoaderOptions,
    ) -> Result<Self> {
        let (runtime, options) = loader_runtime(options)?;
        let servers: Vec<String> = servers.iter().map(|s| s.as_ref().to_owned()).collect();
        let mixture = runtime.block_on(Mixture::packed(&servers, source, pack, &options))?;
        Self::regrouped(runtime, mixture, &options)
    }

    /// Rows of `source` in global batches each drawn from one length bucket of
    /// `by.column`'s token lists, padded to the batch's longest (with each row's length in
    /// `{column}_length`), so that every rank's share of a step holds sequences of about one
    /// length: tf.data service's coordinated reads (see [`crate::bucket`]). Rows are read as
    /// a mixture's one source is, by partition, each partition queueing its rows by bucket,
    /// so any world size dividing the partitions sees the same global batches. The stream
    /// runs on through the source's epochs, `⌊rows / G⌋` global batches to a loader epoch.
    /// Each rank's state holds its own partitions' queues: restore from every rank's
    /// states merged ([`LoaderState::merge`]).
    pub fn bucketed<S: AsRef<str>>(
        servers: &[S],
        source: LoaderSource,
        by: BucketBy,
        options: LoaderOptions,
    ) -> Result<Self> {
        let (runtime, options) = loader_runtime(options)?;
        let servers: Vec<String> = servers.iter().map(|s| s.as_ref().to_owned()).collect();
        let mixture = runtime.block_on(Mixture::bucketed(&servers, source, by, &options))?;
        Self::regrouped(runtime, mixture, &options)
    }

    /// A packed or bucketed loader over its prepared source, every partition at its start.
    fn regrouped(
        runtime: tokio::runtime::Runtime,
        mixture: Mixture,
        options: &LoaderOptions,
    ) -> Result<Self> {
        let partitions = mixture.order.partitions;
        check_world(partitions, options.world_size as u64)?;
        let prepared = mixture.sources[0].clone();
        let taken = Taken::start(1, partitions);
        let mut loader = Self::assemble(runtime, prepared, partitions);
        let start = mixture.regroup.as_ref().map(|r| r.start());
        loader.parts = vec![start; partitions as usize];
        loader.mixture = Some((Arc::new(mixture), taken));
        Ok(loader)
    }

    fn assemble(runtime: tokio::runtime::Runtime, prepared: Prepared, partitions: u64) -> Self {
        let options = &prepared.shared.options;
        let (shared_echo, options_epochs) = (options.echo, options.epochs as u64);
        Self {
            runtime: Some(runtime),
            prepared,
            planned_epoch: 0,
            epoch: 0,
            batches: 0,
            end: options_epochs,
            passes: false,
            rx: None,
            producer: None,
            signal: EpochSignal::default(),
            stats: LoaderStats::default(),
            started: None,
            failed: false,
            echo: shared_echo.factor(None),
            epoch_start: None,
            last_wait: None,
            appetite: None,
            client_id: rand::random(),
            reported: None,
            ahead: None,
            streams: SharedTotals::default(),
            partitions,
            mixture: None,
            parts: Vec::new(),
        }
    }

    /// The schema of the batches' columns.
    pub fn schema(&self) -> SchemaRef {
        match &self.mixture {
            Some((m, _)) => Arc::clone(&m.schema),
            None => self.prepared.shared.steps.schema(),
        }
    }

    /// Rows each rank gets per epoch (echoes counted), and batches per epoch, as the current
    /// (or last) epoch was planned: a growing dataset gives later epochs more.
    pub fn epoch_len(&self) -> (u64, u64) {
        let shared = &self.prepared.shared;
        if let Some((m, _)) = &self.mixture {
            let world = shared.options.world_size.max(1) as u64;
            return (m.epoch_batches * m.order.global_batch / world, m.epoch_batches);
        }
        let n: u64 = self.prepared.shards.counts.iter().flatten().sum();
        let shape = Shape::new(n, &shared.order.with_partitions(self.partitions));
        let (rank, world) = (shared.options.rank as u64, shared.options.world_size as u64);
        let rows: u64 = rank_partitions(self.partitions, rank, world)
            .map(|p| shape.items_before(p, shape.batches()))
            .sum::<u64>()
            + shape.pad(rank, world);
        (rows * self.echo, shape.batches() * self.echo)
    }

    pub fn state(&self) -> LoaderState {
        if let Some((m, taken)) = &self.mixture {
            return LoaderState {
                order: m.order,
                epoch: self.epoch,
                batches: self.batches,
                version: m.version,
                echo: 1,
                per_rank: None,
                mixture: m.regroup.is_none().then(|| taken.clone()),
                parts: m.regroup.as_ref().map(|_| self.parts.clone()),
            };
        }
        let mid_epoch = self.batches > 0 && self.planned_epoch == self.epoch;
        LoaderState {
            order: self.prepared.shared.order.with_partitions(self.partitions),
            epoch: self.epoch,
            batches: self.batches,
            version: if mid_epoch { self.prepared.version() } else { 0 },
            echo: self.echo,
            per_rank: None,
            mixture: None,
            parts: None,
        }
    }

    /// Continues from `state`: the next batch is the global batch the saved loaders would
    /// have given next, at this loader's world size (any that divides the state's partitions,
    /// with the same global batch and window). Mid-epoch, that needs the shards the epoch was
    /// planned on: a dataset changed since is refused by name (restore at an epoch boundary
    /// instead, which plans on the new version).
    pub fn restore(&mut self, state: LoaderState) -> Result<()> {
        if self.mixture.is_some() {
            return self.restore_mixture(state);
        }
        let partitions = self.check_state(&state)?;
        self.stop_producer();
        self.partitions = partitions;
        if state.batches > 0 {
            if self.prepared.version() != state.version {
                let replanned = self.block_on_replan()?;
                if replanned.version() != state.version {
                    return Err(ClientError::Changed(format!(
                        "the dataset changed since the state was saved in epoch {}: its shards were \
                         version {:016x}, the servers now list version {:016x}; resuming mid-epoch \
                         needs the same files, so restore at the start of an epoch",
                        state.epoch,
                        state.version,
                        replanned.version()
                    )));
                }
                self.prepared = replanned;
            }
            self.planned_epoch = state.epoch;
        }
        self.epoch = state.epoch;
        self.batches = state.batches;
        // Mid-epoch, the epoch goes on with the repeats it was started with; at a boundary a
        // fixed echo is the options' and an automatic one restarts from the saved one.
        self.echo = match self.prepared.shared.options.echo {
            Echo::Auto { max } => state.echo.clamp(1, u64::from(max.max(1))),
            fixed => fixed.factor(None),
        };
        self.epoch_start = None;
        self.failed = false;
        Ok(())
    }

    /// [`Self::restore`] of a mixture: the same sources, weights, seed and batching, on the
    /// same versions of the sources (a source's epochs run across the mixture's, so its
    /// position depends on its rows at any point).
    fn restore_mixture(&mut self, state: LoaderState) -> Result<()> {
        let Some((m, _)) = &self.mixture else {
            return Err(ClientError::Invalid("not a mixture".into()));
        };
        if m.regroup.is_some() {
            return self.restore_regrouped(state);
        }
        let Some(taken) = state.mixture.clone() else {
            return Err(ClientError::Invalid(
                "the state was saved by a loader of one source, not by a mixture".into(),
            ));
        };
        if taken.0.len() != m.sources.len() {
            return Err(ClientError::Invalid(format!(
                "the state was saved by a mixture of {} sources, this loader mixes {}",
                taken.0.len(),
                m.sources.len()
            )));
        }
        let partitions = self.same_run(m, &state, "mixture (its sources' queries or weights differ)")?;
        let mixture = match partitions == m.order.partitions {
            true => Arc::clone(m),
            false => Arc::new(m.with_partitions(partitions)?),
        };
        self.stop_producer();
        self.partitions = partitions;
        self.mixture = Some((mixture, taken));
        self.epoch = state.epoch;
        self.batches = state.batches;
        self.epoch_start = None;
        self.failed = false;
        Ok(())
    }

    /// The partitions to continue a mixture's or packed loader's `state` with: the same
    /// sources (`other` says what differs otherwise), order and files.
    fn same_run(&self, m: &Mixture, state: &LoaderState, other: &str) -> Result<u64> {
        if state.order.sources != m.order.sources {
            return Err(ClientError::Invalid(format!(
                "the state was saved by another {other}"
            )));
        }
        let world = self.prepared.shared.options.world_size as u64;
        if let Some(why) = m.order.differs(&state.order, world) {
            return Err(ClientError::Invalid(why));
        }
        let partitions = self.state_partitions(state)?;
        if state.version != m.version {
            return Err(ClientError::Changed(format!(
                "a source changed since the state was saved in epoch {}: the sources were \
                 version {:016x}, they are now {:016x}; a mixture or packed loader continues \
                 only on the files it was saved on",
                state.epoch, state.version, m.version
            )));
        }
        Ok(partitions)
    }

    /// [`Self::restore`] of a packed or bucketed loader: the same query, regrouping, seed
    /// and batching, on the same files, from a state that knows at least this rank's
    /// partitions.
    fn restore_regrouped(&mut self, state: LoaderState) -> Result<()> {
        let Some((m, _)) = &self.mixture else {
            return Err(ClientError::Invalid("not a packed or bucketed loader".into()));
        };
        let Some(regroup) = &m.regroup else {
            return Err(ClientError::Invalid("not a packed or bucketed loader".into()));
        };
        let option = regroup.option();
        let parts = match state.parts.clone() {
            Some(parts) if parts.iter().flatten().all(|p| regroup.fits(p)) => parts,
            _ => {
                return Err(ClientError::Invalid(format!(
                    "the state was not saved by a loader with {option}: it has no positions of \
                     that kind to continue"
                )));
            }
        };
        let other = format!("loader with {option} (its query or settings differ)");
        let partitions = self.same_run(m, &state, &other)?;
        let world = self.prepared.shared.options.world_size as u64;
        let rank = self.prepared.shared.options.rank as u64;
        if let Some(p) = rank_partitions(partitions, rank, world).find(|&p| parts[p as usize].is_none()) {
            return Err(ClientError::Invalid(format!(
                "the state does not say where partition {p} is (rank {rank} of {world} reads it): a \
                 loader with {option} saves on each rank only that rank's partitions, so restore \
                 the states of every rank merged (load_state_dict with the list of them; \
                 LoaderState::merge in Rust)"
            )));
        }
        let mixture = match partitions == m.order.partitions {
            true => Arc::clone(m),
            false => Arc::new(m.with_partitions(partitions)?),
        };
        self.stop_producer();
        self.partitions = partitions;
        self.mixture = Some((mixture, Taken::start(1, partitions)));
        self.parts = parts;
        self.epoch = state.epoch;
        self.batches = state.batches;
        self.epoch_start = None;
        self.failed = false;
        Ok(())
    }

    /// The partitions to continue `state` with, or why it cannot be continued here.
    fn check_state(&self, state: &LoaderState) -> Result<u64> {
        if let Some(taken) = &state.mixture {
            return Err(ClientError::Invalid(format!(
                "the state was saved by a mixture of {} sources, not by a loader of one",
                taken.0.len()
            )));
        }
        let shared = &self.prepared.shared;
        if let Some(fingerprint) = state.per_rank {
            if fingerprint != shared.per_rank {
                return Err(ClientError::Invalid(
                    "the state (saved by the per-rank order of an earlier pushdown) belongs to \
                     another query, seed, rank, world size or batching"
                        .into(),
                ));
            }
            if state.batches > 0 {
                return Err(ClientError::Invalid(format!(
                    "the state was saved mid-epoch {} by the per-rank order of an earlier \
                     pushdown, which this version's global order cannot continue: restart from \
                     the start of epoch {} (a state saved at an epoch boundary restores)",
                    state.epoch, state.epoch
                )));
            }
            return Ok(self.partitions);
        }
        let world = shared.options.world_size as u64;
        if let Some(why) = shared.order.differs(&state.order, world) {
            return Err(ClientError::Invalid(why));
        }
        self.state_partitions(state)
    }

    /// The state's partitions, if this loader can read them.
    fn state_partitions(&self, state: &LoaderState) -> Result<u64> {
        let shared = &self.prepared.shared;
        let world = shared.options.world_size as u64;
        let saved = state.order.partitions;
        if let Some(asked) = shared.options.partitions
            && asked as u64 != saved
        {
            return Err(ClientError::Invalid(format!(
                "the state's order has {saved} partitions, this loader asks for {asked}: drop \
                 `partitions` to continue the state's"
            )));
        }
        check_world(saved, world)?;
        Ok(saved)
    }

    /// Iterates `count` epochs from `first` (a pass, as a `for` loop over a torch dataset
    /// makes one per epoch); `continuing`: from where the loader is (after a restore, or
    /// when it has not begun `first`), only the pass's end set. The epoch started ahead is
    /// kept when it is `first`.
    pub fn begin(&mut self, first: u64, count: u64, continuing: bool) {
        self.passes = true;
        self.end = first.saturating_add(count);
        self.failed = false;
        if continuing || (self.epoch == first && self.batches == 0) {
            // Already there (an epoch adopted ahead keeps running).
            return;
        }
        self.rx = None;
        if let Some(p) = self.producer.take() {
            p.abort();
        }
        // An epoch started ahead that is not `first` stops as it drops.
        drop(self.ahead.take_if(|a| a.epoch != first));
        self.epoch = first;
        self.batches = 0;
        self.epoch_start = None;
        if let Some((m, taken)) = &mut self.mixture
            && m.regroup.is_none()
        {
            // A packed or bucketed stream goes on where it is: its epochs only count its
            // batches.
            *taken = m.epoch_start(first);
        }
        if let Some(ahead) = self.ahead.take()
            && let Err(e) = self.adopt_ahead(ahead)
        {
            // Planned again when the epoch starts; the error, if it stays, is its error.
            tracing::debug!(error = %e, "the epoch started ahead could not be adopted");
        }
    }

    /// What a state of the per-rank order (saved by earlier versions) of these options
    /// carries: tests build such states with it.
    #[doc(hidden)]
    pub fn per_rank_fingerprint(&self) -> u64 {
        self.prepared.shared.per_rank
    }

    /// The epoch the next batch belongs to, and batches of it already given.
    pub fn position(&self) -> (u64, u64) {
        (self.epoch, self.batches)
    }

    fn block_on_replan(&self) -> Result<Prepared> {
        let runtime = self
            .runtime
            .as_ref()
            .ok_or_else(|| ClientError::Closed("the loader is shut down"))?;
        runtime.block_on(self.prepared.replan())
    }

    pub fn stats(&self) -> LoaderStats {
        let mut s = self.stats;
        let streams = *self.streams.lock();
        (s.peak_streams, s.bytes_received) = (streams.peak_streams, streams.bytes_received);
        s.elapsed = self.started.map_or(Duration::ZERO, |t| t.elapsed());
        // Epochs up to the one the consumer is in: one started ahead (the next, before its
        // first batch is given) is not yet the consumer's.
        let reached = match self.batches {
            0 => self.epoch.saturating_sub(1),
            _ => self.epoch,
        };
        s.distinct_rows = match &self.mixture {
            // Every source's rows read so far (their epochs are their own, not the mixture's).
            Some((m, _)) => (m.sources.iter())
                .map(|p| {
                    let distinct = p.shared.distinct.lock();
                    distinct.values().sum::<u64>()
                })
                .sum(),
            None => (self.prepared.shared.distinct.lock())
                .range(..=reached)
                .map(|(_, rows)| rows)
                .sum(),
        };
        s.echo = self.echo;
        s.completed = self.prepared.completed();
        s
    }

    /// Every [`APPETITE_WINDOW`] from the first batch on, tells the planner's split or the
    /// adapted one whether the consumer waited for more than [`APPETITE_WAIT`] of it: shards
    /// are run here only while the consumer waits (before the first batch it does). A split
    /// the options force (benchmarks measuring each placement) is left as asked.
    fn watch_appetite(&mut self) {
        let shared = &self.prepared.shared;
        let Some(completion) = shared
            .completion
            .as_ref()
            .filter(|_| matches!(shared.options.push, Push::Costed | Push::Adaptive(_)))
        else {
            return;
        };
        let now = Instant::now();
        let Some((since, waited)) = self.appetite else {
            self.appetite = Some((now, self.stats.waited));
            return;
        };
        let elapsed = now.duration_since(since);
        if elapsed >= APPETITE_WINDOW {
            let wait = (self.stats.waited - waited).as_secs_f64() / elapsed.as_secs_f64();
            completion.set_consumer_waiting(wait > APPETITE_WAIT);
            self.appetite = Some((now, self.stats.waited));
        }
    }

    /// Every `report_every`, sends the servers the consumer's wait and rows since the last
    /// report, in the background (a report never delays or fails a batch).
    fn maybe_report(&mut self) {
        let Some(every) = self.prepared.shared.options.report_every else {
            return;
        };
        let now = Instant::now();
        let Some((since, waited, rows)) = self.reported else {
            // The window starts at the first batch: connecting and planning are not a stall.
            self.reported = Some((now, self.stats.waited, self.stats.rows));
            return;
        };
        if now.duration_since(since) < every {
            return;
        }
        let Some(runtime) = &self.runtime else { return };
        let client = self.prepared.shared.client.clone();
        let report = pushdown_protocol::ClientReport {
            client: self.client_id,
            servers: client.urls().len().try_into().unwrap_or(u32::MAX),
            elapsed_seconds: now.duration_since(since).as_secs_f64(),
            wait_seconds: (self.stats.waited - waited).as_secs_f64(),
            rows: self.stats.rows - rows,
        };
        self.reported = Some((now, self.stats.waited, self.stats.rows));
        // Best effort, and short: it must not stop with the loader's epoch.
        pushdown_task::detach_on(runtime.handle(), async move { client.report(&report).await });
    }

    fn stop_producer(&mut self) {
        self.rx = None;
        if let Some(p) = self.producer.take() {
            p.abort();
        }
        // An epoch started ahead stops as it drops.
        self.ahead = None;
    }

    /// Starts the next epoch ahead when the shared policy says it is due (see `ahead`). Not
    /// with an automatic echo, whose factor is chosen from the whole epoch's wait.
    fn start_ahead(&mut self) {
        let options = &self.prepared.shared.options;
        let epoch = self.epoch + 1;
        let last = epoch >= self.end && !self.passes;
        if self.ahead.is_some() || last || self.mixture.is_some() || matches!(options.echo, Echo::Auto { .. })
        {
            return;
        }
        let produced = self.rx.as_ref().is_some_and(|rx| rx.is_closed());
        if !self.signal.next_due(produced) {
            return;
        }
        let Some(runtime) = &self.runtime else { return };
        let spec = EpochSpec {
            epoch,
            echo: options.echo.factor(None),
            first: 0,
            partitions: Some(self.partitions),
            finish: to_tensors,
        };
        self.ahead = Some(EpochAhead::start(
            &self.prepared,
            spec,
            self.streams.clone(),
            runtime.handle(),
        ));
    }

    /// Begins the current epoch with the one started ahead, if it is this epoch, with this
    /// echo, on the shards the servers list now ([`EpochAhead::begin`]).
    fn adopt_ahead(&mut self, ahead: EpochAhead<TensorBatch>) -> Result<()> {
        let Some(runtime) = &self.runtime else {
            return Ok(());
        };
        let begun = runtime.block_on(ahead.begin(self.epoch, self.echo, self.batches == 0))?;
        let produced = match begun {
            Begun::Taken(prepared, produced) => {
                self.prepared = prepared;
                self.stats.epochs_ahead += 1;
                produced
            }
            Begun::Failed(produced) => produced,
            Begun::Dropped => return Ok(()),
        };
        self.planned_epoch = self.epoch;
        self.rx = Some(produced.rx);
        self.producer = Some(produced.producer);
        self.signal = produced.signal;
        Ok(())
    }

    /// Starts producing the current epoch, planning it first if it is a new one.
    fn start_producer(&mut self) -> Result<()> {
        if let Some((m, taken)) = &self.mixture {
            return self.start_mixture(Arc::clone(m), taken.clone());
        }
        if self.planned_epoch != self.epoch {
            self.prepared = self.block_on_replan()?;
            self.planned_epoch = self.epoch;
        }
        let Some(runtime) = &self.runtime else {
            return Err(ClientError::Closed("the loader is shut down"));
        };
        let spec = EpochSpec {
            epoch: self.epoch,
            echo: self.echo,
            first: self.batches,
            partitions: Some(self.partitions),
            finish: to_tensors,
        };
        let produced = spec.start(&self.prepared, self.streams.clone(), runtime.handle());
        self.rx = Some(produced.rx);
        self.producer = Some(produced.producer);
        self.signal = produced.signal;
        Ok(())
    }
}

impl Loader {
    /// Starts producing the current epoch of a mixture from the consumer's position.
    fn start_mixture(&mut self, mixture: Arc<Mixture>, taken: Taken) -> Result<()> {
        let options = &self.prepared.shared.options;
        let (tx, rx) = mpsc::channel(options.prefetch.max(1));
        let producer = MixProducer {
            mixture,
            epoch: self.epoch,
            first: self.batches,
            taken,
            rank: options.rank as u64,
            world: options.world_size as u64,
            totals: self.streams.clone(),
            parts: self.parts.clone(),
        };
        let Some(runtime) = &self.runtime else {
            return Err(ClientError::Closed("the loader is shut down"));
        };
        let handle = Task::spawn_on(runtime.handle(), async move {
            if let Err(e) = producer.run(tx.clone()).await {
                let _ = tx.send(Err(e)).await;
            }
        });
        self.rx = Some(rx);
        self.producer = Some(handle);
        Ok(())
    }
}

/// The loader's own threads, each confined to the options' CPUs when they name some, as many
/// as those CPUs (else the process's) can run: `workers` for client ops and tensors (one per
/// CPU unless the options say), and [`network_threads`] for the streams. Returns the options
/// with `workers` resolved.
fn loader_runtime(mut options: LoaderOptions) -> Result<(tokio::runtime::Runtime, LoaderOptions)> {
    let cpus = crate::affinity::loader_cpus(options.cpu_affinity.as_deref())?;
    let count = cpus.as_ref().map_or_else(
        || std::thread::available_parallelism().map_or(2, std::num::NonZeroUsize::get),
        Vec::len,
    );
    let workers = options.workers.unwrap_or(count).max(1);
    options.workers = Some(workers);
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder
        .worker_threads(network_threads(count))
        .max_blocking_threads(workers)
        .thread_name("pushdown-loader")
        .enable_all();
    if let Some(cpus) = cpus {
        builder.on_thread_start(move || crate::affinity::confine_this_thread(&cpus));
    }
    let runtime = builder
        .build()
        .map_err(|e| ClientError::io("starting the loader's threads", e))?;
    Ok((runtime, options))
}

/// Threads receiving and decoding streams for a loader on `cpus` CPUs: two, and one more per
/// four CPUs past eight (IPC decoding and decompression run there), at most eight.
fn network_threads(cpus: usize) -> usize {
    (2 + cpus.saturating_sub(8) / 4).min(8)
}

impl Iterator for Loader {
    type Item = Result<TensorBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        self.started.get_or_insert_with(Instant::now);
        if self.failed {
            return None;
        }
        loop {
            if self.epoch >= self.end {
                return None;
            }
            if self.rx.is_none()
                && let Err(e) = self.start_producer()
            {
                self.failed = true;
                return Some(Err(e));
            }
            let rx = self.rx.as_mut()?;
            let start = Instant::now();
            if self.batches == 0 && self.epoch_start.is_none() {
                self.epoch_start = Some((start, self.stats.waited));
            }
            let got = rx.blocking_recv();
            self.stats.waited += start.elapsed();
            match got {
                Some(Ok(batch)) => {
                    if let Some((m, taken)) = &mut self.mixture {
                        if m.regroup.is_some() {
                            // Other ranks' partitions move too, where this rank cannot see.
                            self.parts.iter_mut().for_each(|p| *p = None);
                            for (p, pos) in &batch.parts {
                                self.parts[*p as usize] = Some(pos.clone());
                            }
                        } else {
                            m.schedule.step(taken);
                        }
                    }
                    self.batches += 1;
                    self.stats.batches += 1;
                    self.stats.rows += batch.rows as u64;
                    self.watch_appetite();
                    self.maybe_report();
                    self.start_ahead();
                    return Some(Ok(batch));
                }
                Some(Err(e)) => {
                    self.failed = true;
                    self.stop_producer();
                    return Some(Err(e));
                }
                None => {
                    let ahead = self.ahead.take();
                    self.stop_producer();
                    if let Some((since, waited)) = self.epoch_start.take() {
                        let wait = (self.stats.waited - waited).as_secs_f64();
                        self.last_wait = Some(wait / since.elapsed().as_secs_f64().max(1e-9));
                    }
                    self.echo = self.prepared.shared.options.echo.factor(self.last_wait);
                    self.epoch += 1;
                    self.batches = 0;
                    if let Some(ahead) = ahead
                        && let Err(e) = self.adopt_ahead(ahead)
                    {
                        self.failed = true;
                        return Some(Err(e));
                    }
                }
            }
        }
    }
}

impl Drop for Loader {
    fn drop(&mut self) {
        self.stop_producer();
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placements_parse_and_bad_ones_are_named() {
        assert_eq!("costed".parse::<Push>().ok(), Some(Push::Costed));
        assert_eq!("server".parse::<Push>().ok(), Some(Push::First(usize::MAX)));
        assert_eq!("trainer".parse::<Push>().ok(), Some(Push::First(0)));
        assert_eq!("adaptive".parse::<Push>().ok(), Some(Push::Adaptive(usize::MAX)));
        assert_eq!(
            "split:0.45".parse::<Push>().ok(),
            Some(Push::Split {
                first: usize::MAX,
                server_fraction: 0.45
            })
        );
        for bad in ["split:1.5", "split:x", "split", "everywhere", ""] {
            let e = bad.parse::<Push>().expect_err(bad).to_string();
            assert!(e.contains("split:F"), "{bad}: {e}");
        }
    }
}
