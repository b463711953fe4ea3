//! The pipeline a trainer describes, as a Rust builder or a TOML/JSON file.
//!
//! ```toml
//! dataset = "images"
//!
//! [[steps]]
//! op = "filter"
//! expr = "label < 100"
//!
//! [[steps]]
//! op = "select"
//! columns = ["image", "label"]
//!
//! [[steps]]
//! op = "shuffle"
//! buffer = 10000
//!
//! [[steps]]
//! op = "batch"
//! size = 256
//! drop_last = true
//! ```

use std::fmt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::PlanError;

/// A dataset and the ordered steps a trainer wants applied to it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pipeline {
    pub dataset: String,
    #[serde(default)]
    steps: Vec<Step>,
}

/// One step of a pipeline. Every step declares whether it is deterministic, whether it is
/// row-wise (each output row depends on one input row, order irrelevant), and which columns it
/// reads and writes; the planner decides with those properties alone.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Step {
    /// Keep these columns, in this order.
    Select { columns: Vec<String> },
    /// Keep rows for which the SQL boolean expression is true.
    Filter { expr: String },
    /// Shuffle rows through a buffer of `buffer` rows.
    Shuffle { buffer: usize },
    /// Apply an op to a column.
    Map(MapStep),
    /// Group rows into batches of `size`.
    Batch {
        size: usize,
        #[serde(default)]
        drop_last: bool,
    },
    /// Pack each document's token ids into blocks (the loader's `pack=`): the last step but
    /// for a batch step, which then counts blocks.
    Pack(PackStep),
    /// Draw every global batch from one length bucket (the loader's `bucket_by=`): the last
    /// step but for a batch step.
    BucketBy(BucketStep),
}

/// `pack`: documents' token ids in `column` packed into blocks of `length` tokens, each
/// document followed by `eos_id` when given; `split_documents = false` keeps documents whole
/// (a block's tail padded with `pad_id`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PackStep {
    pub column: String,
    pub length: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eos_id: Option<u32>,
    #[serde(default = "split_by_default")]
    pub split_documents: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pad_id: Option<u32>,
}

fn split_by_default() -> bool {
    true
}

/// `bucket_by`: `column`'s token lists bucketed at `boundaries`, padded with `pad_id`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BucketStep {
    pub column: String,
    pub boundaries: Vec<u32>,
    #[serde(default)]
    pub pad_id: u32,
}

/// `call(input, params…)`, written to `output` (default: the input column, replaced). The
/// input may name a struct's field, `image.bytes` or `image['bytes']` (the Hub's image
/// struct); the default output is then the struct's column.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MapStep {
    pub call: String,
    pub input: String,
    #[serde(default)]
    pub params: Vec<pushdown_ops::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
}

impl MapStep {
    /// The column the op writes.
    pub fn output(&self) -> &str {
        match &self.output {
            Some(output) => output,
            None => match self.input.find(['.', '[']) {
                Some(end) => &self.input[..end],
                None => &self.input,
            },
        }
    }

    /// The registered op this step calls, if any.
    pub fn op(&self) -> Option<&'static dyn pushdown_ops::Op> {
        pushdown_ops::lookup(&self.call)
    }

    /// The step as the op call both sides execute.
    pub fn call(&self) -> pushdown_ops::Call {
        pushdown_ops::Call::new(&self.call, &self.input, self.params.clone(), self.output())
    }
}

impl Pipeline {
    pub fn new(dataset: impl Into<String>) -> Self {
        Self {
            dataset: dataset.into(),
            steps: Vec::new(),
        }
    }

    pub fn steps(&self) -> &[Step] {
        &self.steps
    }

    pub fn step(mut self, step: Step) -> Self {
        self.steps.push(step);
        self
    }

    pub fn select<I, S>(self, columns: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.step(Step::Select {
            columns: columns.into_iter().map(Into::into).collect(),
        })
    }

    pub fn filter(self, expr: impl Into<String>) -> Self {
        self.step(Step::Filter { expr: expr.into() })
    }

    pub fn shuffle(self, buffer: usize) -> Self {
        self.step(Step::Shuffle { buffer })
    }

    /// `call(input, params…) AS output`.
    pub fn map<P: Into<pushdown_ops::Value>>(
        self,
        call: &str,
        input: &str,
        params: impl IntoIterator<Item = P>,
        output: &str,
    ) -> Self {
        self.step(Step::Map(MapStep {
            call: call.into(),
            input: input.into(),
            params: params.into_iter().map(Into::into).collect(),
            output: (output != input).then(|| output.to_owned()),
        }))
    }

    pub fn batch(self, size: usize) -> Self {
        self.step(Step::Batch {
            size,
            drop_last: false,
        })
    }

    /// The pipeline without its `pack` or `bucket_by` step, and that step: a loader reads
    /// the rest and regroups its rows so.
    pub fn without_regroup(&self) -> (Pipeline, Option<Step>) {
        let mut rest = self.clone();
        let at = rest
            .steps
            .iter()
            .position(|s| matches!(s, Step::Pack(_) | Step::BucketBy(_)));
        let step = at.map(|i| rest.steps.remove(i));
        (rest, step)
    }

    /// Parses a pipeline file: TOML, or JSON when the text starts with `{`.
    pub fn parse(text: &str) -> Result<Self, PlanError> {
        if text.trim_start().starts_with('{') {
            serde_json::from_str(text).map_err(|e| PlanError::Format(e.to_string()))
        } else {
            toml::from_str(text).map_err(|e| PlanError::Format(e.to_string()))
        }
    }

    /// Reads and parses a pipeline file.
    pub fn from_file(path: &Path) -> Result<Self, PlanError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| PlanError::Format(format!("{}: {e}", path.display())))?;
        Self::parse(&text)
    }

    pub fn to_toml(&self) -> String {
        toml::to_string(self).unwrap_or_else(|e| format!("# not representable as TOML: {e}"))
    }
}

impl Step {
    /// The same input gives the same output, whatever the seed or epoch.
    pub fn is_deterministic(&self) -> bool {
        match self {
            Step::Select { .. } | Step::Filter { .. } | Step::Batch { .. } => true,
            Step::Pack(_) | Step::BucketBy(_) => true,
            Step::Map(m) => m.op().is_some_and(|op| op.is_deterministic()),
            Step::Shuffle { .. } => false,
        }
    }

    /// Each output row depends only on one input row, whatever the order.
    pub fn is_row_wise(&self) -> bool {
        match self {
            Step::Select { .. } | Step::Filter { .. } | Step::Map(_) => true,
            Step::Shuffle { .. } | Step::Batch { .. } | Step::Pack(_) | Step::BucketBy(_) => false,
        }
    }

    /// A filter may move from after this step to before it (when it reads nothing this step
    /// writes): true of row-wise steps and of permutations such as a shuffle, whose output
    /// rows are its input rows; false of batching.
    pub fn commutes_with_filters(&self) -> bool {
        match self {
            Step::Select { .. } | Step::Filter { .. } | Step::Shuffle { .. } | Step::Map(_) => true,
            Step::Batch { .. } | Step::Pack(_) | Step::BucketBy(_) => false,
        }
    }

    /// Columns this step reads. Filters that do not parse read nothing here (planning reports
    /// their parse errors).
    pub fn reads(&self) -> Vec<String> {
        self.reads_checked().unwrap_or_default()
    }

    pub(crate) fn reads_checked(&self) -> Result<Vec<String>, String> {
        match self {
            Step::Select { columns } => Ok(columns.clone()),
            Step::Filter { expr } => crate::expr::columns_read(expr),
            Step::Map(m) => Ok(vec![pushdown_ops::input_column(&m.input)]),
            Step::Pack(p) => Ok(vec![p.column.clone()]),
            Step::BucketBy(b) => Ok(vec![b.column.clone()]),
            Step::Shuffle { .. } | Step::Batch { .. } => Ok(vec![]),
        }
    }

    /// Columns this step creates or replaces.
    pub fn writes(&self) -> Vec<String> {
        match self {
            Step::Map(m) => vec![m.output().to_owned()],
            Step::Pack(_) => vec!["tokens".to_owned(), "position_ids".to_owned()],
            Step::BucketBy(b) => vec![format!("{}_length", b.column)],
            Step::Select { .. } | Step::Filter { .. } | Step::Shuffle { .. } | Step::Batch { .. } => vec![],
        }
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::Select { columns } => write!(f, "select [{}]", columns.join(", ")),
            Step::Filter { expr } => write!(f, "filter {expr}"),
            Step::Shuffle { buffer } => write!(f, "shuffle buffer={buffer}"),
            Step::Map(m) => {
                write!(f, "{}({}", m.call, m.input)?;
                for p in &m.params {
                    write!(f, ", {}", p)?;
                }
                write!(f, ")")?;
                match &m.output {
                    Some(o) => write!(f, " AS {o}"),
                    None => Ok(()),
                }
            }
            Step::Batch { size, drop_last } => {
                write!(f, "batch {size}{}", if *drop_last { " drop_last" } else { "" })
            }
            Step::Pack(p) => {
                write!(f, "pack {} length={}", p.column, p.length)?;
                if let Some(eos) = p.eos_id {
                    write!(f, " eos_id={eos}")?;
                }
                if !p.split_documents {
                    write!(f, " whole documents")?;
                }
                Ok(())
            }
            Step::BucketBy(b) => write!(f, "bucket_by {} boundaries={:?}", b.column, b.boundaries),
        }
    }
}
