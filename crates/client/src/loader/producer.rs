//! One epoch of a rank, produced: its partitions streamed side by side, each permuted by
//! window, the windows' batches cut from every partition's chunk, each batch finished on a
//! worker thread. What is read and in which order is `order.rs`'s; this module only follows it.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;

use arrow::array::Array;
use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use futures::StreamExt;
use tokio::sync::mpsc;

use super::prepared::{Shards, Shared};
use crate::error::{ClientError, Result};
use crate::order::{
    Permutation, RankSlice, Shape, batch_key, locate, plan_window, plan_window_at, segments, shard_order,
};
use crate::stream::SharedTotals;
use crate::stream::{Order, Segment, ShardStream};

/// One epoch of a prepared query from batch `first` on: the rank's partitions read side by
/// side in the epoch's order, permuted by window, batched, and each batch finished on a
/// worker thread.
pub(super) struct Producer {
    pub(super) shared: Arc<Shared>,
    pub(super) shards: Arc<Shards>,
    pub(super) epoch: u64,
    /// Times each sample repeats (at least 1).
    pub(super) echo: u64,
    pub(super) first: u64,
    /// The order's partitions (the options', or a restored state's).
    pub(super) partitions: u64,
    /// A mixture's feed: one partition read alone, every row of it (no `drop_last`, no
    /// repeated row), by one of `readers` producers sharing the stream budget.
    pub(super) part: Option<(u64, usize)>,
}

/// What a rank reads of an epoch: the global order's shape (`None`: not counted, when rank 0
/// of 1 reads every shard whole in one partition) and its partitions.
pub(super) struct RankPlan {
    pub(super) shape: Option<Shape>,
    pub(super) slice: RankSlice,
    /// Batches the rank gives in the epoch (echoes counted); `u64::MAX` when not counted.
    pub(super) total: u64,
}

/// One partition's stream and its rows not yet in a window.
pub(super) struct Cursor {
    pub(super) partition: u64,
    pub(super) stream: Option<ShardStream>,
    pub(super) pending: VecDeque<RecordBatch>,
    pub(super) pending_rows: usize,
    /// Rows held beyond which it stops reading (two windows' worth).
    pub(super) limit: usize,
    pub(super) done: bool,
    pub(super) started: Arc<AtomicBool>,
}

/// A producer's rows on their way from its streams to its workers, and where it is in the
/// epoch.
/// An epoch's batching that adds what its streams cost to `totals` when it is dropped: at
/// the end of the epoch, or when its producer is aborted (a mixture's or packed loader's
/// feeds are, mid-epoch, when their loader's epoch ends).
struct Counted<T> {
    at: Batching<T>,
    totals: SharedTotals,
}

impl<T> Drop for Counted<T> {
    fn drop(&mut self) {
        let mut totals = self.totals.lock();
        for cursor in &self.at.cursors {
            if let Some(stream) = &cursor.stream {
                *totals += stream.totals();
            }
        }
    }
}

pub(super) struct Batching<T> {
    pub(super) cursors: Vec<Cursor>,
    /// The next window to build.
    pub(super) window: u64,
    /// The first batch to queue (a resumed epoch's): the window holding it is built whole.
    pub(super) skip: u64,
    /// Batches cut from built windows, not yet handed to a worker: the rows they gather.
    pub(super) ready: VecDeque<Gather>,
    pub(super) next_batch: u64,
    pub(super) total_batches: u64,
    pub(super) in_flight: futures::stream::FuturesOrdered<tokio::task::JoinHandle<Result<T>>>,
    pub(super) workers: usize,
    pub(super) schema: SchemaRef,
    pub(super) finish: fn(RecordBatch, u64, u64) -> Result<T>,
    /// Every window is built.
    pub(super) built: bool,
    /// Where the poll over the cursors starts (turns, so that none is starved).
    pub(super) turn: usize,
}

impl<T> Batching<T> {
    /// Whether every batch there is has been handed out.
    pub(super) fn finished(&self) -> bool {
        self.built && self.ready.is_empty() && self.in_flight.is_empty()
    }

    /// Whether a cursor should read on: windows are short of rows, and fewer than one
    /// built window's batches wait (reading goes on while the consumer takes a window's
    /// batches, so the servers never wait for it to drain).
    fn reading(&self, cursor: &Cursor) -> bool {
        !self.built && !cursor.done && cursor.pending_rows < cursor.limit
    }

    /// The cursors to read from now: of those that should read on, the `active` furthest
    /// behind (the fewest rows held for their limit). The others' streams wait, paused by
    /// back-pressure, so that `concurrency` bounds the streams transferring at once, however
    /// many partitions the rank reads.
    fn wants(&self, active: usize) -> Vec<bool> {
        let mut behind: Vec<(usize, f64)> = (self.cursors.iter().enumerate())
            .filter(|(_, c)| self.reading(c))
            .map(|(i, c)| (i, c.pending_rows as f64 / c.limit.max(1) as f64))
            .collect();
        behind.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
        let mut wants = vec![false; self.cursors.len()];
        for (i, _) in behind.into_iter().take(active.max(1)) {
            wants[i] = true;
        }
        wants
    }
}

impl Producer {
    pub(super) fn new(shared: Arc<Shared>, shards: Arc<Shards>, epoch: u64, echo: u64, first: u64) -> Self {
        let partitions = shared.order.partitions;
        Self {
            shared,
            shards,
            epoch,
            echo: echo.max(1),
            first,
            partitions,
            part: None,
        }
    }

    /// A mixture's feed: partition `p` alone, one of `readers` producers side by side.
    pub(super) fn partition(mut self, p: u64, readers: usize) -> Self {
        self.part = Some((p, readers.max(1)));
        self
    }

    /// The order's partitions, when a restored state's differ from the options'.
    pub(super) fn with_partitions(mut self, partitions: u64) -> Self {
        self.partitions = partitions;
        self
    }

    /// Produces batches `first..` of `epoch` into `tx`, each finished by `finish(batch, epoch,
    /// index)` on a worker thread; adds what the streams cost to `watch.totals` at the end.
    pub(super) async fn run<T: Send + 'static>(
        self,
        tx: mpsc::Sender<Result<T>>,
        finish: fn(RecordBatch, u64, u64) -> Result<T>,
        watch: EpochWatch,
    ) -> Result<()> {
        let plan = self.plan()?;
        if self.first >= plan.total {
            return Ok(());
        }
        let mut at = Counted {
            at: self.batching(&plan, finish)?,
            totals: watch.totals.clone(),
        };
        self.produce(&plan, &mut at.at, &tx, &watch).await
    }

    async fn produce<T: Send + 'static>(
        &self,
        plan: &RankPlan,
        at: &mut Batching<T>,
        tx: &mpsc::Sender<Result<T>>,
        watch: &EpochWatch,
    ) -> Result<()> {
        loop {
            self.build_windows(plan, at)?;
            self.dispatch(at);
            if at.finished() {
                break;
            }
            if !watch.all_started.load(Ordering::Relaxed)
                && at.cursors.iter().all(|c| c.started.load(Ordering::Acquire))
            {
                watch.all_started.store(true, Ordering::Release);
            }
            // Hand out the oldest batch, or read on: whichever can go first.
            let wants = at.wants(self.shared.options.stream.concurrency);
            let read = wants.iter().any(|&w| w);
            let Batching {
                cursors,
                in_flight,
                turn,
                ..
            } = &mut *at;
            tokio::select! {
                biased;
                sent = send_next(in_flight, tx), if !in_flight.is_empty() => sent?,
                (i, batch) = read_any(cursors, &wants, *turn), if read => {
                    *turn = (i + 1) % cursors.len().max(1);
                    let cursor = &mut cursors[i];
                    match batch {
                        Some(batch) => {
                            let batch = batch?;
                            cursor.pending_rows += batch.num_rows();
                            cursor.pending.push_back(batch);
                        }
                        None => cursor.done = true,
                    }
                }
                else => return Err(ClientError::Invalid(
                    "the loader's producer stalled with batches left (a bug: please report it)".into(),
                )),
            }
        }
        while !at.in_flight.is_empty() {
            send_next(&mut at.in_flight, tx).await?;
        }
        Ok(())
    }

    /// What this rank reads of the epoch.
    pub(super) fn plan(&self) -> Result<RankPlan> {
        let options = &self.shared.options;
        let (rank, world) = (options.rank as u64, options.world_size as u64);
        if let (Some((p, _)), Some(counts)) = (self.part, &self.shards.counts) {
            let order = self.shared.order.with_partitions(self.partitions);
            let shape = Shape {
                drop_last: false,
                ..Shape::new(counts.iter().sum(), &order)
            };
            return Ok(RankPlan {
                shape: Some(shape),
                slice: RankSlice {
                    parts: p..p + 1,
                    pad: false,
                },
                total: shape.batches(),
            });
        }
        match &self.shards.counts {
            Some(counts) => {
                crate::order::check_world(self.partitions, world)?;
                let n = counts.iter().sum();
                let shape = Shape::new(n, &self.shared.order.with_partitions(self.partitions));
                Ok(RankPlan {
                    shape: Some(shape),
                    slice: RankSlice::new(&shape, rank, world),
                    total: shape.batches() * self.permutation().rounds(),
                })
            }
            // Not counted: rank 0 of 1 in one partition (the prepare step counts otherwise)
            // reads every endpoint whole, in the epoch's shard order, to the end.
            None if self.first > 0 => Err(ClientError::Invalid(
                "resuming mid-epoch needs each shard's rows counted".into(),
            )),
            None => Ok(RankPlan {
                shape: None,
                slice: RankSlice {
                    parts: 0..1,
                    pad: false,
                },
                total: u64::MAX,
            }),
        }
    }

    /// The rank's cursors, each reading its partition from the window holding batch `first`,
    /// and nothing batched yet.
    pub(super) fn batching<T>(
        &self,
        plan: &RankPlan,
        finish: fn(RecordBatch, u64, u64) -> Result<T>,
    ) -> Result<Batching<T>> {
        let (window, _, _) = plan
            .shape
            .map_or((0, 0, 0), |s| locate(&s, self.echo, self.first));
        let cursors = self.cursors(plan, window)?;
        let schema = match cursors.iter().find_map(|c| c.stream.as_ref()) {
            Some(stream) => stream.schema(),
            None => Arc::new(self.shards.info.clone().try_decode_schema()?),
        };
        Ok(Batching {
            cursors,
            window,
            skip: self.first,
            ready: VecDeque::new(),
            next_batch: self.first,
            total_batches: plan.total,
            in_flight: futures::stream::FuturesOrdered::new(),
            workers: self.shared.options.workers.unwrap_or(1).max(1),
            schema,
            finish,
            built: false,
            turn: 0,
        })
    }

    /// One cursor per partition of the rank, reading its items from window `window` to the
    /// epoch's end (the last one then the repeated row, if the rank pads).
    fn cursors(&self, plan: &RankPlan, window: u64) -> Result<Vec<Cursor>> {
        let (shared, shards, epoch) = (&self.shared, &self.shards, self.epoch);
        let order = shard_order(shared.options.seed, epoch, shards.info.endpoint.len());
        let endpoints = shards.info.endpoint.len() as u64;
        // A part that runs to its shard's end is read to the end: its stream's trailer (the
        // server's accounting of it) then arrives too.
        let to_end = |shard: usize, skip: u64, take: u64| {
            shards.counts.as_ref().is_some_and(|c| skip + take >= c[shard])
        };
        let segment = |(shard, skip, take): (usize, u64, u64), counted: bool| Segment {
            endpoint: shards.info.endpoint[shard].clone(),
            index: shard,
            skip,
            take: (counted && !to_end(shard, skip, take)).then_some(take),
            position: epoch * endpoints + shard as u64,
        };
        let readers = self.part.map_or(1, |(_, readers)| readers) as u64;
        let cursors = (plan.slice.parts.end - plan.slice.parts.start) * readers;
        let mut stream_options = shared.options.stream.clone();
        stream_options.order = Order::Sequential;
        stream_options.concurrency = (stream_options.concurrency / cursors as usize).max(1);
        stream_options.max_concurrency = (stream_options.max_concurrency / cursors as usize).max(1);
        stream_options.buffered_bytes = (stream_options.buffered_bytes / cursors as usize).max(1);
        let mut out = Vec::new();
        for p in plan.slice.parts.clone() {
            let (parts, limit) = match (&plan.shape, &shards.counts) {
                (Some(shape), Some(counts)) => {
                    let from = shape.items_before(p, shape.window_batches(window).start);
                    let to = shape.items_before(p, shape.batches());
                    let range = shape.positions(p, from..to);
                    let mut parts: Vec<Segment> = segments(counts, &order, range.start, range.end)
                        .into_iter()
                        .map(|s| segment(s, true))
                        .collect();
                    if plan.slice.pad && p + 1 == plan.slice.parts.end {
                        let row = shared.options.rank as u64 % shape.n.max(1);
                        parts.extend(
                            segments(counts, &order, row, row + 1)
                                .into_iter()
                                .map(|s| segment(s, true)),
                        );
                    }
                    let window_rows = shape.items_before(p, shape.window.min(shape.batches()));
                    (parts, 2 * window_rows as usize + 2)
                }
                _ => (
                    order.iter().map(|&shard| segment((shard, 0, 0), false)).collect(),
                    2 * self.window_rows(),
                ),
            };
            let started = Arc::new(AtomicBool::new(false));
            let stream = ShardStream::segments(
                Arc::clone(shared.client.fleet()),
                &shards.info,
                parts,
                stream_options.clone(),
            )?
            .with_completion(shared.completion.clone())
            .signal_all_started(Arc::clone(&started));
            out.push(Cursor {
                partition: p,
                stream: Some(stream),
                pending: VecDeque::new(),
                pending_rows: 0,
                limit,
                done: false,
                started,
            });
        }
        Ok(out)
    }

    /// Rows of a window when not counted: whole batches covering the shuffle buffer.
    fn window_rows(&self) -> usize {
        let b = self.shared.batch_size;
        self.shared.order.window.max(1) as usize * b
    }

    /// Builds the windows whose rows are in, while the batches cut from built ones run short
    /// of the workers'.
    pub(super) fn build_windows<T>(&self, plan: &RankPlan, at: &mut Batching<T>) -> Result<()> {
        while !at.built && at.ready.len() <= at.workers {
            let built = match &plan.shape {
                Some(shape) => self.build_counted(shape, plan, at)?,
                None => self.build_whole(at),
            };
            if !built {
                break;
            }
        }
        Ok(())
    }

    /// Window `at.window` of the global order, if every cursor holds its rows.
    fn build_counted<T>(&self, shape: &Shape, plan: &RankPlan, at: &mut Batching<T>) -> Result<bool> {
        let w = at.window;
        if w >= shape.windows() {
            at.built = true;
            return Ok(true);
        }
        let window = plan_window(shape, &plan.slice, &self.permutation(), w);
        for (c, &need) in at.cursors.iter().zip(&window.needs) {
            if c.pending_rows < need {
                if c.done {
                    return Err(ClientError::Changed(format!(
                        "partition {} of epoch {} ended {} rows short of the rows its shards were \
                         counted with: the dataset changed while it was read",
                        c.partition,
                        self.epoch,
                        need - c.pending_rows
                    )));
                }
                return Ok(false);
            }
        }
        let mut rows = WindowRows::default();
        let held: Vec<Vec<(u32, u32)>> = at
            .cursors
            .iter_mut()
            .zip(&window.needs)
            .map(|(c, &need)| {
                c.pending_rows -= need;
                rows.add(&mut c.pending, need)
            })
            .collect();
        let batches = window.batches.into_iter().map(|batch| {
            batch
                .into_iter()
                .map(|(i, k)| {
                    let (source, row) = held[i][k];
                    (source as usize, row as usize)
                })
                .collect()
        });
        self.count_distinct(window.needs.iter().sum());
        queue(at, rows.sources, batches, window.first);
        at.window += 1;
        Ok(true)
    }

    /// The next window when not counted (one partition, read whole): the buffer's rows, or
    /// once the stream has ended, what is left, permuted and cut into batches as a counted
    /// window is.
    fn build_whole<T>(&self, at: &mut Batching<T>) -> bool {
        let want = self.window_rows();
        let c = &mut at.cursors[0];
        if c.pending_rows < want && !c.done {
            return false;
        }
        if c.pending_rows == 0 {
            at.built = true;
            return true;
        }
        let take = c.pending_rows.min(want);
        c.pending_rows -= take;
        let mut rows = WindowRows::default();
        let held = rows.add(&mut c.pending, take);
        // The window as a shape of its own: one partition, batches of the batch size.
        let shape = Shape {
            n: take as u64,
            global: self.shared.batch_size as u64,
            partitions: 1,
            window: u64::MAX,
            drop_last: false,
        };
        let slice = RankSlice {
            parts: 0..1,
            pad: false,
        };
        let window = plan_window_at(&shape, &slice, &self.permutation(), 0, at.window);
        // Numbered after what was cut before (the window's own numbering starts at 0).
        let first = at.next_batch + at.ready.len() as u64;
        let batches = window.batches.into_iter().map(|batch| {
            batch
                .into_iter()
                .map(|(_, k)| (held[k].0 as usize, held[k].1 as usize))
                .collect()
        });
        self.count_distinct(take);
        queue(at, rows.sources, batches, first);
        at.window += 1;
        true
    }

    /// Counts rows read into a window (the distinct samples of `LoaderStats`), by epoch.
    fn count_distinct(&self, rows: usize) {
        *self.shared.distinct.lock().entry(self.epoch).or_default() += rows as u64;
    }

    /// How this epoch's windows are permuted.
    fn permutation(&self) -> Permutation {
        Permutation {
            seed: self.shared.options.seed,
            epoch: self.epoch,
            echo: self.echo,
            shuffled: self.shared.order.shuffled(),
        }
    }

    /// Hands the batches cut to the workers, as many as they take.
    pub(super) fn dispatch<T: Send + 'static>(&self, at: &mut Batching<T>) {
        let shared = &self.shared;
        while at.in_flight.len() < at.workers && at.next_batch < at.total_batches {
            let Some(gather) = at.ready.pop_front() else { break };
            let first_partition = at.cursors.first().map_or(0, |c| c.partition);
            let key = batch_key(shared.options.seed, self.epoch, first_partition, at.next_batch);
            let (epoch, index, finish) = (self.epoch, at.next_batch, at.finish);
            let worker_shared = Arc::clone(shared);
            let schema = Arc::clone(&at.schema);
            at.in_flight.push_back(tokio::task::spawn_blocking(move || {
                let rows = gather.run(&schema)?;
                finish(worker_shared.steps.apply(rows, key)?, epoch, index)
            }));
            at.next_batch += 1;
        }
        if at.next_batch >= at.total_batches {
            at.ready.clear();
            at.built = true;
        }
    }
}

/// Queues a built window's batches (rows as positions into `sources`), numbered from
/// `first`; those before the producer's first batch are left out.
fn queue<T>(
    at: &mut Batching<T>,
    sources: Vec<RecordBatch>,
    batches: impl Iterator<Item = Vec<(usize, usize)>>,
    first: u64,
) {
    let sources = Arc::new(sources);
    for (t, indices) in (first..).zip(batches) {
        if t >= at.skip {
            at.ready.push_back(Gather {
                sources: Arc::clone(&sources),
                indices,
            });
        }
    }
}

/// The rows of a window being built: the received batches holding them (all partitions').
#[derive(Default)]
struct WindowRows {
    sources: Vec<RecordBatch>,
}

impl WindowRows {
    /// Moves the first `n` rows of `pending` in; their (batch, row) positions.
    fn add(&mut self, pending: &mut VecDeque<RecordBatch>, n: usize) -> Vec<(u32, u32)> {
        let base = self.sources.len();
        let parts = split_rows(pending, n);
        let rows = parts
            .iter()
            .enumerate()
            .flat_map(|(i, b)| (0..b.num_rows() as u32).map(move |r| ((base + i) as u32, r)))
            .collect();
        self.sources.extend(parts);
        rows
    }
}

/// The first of `cursors` (from `turn` on) that `wants` to read and has a batch (or its end).
fn read_any<'a>(
    cursors: &'a mut [Cursor],
    wants: &'a [bool],
    turn: usize,
) -> impl Future<Output = (usize, Option<Result<RecordBatch>>)> + 'a {
    futures::future::poll_fn(move |cx| {
        let n = cursors.len();
        for k in 0..n {
            let i = (turn + k) % n;
            if !wants[i] {
                continue;
            }
            if let Some(stream) = cursors[i].stream.as_mut()
                && let Poll::Ready(item) = stream.poll_next_unpin(cx)
            {
                return Poll::Ready((i, item));
            }
        }
        Poll::Pending
    })
}

/// What a producer tells its reader besides batches.
#[derive(Debug, Clone, Default)]
pub(super) struct EpochWatch {
    /// What the epoch's streams cost, added when it ends.
    pub(super) totals: SharedTotals,
    /// Set once every shard of the epoch is in flight.
    pub(super) all_started: Arc<AtomicBool>,
}

/// One batch's rows, as positions into the (shared) batches that hold them.
pub(super) struct Gather {
    pub(super) sources: Arc<Vec<RecordBatch>>,
    pub(super) indices: Vec<(usize, usize)>,
}

impl Gather {
    /// Copies the rows into one batch: each value is copied once.
    pub(super) fn run(&self, schema: &SchemaRef) -> Result<RecordBatch> {
        if self.indices.is_empty() {
            // A mixture's feed: its partition's share of a short last batch may be no rows.
            return Ok(RecordBatch::new_empty(Arc::clone(schema)));
        }
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

pub(super) async fn send_next<T>(
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
            cause: source,
        })??;
        room.send(Ok(batch));
    }
    Ok(())
}

/// Removes the first `n` rows of `queue`, as slices of its batches (no copy).
pub(super) fn split_rows(queue: &mut VecDeque<RecordBatch>, n: usize) -> Vec<RecordBatch> {
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
