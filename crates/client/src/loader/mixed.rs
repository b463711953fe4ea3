//! A mixture of sources, produced: every source prepared as a loader's query of its own, each
//! of the rank's partitions of each source read by a feed (a [`Producer`] of that partition
//! alone, running on through the source's own epochs), and every global batch assembled from
//! the feeds as the schedule (`mixture.rs`) deals its places. What is read and in which order
//! is `order.rs`'s and `mixture.rs`'s; this module only follows them.
//!
//! * Source `s` is ordered as a loader of its own with the seed `mix(seed, s + 1)`: its
//!   epochs' shards permuted, its rows cut into the mixture's `P` partitions and permuted by
//!   window. Its partition `p` is read as one sequence, epoch after epoch of the source.
//! * Global batch `b` takes, for each partition `p`, `chunks[p][s]` rows from source `s`'s
//!   partition `p`, in the places the schedule gave them. Rank `r` of `W` holds the places of
//!   its partitions: it reads only its partitions of every source.
//! * The mixture's epoch is `⌊Σ rows / G⌋` global batches; a source that runs out begins its
//!   own next epoch (its rows once per its epoch), counted apart from the mixture's.

use std::collections::VecDeque;
use std::sync::Arc;

use arrow::datatypes::{Field, Schema, SchemaRef};
use arrow::record_batch::RecordBatch;
use tokio::sync::mpsc;

use super::options::{LoaderOptions, LoaderSource, MixtureSource};
use super::prepared::{Prepared, prepare};
use super::producer::{EpochWatch, Gather, Producer, send_next, split_rows};
use super::tensors::TensorBatch;
use crate::bucket::{BucketBy, Bucketer, Buckets, SAMPLE, list_len};
use crate::client::PushdownClient;
use crate::error::{ClientError, Result};
use crate::mixture::{Schedule, Taken};
use crate::order::{Echo, Fnv, Order, PartPos, Shape, cut, rank_partitions};
use crate::pack::{Pack, Packer, blocks_batch, token_ids};
use crate::stream::SharedTotals;
use pushdown_task::Task;

/// A mixture's sources, prepared, and what is fixed for its life.
#[derive(Debug, Clone)]
pub(super) struct Mixture {
    pub(super) sources: Vec<Prepared>,
    pub(super) schedule: Schedule,
    /// The mixture's order: its sources are the sources' queries and weights together.
    pub(super) order: Order,
    /// The sources' versions together.
    pub(super) version: u64,
    /// The batches' columns, every source's (nullable where any source's is).
    pub(super) schema: SchemaRef,
    /// Global batches in a mixture epoch: as many rows as the sources hold together (packed:
    /// about as many blocks as one pass over the documents fills).
    pub(super) epoch_batches: u64,
    /// A packed or bucketed loader: how its one source's rows are regrouped.
    pub(super) regroup: Option<Regroup>,
}

/// How a loader of one source regroups its rows, partition by partition.
#[derive(Debug, Clone)]
pub(super) enum Regroup {
    /// Documents packed into blocks, `G` blocks per global batch.
    Pack(Pack),
    /// Sequences queued by length, each global batch from one bucket.
    Buckets(Buckets),
}

impl Regroup {
    /// What a partition of it starts at.
    pub(super) fn start(&self) -> PartPos {
        match self {
            Regroup::Pack(_) => PartPos::Pack(Default::default()),
            Regroup::Buckets(_) => PartPos::Bucket(Default::default()),
        }
    }

    /// Whether `pos` is a position of this kind of regrouping.
    pub(super) fn fits(&self, pos: &PartPos) -> bool {
        matches!(
            (self, pos),
            (Regroup::Pack(_), PartPos::Pack(_)) | (Regroup::Buckets(_), PartPos::Bucket(_))
        )
    }

    /// The option that asks for it, for messages.
    pub(super) fn option(&self) -> &'static str {
        match self {
            Regroup::Pack(_) => "pack=",
            Regroup::Buckets(_) => "bucket_by=",
        }
    }
}

impl Mixture {
    /// Prepares every source (on its own servers, or `servers`) and checks that they fit
    /// together: row-wise, the same global batch and window, the same columns, each holding
    /// at least a global batch.
    pub(super) async fn prepare(
        servers: &[String],
        sources: Vec<MixtureSource>,
        options: &LoaderOptions,
    ) -> Result<Self> {
        if options.echo != Echo::Off {
            return Err(ClientError::Invalid(
                "data echoing (echo=) is not available for a mixture: weight its sources instead".into(),
            ));
        }
        let weights: Vec<f64> = sources.iter().map(|s| s.weight).collect();
        // Weights first: a bad one is named before any server is asked.
        Schedule::new(&weights, 1, 1)?;
        let mut clients: Vec<(Vec<String>, PushdownClient)> = Vec::new();
        let mut prepared = Vec::with_capacity(sources.len());
        for (i, source) in sources.into_iter().enumerate() {
            let urls = source.servers.unwrap_or_else(|| servers.to_vec());
            let client = match clients.iter().find(|(u, _)| *u == urls) {
                Some((_, client)) => client.clone(),
                None => {
                    let client = PushdownClient::connect_with(&urls, options.connect.clone()).await?;
                    clients.push((urls, client.clone()));
                    client
                }
            };
            let mut own = options.clone();
            own.seed = pushdown_ops::mix(options.seed, i as u64 + 1);
            let (shared, shards) = prepare(client, source.source, own, true)
                .await
                .map_err(|e| named(i, e))?;
            prepared.push(Prepared {
                shared: Arc::new(shared),
                shards: Arc::new(shards),
            });
        }
        Self::check(&prepared)?;
        let first = prepared[0].shared.order;
        let mut sources_hash = Fnv::new();
        let mut version = Fnv::new();
        for (p, w) in prepared.iter().zip(&weights) {
            sources_hash.eat(&p.shared.order.sources.to_le_bytes());
            sources_hash.eat(&w.to_bits().to_le_bytes());
            version.eat(&p.version().to_le_bytes());
        }
        let order = Order {
            sources: sources_hash.finish(),
            seed: options.seed,
            drop_last: false,
            echo: Echo::Off.code(),
            ..first
        };
        let schedule = Schedule::new(&weights, order.global_batch, order.partitions)?;
        let rows: Vec<u64> = prepared.iter().map(rows_of).collect();
        Ok(Self {
            schema: merged_schema(&prepared)?,
            epoch_batches: schedule.epoch_batches(&rows),
            sources: prepared,
            schedule,
            order,
            version: version.finish().max(1),
            regroup: None,
        })
    }

    /// A packed loader's source: one query whose `pack.column` holds each document's token
    /// ids, its documents read by partition as a mixture's source is, packed into blocks.
    /// The epoch is as many global batches as a pass over the documents fills, estimated
    /// from the first documents of partition 0 (the same on every rank).
    pub(super) async fn packed(
        servers: &[String],
        source: LoaderSource,
        pack: Pack,
        options: &LoaderOptions,
    ) -> Result<Self> {
        let mut m = Self::one_source(
            servers,
            source,
            options,
            "pack",
            "a packed loader's global batch (in blocks)",
        )
        .await?;
        pack.check(&m.schema)?;
        m.fingerprint(&format!("{pack:?}"));
        let rows = rows_of(&m.sources[0]);
        let sample = (rows / m.order.partitions).clamp(1, 256) as usize;
        let lengths = m.sample_lengths(&pack.column, sample, 0..1, "pack").await?;
        let eos = u64::from(pack.eos_id.is_some());
        let tokens: u64 = lengths.iter().map(|&n| n as u64 + eos).sum();
        let per_batch = m.order.global_batch * pack.length as u64;
        m.epoch_batches =
            ((rows as u128 * tokens as u128) / (lengths.len() as u128 * per_batch as u128)).max(1) as u64;
        m.schema = pack.schema(&m.schema);
        m.regroup = Some(Regroup::Pack(pack));
        Ok(m)
    }

    /// A bucketed loader's source: one query whose `by.column` holds each row's token ids,
    /// its rows read by partition as a mixture's source is, each global batch from one
    /// length bucket (see [`crate::bucket`]). The buckets' weights are their shares of the
    /// first rows of every partition ([`SAMPLE`] in all; the same on every rank); the epoch
    /// is `⌊rows / G⌋` global batches.
    pub(super) async fn bucketed(
        servers: &[String],
        source: LoaderSource,
        by: BucketBy,
        options: &LoaderOptions,
    ) -> Result<Self> {
        let mut m = Self::one_source(
            servers,
            source,
            options,
            "bucket_by",
            "a bucketed loader's global batch",
        )
        .await?;
        by.check(&m.schema)?;
        m.fingerprint(&format!("{by:?}"));
        let rows = rows_of(&m.sources[0]);
        let partitions = m.order.partitions;
        let sample = (rows / partitions).clamp(1, (SAMPLE as u64 / partitions).max(1)) as usize;
        let lengths = m
            .sample_lengths(&by.column, sample, 0..partitions, "bucket_by")
            .await?;
        m.epoch_batches = (rows / m.order.global_batch).max(1);
        m.schema = by.schema(&m.schema);
        // A bucket the sample holds less than a global batch of joins a neighbour.
        let min_rows = m.order.global_batch as usize;
        m.regroup = Some(Regroup::Buckets(Buckets::from_sample(
            by,
            &lengths,
            min_rows,
            m.order.seed,
        )?));
        Ok(m)
    }

    /// One source prepared as a mixture of one, its checks' messages speaking of `option`
    /// and `batch` rather than of "mixture source 0" and a mixture's global batch.
    async fn one_source(
        servers: &[String],
        source: LoaderSource,
        options: &LoaderOptions,
        option: &str,
        batch: &str,
    ) -> Result<Self> {
        let one = MixtureSource {
            source,
            weight: 1.0,
            servers: None,
        };
        Self::prepare(servers, vec![one], options)
            .await
            .map_err(|e| match e {
                ClientError::Invalid(why) => ClientError::Invalid(
                    why.replace("mixture source 0: ", &format!("{option}: "))
                        .replace("mixture source 0", "the query")
                        .replace("a mixture's global batch", batch),
                ),
                other => other,
            })
    }

    /// Makes the order's fingerprint also name the regrouping (`what`).
    fn fingerprint(&mut self, what: &str) {
        let mut sources = Fnv::new();
        sources.eat(&self.order.sources.to_le_bytes());
        sources.eat(what.as_bytes());
        self.order.sources = sources.finish();
    }

    /// The lengths of `column`'s lists in the first `n` rows of each of `partitions`
    /// partitions, in order (every rank reads the same).
    async fn sample_lengths(
        &self,
        column: &str,
        n: usize,
        partitions: std::ops::Range<u64>,
        option: &str,
    ) -> Result<Vec<usize>> {
        let totals = Arc::default();
        let mut lengths = Vec::with_capacity(n * (partitions.end - partitions.start) as usize);
        for p in partitions {
            let mut feed = Feed::start(&self.sources[0], p, self.order.partitions, 1, 0, &totals)?;
            for batch in feed.take(n).await? {
                let column = batch.column_by_name(column).ok_or_else(|| {
                    ClientError::Invalid(format!("{option}: the stream has no column `{column}`"))
                })?;
                for row in 0..batch.num_rows() {
                    lengths.push(list_len(column, row)?);
                }
            }
            feed.stop().await;
        }
        Ok(lengths)
    }

    /// Refuses sources that cannot be mixed, naming the source and what differs.
    fn check(prepared: &[Prepared]) -> Result<()> {
        let first = &prepared[0].shared;
        for (i, p) in prepared.iter().enumerate() {
            let shared = &p.shared;
            if p.shards.counts.is_none() {
                return Err(ClientError::Invalid(format!(
                    "mixture source {i} is not a row-wise query (projection and filter over one \
                     dataset): a mixture shuffles and resumes each source by shard"
                )));
            }
            let (o, f) = (&shared.order, &first.order);
            if (o.global_batch, o.window, o.partitions) != (f.global_batch, f.window, f.partitions) {
                return Err(ClientError::Invalid(format!(
                    "mixture source {i} batches {} rows per global batch with a window of {} \
                     global batches over {} partitions, source 0 {}, {} and {}: a pipeline's \
                     batch and shuffle steps must agree across the sources (or leave them to \
                     batch_size and shuffle_buffer)",
                    o.global_batch, o.window, o.partitions, f.global_batch, f.window, f.partitions
                )));
            }
            if !o.global_batch.is_multiple_of(o.partitions) {
                return Err(ClientError::Invalid(format!(
                    "a mixture's global batch ({} rows) must be a multiple of its partitions ({}), \
                     so that every partition takes as many rows of each batch and a source's \
                     partitions run out together: change batch_size or partitions",
                    o.global_batch, o.partitions
                )));
            }
            let rows = rows_of(p);
            if rows < o.global_batch {
                return Err(ClientError::Invalid(format!(
                    "mixture source {i} has {rows} rows, fewer than one global batch ({}): its \
                     partitions could not give every batch its share",
                    o.global_batch
                )));
            }
        }
        Ok(())
    }

    /// The mixture over `partitions` partitions (a restored state's).
    pub(super) fn with_partitions(&self, partitions: u64) -> Result<Self> {
        let mut out = self.clone();
        out.order = self.order.with_partitions(partitions);
        out.schedule = Schedule::new(self.schedule.weights(), self.order.global_batch, partitions)?;
        if !self.order.global_batch.is_multiple_of(partitions) {
            return Err(ClientError::Invalid(format!(
                "the state's {partitions} partitions do not divide this mixture's global batch ({})",
                self.order.global_batch
            )));
        }
        Ok(out)
    }

    /// Where the mixture is at the start of epoch `epoch`.
    pub(super) fn epoch_start(&self, epoch: u64) -> Taken {
        self.schedule.replay(epoch.saturating_mul(self.epoch_batches))
    }
}

/// A source's epoch as its feeds read it over `partitions` partitions: every row (no
/// `drop_last`).
fn feed_shape(source: &Prepared, partitions: u64) -> Shape {
    Shape {
        drop_last: false,
        ..Shape::new(rows_of(source), &source.shared.order.with_partitions(partitions))
    }
}

/// `column` of a row from the feed, or an error naming `option`.
fn column_of<'a>(row: &'a RecordBatch, column: &str, option: &str) -> Result<&'a arrow::array::ArrayRef> {
    row.column_by_name(column)
        .ok_or_else(|| ClientError::Invalid(format!("{option}: the stream has no column `{column}`")))
}

/// A state's position of partition `p` is not of the regrouping `option` asks for.
fn not_this_kind(p: u64, option: &str) -> ClientError {
    ClientError::Invalid(format!(
        "the state's partition {p} was saved by another kind of loader, not by one with {option}"
    ))
}

/// A source's error, prefixed with which source it is where that is not said.
fn named(i: usize, e: ClientError) -> ClientError {
    match e {
        ClientError::Invalid(why) => ClientError::Invalid(format!("mixture source {i}: {why}")),
        other => other,
    }
}

/// Rows a prepared source holds per epoch.
fn rows_of(p: &Prepared) -> u64 {
    p.shards.counts.iter().flatten().sum()
}

/// The sources' common schema: the same column names and types in the same order, each
/// nullable where any source's is. A mismatch names the columns.
fn merged_schema(prepared: &[Prepared]) -> Result<SchemaRef> {
    let first = prepared[0].schema();
    let describe = |s: &Schema| {
        s.fields()
            .iter()
            .map(|f| format!("{}: {}", f.name(), f.data_type()))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut fields: Vec<Field> = first.fields().iter().map(|f| f.as_ref().clone()).collect();
    for (i, p) in prepared.iter().enumerate().skip(1) {
        let schema = p.schema();
        let same = schema.fields().len() == fields.len()
            && schema
                .fields()
                .iter()
                .zip(&fields)
                .all(|(a, b)| a.name() == b.name() && a.data_type() == b.data_type());
        if !same {
            let names = |s: &Schema| s.fields().iter().map(|f| f.name().clone()).collect::<Vec<_>>();
            let (mine, theirs) = (names(&first), names(&schema));
            let missing: Vec<_> = mine.iter().filter(|n| !theirs.contains(n)).collect();
            let extra: Vec<_> = theirs.iter().filter(|n| !mine.contains(n)).collect();
            return Err(ClientError::Invalid(format!(
                "mixture source {i}'s columns differ from source 0's (the sources must share one \
                 schema): source 0 has [{}], source {i} has [{}]; missing from source {i}: \
                 {missing:?}, not in source 0: {extra:?}",
                describe(&first),
                describe(&schema)
            )));
        }
        for (f, other) in fields.iter_mut().zip(schema.fields()) {
            if other.is_nullable() {
                f.set_nullable(true);
            }
        }
    }
    Ok(Arc::new(Schema::new(fields)))
}

/// One mixture epoch of a rank from global batch `first`, the mixture at `taken` then.
pub(super) struct MixProducer {
    pub(super) mixture: Arc<Mixture>,
    pub(super) epoch: u64,
    pub(super) first: u64,
    pub(super) taken: Taken,
    pub(super) rank: u64,
    pub(super) world: u64,
    pub(super) totals: SharedTotals,
    /// A packed or bucketed loader's partitions, where they are (known for this rank's).
    pub(super) parts: Vec<Option<PartPos>>,
}

impl MixProducer {
    /// Produces batches `first..` of the mixture's epoch into `tx`, each finished on a
    /// worker thread.
    pub(super) async fn run(mut self, tx: mpsc::Sender<Result<TensorBatch>>) -> Result<()> {
        let m = Arc::clone(&self.mixture);
        match &m.regroup {
            Some(Regroup::Pack(pack)) => return self.run_packed(pack, tx).await,
            Some(Regroup::Buckets(buckets)) => return self.run_bucketed(buckets, tx).await,
            None => {}
        }
        let options = &m.sources[0].shared.options;
        let partitions = m.schedule.partitions();
        let parts = rank_partitions(partitions, self.rank, self.world);
        let readers = (parts.end - parts.start) as usize * m.sources.len();
        let mut feeds = Vec::new();
        for p in parts.clone() {
            let mut row = Vec::new();
            for (s, source) in m.sources.iter().enumerate() {
                let taken = self.taken.0[s][p as usize];
                row.push(Feed::start(source, p, partitions, readers, taken, &self.totals)?);
            }
            feeds.push(row);
        }
        let workers = options.workers.unwrap_or(1).max(1);
        let mut in_flight = futures::stream::FuturesOrdered::new();
        for t in self.first..m.epoch_batches {
            let places = m.schedule.step(&mut self.taken);
            let gather = self.gather(&places, parts.clone(), &mut feeds).await?;
            while in_flight.len() >= workers {
                send_next(&mut in_flight, &tx).await?;
            }
            let (schema, epoch) = (Arc::clone(&m.schema), self.epoch);
            in_flight.push_back(tokio::task::spawn_blocking(move || {
                TensorBatch::from_record_batch(&gather.run(&schema)?, epoch, t)
            }));
        }
        while !in_flight.is_empty() {
            send_next(&mut in_flight, &tx).await?;
        }
        for feed in feeds.into_iter().flatten() {
            feed.stop().await;
        }
        Ok(())
    }

    /// The feeds of the rank's partitions, each started where its position says, with it.
    fn part_feeds(&self) -> Result<Vec<(u64, Feed, PartPos)>> {
        let m = &self.mixture;
        let partitions = m.schedule.partitions();
        let parts = rank_partitions(partitions, self.rank, self.world);
        let readers = (parts.end - parts.start) as usize;
        parts
            .map(|p| {
                let pos = self.parts.get(p as usize).cloned().flatten().ok_or_else(|| {
                    ClientError::Invalid(format!(
                        "the state does not say where partition {p} is: a packed or bucketed \
                         loader's ranks each save their own partitions, so restore the states of \
                         every rank merged (load_state_dict with the list of them; \
                         LoaderState::merge in Rust)"
                    ))
                })?;
                let row = match &pos {
                    PartPos::Pack(k) => k.done,
                    PartPos::Bucket(b) => b.first,
                };
                let feed = Feed::start(&m.sources[0], p, partitions, readers, row, &self.totals)?;
                Ok((p, feed, pos))
            })
            .collect()
    }

    /// Produces a packed loader's batches `first..` into `tx`: each of the rank's partitions
    /// gives its share of every global batch's blocks, packed from its documents.
    async fn run_packed(self, pack: &Pack, tx: mpsc::Sender<Result<TensorBatch>>) -> Result<()> {
        let m = &self.mixture;
        let partitions = m.schedule.partitions();
        let mut feeds = Vec::new();
        for (p, feed, pos) in self.part_feeds()? {
            let PartPos::Pack(pos) = pos else {
                return Err(not_this_kind(p, "pack="));
            };
            feeds.push((p, feed, Packer::new(pack.clone(), pos)));
        }
        let g = m.order.global_batch;
        for t in self.first..m.epoch_batches {
            let mut blocks = Vec::new();
            let mut after = Vec::with_capacity(feeds.len());
            for (p, feed, packer) in &mut feeds {
                for _ in cut(g, *p, partitions)..cut(g, *p + 1, partitions) {
                    while !packer.fill() {
                        let row = feed.row().await?;
                        packer.push_document(token_ids(column_of(&row, &pack.column, "pack")?, 0)?);
                    }
                    blocks.push(packer.take_block());
                }
                after.push((*p, PartPos::Pack(packer.pos())));
            }
            let batch = blocks_batch(&m.schema, pack.length, &blocks)?;
            let mut batch = TensorBatch::from_record_batch(&batch, self.epoch, t)?;
            batch.parts = after;
            if tx.send(Ok(batch)).await.is_err() {
                break;
            }
        }
        for (_, feed, _) in feeds {
            feed.stop().await;
        }
        Ok(())
    }

    /// Produces a bucketed loader's batches `first..` into `tx`: every global batch's bucket
    /// from the schedule, each of the rank's partitions giving its share of the batch's rows
    /// from that bucket's queue, read on until the queue holds them.
    async fn run_bucketed(self, buckets: &Buckets, tx: mpsc::Sender<Result<TensorBatch>>) -> Result<()> {
        let m = &self.mixture;
        let partitions = m.schedule.partitions();
        let mut feeds = Vec::new();
        for (p, feed, pos) in self.part_feeds()? {
            let PartPos::Bucket(pos) = pos else {
                return Err(not_this_kind(p, "bucket_by="));
            };
            feeds.push((p, feed, Bucketer::new(buckets.len(), pos)));
        }
        let g = m.order.global_batch;
        // A partition that queues two passes over its rows waits on a bucket the data lacks.
        let bound = 2 * rows_of(&m.sources[0]) / partitions + 2 * g;
        let mut schedule = buckets.schedule(self.epoch * m.epoch_batches + self.first);
        for t in self.first..m.epoch_batches {
            let bucket = schedule.next().unwrap_or_default();
            let mut rows = Vec::new();
            let mut after = Vec::with_capacity(feeds.len());
            for (p, feed, bucketer) in &mut feeds {
                let need = (cut(g, *p + 1, partitions) - cut(g, *p, partitions)) as usize;
                while bucketer.ready(bucket) < need {
                    let row = feed.row().await?;
                    let len = list_len(column_of(&row, &buckets.by.column, "bucket_by")?, 0)?;
                    bucketer.push(buckets.queue_of(len), row);
                    if bucketer.queued() as u64 > bound {
                        return Err(ClientError::Invalid(format!(
                            "bucket_by: partition {p} queued {} rows waiting for bucket {bucket}, \
                             whose share of the data is far below its share of the sample the \
                             buckets were weighted by ({:.3}): merge it with a neighbour (drop a \
                             boundary)",
                            bucketer.queued(),
                            buckets.weights()[bucket]
                        )));
                    }
                }
                rows.extend(bucketer.take(bucket, need));
                after.push((*p, PartPos::Bucket(bucketer.pos())));
            }
            let (by, epoch) = (buckets.by.clone(), self.epoch);
            let batch = tokio::task::spawn_blocking(move || {
                TensorBatch::from_record_batch(&by.padded(&rows)?, epoch, t)
            })
            .await
            .map_err(|e| ClientError::Invalid(format!("a bucketed batch's worker failed: {e}")))?;
            let mut batch = batch?;
            batch.parts = after;
            if tx.send(Ok(batch)).await.is_err() {
                break;
            }
        }
        for (_, feed, _) in feeds {
            feed.stop().await;
        }
        Ok(())
    }

    /// The rank's rows of a global batch whose places are `places`: each partition's
    /// chunk, each place the next row of its source's feed.
    async fn gather(
        &self,
        places: &[usize],
        parts: std::ops::Range<u64>,
        feeds: &mut [Vec<Feed>],
    ) -> Result<Gather> {
        let (g, partitions) = (places.len() as u64, self.mixture.schedule.partitions());
        let mut sources = Vec::new();
        let mut indices = Vec::new();
        for (row, p) in feeds.iter_mut().zip(parts) {
            let chunk = &places[cut(g, p, partitions) as usize..cut(g, p + 1, partitions) as usize];
            let mut queues: Vec<VecDeque<(usize, usize)>> = vec![VecDeque::new(); row.len()];
            for (s, feed) in row.iter_mut().enumerate() {
                let need = chunk.iter().filter(|&&x| x == s).count();
                for batch in feed.take(need).await? {
                    let i = sources.len();
                    queues[s].extend((0..batch.num_rows()).map(|r| (i, r)));
                    sources.push(batch);
                }
            }
            for &s in chunk {
                indices.push(queues[s].pop_front().ok_or_else(|| {
                    ClientError::Invalid(
                        "a mixture feed gave fewer rows than asked (a bug: please report it)".into(),
                    )
                })?);
            }
        }
        Ok(Gather {
            sources: Arc::new(sources),
            indices,
        })
    }
}

/// One partition of the mixture's, for one source, read on through the source's epochs:
/// in the source's epoch `e`, feed `p` reads the source's partition `(p + e) mod P` (a
/// [`Producer`] of that partition alone), so that every epoch of the source is read whole
/// by its feeds together, each row once, and over any run of epochs every feed reads as
/// many rows as the others within one (partitions differ by a row where `P` does not divide
/// the source's last batch): a source's feeds run out together, epoch after epoch.
struct Feed {
    source: Prepared,
    /// The mixture's partition this feed serves.
    slot: u64,
    partitions: u64,
    readers: usize,
    epoch: u64,
    rx: mpsc::Receiver<Result<RecordBatch>>,
    /// Reads the current epoch's partition (aborted when dropped).
    producer: Option<Task<()>>,
    pending: VecDeque<RecordBatch>,
    rows: usize,
    /// Rows still to drop from the front (a resumed feed starts inside a batch).
    skip: usize,
    totals: SharedTotals,
}

impl Feed {
    /// The feed of partition `p` of the mixture for `source`, after `taken` of its rows (over
    /// all the source's epochs).
    fn start(
        source: &Prepared,
        p: u64,
        partitions: u64,
        readers: usize,
        taken: u64,
        totals: &SharedTotals,
    ) -> Result<Self> {
        let shape = feed_shape(source, partitions);
        let lengths: Vec<u64> = (0..partitions)
            .map(|q| shape.items_before(q, shape.batches()))
            .collect();
        let n: u64 = lengths.iter().sum();
        if n == 0 {
            return Err(ClientError::Invalid("a mixture source holds no rows".into()));
        }
        // Every `P` epochs the feed reads each partition once: `n` rows.
        let (mut epoch, mut left) = (partitions * (taken / n), taken % n);
        while left >= lengths[((p + epoch) % partitions) as usize] {
            left -= lengths[((p + epoch) % partitions) as usize];
            epoch += 1;
        }
        let (batch, within) = shape.item_at((p + epoch) % partitions, left);
        let mut feed = Self {
            source: source.clone(),
            slot: p,
            partitions,
            readers,
            epoch,
            rx: mpsc::channel(1).1,
            producer: None,
            pending: VecDeque::new(),
            rows: 0,
            skip: within as usize,
            totals: totals.clone(),
        };
        feed.spawn(batch);
        Ok(feed)
    }

    /// Starts reading the feed's epoch from its partition's batch `first`.
    fn spawn(&mut self, first: u64) {
        let (tx, rx) = mpsc::channel(self.source.shared.options.prefetch.max(2));
        let (shared, shards) = (Arc::clone(&self.source.shared), Arc::clone(&self.source.shards));
        let watch = EpochWatch {
            totals: self.totals.clone(),
            ..EpochWatch::default()
        };
        let (epoch, partitions, readers) = (self.epoch, self.partitions, self.readers);
        let part = (self.slot + epoch) % partitions;
        self.producer = Some(Task::spawn(async move {
            let producer = Producer::new(shared, shards, epoch, 1, first)
                .with_partitions(partitions)
                .partition(part, readers);
            if let Err(e) = producer.run(tx.clone(), |batch, _, _| Ok(batch), watch).await {
                let _ = tx.send(Err(e)).await;
            }
        }));
        self.rx = rx;
    }

    /// Stops reading, once what the feed's streams cost is counted in its totals.
    async fn stop(mut self) {
        if let Some(producer) = self.producer.take() {
            producer.abort();
            // Resolves once the producer's future is dropped (its streams counted).
            let _ = producer.await;
        }
    }

    /// The next row, as a batch of one.
    async fn row(&mut self) -> Result<RecordBatch> {
        self.take(1).await?.pop().ok_or_else(|| {
            ClientError::Invalid("a partition's feed gave no row (a bug: please report it)".into())
        })
    }

    /// The next `n` rows, beginning the source's next epoch where this one runs out.
    async fn take(&mut self, n: usize) -> Result<Vec<RecordBatch>> {
        while self.rows < n {
            match self.rx.recv().await {
                Some(Ok(batch)) => {
                    let drop = self.skip.min(batch.num_rows());
                    self.skip -= drop;
                    let batch = batch.slice(drop, batch.num_rows() - drop);
                    self.rows += batch.num_rows();
                    self.pending.push_back(batch);
                }
                Some(Err(e)) => return Err(e),
                None => {
                    self.epoch += 1;
                    self.spawn(0);
                }
            }
        }
        self.rows -= n;
        Ok(split_rows(&mut self.pending, n))
    }
}
