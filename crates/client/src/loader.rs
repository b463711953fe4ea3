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

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::{Array, ArrayRef, AsArray};
use arrow::datatypes::{DataType, SchemaRef};
use arrow::record_batch::RecordBatch;
use arrow_flight::FlightInfo;
use futures::{StreamExt, TryStreamExt};
use pushdown_planner::{Pipeline, Step};
use pushdown_protocol::{Compression, Query, ScanRequest, ShardTicket};
use tokio::sync::mpsc;

use crate::client::PushdownClient;
use crate::completion::{Completion, CompletionTotals, ShardPlacement};
use crate::connect::{ConnectOptions, plan_estimate};
use crate::error::{ClientError, Result};
use crate::order::{
    Echo, Fnv, LoaderState, Sequence, batch_key, batches_in, echoed_order, fingerprint, rank_range, segments,
    shard_order, window_rng,
};
use crate::plan::{Link, LinkSource, costed_plan_for_ranks};
use crate::steps::RowSteps;
use crate::stream::StreamOptions;
use crate::stream::StreamTotals;
use crate::stream::{Order, Segment, ShardStream};
use pushdown_planner::Plan;
use pushdown_protocol::PlanEstimate;
use pushdown_task::Task;

/// What the loader reads.
#[derive(Debug, Clone)]
pub enum LoaderSource {
    /// A row-wise SQL query (projection and filter over one dataset, server ops allowed).
    Sql(String),
    /// A pipeline: the planner places its ops; its shuffle and batch steps set the loader's
    /// shuffle window and batch size unless the options do.
    Pipeline(Pipeline),
}

/// How the loader orders, partitions and batches.
#[derive(Debug, Clone)]
pub struct LoaderOptions {
    /// Rows per batch (default: the pipeline's batch step, else 256).
    pub batch_size: Option<usize>,
    /// Rows per shuffle window (default: the pipeline's shuffle step, else 1: no shuffle).
    pub shuffle_buffer: Option<usize>,
    pub seed: u64,
    pub rank: usize,
    pub world_size: usize,
    /// Epochs to iterate.
    pub epochs: usize,
    /// Drop the rows that do not fill a batch (and those that would make ranks unequal);
    /// otherwise ranks are padded by wrapping around the epoch, as `DistributedSampler`.
    pub drop_last: bool,
    /// Batches prepared ahead of the consumer.
    pub prefetch: usize,
    /// Threads that run client-side ops and build tensors.
    pub workers: usize,
    /// Streams in flight, buffering and retries. Its `order` is not used: the loader always
    /// takes shards in its epoch's order (the streams in flight only prefetch).
    pub stream: StreamOptions,
    /// How the server compresses the stream. Default (`None`): what the link calls for
    /// ([`Link::codec`]): none to servers on this host, the servers' measured choice
    /// ([`Compression::Adaptive`]) to the rest, the planner's choice for a given bandwidth.
    /// Set it to force zstd, LZ4 or none.
    pub compression: Option<Compression>,
    /// For placing a pipeline's ops and choosing the codec. Default: [`Link::auto`], found
    /// when connecting (unlimited on this host, measured off it).
    pub link: Link,
    /// Which of a pipeline's ops run on the servers.
    pub push: Push,
    /// The token and TLS settings the servers need.
    pub connect: ConnectOptions,
    /// Data echoing: each sample delivered more than once per epoch when reading it is the
    /// bottleneck (needs a shuffle window to spread the repeats).
    pub echo: Echo,
    /// How often the loader tells its servers how long its consumer waits (the `report`
    /// action, for their scaling signal); `None` never.
    pub report_every: Option<Duration>,
}

/// Which of a pipeline's ops run on the servers. Placement never changes the samples: a
/// shard the server leaves un-reduced is finished by this client with the same kernels.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub enum Push {
    /// The planner's choice, from the servers' measurements and [`LoaderOptions::link`],
    /// which may split an op's shards between the servers and this client. Not adapted at
    /// run time (see [`Push::Adaptive`]): the planner accounts for the link, which the
    /// adaptive policy sees only through the rates it measures.
    #[default]
    Costed,
    /// Exactly the first `k` ops that may run on a server, on every shard (benchmarks that
    /// measure every placement). Not costed: the codec is [`Compression::for_link`] unless
    /// forced.
    First(usize),
    /// The first `first` ops on the server for `server_fraction` of the shards; the other
    /// shards arrive un-reduced and this client runs those ops. Not adapted.
    Split { first: usize, server_fraction: f64 },
    /// The first `k` ops, each shard's placed when it is requested, with no plan: to the end
    /// expected to finish it first, the server timed by its shards' recent latency once per
    /// round of two this trainer keeps there (a shared server's cores are divided about
    /// equally among its trainers), this client by its queue at its rate; every shard to
    /// the server while the loader's consumer does not wait. See benches/RESULTS.md, "Split
    /// placement" and "One server core shared by 3 trainers".
    Adaptive(usize),
}

impl Push {
    /// The first `first` ops on the server for `server_fraction` of the shards:
    /// [`Push::Split`], or [`Push::First`] when that is every shard.
    pub fn placed(first: usize, server_fraction: f64) -> Self {
        if server_fraction < 1.0 {
            Push::Split {
                first,
                server_fraction,
            }
        } else {
            Push::First(first)
        }
    }
}

impl std::str::FromStr for Push {
    type Err = ClientError;

    /// `costed` (the planner's choice), `server` (every op that may run on a server runs
    /// there), `trainer` (none does), `split:F` (every such op, on a fraction F of the
    /// shards) or `adaptive` (every such op, each shard placed when it is requested).
    fn from_str(s: &str) -> Result<Self> {
        let all = usize::MAX;
        match s.trim() {
            "costed" => Ok(Push::Costed),
            "server" => Ok(Push::First(all)),
            "trainer" | "client" => Ok(Push::First(0)),
            "adaptive" => Ok(Push::Adaptive(all)),
            other => match other.strip_prefix("split:").map(|f| f.trim().parse::<f64>()) {
                Some(Ok(f)) if (0.0..=1.0).contains(&f) => Ok(Push::Split {
                    first: all,
                    server_fraction: f,
                }),
                _ => Err(ClientError::Invalid(format!(
                    "placement {other:?}: one of costed, server, trainer, split:F (F in 0..=1, \
                     the servers' share of the shards), adaptive"
                ))),
            },
        }
    }
}

impl LoaderOptions {
    /// What the sample sequence takes from these options.
    pub(crate) fn sequence(&self) -> Sequence {
        Sequence {
            seed: self.seed,
            rank: self.rank as u64,
            world_size: self.world_size as u64,
            drop_last: self.drop_last,
            echo: self.echo,
        }
    }
}

impl Default for LoaderOptions {
    fn default() -> Self {
        Self {
            batch_size: None,
            shuffle_buffer: None,
            seed: 0,
            rank: 0,
            world_size: 1,
            epochs: 1,
            drop_last: false,
            prefetch: 4,
            workers: 2,
            stream: StreamOptions::default(),
            compression: None,
            link: Link::auto(),
            push: Push::Costed,
            connect: ConnectOptions::default(),
            echo: Echo::Off,
            report_every: Some(Duration::from_secs(1)),
        }
    }
}

/// One column of a batch: a contiguous tensor where the schema allows, else Arrow.
#[derive(Debug, Clone)]
pub enum Column {
    /// Row-major values of a primitive type; `shape[0]` is the batch's rows.
    Tensor { shape: Vec<usize>, values: ArrayRef },
    /// Variable-length or nullable values, as Arrow (nulls kept).
    Arrow(ArrayRef),
}

/// A batch as a trainer consumes it.
#[derive(Debug, Clone)]
pub struct TensorBatch {
    pub rows: usize,
    pub columns: Vec<(String, Column)>,
    /// The batch's index in its epoch, and the epoch.
    pub index: u64,
    pub epoch: u64,
}

impl TensorBatch {
    /// Fixed-shape integer and float columns (scalars, `FixedSizeList`s with their
    /// `pushdown.shape`) become tensors, nullable or not; everything else stays Arrow.
    /// Decided by the schema ([`Column::is_tensor`]), so a column has one type in every
    /// batch: a null where a tensor is due is an error naming the column and the row
    /// ([`ClientError::NullInTensor`]), never a switch to Arrow.
    pub fn from_record_batch(batch: &RecordBatch, epoch: u64, index: u64) -> Result<Self> {
        let rows = batch.num_rows();
        let columns = batch
            .schema()
            .fields()
            .iter()
            .zip(batch.columns())
            .map(|(field, array)| Ok((field.name().clone(), to_column(field, array, rows, index)?)))
            .collect::<Result<_>>()?;
        Ok(Self {
            rows,
            columns,
            index,
            epoch,
        })
    }

    pub fn column(&self, name: &str) -> Option<&Column> {
        self.columns.iter().find(|(n, _)| n == name).map(|(_, c)| c)
    }
}

impl Column {
    /// Whether a column of `field` arrives as a tensor: a fixed-width integer or
    /// `f32`/`f64` (what numpy and torch hold), or a `FixedSizeList` of them, whether the
    /// schema calls it nullable or not (pyarrow, pandas, Spark and `datasets` call every
    /// column nullable). Dates, decimals, `f16`, strings, lists and the rest arrive as Arrow.
    pub fn is_tensor(field: &arrow::datatypes::Field) -> bool {
        fn numeric(t: &DataType) -> bool {
            t.is_integer() || matches!(t, DataType::Float32 | DataType::Float64)
        }
        match field.data_type() {
            DataType::FixedSizeList(item, _) => numeric(item.data_type()),
            t => numeric(t),
        }
    }
}

/// The first null of a tensor column's `array` (a row, or a value inside a row's list).
fn first_null(array: &ArrayRef) -> Option<usize> {
    if let Some(nulls) = array.logical_nulls().filter(|n| n.null_count() > 0) {
        return nulls.iter().position(|valid| !valid);
    }
    if let DataType::FixedSizeList(_, n) = array.data_type() {
        let list = array.as_fixed_size_list();
        let values = list
            .values()
            .slice(list.offset() * *n as usize, list.len() * *n as usize);
        let nulls = values.logical_nulls().filter(|n| n.null_count() > 0)?;
        return nulls
            .iter()
            .position(|valid| !valid)
            .map(|i| i / (*n as usize).max(1));
    }
    None
}

fn to_column(field: &arrow::datatypes::Field, array: &ArrayRef, rows: usize, batch: u64) -> Result<Column> {
    if !Column::is_tensor(field) {
        return Ok(Column::Arrow(Arc::clone(array)));
    }
    if let Some(row) = first_null(array) {
        return Err(ClientError::NullInTensor {
            column: field.name().clone(),
            batch,
            row,
        });
    }
    Ok(match array.data_type() {
        DataType::FixedSizeList(_, n) => {
            let list = array.as_fixed_size_list();
            let n = *n as usize;
            let values = list.values();
            let values = if values.len() == rows * n {
                Arc::clone(values)
            } else {
                values.slice(list.offset() * n, rows * n)
            };
            let dims: Option<Vec<usize>> = field
                .metadata()
                .get(pushdown_ops::SHAPE_METADATA_KEY)
                .and_then(|s| s.split(',').map(|d| d.trim().parse().ok()).collect());
            let mut shape = vec![rows];
            match dims {
                Some(d) if d.iter().product::<usize>() == n => shape.extend(d),
                _ => shape.push(n),
            }
            Column::Tensor { shape, values }
        }
        _ => Column::Tensor {
            shape: vec![rows],
            values: Arc::clone(array),
        },
    })
}

/// What the consumer experienced.
#[derive(Debug, Clone, Copy, Default)]
pub struct LoaderStats {
    pub batches: u64,
    /// Samples delivered (each echo counted).
    pub rows: u64,
    /// Distinct samples read from the servers (rows of the shuffle windows filled).
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
}

impl LoaderStats {
    /// The fraction of the consumer's time spent waiting for data.
    pub fn wait_fraction(&self) -> f64 {
        self.waited.as_secs_f64() / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// Everything fixed for a prepared query's life.
#[derive(Debug)]
struct Shared {
    client: PushdownClient,
    /// The query the servers plan, each epoch.
    request: ScanRequest,
    /// Whether each shard's rows are counted (ranks, `drop_last`, resuming).
    counted: bool,
    steps: RowSteps,
    batch_size: usize,
    window: usize,
    options: LoaderOptions,
    fingerprint: u64,
    plan: Option<Plan>,
    compression: Compression,
    /// Finishes shards the servers leave un-reduced; where each shard's ops run.
    completion: Option<Arc<Completion>>,
    /// Rows read into shuffle windows, every epoch (the distinct samples of [`LoaderStats`]).
    distinct: std::sync::atomic::AtomicU64,
}

/// The query planned on one version of its dataset: the shards the servers listed, and their
/// rows.
#[derive(Debug)]
struct Shards {
    info: FlightInfo,
    /// Rows each endpoint streams (after the filter). `None`: not counted, which is allowed
    /// only when rank 0 of 1 reads every endpoint whole (no `drop_last`), or for a query that
    /// is not row-wise.
    counts: Option<Vec<u64>>,
    /// A hash of the shard tickets (dataset, file, file version, row groups, rows): what the
    /// sample sequence depends on of the dataset.
    version: u64,
}

impl Shards {
    fn new(info: FlightInfo, counts: Option<Vec<u64>>) -> Self {
        let mut h = Fnv::new();
        let mut field = |bytes: &[u8]| {
            h.eat(&(bytes.len() as u64).to_le_bytes());
            h.eat(bytes);
        };
        for endpoint in &info.endpoint {
            let ticket = endpoint.ticket.as_ref().map_or(&[][..], |t| &t.ticket[..]);
            // The shard, not the request: the codec is in the request, and no part of the
            // sample sequence.
            match ShardTicket::decode(ticket) {
                Ok(ShardTicket { shard: Some(s), .. }) => {
                    field(s.dataset.as_bytes());
                    field(s.file.as_bytes());
                    field(&s.row_groups.start.to_le_bytes());
                    field(&s.row_groups.end.to_le_bytes());
                    field(&s.rows.to_le_bytes());
                    field(&s.version.size.to_le_bytes());
                    field(s.version.hash.as_bytes());
                }
                _ => field(ticket),
            }
        }
        // 0 means "no version" in a state.
        let version = h.finish().max(1);
        Self {
            info,
            counts,
            version,
        }
    }
}

impl Shared {
    /// Plans the query again on what the servers list now. Shards planned before keep their
    /// counts (a ticket names its file version: same ticket, same rows).
    async fn replan(&self, previous: &Shards) -> Result<Shards> {
        let info = self.client.plan(&self.request).await?;
        if info.schema != previous.info.schema {
            return Err(ClientError::Changed(
                "the dataset's schema changed since the query was planned: prepare it again".into(),
            ));
        }
        let counts = if self.counted {
            let known: std::collections::HashMap<&[u8], u64> = match &previous.counts {
                Some(counts) => previous
                    .info
                    .endpoint
                    .iter()
                    .zip(counts)
                    .filter_map(|(e, c)| Some((&e.ticket.as_ref()?.ticket[..], *c)))
                    .collect(),
                None => Default::default(),
            };
            Some(count_rows(&self.client, &info, &known).await?)
        } else {
            None
        };
        Ok(Shards::new(info, counts))
    }
}

/// A query planned and ready to stream as the loader's sample sequence: connected, its ops
/// placed, its shards known (and counted where ranks or resuming need it), its client steps
/// bound. [`Loader`] and `pushdown run` are both built on it.
#[derive(Debug, Clone)]
pub struct Prepared {
    shared: Arc<Shared>,
    shards: Arc<Shards>,
}

impl Prepared {
    /// Plans `source` on `client`'s servers. A query that is not row-wise (an aggregate, a
    /// join) is streamed whole, in the server's order: it cannot be sharded over ranks or
    /// shuffled by window.
    pub async fn new(client: PushdownClient, source: LoaderSource, options: LoaderOptions) -> Result<Self> {
        let (shared, shards) = prepare(client, source, options, false).await?;
        Ok(Self {
            shared: Arc::new(shared),
            shards: Arc::new(shards),
        })
    }

    /// The same query planned on what the servers list now (files added or removed since),
    /// for the next epoch.
    pub async fn replan(&self) -> Result<Self> {
        Ok(Self {
            shared: Arc::clone(&self.shared),
            shards: Arc::new(self.shared.replan(&self.shards).await?),
        })
    }

    /// Identifies the shards this plan reads (a hash of their files, file versions and row
    /// groups).
    pub fn version(&self) -> u64 {
        self.shards.version
    }

    /// The schema of the batches, after the client steps.
    pub fn schema(&self) -> SchemaRef {
        self.shared.steps.schema()
    }

    /// The plan of a pipeline (`None` for SQL).
    pub fn plan(&self) -> Option<&Plan> {
        self.shared.plan.as_ref()
    }

    /// The servers' estimate of what the query scans.
    pub fn estimate(&self) -> Option<PlanEstimate> {
        plan_estimate(&self.shards.info)
    }

    /// How the servers compress the streams.
    pub fn compression(&self) -> Compression {
        self.shared.compression
    }

    /// The link the query was planned for, resolved against the servers ([`Link::resolve`]).
    pub fn link(&self) -> Link {
        self.shared.options.link
    }

    /// What this client did of the fragment's ops, on shards the servers left un-reduced.
    pub fn completed(&self) -> CompletionTotals {
        self.shared
            .completion
            .as_ref()
            .map_or_else(CompletionTotals::default, |c| c.totals())
    }

    /// The connection to the servers.
    pub fn client(&self) -> &PushdownClient {
        &self.shared.client
    }

    /// Shard streams (endpoints) per epoch.
    pub fn endpoints(&self) -> usize {
        self.shards.info.endpoint.len()
    }

    /// Batches `first..` of `epoch`, in order, with the client steps applied on `workers`
    /// blocking threads. `totals` receives what the streams cost when the epoch ends.
    pub fn epoch(&self, epoch: u64, first: u64, totals: Arc<std::sync::Mutex<StreamTotals>>) -> EpochBatches {
        let (tx, rx) = mpsc::channel(self.shared.options.prefetch.max(1));
        let (shared, shards) = (Arc::clone(&self.shared), Arc::clone(&self.shards));
        let watch = EpochWatch {
            totals,
            all_started: Arc::default(),
        };
        let all_started = Arc::clone(&watch.all_started);
        let producer = Task::spawn(async move {
            let finish = |batch, _, _| Ok(batch);
            // `run` has no consumer to measure: an automatic echo is not applied.
            let echo = shared.options.echo.factor(None);
            let producer = Producer::new(shared, shards, epoch, echo, first);
            if let Err(e) = producer.run(tx.clone(), finish, watch).await {
                let _ = tx.send(Err(e)).await;
            }
        });
        EpochBatches {
            rx,
            _producer: producer,
            all_started,
        }
    }
}

/// The record batches of one epoch of a [`Prepared`] query, in order.
#[derive(Debug)]
pub struct EpochBatches {
    rx: mpsc::Receiver<Result<RecordBatch>>,
    /// Held for its drop: the producer is aborted when the batches are dropped.
    _producer: Task<()>,
    all_started: Arc<std::sync::atomic::AtomicBool>,
}

impl EpochBatches {
    /// Whether every shard of the epoch is in flight: from then on its tail leaves cores
    /// idle, and the next epoch may start.
    pub fn all_started(&self) -> bool {
        self.all_started.load(std::sync::atomic::Ordering::Acquire)
    }
}

impl futures::Stream for EpochBatches {
    type Item = Result<RecordBatch>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx)
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
    /// The next epoch, started once this one's last shards are in flight.
    ahead: Option<Ahead>,
    /// What the finished epochs' streams cost (bytes, retries, streams in flight).
    streams: Arc<std::sync::Mutex<StreamTotals>>,
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

/// An epoch started before the consumer reaches it, so that filling its first shuffle
/// window overlaps the end of the epoch before instead of stalling the trainer at every
/// boundary. Its plan is checked when it begins: if the servers list other shards by then
/// (a file added, removed or rewritten), it is dropped and the epoch planned afresh, so an
/// epoch still reads what the servers list when it starts.
struct Ahead {
    epoch: u64,
    echo: u64,
    rx: mpsc::Receiver<Result<TensorBatch>>,
    producer: Task<()>,
    prepared: tokio::sync::oneshot::Receiver<Prepared>,
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
    /// Connects, plans, and counts each shard's rows. Blocks; call from a plain thread.
    pub fn new<S: AsRef<str>>(servers: &[S], source: LoaderSource, options: LoaderOptions) -> Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .max_blocking_threads(options.workers.max(1))
            .thread_name("pushdown-loader")
            .enable_all()
            .build()
            .map_err(|e| ClientError::io("starting the loader's threads", e))?;
        let servers: Vec<String> = servers.iter().map(|s| s.as_ref().to_owned()).collect();
        let shared_echo = options.echo;
        let options_epochs = options.epochs as u64;
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
        Ok(Self {
            runtime: Some(runtime),
            prepared: Prepared {
                shared: Arc::new(shared),
                shards: Arc::new(shards),
            },
            planned_epoch: 0,
            epoch: 0,
            batches: 0,
            end: options_epochs,
            passes: false,
            rx: None,
            producer: None,
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
            streams: Arc::default(),
        })
    }

    /// The schema of the batches' columns.
    pub fn schema(&self) -> SchemaRef {
        self.prepared.shared.steps.schema()
    }

    /// Rows each rank gets per epoch (echoes counted), and batches per epoch, as the current
    /// (or last) epoch was planned: a growing dataset gives later epochs more.
    pub fn epoch_len(&self) -> (u64, u64) {
        let n: u64 = self.prepared.shards.counts.iter().flatten().sum();
        let (rows, _) = rank_range(n, &self.prepared.shared.options.sequence());
        let rows = rows * self.echo;
        (
            rows,
            batches_in(
                rows,
                self.prepared.shared.batch_size as u64,
                self.prepared.shared.options.drop_last,
            ),
        )
    }

    pub fn state(&self) -> LoaderState {
        let mid_epoch = self.batches > 0 && self.planned_epoch == self.epoch;
        LoaderState {
            fingerprint: self.prepared.shared.fingerprint,
            epoch: self.epoch,
            batches: self.batches,
            version: if mid_epoch { self.prepared.version() } else { 0 },
            echo: self.echo,
        }
    }

    /// Continues from `state`: the next batch is the one the saved loader would have given.
    /// Mid-epoch, that needs the shards the epoch was planned on: a dataset changed since is
    /// refused by name (restore at an epoch boundary instead, which plans on the new version).
    pub fn restore(&mut self, state: LoaderState) -> Result<()> {
        if state.fingerprint != self.prepared.shared.fingerprint {
            return Err(ClientError::Invalid(
                "the state belongs to another query, seed, rank, world size or batching".into(),
            ));
        }
        self.stop_producer();
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
        if let Some(ahead) = self.ahead.take_if(|a| a.epoch != first) {
            ahead.producer.abort();
        }
        self.epoch = first;
        self.batches = 0;
        self.epoch_start = None;
        if let Some(ahead) = self.ahead.take()
            && let Err(e) = self.adopt_ahead(ahead)
        {
            // Planned again when the epoch starts; the error, if it stays, is its error.
            tracing::debug!(error = %e, "the epoch started ahead could not be adopted");
        }
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
        let streams = *self.streams.lock().unwrap_or_else(|p| p.into_inner());
        (s.peak_streams, s.bytes_received) = (streams.peak_streams, streams.bytes_received);
        s.elapsed = self.started.map_or(Duration::ZERO, |t| t.elapsed());
        s.distinct_rows = self
            .prepared
            .shared
            .distinct
            .load(std::sync::atomic::Ordering::Relaxed);
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
        if let Some(ahead) = self.ahead.take() {
            ahead.producer.abort();
        }
    }

    /// Once the current epoch's last shards are in flight (or its producer is done), starts
    /// the next epoch's producer (planned now, checked again when it begins). Not with an
    /// automatic echo, whose factor is chosen from the whole epoch's wait.
    fn start_ahead(&mut self) {
        let options = &self.prepared.shared.options;
        let epoch = self.epoch + 1;
        let last = epoch >= self.end && !self.passes;
        if self.ahead.is_some() || last || matches!(options.echo, Echo::Auto { .. }) {
            return;
        }
        // Start when this epoch's last shards are in flight: from then on its streams leave
        // servers idle (fewer shards than streams), so the next epoch's take up the slack.
        let shards = self.prepared.shards.info.endpoint.len().max(1) as u64;
        let all_rows: u64 = self.prepared.shards.counts.iter().flatten().sum();
        let horizon = all_rows.div_ceil(shards) * self.echo * options.stream.concurrency.max(1) as u64;
        let (rows, _) = self.epoch_len();
        let remaining = rows.saturating_sub(self.batches * self.prepared.shared.batch_size as u64);
        let produced = self.rx.as_ref().is_some_and(|rx| rx.is_closed());
        if !(produced || remaining <= horizon) {
            return;
        }
        let Some(runtime) = &self.runtime else { return };
        let (tx, rx) = mpsc::channel(options.prefetch.max(1));
        let (planned, prepared) = tokio::sync::oneshot::channel();
        let base = self.prepared.clone();
        let echo = options.echo.factor(None);
        let streams = Arc::clone(&self.streams);
        let producer = Task::spawn_on(runtime.handle(), async move {
            let next = match base.replan().await {
                Ok(next) => next,
                Err(e) => {
                    let _ = tx.send(Err(e)).await;
                    return;
                }
            };
            let (shared, shards) = (Arc::clone(&next.shared), Arc::clone(&next.shards));
            let _ = planned.send(next);
            let producer = Producer::new(shared, shards, epoch, echo, 0);
            let watch = EpochWatch {
                totals: Arc::clone(&streams),
                ..EpochWatch::default()
            };
            if let Err(e) = producer.run(tx.clone(), to_tensors, watch).await {
                let _ = tx.send(Err(e)).await;
            }
        });
        self.ahead = Some(Ahead {
            epoch,
            echo,
            rx,
            producer,
            prepared,
        });
    }

    /// Begins the current epoch with the one started ahead, if it is this epoch, with this
    /// echo, on the shards the servers list now. Planning it now failing is the epoch's
    /// error (planned again, it would wait the same deadlines to fail the same way).
    fn adopt_ahead(&mut self, ahead: Ahead) -> Result<()> {
        let Some(runtime) = &self.runtime else {
            return Ok(());
        };
        if ahead.epoch != self.epoch || ahead.echo != self.echo || self.batches != 0 {
            ahead.producer.abort();
            return Ok(());
        }
        let Ok(prepared) = runtime.block_on(ahead.prepared) else {
            // Its planning failed: the error waits in its channel.
            self.rx = Some(ahead.rx);
            self.producer = Some(ahead.producer);
            self.planned_epoch = self.epoch;
            return Ok(());
        };
        let shared = Arc::clone(&prepared.shared);
        let current = runtime.block_on(async move { shared.client.plan(&shared.request).await });
        match current.map(|info| Shards::new(info, None).version) {
            Ok(version) if version == prepared.version() => {
                self.prepared = prepared;
                self.planned_epoch = self.epoch;
                self.rx = Some(ahead.rx);
                self.producer = Some(ahead.producer);
            }
            // The shards changed: plan the epoch afresh.
            Ok(_) => ahead.producer.abort(),
            Err(e) => {
                ahead.producer.abort();
                return Err(e);
            }
        }
        Ok(())
    }

    /// Starts producing the current epoch, planning it first if it is a new one.
    fn start_producer(&mut self) -> Result<()> {
        if self.planned_epoch != self.epoch {
            self.prepared = self.block_on_replan()?;
            self.planned_epoch = self.epoch;
        }
        let (tx, rx) = mpsc::channel(self.prepared.shared.options.prefetch.max(1));
        let (shared, shards) = (
            Arc::clone(&self.prepared.shared),
            Arc::clone(&self.prepared.shards),
        );
        let (epoch, first, echo) = (self.epoch, self.batches, self.echo);
        let streams = Arc::clone(&self.streams);
        let Some(runtime) = &self.runtime else {
            return Err(ClientError::Closed("the loader is shut down"));
        };
        let handle = Task::spawn_on(runtime.handle(), async move {
            let producer = Producer::new(shared, shards, epoch, echo, first);
            let watch = EpochWatch {
                totals: Arc::clone(&streams),
                ..EpochWatch::default()
            };
            if let Err(e) = producer.run(tx.clone(), to_tensors, watch).await {
                let _ = tx.send(Err(e)).await;
            }
        });
        self.rx = Some(rx);
        self.producer = Some(handle);
        Ok(())
    }
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

/// Plans `source`: places a pipeline's ops, opens the query, counts each shard's rows when
/// ranks or `drop_last` need them or `count` asks (the Loader: `epoch_len` and resuming),
/// binds the client steps.
async fn prepare(
    client: PushdownClient,
    source: LoaderSource,
    mut options: LoaderOptions,
    count: bool,
) -> Result<(Shared, Shards)> {
    options.link = options.link.resolve(&client.urls()).await;
    if options.world_size == 0 || options.rank >= options.world_size {
        return Err(ClientError::Invalid(format!(
            "rank {} is not in 0..{}",
            options.rank, options.world_size
        )));
    }
    let SourceQuery {
        mut request,
        steps,
        dataset,
        batch_step,
        shuffle_step,
        plan,
    } = SourceQuery::new(&client, &source, &options).await?;
    if let Some(forced) = options.compression {
        request.compression = forced;
    }
    // Each stream ends with the server's accounting of it (one small message).
    request.stats = true;
    let (batch_size, window) = batch_and_window(&mut options, batch_step, shuffle_step)?;
    let (info, counts) = plan_shards(&client, &request, &options, window, count).await?;
    let resources: Arc<dyn pushdown_ops::Resources> = match &dataset {
        Some(d) => Arc::new(client.resources_for(&steps, d).await?),
        None => Arc::new(pushdown_ops::NoResources),
    };
    let schema = Arc::new(info.clone().try_decode_schema()?);
    let completion = completion_for(&client, plan.as_ref(), dataset.as_deref(), &schema).await?;
    let plan = plan.map(|(plan, _)| plan);
    let steps = RowSteps::new(&steps, schema, options.seed, resources)?;
    let fingerprint = fingerprint(&request, &options.sequence(), batch_size, window);
    let compression = request.compression;
    let shared = Shared {
        client,
        request,
        counted: counts.is_some(),
        steps,
        batch_size,
        window,
        options,
        fingerprint,
        plan,
        compression,
        completion,
        distinct: Default::default(),
    };
    Ok((shared, Shards::new(info, counts)))
}

/// What a source asks of the servers, and what it leaves to this client.
struct SourceQuery {
    request: ScanRequest,
    /// The client's row-wise steps (a pipeline's, less its batch and shuffle steps).
    steps: Vec<Step>,
    /// The dataset a pipeline reads (where its ops' resources come from).
    dataset: Option<String>,
    /// The batch size (and `drop_last`) and shuffle window a pipeline's steps ask for.
    batch_step: Option<(usize, bool)>,
    shuffle_step: Option<usize>,
    /// A pipeline's plan, and where each shard's fragment ops run.
    plan: Option<(Plan, ShardPlacement)>,
}

impl SourceQuery {
    /// SQL as it is; a pipeline with its ops placed (`place_pipeline`) and its fragment the query.
    async fn new(client: &PushdownClient, source: &LoaderSource, options: &LoaderOptions) -> Result<Self> {
        match source {
            LoaderSource::Sql(sql) => {
                let mut request = ScanRequest::new(Query::Sql(sql.clone()));
                request.compression = options.link.codec();
                Ok(Self {
                    request,
                    steps: Vec::new(),
                    dataset: None,
                    batch_step: None,
                    shuffle_step: None,
                    plan: None,
                })
            }
            LoaderSource::Pipeline(pipeline) => {
                let schema = client.dataset_schema(&pipeline.dataset).await?;
                let (plan, compression, placement) =
                    place_pipeline(client, pipeline, &schema, options).await?;
                let (batch_step, shuffle_step, steps) = client_steps(&plan);
                let mut request = ScanRequest::new(Query::Fragment(plan.fragment.clone()));
                request.compression = compression;
                Ok(Self {
                    request,
                    steps,
                    dataset: Some(pipeline.dataset.clone()),
                    batch_step,
                    shuffle_step,
                    plan: Some((plan, placement)),
                })
            }
        }
    }
}

/// Places `pipeline`'s ops as `options.push` asks: the plan, the codec of its streams, and
/// where each shard's fragment ops run.
async fn place_pipeline(
    client: &PushdownClient,
    pipeline: &Pipeline,
    schema: &arrow::datatypes::Schema,
    options: &LoaderOptions,
) -> Result<(Plan, Compression, ShardPlacement)> {
    let cores = options.link.trainer_cores().ceil() as usize;
    let forced = |first: usize, server_fraction: f64, adaptive: bool| -> Result<_> {
        Ok((
            pushdown_planner::plan_limited(pipeline, schema, first)?,
            options.link.codec(),
            ShardPlacement {
                server_fraction,
                adaptive,
                cores,
            },
        ))
    };
    Ok(match options.push {
        Push::Costed => {
            let costed =
                costed_plan_for_ranks(client, pipeline, schema, options.link, options.world_size).await?;
            let placement = ShardPlacement {
                server_fraction: costed.chosen.server_fraction,
                adaptive: false,
                cores,
            };
            // A given bandwidth is planned for, codec included; a found one is
            // unlimited (none) or measured by the servers as they send.
            let compression = match options.link.source {
                LinkSource::Given => costed.chosen.compression,
                _ => options.link.codec(),
            };
            (costed.plan, compression, placement)
        }
        Push::First(k) => forced(k, 1.0, false)?,
        Push::Split {
            first,
            server_fraction,
        } => forced(first, server_fraction, false)?,
        Push::Adaptive(k) => forced(k, 1.0, true)?,
    })
}

/// A plan's client steps: the batch size (and `drop_last`) and shuffle window they ask for,
/// and the row-wise rest, in order.
fn client_steps(plan: &Plan) -> (Option<(usize, bool)>, Option<usize>, Vec<Step>) {
    let (mut batch, mut shuffle) = (None, None);
    let mut row_steps = Vec::new();
    for step in &plan.client_steps {
        match step {
            Step::Batch { size, drop_last } => batch = Some((*size, *drop_last)),
            Step::Shuffle { buffer } => shuffle = Some(*buffer),
            other => row_steps.push(other.clone()),
        }
    }
    (batch, shuffle, row_steps)
}

/// Rows per batch and per shuffle window: the options', else the pipeline's steps', else
/// 256 and 1 (no shuffle). A pipeline's batch step is honoured, its `drop_last` included: a
/// batch size in the options that disagrees with it is an error, not an override.
fn batch_and_window(
    options: &mut LoaderOptions,
    batch_step: Option<(usize, bool)>,
    shuffle_step: Option<usize>,
) -> Result<(usize, usize)> {
    if let (Some(asked), Some((size, _))) = (options.batch_size, batch_step)
        && asked != size
    {
        return Err(ClientError::Invalid(format!(
            "batch_size {asked} disagrees with the pipeline's batch step ({size} rows): give one \
             (drop batch_size, or change the step)"
        )));
    }
    if let Some((_, true)) = batch_step {
        options.drop_last = true;
    }
    let batch_size = options
        .batch_size
        .or(batch_step.map(|(size, _)| size))
        .unwrap_or(256)
        .max(1);
    let window = options.shuffle_buffer.or(shuffle_step).unwrap_or(1).max(1);
    if options.echo != Echo::Off && window < 2 {
        return Err(ClientError::Invalid(
            "data echoing spreads each sample's repeats through the shuffle window: set a \
             shuffle buffer of 2 rows or more"
                .into(),
        ));
    }
    Ok((batch_size, window))
}

/// Opens the query: the servers' plan of its shards (a query that is not row-wise refused
/// where ranks, a shuffle window or `drop_last` need one), and each shard's rows where those
/// or `count` need them (`None`: not counted).
async fn plan_shards(
    client: &PushdownClient,
    request: &ScanRequest,
    options: &LoaderOptions,
    window: usize,
    count: bool,
) -> Result<(FlightInfo, Option<Vec<u64>>)> {
    // No endpoints is an answer: the server's statistics ruled every row group out, or the
    // dataset is empty. Epochs are then empty.
    let info = client.plan(request).await?;
    let row_wise = plan_estimate(&info).is_some_and(|e| e.row_wise);
    if !row_wise && (options.world_size > 1 || window > 1 || options.drop_last) {
        return Err(ClientError::Invalid(
            "ranks, shuffling and drop_last need a row-wise query (projection and filter over one \
             dataset): this one is streamed whole"
                .into(),
        ));
    }
    let counted = row_wise && (count || options.world_size > 1 || options.drop_last);
    let counts = if counted {
        Some(count_rows(client, &info, &Default::default()).await?)
    } else {
        None
    };
    Ok((info, counts))
}

/// What finishes the shards the servers leave un-reduced, for a pipeline with fragment ops.
async fn completion_for(
    client: &PushdownClient,
    plan: Option<&(Plan, ShardPlacement)>,
    dataset: Option<&str>,
    schema: &SchemaRef,
) -> Result<Option<Arc<Completion>>> {
    match (plan, dataset) {
        (Some((plan, placement)), Some(d)) if !plan.fragment.ops.is_empty() => {
            let ops = plan.fragment.ops.clone();
            let resources = Arc::new(client.resources_for_calls(&ops, d).await?);
            Ok(Some(Arc::new(Completion::new(
                *placement,
                ops,
                Arc::clone(schema),
                resources,
            ))))
        }
        _ => Ok(None),
    }
}

/// The rows each endpoint of `info` streams, counted by the servers (the `count` action),
/// except those `known` by ticket.
async fn count_rows(
    client: &PushdownClient,
    info: &FlightInfo,
    known: &std::collections::HashMap<&[u8], u64>,
) -> Result<Vec<u64>> {
    // Collected first: a stream over a mapping closure is not provably `Send` for every
    // lifetime (rustc's higher-ranked check), and loaders plan on spawned tasks.
    let counts: Vec<_> = info
        .endpoint
        .iter()
        .map(|e| async move {
            match e.ticket.as_ref().and_then(|t| known.get(&t.ticket[..])) {
                Some(rows) => Ok(*rows),
                None => client.count(e).await,
            }
        })
        .collect();
    futures::stream::iter(counts).buffered(16).try_collect().await
}

/// One epoch of a prepared query from batch `first` on: its shards' rows read in the epoch's
/// order, permuted by window, batched, and each batch finished on a worker thread.
struct Producer {
    shared: Arc<Shared>,
    shards: Arc<Shards>,
    epoch: u64,
    /// Times each sample repeats (at least 1).
    echo: u64,
    first: u64,
}

/// A producer's rows on their way from its stream to its workers, and where it is in the
/// epoch.
struct Batching<T> {
    /// Rows of the current window.
    pending: VecDeque<RecordBatch>,
    pending_rows: usize,
    /// Permuted windows, not yet batched. Rows are never copied before their batch is
    /// gathered, once, on a worker thread.
    shuffled: VecDeque<Window>,
    shuffled_rows: usize,
    /// The next window to permute (without a shuffle, the next row).
    window: u64,
    /// Rows of the first window permuted that come before batch `first`, not delivered.
    drop_rows: usize,
    next_batch: u64,
    total_batches: u64,
    in_flight: futures::stream::FuturesOrdered<tokio::task::JoinHandle<Result<T>>>,
    workers: usize,
    /// Rows read ahead of the batches being handed out: the window being emitted and the next
    /// one filling. Reading goes on while the consumer takes a window's batches, so the
    /// servers never wait for a window to drain (they did: the epoch alternated between
    /// filling a window, the consumer waiting, and emitting it, the servers idle).
    ahead: usize,
    schema: SchemaRef,
    finish: fn(RecordBatch, u64, u64) -> Result<T>,
    /// The stream has ended.
    done: bool,
}

impl<T> Batching<T> {
    /// Whether every batch there is has been handed out.
    fn finished(&self) -> bool {
        self.done
            && self.in_flight.is_empty()
            && (self.next_batch >= self.total_batches || self.shuffled_rows == 0)
    }

    /// Whether to read on: the stream has more, and fewer rows than `ahead` are held.
    fn reads(&self) -> bool {
        !self.done && self.pending_rows + self.shuffled_rows < self.ahead
    }
}

impl Producer {
    fn new(shared: Arc<Shared>, shards: Arc<Shards>, epoch: u64, echo: u64, first: u64) -> Self {
        Self {
            shared,
            shards,
            epoch,
            echo: echo.max(1),
            first,
        }
    }

    /// Produces batches `first..` of `epoch` into `tx`, each finished by `finish(batch, epoch,
    /// index)` on a worker thread; adds what the streams cost to `watch.totals` at the end.
    async fn run<T: Send + 'static>(
        self,
        tx: mpsc::Sender<Result<T>>,
        finish: fn(RecordBatch, u64, u64) -> Result<T>,
        watch: EpochWatch,
    ) -> Result<()> {
        let (b, s) = (self.shared.batch_size as u64, self.shared.window as u64);
        let echo = self.echo;
        // Positions are in the echoed sequence: a window of `s` rows read gives `s × echo`.
        let skip = self.first * b;
        let window = skip / (s * echo);
        let drop_rows = (skip - window * s * echo) as usize;
        let Some((segments, total_batches)) = self.seek(window)? else {
            return Ok(());
        };
        let mut stream = self.open_stream(segments, &watch)?;
        let mut at = self.batching(window, drop_rows, total_batches, stream.schema(), finish);
        loop {
            self.permute_windows(&mut at);
            self.dispatch(&mut at);
            if at.finished() {
                break;
            }
            // Hand out the oldest batch, or read on: whichever can go first.
            let read = at.reads();
            tokio::select! {
                biased;
                sent = send_next(&mut at.in_flight, &tx), if !at.in_flight.is_empty() => sent?,
                batch = stream.next(), if read => match batch {
                    Some(batch) => {
                        let batch = batch?;
                        at.pending_rows += batch.num_rows();
                        at.pending.push_back(batch);
                    }
                    None => at.done = true,
                },
                else => break,
            }
        }
        while !at.in_flight.is_empty() {
            send_next(&mut at.in_flight, &tx).await?;
        }
        *watch.totals.lock().unwrap_or_else(|p| p.into_inner()) += stream.totals();
        Ok(())
    }

    /// The parts of the shards this rank reads from window `window` on, in the epoch's shard
    /// order, and the epoch's batches; `None` when it has no batch `first`.
    fn seek(&self, window: u64) -> Result<Option<(Vec<Segment>, u64)>> {
        let (shared, shards, epoch) = (&self.shared, &self.shards, self.epoch);
        let (b, s) = (shared.batch_size as u64, shared.window as u64);
        let order = shard_order(shared.options.seed, epoch, shards.info.endpoint.len());
        let endpoints = shards.info.endpoint.len() as u64;
        let segment = |shard: usize, skip: u64, take: Option<u64>| Segment {
            endpoint: shards.info.endpoint[shard].clone(),
            index: shard,
            skip,
            take,
            position: epoch * endpoints + shard as u64,
        };
        match &shards.counts {
            Some(counts) => {
                let n: u64 = counts.iter().sum();
                let (per_rank, rank_start) = rank_range(n, &shared.options.sequence());
                let total_batches = batches_in(per_rank * self.echo, b, shared.options.drop_last);
                if self.first >= total_batches {
                    return Ok(None);
                }
                // Seek: to the window holding the first row of batch `first`.
                let parts = segments(counts, &order, rank_start + window * s, rank_start + per_rank);
                let segments: Vec<Segment> = parts
                    .into_iter()
                    .map(|(shard, skip, take)| segment(shard, skip, Some(take)))
                    .collect();
                Ok(Some((segments, total_batches)))
            }
            // Not counted: rank 0 of 1 reads every endpoint whole, in the epoch's shard order
            // (the same rows, in the same order, as the counted segments), to the end.
            None => {
                if self.first > 0 {
                    return Err(ClientError::Invalid(
                        "resuming mid-epoch needs each shard's rows counted".into(),
                    ));
                }
                let segments: Vec<Segment> = order.iter().map(|&shard| segment(shard, 0, None)).collect();
                Ok(Some((segments, u64::MAX)))
            }
        }
    }

    /// Streams `segments` in order (the streams in flight only prefetch), finishing shards the
    /// servers leave un-reduced, and telling `watch` once every one is in flight.
    fn open_stream(&self, segments: Vec<Segment>, watch: &EpochWatch) -> Result<ShardStream> {
        let shared = &self.shared;
        let mut options = shared.options.stream.clone();
        options.order = Order::Sequential;
        let fleet = Arc::clone(shared.client.fleet());
        let stream = ShardStream::segments(fleet, &self.shards.info, segments, options)?;
        Ok(stream
            .with_completion(shared.completion.clone())
            .signal_all_started(Arc::clone(&watch.all_started)))
    }

    /// Nothing read yet: the next window is `window`, and its first `drop_rows` rows come
    /// before batch `first`.
    fn batching<T>(
        &self,
        window: u64,
        drop_rows: usize,
        total_batches: u64,
        schema: SchemaRef,
        finish: fn(RecordBatch, u64, u64) -> Result<T>,
    ) -> Batching<T> {
        let workers = self.shared.options.workers.max(1);
        Batching {
            pending: VecDeque::new(),
            pending_rows: 0,
            shuffled: VecDeque::new(),
            shuffled_rows: 0,
            window,
            drop_rows,
            next_batch: self.first,
            total_batches,
            in_flight: futures::stream::FuturesOrdered::new(),
            workers,
            ahead: 2 * self.shared.window.max(self.shared.batch_size * workers),
            schema,
            finish,
            done: false,
        }
    }

    /// Permutes the full windows (or, once the stream has ended, the last one) and queues
    /// them for batching.
    fn permute_windows<T>(&self, at: &mut Batching<T>) {
        let shared = &self.shared;
        while at.pending_rows >= shared.window || (at.done && at.pending_rows > 0) {
            // Without a shuffle every row is a window of its own, in order: all the rows
            // pending are taken at once (the same order, without a window per row).
            let unshuffled = shared.window == 1;
            let take = if unshuffled {
                at.pending_rows
            } else {
                at.pending_rows.min(shared.window)
            };
            let parts = split_rows(&mut at.pending, take);
            at.pending_rows -= take;
            shared
                .distinct
                .fetch_add(take as u64, std::sync::atomic::Ordering::Relaxed);
            let rows: Vec<(u32, u32)> = parts
                .iter()
                .enumerate()
                .flat_map(|(p, b)| (0..b.num_rows() as u32).map(move |r| (p as u32, r)))
                .collect();
            let order = if unshuffled {
                at.window += take as u64;
                rows
            } else {
                let order = echoed_order(
                    rows,
                    self.echo,
                    &mut window_rng(&shared.options.sequence(), self.epoch, at.window),
                );
                at.window += 1;
                order
            };
            let d = at.drop_rows.min(order.len());
            at.drop_rows -= d;
            let order: VecDeque<(u32, u32)> = order.into_iter().skip(d).collect();
            at.shuffled_rows += order.len();
            at.shuffled.push_back(Window { parts, order });
        }
    }

    /// Hands whole batches (or, once the stream has ended, the last partial one) to the
    /// workers, as many as they take.
    fn dispatch<T: Send + 'static>(&self, at: &mut Batching<T>) {
        let shared = &self.shared;
        while at.in_flight.len() < at.workers
            && at.next_batch < at.total_batches
            && (at.shuffled_rows >= shared.batch_size || (at.done && at.shuffled_rows > 0))
        {
            let take = at.shuffled_rows.min(shared.batch_size);
            let gather = Gather::take(&mut at.shuffled, take);
            at.shuffled_rows -= take;
            let key = batch_key(&shared.options.sequence(), self.epoch, at.next_batch);
            let (epoch, index, finish) = (self.epoch, at.next_batch, at.finish);
            let worker_shared = Arc::clone(shared);
            let schema = Arc::clone(&at.schema);
            at.in_flight.push_back(tokio::task::spawn_blocking(move || {
                let rows = gather.run(&schema)?;
                finish(worker_shared.steps.apply(rows, key)?, epoch, index)
            }));
            at.next_batch += 1;
        }
    }
}

/// What a producer tells its reader besides batches.
#[derive(Debug, Clone, Default)]
struct EpochWatch {
    /// What the epoch's streams cost, added when it ends.
    totals: Arc<std::sync::Mutex<StreamTotals>>,
    /// Set once every shard of the epoch is in flight.
    all_started: Arc<std::sync::atomic::AtomicBool>,
}

/// A permuted window: the received batches holding its rows, and the rows' order as
/// (batch, row) positions, front first.
struct Window {
    parts: Vec<RecordBatch>,
    order: VecDeque<(u32, u32)>,
}

/// One batch's rows, as positions into the (shared) batches that hold them.
struct Gather {
    sources: Vec<RecordBatch>,
    indices: Vec<(usize, usize)>,
}

impl Gather {
    /// Takes the next `n` permuted rows, spanning windows where a batch does.
    fn take(windows: &mut VecDeque<Window>, n: usize) -> Self {
        let mut sources = Vec::new();
        let mut indices = Vec::with_capacity(n);
        while indices.len() < n {
            let Some(front) = windows.front_mut() else { break };
            let base = sources.len();
            sources.extend(front.parts.iter().cloned());
            let want = (n - indices.len()).min(front.order.len());
            indices.extend(
                front
                    .order
                    .drain(..want)
                    .map(|(p, r)| (base + p as usize, r as usize)),
            );
            if front.order.is_empty() {
                windows.pop_front();
            }
        }
        Self { sources, indices }
    }

    /// Copies the rows into one batch: each value is copied once.
    fn run(&self, schema: &SchemaRef) -> Result<RecordBatch> {
        let columns = (0..schema.fields().len())
            .map(|c| {
                let arrays: Vec<&dyn Array> = self.sources.iter().map(|b| b.column(c).as_ref()).collect();
                arrow::compute::interleave(&arrays, &self.indices)
            })
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let options = arrow::record_batch::RecordBatchOptions::new().with_row_count(Some(self.indices.len()));
        Ok(RecordBatch::try_new_with_options(
            Arc::clone(schema),
            columns,
            &options,
        )?)
    }
}

async fn send_next<T>(
    in_flight: &mut futures::stream::FuturesOrdered<tokio::task::JoinHandle<Result<T>>>,
    tx: &mpsc::Sender<Result<T>>,
) -> Result<()> {
    // Room first, then the batch: dropped at any await (the producer reads on meanwhile),
    // it loses nothing.
    let Ok(room) = tx.reserve().await else {
        // The consumer is gone (restored or dropped): stop quietly.
        return Err(ClientError::Closed("the loader's consumer is gone"));
    };
    if let Some(joined) = in_flight.next().await {
        let batch = joined.map_err(|source| ClientError::Task {
            what: "a loader worker",
            source,
        })??;
        room.send(Ok(batch));
    }
    Ok(())
}

/// Removes the first `n` rows of `queue`, as slices of its batches (no copy).
fn split_rows(queue: &mut VecDeque<RecordBatch>, n: usize) -> Vec<RecordBatch> {
    let mut parts = Vec::new();
    let mut left = n;
    while left > 0 {
        let Some(front) = queue.pop_front() else { break };
        if front.num_rows() <= left {
            left -= front.num_rows();
            parts.push(front);
        } else {
            parts.push(front.slice(0, left));
            queue.push_front(front.slice(left, front.num_rows() - left));
            left = 0;
        }
    }
    parts
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
