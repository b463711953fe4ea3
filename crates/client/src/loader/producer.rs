//! One epoch's batches, produced: shards streamed in order, windows shuffled, batches cut.

use std::collections::VecDeque;
use std::sync::Arc;

use arrow::array::Array;
use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use futures::StreamExt;
use tokio::sync::mpsc;

use super::prepared::{Shards, Shared};
use crate::error::{ClientError, Result};
use crate::order::{batch_key, batches_in, echoed_order, rank_range, segments, shard_order, window_rng};
use crate::stream::StreamTotals;
use crate::stream::{Order, Segment, ShardStream};

/// One epoch of a prepared query from batch `first` on: its shards' rows read in the epoch's
/// order, permuted by window, batched, and each batch finished on a worker thread.
pub(super) struct Producer {
    pub(super) shared: Arc<Shared>,
    pub(super) shards: Arc<Shards>,
    pub(super) epoch: u64,
    /// Times each sample repeats (at least 1).
    pub(super) echo: u64,
    pub(super) first: u64,
}

/// A producer's rows on their way from its stream to its workers, and where it is in the
/// epoch.
pub(super) struct Batching<T> {
    /// Rows of the current window.
    pub(super) pending: VecDeque<RecordBatch>,
    pub(super) pending_rows: usize,
    /// Permuted windows, not yet batched. Rows are never copied before their batch is
    /// gathered, once, on a worker thread.
    pub(super) shuffled: VecDeque<Window>,
    pub(super) shuffled_rows: usize,
    /// The next window to permute (without a shuffle, the next row).
    pub(super) window: u64,
    /// Rows of the first window permuted that come before batch `first`, not delivered.
    pub(super) drop_rows: usize,
    pub(super) next_batch: u64,
    pub(super) total_batches: u64,
    pub(super) in_flight: futures::stream::FuturesOrdered<tokio::task::JoinHandle<Result<T>>>,
    pub(super) workers: usize,
    /// Rows read ahead of the batches being handed out: the window being emitted and the next
    /// one filling. Reading goes on while the consumer takes a window's batches, so the
    /// servers never wait for a window to drain (they did: the epoch alternated between
    /// filling a window, the consumer waiting, and emitting it, the servers idle).
    pub(super) ahead: usize,
    pub(super) schema: SchemaRef,
    pub(super) finish: fn(RecordBatch, u64, u64) -> Result<T>,
    /// The stream has ended.
    pub(super) done: bool,
}

impl<T> Batching<T> {
    /// Whether every batch there is has been handed out.
    pub(super) fn finished(&self) -> bool {
        self.done
            && self.in_flight.is_empty()
            && (self.next_batch >= self.total_batches || self.shuffled_rows == 0)
    }

    /// Whether to read on: the stream has more, and fewer rows than `ahead` are held.
    pub(super) fn reads(&self) -> bool {
        !self.done && self.pending_rows + self.shuffled_rows < self.ahead
    }
}

impl Producer {
    pub(super) fn new(shared: Arc<Shared>, shards: Arc<Shards>, epoch: u64, echo: u64, first: u64) -> Self {
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
    pub(super) async fn run<T: Send + 'static>(
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
    pub(super) fn seek(&self, window: u64) -> Result<Option<(Vec<Segment>, u64)>> {
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
    pub(super) fn open_stream(&self, segments: Vec<Segment>, watch: &EpochWatch) -> Result<ShardStream> {
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
    pub(super) fn batching<T>(
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
    pub(super) fn permute_windows<T>(&self, at: &mut Batching<T>) {
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
            *shared
                .distinct
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .entry(self.epoch)
                .or_default() += take as u64;
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
    pub(super) fn dispatch<T: Send + 'static>(&self, at: &mut Batching<T>) {
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
pub(super) struct EpochWatch {
    /// What the epoch's streams cost, added when it ends.
    pub(super) totals: Arc<std::sync::Mutex<StreamTotals>>,
    /// Set once every shard of the epoch is in flight.
    pub(super) all_started: Arc<std::sync::atomic::AtomicBool>,
}

/// A permuted window: the received batches holding its rows, and the rows' order as
/// (batch, row) positions, front first.
pub(super) struct Window {
    pub(super) parts: Vec<RecordBatch>,
    pub(super) order: VecDeque<(u32, u32)>,
}

/// One batch's rows, as positions into the (shared) batches that hold them.
pub(super) struct Gather {
    pub(super) sources: Vec<RecordBatch>,
    pub(super) indices: Vec<(usize, usize)>,
}

impl Gather {
    /// Takes the next `n` permuted rows, spanning windows where a batch does.
    pub(super) fn take(windows: &mut VecDeque<Window>, n: usize) -> Self {
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
    pub(super) fn run(&self, schema: &SchemaRef) -> Result<RecordBatch> {
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
            source,
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
