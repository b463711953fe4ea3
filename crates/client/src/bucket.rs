//! Coordinated length buckets, for unpacked variable-length sequences (tf.data service's
//! *coordinated reads*, SoCC '23): every global batch is drawn from one length bucket, so
//! every rank's share of a step holds sequences of about one length and no rank waits for
//! another's long tail. Pure: no I/O.
//!
//! * A sequence of `n` tokens falls in bucket `i`, the number of boundaries `≤ n`
//!   (`[0, b₀)`, `[b₀, b₁)`, …, `[b_last, ∞)`), as `tf.data`'s `bucket_by_sequence_length`.
//! * **Which bucket each global batch takes** ([`Buckets::schedule`]) is a function of the
//!   seed and the buckets' weights alone, never of the data a rank sees, so every rank agrees
//!   without talking: the weights are the buckets' shares of a sample (the first rows of every
//!   partition, [`SAMPLE`] in all, which every rank reads alike); batches are dealt to the bucket furthest
//!   behind its weight (as a mixture deals rows), and each run of [`SPAN`] batches is then
//!   shuffled by the seed. A bucket the sample holds less than a global batch of takes no
//!   batches of its own: its sequences join the next longer bucket (the last ones, the next
//!   shorter), so that no partition reads much of the data to fill a rare bucket's batch.
//! * **Each partition** ([`Bucketer`]) reads its rows in the order's sequence into one
//!   queue per bucket and gives each batch its share from the batch's bucket, oldest first.
//!   Where it is, [`BucketPos`], is the first row still queued and which rows after it were
//!   given: a bucketer restored there, fed the rows from there, queues and gives the same.
//! * A batch is padded to its own longest sequence (`pad_id`), with each row's length.
//!
//! Where the sample's shares differ from the data's, a bucket's queue grows by the
//! difference (a share off by 1% queues 1% of the rows read, until its batches catch up).

use std::collections::VecDeque;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, FixedSizeListArray, Int32Array, UInt16Array, UInt32Array};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::record_batch::RecordBatch;
use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;

use crate::error::{ClientError, Result};
use crate::pack::token_ids;

/// Global batches whose buckets are shuffled together: the deal's order is hidden within
/// them, and a bucket's batches stay within a span of its share.
pub const SPAN: u64 = 16;

/// Rows whose lengths give the buckets' weights: the first of every partition, this many
/// in all.
pub const SAMPLE: usize = 4096;

/// What a loader buckets, and how (`bucket_by=` in Python).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketBy {
    /// The column of token ids (a list of integers per row, as `tokenize` makes).
    pub column: String,
    /// Increasing lengths where one bucket ends and the next begins.
    pub boundaries: Vec<u32>,
    /// The id that fills a sequence shorter than its batch's longest (default 0).
    pub pad_id: u32,
}

impl BucketBy {
    /// `column` bucketed at `boundaries`, padded with 0.
    pub fn new(column: impl Into<String>, boundaries: Vec<u32>) -> Self {
        Self {
            column: column.into(),
            boundaries,
            pad_id: 0,
        }
    }

    /// The name of the column of each row's length.
    pub fn length_column(&self) -> String {
        format!("{}_length", self.column)
    }

    /// Checks the settings against the source's schema: increasing boundaries, a column of
    /// integer lists, a pad id that fits its ids.
    pub fn check(&self, schema: &Schema) -> Result<()> {
        if self.boundaries.is_empty() || self.boundaries[0] == 0 {
            return Err(ClientError::Invalid(format!(
                "bucket_by: boundaries must be one or more lengths of 1 or more tokens, got {:?}",
                self.boundaries
            )));
        }
        if let Some(w) = self.boundaries.windows(2).find(|w| w[0] >= w[1]) {
            return Err(ClientError::Invalid(format!(
                "bucket_by: boundaries must increase, got {} then {} in {:?}",
                w[0], w[1], self.boundaries
            )));
        }
        let field = schema.field_with_name(&self.column).map_err(|_| {
            let names: Vec<_> = schema.fields().iter().map(|f| f.name().as_str()).collect();
            ClientError::Invalid(format!(
                "bucket_by: no column `{}` to bucket; the query's columns are {names:?}",
                self.column
            ))
        })?;
        if schema.field_with_name(&self.length_column()).is_ok() {
            return Err(ClientError::Invalid(format!(
                "bucket_by: the query already has a column `{}`, where each row's length goes",
                self.length_column()
            )));
        }
        match field.data_type() {
            DataType::List(item) | DataType::LargeList(item) | DataType::FixedSizeList(item, _)
                if item.data_type().is_integer() =>
            {
                if item.data_type() == &DataType::UInt16 && self.pad_id > u32::from(u16::MAX) {
                    return Err(ClientError::Invalid(format!(
                        "bucket_by: pad_id {} does not fit the column's 16-bit token ids",
                        self.pad_id
                    )));
                }
                Ok(())
            }
            other => Err(ClientError::Invalid(format!(
                "bucket_by: column `{}` is {other}, not a list of token ids (tokenize(text, \
                 max_len) makes one)",
                self.column
            ))),
        }
    }

    /// The bucket of a sequence of `len` tokens (before merging empty buckets).
    pub fn bucket_of(&self, len: usize) -> usize {
        self.boundaries.partition_point(|&b| b as usize <= len)
    }

    /// The batches' columns, as the loader's schema gives them: the source's, with the
    /// bucketed column a list of 16-bit ids where the source's are 16-bit (else 32-bit), and
    /// `{column}_length` after it. In each batch the column is a `FixedSizeList` as long
    /// as the batch's longest sequence.
    pub fn schema(&self, source: &Schema) -> SchemaRef {
        let mut fields = Vec::with_capacity(source.fields().len() + 1);
        for f in source.fields() {
            if f.name() != &self.column {
                fields.push(f.as_ref().clone());
                continue;
            }
            let item = Field::new("item", ids_type(f.data_type()), false);
            fields.push(Field::new(f.name(), DataType::List(Arc::new(item)), false));
            fields.push(Field::new(self.length_column(), DataType::Int32, false));
        }
        Arc::new(Schema::new(fields))
    }

    /// `rows` (each one row of the source's columns), with the bucketed column padded to
    /// their longest sequence and each row's length after it.
    pub fn padded(&self, rows: &[RecordBatch]) -> Result<RecordBatch> {
        let Some(first) = rows.first() else {
            return Err(ClientError::Invalid("bucket_by: a batch of no rows".into()));
        };
        let source = first.schema();
        let batch = arrow::compute::concat_batches(&source, rows)?;
        let mut fields = Vec::with_capacity(source.fields().len() + 1);
        let mut columns = Vec::with_capacity(fields.capacity());
        for (f, column) in source.fields().iter().zip(batch.columns()) {
            if f.name() != &self.column {
                fields.push(f.as_ref().clone());
                columns.push(Arc::clone(column));
                continue;
            }
            let ids = (0..batch.num_rows())
                .map(|r| token_ids(column, r))
                .collect::<Result<Vec<_>>>()?;
            let longest = ids.iter().map(Vec::len).max().unwrap_or(0).max(1);
            let lengths = Int32Array::from_iter_values(ids.iter().map(|t| t.len() as i32));
            let flat = ids.iter().flat_map(|t| {
                t.iter()
                    .copied()
                    .chain(std::iter::repeat_n(self.pad_id, longest - t.len()))
            });
            let values: ArrayRef = match ids_type(f.data_type()) {
                // The source's ids are 16-bit, and so is the pad (checked): every one fits.
                DataType::UInt16 => Arc::new(UInt16Array::from_iter_values(flat.map(|t| t as u16))),
                _ => Arc::new(UInt32Array::from_iter_values(flat)),
            };
            let item = Arc::new(Field::new("item", values.data_type().clone(), false));
            let list = FixedSizeListArray::try_new(Arc::clone(&item), longest as i32, values, None)?;
            let shape = [(pushdown_ops::SHAPE_METADATA_KEY.to_string(), longest.to_string())];
            fields.push(Field::new(f.name(), list.data_type().clone(), false).with_metadata(shape.into()));
            columns.push(Arc::new(list) as ArrayRef);
            fields.push(Field::new(self.length_column(), DataType::Int32, false));
            columns.push(Arc::new(lengths) as ArrayRef);
        }
        Ok(RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)?)
    }
}

impl From<pushdown_planner::BucketStep> for BucketBy {
    fn from(s: pushdown_planner::BucketStep) -> Self {
        Self {
            column: s.column,
            boundaries: s.boundaries,
            pad_id: s.pad_id,
        }
    }
}

/// The ids a bucketed column of `source` type gives: 16-bit where the source's are.
fn ids_type(source: &DataType) -> DataType {
    match source {
        DataType::List(item) | DataType::LargeList(item) | DataType::FixedSizeList(item, _)
            if item.data_type() == &DataType::UInt16 =>
        {
            DataType::UInt16
        }
        _ => DataType::UInt32,
    }
}

/// The number of values in row `row` of a list column.
pub fn list_len(column: &ArrayRef, row: usize) -> Result<usize> {
    Ok(match column.data_type() {
        DataType::List(_) => column.as_list::<i32>().value_length(row) as usize,
        DataType::LargeList(_) => column.as_list::<i64>().value_length(row) as usize,
        DataType::FixedSizeList(_, n) => *n as usize,
        other => {
            return Err(ClientError::Invalid(format!(
                "bucket_by: {other} is not a list of token ids"
            )));
        }
    })
}

/// The buckets as a loader runs them: where each bucket's sequences go, and each
/// scheduled bucket's weight.
#[derive(Debug, Clone, PartialEq)]
pub struct Buckets {
    pub by: BucketBy,
    /// The scheduled bucket of each bucket (itself, or the nearest one the sample holds).
    route: Vec<usize>,
    /// Each bucket's share of the sample (0 for buckets routed elsewhere).
    weights: Vec<f64>,
    seed: u64,
}

impl Buckets {
    /// Buckets weighted by the lengths of a sample of the sequences. A bucket the sample
    /// holds fewer than `min_rows` of (a global batch's worth) is too rare to fill its
    /// batches without queueing much of the data: it joins the next longer bucket (the last
    /// ones, the next shorter), and its sequences wait there.
    pub fn from_sample(by: BucketBy, lengths: &[usize], min_rows: usize, seed: u64) -> Result<Self> {
        if lengths.is_empty() {
            return Err(ClientError::Invalid(
                "bucket_by: the sample of sequences is empty, so no bucket can be weighted".into(),
            ));
        }
        let k = by.boundaries.len() + 1;
        let mut counts = vec![0u64; k];
        for &n in lengths {
            counts[by.bucket_of(n)] += 1;
        }
        // Groups of consecutive buckets, each holding at least `min_rows` (but perhaps the
        // last), scheduled as their longest bucket.
        let min_rows = (min_rows as u64).clamp(1, lengths.len() as u64);
        let mut groups: Vec<(std::ops::Range<usize>, u64)> = Vec::new();
        let mut start = 0;
        let mut held = 0;
        for (b, &c) in counts.iter().enumerate() {
            held += c;
            if held >= min_rows {
                groups.push((start..b + 1, held));
                (start, held) = (b + 1, 0);
            }
        }
        match groups.last_mut() {
            Some((range, count)) if start < k => {
                *range = range.start..k;
                *count += held;
            }
            _ if start < k => groups.push((start..k, held)),
            _ => {}
        }
        let mut route = vec![0; k];
        let mut weights = vec![0.0; k];
        for (range, count) in groups {
            let scheduled = range.end - 1;
            for b in range {
                route[b] = scheduled;
            }
            weights[scheduled] = count as f64 / lengths.len() as f64;
        }
        Ok(Self {
            by,
            route,
            weights,
            seed,
        })
    }

    /// The buckets, merged empty ones included.
    pub fn len(&self) -> usize {
        self.weights.len()
    }

    pub fn is_empty(&self) -> bool {
        self.weights.is_empty()
    }

    /// Each bucket's weight (its share of the sample).
    pub fn weights(&self) -> &[f64] {
        &self.weights
    }

    /// The scheduled bucket a sequence of `len` tokens waits in.
    pub fn queue_of(&self, len: usize) -> usize {
        self.route[self.by.bucket_of(len)]
    }

    /// The buckets of global batches `from..` of the stream (over its epochs).
    pub fn schedule(&self, from: u64) -> BucketSchedule {
        let mut s = BucketSchedule {
            weights: self.weights.clone(),
            seed: self.seed,
            counts: vec![0; self.weights.len()],
            span: Vec::new(),
            span_index: from / SPAN,
            next: from,
        };
        // Replays the spans before `from`'s (a deal of SPAN batches each), then deals it.
        for _ in 0..from / SPAN {
            s.deal();
        }
        s.span = s.deal();
        s
    }
}

/// The buckets of successive global batches.
#[derive(Debug, Clone)]
pub struct BucketSchedule {
    weights: Vec<f64>,
    seed: u64,
    /// Batches dealt to each bucket, before `span`'s.
    counts: Vec<u64>,
    /// The current span's buckets, shuffled, and its index.
    span: Vec<usize>,
    span_index: u64,
    /// The next global batch.
    next: u64,
}

impl BucketSchedule {
    /// Deals the next span: [`SPAN`] batches to the buckets furthest behind their weights,
    /// shuffled by the seed and the span's index.
    fn deal(&mut self) -> Vec<usize> {
        let first: u64 = self.counts.iter().sum();
        let mut span: Vec<usize> = (first..first + SPAN)
            .map(|t| {
                let b = crate::deal::furthest_behind(&self.weights, &self.counts, t);
                self.counts[b] += 1;
                b
            })
            .collect();
        span.shuffle(&mut ChaCha8Rng::seed_from_u64(pushdown_ops::mix(
            self.seed,
            first / SPAN,
        )));
        span
    }
}

impl Iterator for BucketSchedule {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        if self.next / SPAN != self.span_index {
            self.span = self.deal();
            self.span_index = self.next / SPAN;
        }
        let b = self.span[(self.next % SPAN) as usize];
        self.next += 1;
        Some(b)
    }
}

/// Where a partition's bucketer is: `first`, the first of its rows (counted over the
/// stream) still queued or not yet read, and `given`, a bitmap of the rows from it on
/// already given to batches (bit `i`: row `first + i`; a restored bucketer may not have
/// read row `first` again yet, so it may be given).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BucketPos {
    pub first: u64,
    pub given: Vec<u8>,
}

impl BucketPos {
    fn is_given(&self, row: u64) -> bool {
        let Some(i) = row.checked_sub(self.first) else {
            return false;
        };
        self.given
            .get((i / 8) as usize)
            .is_some_and(|byte| byte & (1 << (i % 8)) != 0)
    }
}

/// One partition's rows, queued by bucket.
#[derive(Debug)]
pub struct Bucketer {
    /// Given rows from the restored position, not yet read again.
    restored: BucketPos,
    /// The first row not yet given.
    first: u64,
    /// The next row to be read.
    next: u64,
    /// Whether each row of `first..next` was given.
    given: VecDeque<bool>,
    /// Each bucket's rows, oldest first: (row, one row of the source's columns).
    queues: Vec<VecDeque<(u64, RecordBatch)>>,
}

impl Bucketer {
    /// A bucketer of `buckets` queues at `pos`: the first row it is given is row `pos.first`.
    pub fn new(buckets: usize, pos: BucketPos) -> Self {
        Self {
            first: pos.first,
            next: pos.first,
            restored: pos,
            given: VecDeque::new(),
            queues: vec![VecDeque::new(); buckets],
        }
    }

    /// Queues the partition's next row in `bucket` (or passes it, where the restored
    /// position says it was given already).
    pub fn push(&mut self, bucket: usize, row: RecordBatch) {
        let index = self.next;
        self.next += 1;
        let given = self.restored.is_given(index);
        self.given.push_back(given);
        if !given {
            self.queues[bucket].push_back((index, row));
        }
        self.advance();
    }

    /// Rows waiting in `bucket`.
    pub fn ready(&self, bucket: usize) -> usize {
        self.queues[bucket].len()
    }

    /// Rows waiting in every bucket.
    pub fn queued(&self) -> usize {
        self.queues.iter().map(VecDeque::len).sum()
    }

    /// The oldest `n` rows of `bucket` (the caller made sure there are).
    pub fn take(&mut self, bucket: usize, n: usize) -> Vec<RecordBatch> {
        let rows: Vec<_> = self.queues[bucket].drain(..n).collect();
        for &(index, _) in &rows {
            self.given[(index - self.first) as usize] = true;
        }
        self.advance();
        rows.into_iter().map(|(_, row)| row).collect()
    }

    /// Moves `first` past the rows given.
    fn advance(&mut self) {
        while self.given.front() == Some(&true) {
            self.given.pop_front();
            self.first += 1;
        }
    }

    /// Where the bucketer is: its first row not given (past rows a restored position said
    /// were given, read again or not), and which rows after it were.
    pub fn pos(&self) -> BucketPos {
        // Rows read since the restore (`first..next`), then the restored bits past them.
        let mut bits: Vec<bool> = self.given.iter().copied().collect();
        let end = self.restored.first + self.restored.given.len() as u64 * 8;
        bits.extend((self.next..end).map(|row| self.restored.is_given(row)));
        let skip = bits.iter().take_while(|&&g| g).count();
        let bits = &bits[skip..];
        let used = bits.iter().rposition(|&g| g).map_or(0, |i| i + 1);
        let mut given = vec![0u8; used.div_ceil(8)];
        for (i, _) in bits[..used].iter().enumerate().filter(|(_, g)| **g) {
            given[i / 8] |= 1 << (i % 8);
        }
        BucketPos {
            first: self.first + skip as u64,
            given,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::ListArray;
    use arrow::datatypes::UInt16Type;
    use rand::Rng;

    fn rows(lengths: &[usize]) -> Vec<RecordBatch> {
        lengths
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                let ids = ListArray::from_iter_primitive::<UInt16Type, _, _>([Some(
                    (0..n).map(|t| Some((i + t) as u16)).collect::<Vec<_>>(),
                )]);
                let id = Int32Array::from(vec![i as i32]);
                RecordBatch::try_from_iter([
                    ("id", Arc::new(id) as ArrayRef),
                    ("tokens", Arc::new(ids) as ArrayRef),
                ])
                .expect("batch")
            })
            .collect()
    }

    fn id(row: &RecordBatch) -> i32 {
        row.column(0)
            .as_primitive::<arrow::datatypes::Int32Type>()
            .value(0)
    }

    /// Runs `batches` global batches of `per` rows over one partition from `pos`, giving
    /// each batch's row ids and the position after each.
    fn run(
        buckets: &Buckets,
        lengths: &[usize],
        pos: BucketPos,
        from: u64,
        batches: u64,
        per: usize,
    ) -> Vec<(usize, Vec<i32>, BucketPos)> {
        let source = rows(lengths);
        let mut bucketer = Bucketer::new(buckets.len(), pos.clone());
        let mut next = pos.first as usize;
        let mut out = Vec::new();
        for bucket in buckets.schedule(from).take(batches as usize) {
            while bucketer.ready(bucket) < per {
                let row = &source[next % source.len()];
                next += 1;
                bucketer.push(
                    buckets.queue_of(list_len(row.column(1), 0).expect("len")),
                    row.clone(),
                );
            }
            let ids = bucketer.take(bucket, per).iter().map(id).collect();
            out.push((bucket, ids, bucketer.pos()));
        }
        out
    }

    fn lengths(seed: u64, n: usize) -> Vec<usize> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        (0..n)
            .map(|_| match rng.random_range(0..10) {
                0..6 => rng.random_range(1..64),
                6..9 => rng.random_range(64..256),
                _ => rng.random_range(256..512),
            })
            .collect()
    }

    #[test]
    fn every_batch_holds_one_bucket_and_rows_are_given_once() {
        let by = BucketBy::new("tokens", vec![64, 256]);
        let data = lengths(1, 4000);
        let buckets = Buckets::from_sample(by.clone(), &data[..500], 8, 7).expect("buckets");
        let out = run(&buckets, &data, BucketPos::default(), 0, 300, 8);
        let mut seen = std::collections::HashSet::new();
        for (bucket, ids, _) in &out {
            for &i in ids {
                assert_eq!(buckets.queue_of(data[i as usize]), *bucket, "row {i}");
                assert!(seen.insert(i), "row {i} given twice");
            }
        }
        // Each bucket's batches follow its share of the sample.
        for b in 0..3 {
            let n = out.iter().filter(|(k, _, _)| *k == b).count() as f64;
            assert!((n / 300.0 - buckets.weights()[b]).abs() < 0.03, "bucket {b}: {n}");
        }
    }

    #[test]
    fn a_bucketer_resumed_at_any_batch_gives_the_same_rows() {
        let by = BucketBy::new("tokens", vec![64, 256]);
        let data = lengths(2, 3000);
        let buckets = Buckets::from_sample(by, &data[..400], 4, 3).expect("buckets");
        let whole = run(&buckets, &data, BucketPos::default(), 0, 120, 4);
        for at in [1usize, 17, 40, 99] {
            let pos = whole[at - 1].2.clone();
            let rest = run(&buckets, &data, pos, at as u64, (120 - at) as u64, 4);
            for (a, b) in whole[at..].iter().zip(&rest) {
                assert_eq!((a.0, &a.1, &a.2), (b.0, &b.1, &b.2), "resumed after batch {at}");
            }
        }
    }

    #[test]
    fn the_schedule_replays_from_any_batch_and_skips_empty_buckets() {
        let by = BucketBy::new("tokens", vec![10, 20, 30]);
        // Nothing in [10, 20): its sequences wait in [20, 30).
        let buckets = Buckets::from_sample(by.clone(), &[1, 2, 25, 26, 40], 1, 11).expect("buckets");
        assert_eq!(buckets.queue_of(15), 2);
        assert_eq!(buckets.queue_of(100), 3);
        // Buckets under two rows of the sample join the next longer; the last, the shorter.
        let rare = Buckets::from_sample(by, &[1, 2, 12, 25, 26, 27, 40], 2, 11).expect("buckets");
        assert_eq!((rare.queue_of(1), rare.queue_of(12)), (0, 3));
        assert_eq!((rare.queue_of(25), rare.queue_of(40)), (3, 3));
        assert_eq!(rare.weights(), &[2.0 / 7.0, 0.0, 0.0, 5.0 / 7.0]);
        let all: Vec<usize> = buckets.schedule(0).take(100).collect();
        assert!(all.iter().all(|&b| b != 1));
        for from in [0u64, 5, 16, 33, 64] {
            let tail: Vec<usize> = buckets.schedule(from).take(20).collect();
            assert_eq!(tail, all[from as usize..from as usize + 20]);
        }
    }

    #[test]
    fn padded_batches_pad_to_their_longest_and_keep_16_bit_ids() {
        let by = BucketBy {
            pad_id: 9,
            ..BucketBy::new("tokens", vec![4])
        };
        let source = rows(&[2, 5, 3]);
        let batch = by.padded(&source).expect("padded");
        assert_eq!(
            batch.schema().field(1).data_type().to_string(),
            "FixedSizeList(5 x non-null UInt16)"
        );
        let tokens = batch.column(1).as_fixed_size_list();
        let values = tokens.values().as_primitive::<UInt16Type>().values().to_vec();
        assert_eq!(&values[..5], &[0, 1, 9, 9, 9]);
        assert_eq!(&values[10..], &[2, 3, 4, 9, 9]);
        let lengths = batch.column(2).as_primitive::<arrow::datatypes::Int32Type>();
        assert_eq!(lengths.values().to_vec(), vec![2, 5, 3]);
        assert_eq!(batch.schema().field(2).name(), "tokens_length");
    }

    #[test]
    fn bad_settings_are_refused_by_name() {
        let schema = rows(&[1])[0].schema();
        for (by, says) in [
            (BucketBy::new("tokens", vec![]), "one or more"),
            (BucketBy::new("tokens", vec![0, 4]), "one or more"),
            (BucketBy::new("tokens", vec![8, 8]), "must increase"),
            (BucketBy::new("id", vec![8]), "not a list of token ids"),
            (BucketBy::new("body", vec![8]), "no column `body`"),
            (
                BucketBy {
                    pad_id: 70000,
                    ..BucketBy::new("tokens", vec![8])
                },
                "16-bit",
            ),
        ] {
            let e = by.check(&schema).expect_err("refused").to_string();
            assert!(e.contains(says), "{e}");
        }
    }
}
