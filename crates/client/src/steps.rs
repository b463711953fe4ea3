//! The row-wise client steps of a plan (selects and op calls), as a pure function of a batch
//! and a key. Op calls run on [`pushdown_ops::Calls`], the executor servers and tests use.

use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use pushdown_ops::{Calls, call_seed, mix};
use pushdown_planner::Step;

use crate::error::{ClientError, Result};

/// One stage: a projection, or a run of consecutive op calls.
#[derive(Debug)]
enum Stage {
    Select(Vec<usize>),
    Calls { calls: Calls, seed: u64 },
}

/// The row-wise client steps (selects and op calls) as a pure function of a batch and a key:
/// random ops draw from `(stage seed, key)` and the row's position in the batch, so a batch
/// gets the same augmentation whichever thread runs it, and again after a resume.
#[derive(Debug)]
pub struct RowSteps {
    stages: Vec<Stage>,
    schema: SchemaRef,
    resources: Arc<dyn pushdown_ops::Resources>,
}

impl RowSteps {
    /// `steps` must be selects and maps (shuffles and batching are the loader's).
    pub fn new(
        steps: &[Step],
        schema: SchemaRef,
        seed: u64,
        resources: Arc<dyn pushdown_ops::Resources>,
    ) -> Result<Self> {
        let mut current = schema;
        let mut stages = Vec::new();
        let mut i = 0;
        while i < steps.len() {
            match &steps[i] {
                Step::Select { columns } => {
                    let indices = columns
                        .iter()
                        .map(|c| current.index_of(c))
                        .collect::<Result<Vec<_>, _>>()?;
                    current = Arc::new(current.project(&indices)?);
                    stages.push(Stage::Select(indices));
                    i += 1;
                }
                Step::Map(_) => {
                    // Seeded by the random ops before it, which are the trainer's wherever
                    // the deterministic ones run: placement never changes a draw.
                    let first = steps[..i]
                        .iter()
                        .filter(|s| matches!(s, Step::Map(_)) && !s.is_deterministic())
                        .count();
                    let mut calls = Vec::new();
                    while let Some(Step::Map(m)) = steps.get(i) {
                        calls.push(m.call());
                        i += 1;
                    }
                    let calls = Calls::bind(&calls, Arc::clone(&current), resources.as_ref())?;
                    current = calls.schema();
                    stages.push(Stage::Calls {
                        calls,
                        seed: call_seed(seed, first),
                    });
                }
                other => {
                    return Err(ClientError::Invalid(format!(
                        "{other:?} is not a row-wise step: shuffles and batching are the loader's, filters the server's"
                    )));
                }
            }
        }
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
            batch = match stage {
                Stage::Select(indices) => batch.project(indices)?,
                Stage::Calls { calls, seed } => calls.apply(
                    batch,
                    &pushdown_ops::Context {
                        seed: mix(*seed, key),
                        resources: self.resources.as_ref(),
                    },
                )?,
            };
        }
        Ok(batch)
    }
}
