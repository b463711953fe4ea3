//! The client side of a plan: shuffle buffer, select, batch, applied batch by batch.

use std::sync::Arc;

use arrow::compute::BatchCoalescer;
use arrow::compute::interleave_record_batch;
use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use pushdown_planner::Step;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::{ClientError, Result};

/// A seeded shuffle buffer over rows (the tf.data algorithm): once `capacity` rows are held,
/// each further row pushes out one uniformly chosen held row.
///
/// Rows are gathered with `interleave`, so a batch of output costs one copy, and an input
/// batch is released once all its rows have left.
#[derive(Debug)]
pub struct ShuffleBuffer {
    capacity: usize,
    rng: ChaCha8Rng,
    batches: Vec<Option<RecordBatch>>,
    remaining: Vec<usize>,
    slots: Vec<(usize, usize)>,
    out_rows: usize,
}

impl ShuffleBuffer {
    /// `out_rows`: rows per emitted batch.
    pub fn new(capacity: usize, seed: u64, out_rows: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            rng: ChaCha8Rng::seed_from_u64(seed),
            batches: Vec::new(),
            remaining: Vec::new(),
            slots: Vec::new(),
            out_rows: out_rows.max(1),
        }
    }

    pub fn push(&mut self, batch: RecordBatch) -> Result<Vec<RecordBatch>> {
        if batch.num_rows() == 0 {
            return Ok(vec![]);
        }
        let b = self.batches.len();
        self.slots.extend((0..batch.num_rows()).map(|r| (b, r)));
        self.remaining.push(batch.num_rows());
        self.batches.push(Some(batch));
        let mut out = Vec::new();
        while self.slots.len() >= self.capacity + self.out_rows {
            out.push(self.emit(self.out_rows)?);
        }
        Ok(out)
    }

    /// Drains every held row in random order.
    pub fn finish(&mut self) -> Result<Vec<RecordBatch>> {
        let mut out = Vec::new();
        while !self.slots.is_empty() {
            out.push(self.emit(self.out_rows.min(self.slots.len()))?);
        }
        Ok(out)
    }

    fn emit(&mut self, n: usize) -> Result<RecordBatch> {
        let mut picked = Vec::with_capacity(n);
        for _ in 0..n {
            let i = self.rng.random_range(0..self.slots.len());
            picked.push(self.slots.swap_remove(i));
        }
        // Interleave over the live batches only.
        let mut index_of = vec![usize::MAX; self.batches.len()];
        let mut live: Vec<&RecordBatch> = Vec::new();
        for (i, b) in self.batches.iter().enumerate() {
            if let Some(b) = b {
                index_of[i] = live.len();
                live.push(b);
            }
        }
        let indices: Vec<(usize, usize)> = picked.iter().map(|&(b, r)| (index_of[b], r)).collect();
        let out = interleave_record_batch(&live, &indices)?;
        for &(b, _) in &picked {
            self.remaining[b] -= 1;
            if self.remaining[b] == 0 {
                self.batches[b] = None;
            }
        }
        if self.batches.len() > 64
            && self.batches.iter().filter(|b| b.is_none()).count() * 2 > self.batches.len()
        {
            self.compact();
        }
        Ok(out)
    }

    /// Drops released batches from the index space.
    fn compact(&mut self) {
        let mut remap = vec![usize::MAX; self.batches.len()];
        let mut batches = Vec::new();
        let mut remaining = Vec::new();
        for (i, b) in self.batches.drain(..).enumerate() {
            if let Some(b) = b {
                remap[i] = batches.len();
                batches.push(Some(b));
                remaining.push(self.remaining[i]);
            }
        }
        for slot in &mut self.slots {
            slot.0 = remap[slot.0];
        }
        self.batches = batches;
        self.remaining = remaining;
    }
}

/// The seed of stage `i`, derived from the pipeline's seed.
fn stage_seed(seed: u64, i: usize) -> u64 {
    mix(seed, 0x9E37_79B9_7F4A_7C15u64.wrapping_mul(i as u64 + 1))
}

/// SplitMix64 finalizer over two words: decorrelated seeds from counters.
pub(crate) fn mix(a: u64, b: u64) -> u64 {
    let mut z = a ^ b.rotate_left(32) ^ 0x9E37_79B9_7F4A_7C15;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[derive(Debug)]
enum Stage {
    Shuffle(Box<ShuffleBuffer>),
    /// A select or an op call; random ops draw batch `k` from `(seed, k)`.
    Row {
        stage: RowStage,
        batches: u64,
    },
    Batch {
        coalescer: BatchCoalescer,
        drop_last: bool,
        size: usize,
    },
}

/// The client steps of a plan, applied in order to the batches the servers send.
#[derive(Debug)]
pub struct ClientSteps {
    stages: Vec<Stage>,
    schema: SchemaRef,
    resources: Arc<dyn pushdown_ops::Resources>,
}

impl ClientSteps {
    /// Builds the stages for batches of `schema`. Each shuffle gets its own seed derived from
    /// `seed` and its position.
    pub fn new(steps: &[Step], schema: SchemaRef, seed: u64) -> Result<Self> {
        let mut stages = Vec::new();
        let mut current = schema;
        for (i, step) in steps.iter().enumerate() {
            match step {
                Step::Shuffle { buffer } => {
                    let stage_seed = stage_seed(seed, i);
                    stages.push(Stage::Shuffle(Box::new(ShuffleBuffer::new(
                        *buffer, stage_seed, 1024,
                    ))));
                }
                Step::Batch { size, drop_last } => stages.push(Stage::Batch {
                    coalescer: BatchCoalescer::new(Arc::clone(&current), *size),
                    drop_last: *drop_last,
                    size: *size,
                }),
                Step::Select { .. } | Step::Map(_) => {
                    let stage = RowStage::build(step, &mut current, seed, i)?;
                    stages.push(Stage::Row { stage, batches: 0 });
                }
                Step::Filter { expr } => {
                    return Err(ClientError::Invalid(format!(
                        "filter `{expr}` cannot run on the client; the planner places filters on the server"
                    )));
                }
            }
        }
        Ok(Self {
            stages,
            schema: current,
            resources: Arc::new(pushdown_ops::NoResources),
        })
    }

    /// The resources (tokenizers) client-side ops resolve, e.g. those fetched with
    /// [`crate::PushdownClient::resources_for`].
    pub fn with_resources(mut self, resources: Arc<dyn pushdown_ops::Resources>) -> Self {
        self.resources = resources;
        self
    }

    /// Schema of the batches this produces.
    pub fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    pub fn push(&mut self, batch: RecordBatch) -> Result<Vec<RecordBatch>> {
        self.run_from(0, vec![batch])
    }

    /// Flushes every stage at the end of the input.
    pub fn finish(&mut self) -> Result<Vec<RecordBatch>> {
        let mut out = Vec::new();
        for i in 0..self.stages.len() {
            let flushed = match &mut self.stages[i] {
                Stage::Shuffle(s) => s.finish()?,
                Stage::Row { .. } => vec![],
                Stage::Batch {
                    coalescer,
                    drop_last,
                    size,
                } => {
                    coalescer.finish_buffered_batch()?;
                    let mut last = Vec::new();
                    while let Some(b) = coalescer.next_completed_batch() {
                        if !(*drop_last && b.num_rows() < *size) {
                            last.push(b);
                        }
                    }
                    last
                }
            };
            out = self.run_from(i + 1, out.into_iter().chain(flushed).collect())?;
        }
        Ok(out)
    }

    fn run_from(&mut self, first: usize, mut batches: Vec<RecordBatch>) -> Result<Vec<RecordBatch>> {
        let resources = Arc::clone(&self.resources);
        for stage in &mut self.stages[first..] {
            let mut next = Vec::new();
            for batch in batches {
                match stage {
                    Stage::Shuffle(s) => next.extend(s.push(batch)?),
                    Stage::Row { stage, batches } => {
                        next.push(stage.apply(batch, *batches, resources.as_ref())?);
                        *batches += 1;
                    }
                    Stage::Batch { coalescer, .. } => {
                        coalescer.push_batch(batch)?;
                        while let Some(b) = coalescer.next_completed_batch() {
                            next.push(b);
                        }
                    }
                }
            }
            batches = next;
        }
        Ok(batches)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Array, Int64Array};
    use arrow::datatypes::{DataType, Field, Schema};

    fn batch(start: i64, n: i64) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
        RecordBatch::try_new(
            schema,
            vec![Arc::new(Int64Array::from_iter_values(start..start + n))],
        )
        .unwrap()
    }

    fn ids(batches: &[RecordBatch]) -> Vec<i64> {
        batches
            .iter()
            .flat_map(|b| {
                let a = b.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
                (0..a.len()).map(|i| a.value(i)).collect::<Vec<_>>()
            })
            .collect()
    }

    fn run(steps: &[Step], seed: u64, inputs: Vec<RecordBatch>) -> Vec<RecordBatch> {
        let mut s = ClientSteps::new(steps, inputs[0].schema(), seed).unwrap();
        let mut out = Vec::new();
        for b in inputs {
            out.extend(s.push(b).unwrap());
        }
        out.extend(s.finish().unwrap());
        out
    }

    #[test]
    fn shuffle_is_a_seeded_permutation() {
        let inputs: Vec<_> = (0..20).map(|i| batch(i * 97, 97)).collect();
        let steps = [Step::Shuffle { buffer: 300 }];
        let a = ids(&run(&steps, 7, inputs.clone()));
        let b = ids(&run(&steps, 7, inputs.clone()));
        let c = ids(&run(&steps, 8, inputs));
        assert_eq!(a, b, "same seed, same order");
        assert_ne!(a, c, "another seed, another order");
        let mut sorted = a.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..20 * 97).collect::<Vec<_>>(), "every row exactly once");
        assert_ne!(a, sorted, "actually shuffled");
        // The buffer mixes rows across input batches: the first output is drawn from the rows
        // held at the first emission (14 batches of 97 >= buffer 300 + 1024 out), from many
        // of those batches.
        assert!(a[..100].iter().all(|&x| x < 14 * 97));
        let batches_seen: std::collections::BTreeSet<i64> = a[..100].iter().map(|x| x / 97).collect();
        assert!(batches_seen.len() > 5, "{batches_seen:?}");
    }

    #[test]
    fn batch_sizes_and_drop_last() {
        let inputs: Vec<_> = (0..5).map(|i| batch(i * 7, 7)).collect();
        let out = run(
            &[Step::Batch {
                size: 10,
                drop_last: false,
            }],
            0,
            inputs.clone(),
        );
        assert_eq!(
            out.iter().map(|b| b.num_rows()).collect::<Vec<_>>(),
            vec![10, 10, 10, 5]
        );
        assert_eq!(ids(&out), (0..35).collect::<Vec<_>>());
        let out = run(
            &[Step::Batch {
                size: 10,
                drop_last: true,
            }],
            0,
            inputs,
        );
        assert_eq!(
            out.iter().map(|b| b.num_rows()).collect::<Vec<_>>(),
            vec![10, 10, 10]
        );
    }

    #[test]
    fn shuffle_then_batch_keeps_every_row() {
        let inputs: Vec<_> = (0..50).map(|i| batch(i * 33, 33)).collect();
        let out = run(
            &[
                Step::Shuffle { buffer: 100 },
                Step::Batch {
                    size: 64,
                    drop_last: false,
                },
            ],
            3,
            inputs,
        );
        assert!(out[..out.len() - 1].iter().all(|b| b.num_rows() == 64));
        let mut all = ids(&out);
        all.sort_unstable();
        assert_eq!(all, (0..50 * 33).collect::<Vec<_>>());
    }
}

#[derive(Debug)]
enum RowStage {
    Select(Vec<usize>),
    Map {
        op: &'static dyn pushdown_ops::Op,
        input: usize,
        input_field: arrow::datatypes::FieldRef,
        params: Vec<pushdown_ops::Value>,
        output: Option<usize>,
        schema: SchemaRef,
        seed: u64,
    },
}

impl RowStage {
    /// The stage of `step` (a select or a map at position `i`) over batches of `current`,
    /// which becomes the stage's output schema.
    fn build(step: &Step, current: &mut SchemaRef, seed: u64, i: usize) -> Result<Self> {
        match step {
            Step::Select { columns } => {
                let indices = columns
                    .iter()
                    .map(|c| current.index_of(c))
                    .collect::<Result<Vec<_>, _>>()?;
                *current = Arc::new(current.project(&indices)?);
                Ok(RowStage::Select(indices))
            }
            Step::Map(m) => {
                let op = m
                    .op()
                    .ok_or_else(|| ClientError::Invalid(format!("unknown op `{}`", m.call)))?;
                let input = current.index_of(&m.input)?;
                let input_field = Arc::clone(&current.fields()[input]);
                let name = m.output();
                let params = m.values();
                let field = op.output_field(current.field(input), &params, name)?;
                let output = current.index_of(name).ok();
                let mut fields: Vec<_> = current.fields().iter().cloned().collect();
                match output {
                    Some(i) => fields[i] = Arc::new(field),
                    None => fields.push(Arc::new(field)),
                }
                *current = Arc::new(arrow::datatypes::Schema::new(fields));
                Ok(RowStage::Map {
                    op,
                    input,
                    input_field,
                    params,
                    output,
                    schema: Arc::clone(current),
                    seed: stage_seed(seed, i),
                })
            }
            other => Err(ClientError::Invalid(format!("{other:?} is not a row-wise step"))),
        }
    }

    /// Applies the stage; a random op draws from `(its seed, key)` and the row.
    fn apply(
        &self,
        batch: RecordBatch,
        key: u64,
        resources: &dyn pushdown_ops::Resources,
    ) -> Result<RecordBatch> {
        match self {
            RowStage::Select(indices) => Ok(batch.project(indices)?),
            RowStage::Map {
                op,
                input,
                input_field,
                params,
                output,
                schema,
                seed,
            } => {
                let ctx = pushdown_ops::Context {
                    seed: mix(*seed, key),
                    resources,
                };
                let out = op.apply_in(batch.column(*input), input_field, params, &ctx)?;
                let mut columns = batch.columns().to_vec();
                match output {
                    Some(i) => columns[*i] = out,
                    None => columns.push(out),
                }
                Ok(RecordBatch::try_new(Arc::clone(schema), columns)?)
            }
        }
    }
}

/// The row-wise client steps (selects and op calls) as a pure function of a batch and a key:
/// random ops draw from `(step seed, key)` and the row's position in the batch, so a batch
/// gets the same augmentation whichever thread runs it, and again after a resume.
#[derive(Debug)]
pub struct RowSteps {
    stages: Vec<RowStage>,
    schema: SchemaRef,
    resources: Arc<dyn pushdown_ops::Resources>,
}

impl RowSteps {
    /// `steps` must be selects and maps (shuffles and batching are the caller's).
    pub fn new(
        steps: &[Step],
        schema: SchemaRef,
        seed: u64,
        resources: Arc<dyn pushdown_ops::Resources>,
    ) -> Result<Self> {
        let mut current = schema;
        let stages = steps
            .iter()
            .enumerate()
            .map(|(i, step)| RowStage::build(step, &mut current, seed, i))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            stages,
            schema: current,
            resources,
        })
    }

    pub fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    /// Applies every step to `batch`; `key` identifies the batch (its index in the epoch).
    pub fn apply(&self, mut batch: RecordBatch, key: u64) -> Result<RecordBatch> {
        for stage in &self.stages {
            batch = stage.apply(batch, key, self.resources.as_ref())?;
        }
        Ok(batch)
    }
}
