//! Op calls over record batches: the one executor that servers (profiling), clients and
//! tests share.
//!
//! A [`Call`] names an op, its input column, its literal parameters and the column it
//! writes. [`Calls::bind`] checks a list of calls against an input schema once (op names,
//! columns, parameters, output fields with their tensor shapes); [`Calls::apply`] then runs
//! them on each batch. A call whose output names an existing column replaces it in place;
//! otherwise the output is appended.

use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::ArrayRef;
use arrow::datatypes::{FieldRef, Schema, SchemaRef};
use arrow::record_batch::RecordBatch;

use crate::op::{Context, Op, OpError, Result, Value};
use crate::registry::lookup;
use crate::resources::Need;

/// The parts of an input that names a struct's field: `image.bytes` or `image['bytes']` is
/// `["image", "bytes"]` (deeper paths likewise); a plain name is itself.
pub fn input_path(input: &str) -> Vec<String> {
    if let Some((root, rest)) = input.split_once("['")
        && let Some(rest) = rest.strip_suffix("']")
    {
        return std::iter::once(root.to_owned())
            .chain(rest.split("']['").map(str::to_owned))
            .collect();
    }
    input.split('.').map(str::to_owned).collect()
}

/// The top-level column an input reads: `image` for `image.bytes` (itself when a column
/// of that exact name exists, or the input is not a path).
pub fn input_column(input: &str) -> String {
    input_path(input).swap_remove(0)
}

/// Where `input` is in `schema`: a column of that exact name, or a field inside a struct
/// column (`image.bytes`, `image['bytes']`): the indices down to it and its field.
pub fn resolve_input(schema: &Schema, input: &str) -> Option<(Vec<usize>, FieldRef)> {
    if let Ok(i) = schema.index_of(input) {
        return Some((vec![i], Arc::clone(&schema.fields()[i])));
    }
    let path = input_path(input);
    let (first, rest) = path.split_first()?;
    let root = schema.index_of(first).ok()?;
    let mut field: FieldRef = Arc::new(schema.field(root).clone());
    let mut indices = vec![root];
    for name in rest {
        let arrow::datatypes::DataType::Struct(children) = field.data_type() else {
            return None;
        };
        let (i, child) = children.find(name)?;
        indices.push(i);
        // A field of a null struct is null: the child is as nullable as its parents.
        let nullable = child.is_nullable() || field.is_nullable();
        field = Arc::new(child.as_ref().clone().with_nullable(nullable));
    }
    Some((indices, field))
}

/// The array at `path` (from [`resolve_input`]) in `batch`: a struct's field with the
/// struct's own nulls added to it.
pub fn input_array(batch: &RecordBatch, path: &[usize]) -> Result<ArrayRef> {
    use arrow::array::{Array, AsArray};
    let (first, rest) = path.split_first().ok_or_else(|| OpError::BadArguments {
        op: "input",
        reason: "an empty column path".into(),
    })?;
    let mut array = Arc::clone(batch.column(*first));
    for &i in rest {
        let parent = array.as_struct_opt().ok_or_else(|| OpError::BadArguments {
            op: "input",
            reason: format!("a field of a column of type {}, not a struct", array.data_type()),
        })?;
        let child = Arc::clone(parent.column(i));
        array = match arrow::buffer::NullBuffer::union(parent.nulls(), child.nulls()) {
            nulls if nulls.as_ref() == child.nulls() => child,
            nulls => {
                let data = child
                    .to_data()
                    .into_builder()
                    .nulls(nulls)
                    .build()
                    .map_err(|source| OpError::Arrow {
                        op: "input",
                        cause: source,
                    })?;
                arrow::array::make_array(data)
            }
        };
    }
    Ok(array)
}

/// `op(input, params…) AS output`.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    pub op: String,
    pub input: String,
    pub params: Vec<Value>,
    pub output: String,
}

impl Call {
    pub fn new(
        op: impl Into<String>,
        input: impl Into<String>,
        params: Vec<Value>,
        output: impl Into<String>,
    ) -> Self {
        Self {
            op: op.into(),
            input: input.into(),
            params,
            output: output.into(),
        }
    }

    /// The registered op this call names.
    pub fn resolve(&self) -> Result<&'static dyn Op> {
        lookup(&self.op).ok_or_else(|| OpError::UnknownOp(self.op.clone()))
    }

    /// What the call needs beyond its input and literals (see [`Op::needs`]).
    pub fn needs(&self) -> Result<Vec<Need>> {
        Ok(self.resolve()?.needs(&self.params))
    }
}

impl std::fmt::Display for Call {
    /// `thumbnail(image, 64) AS image`, with text parameters quoted as SQL literals.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}({}", self.op, self.input)?;
        for p in &self.params {
            write!(f, ", {p}")?;
        }
        write!(f, ") AS {}", self.output)
    }
}

/// One call bound to the schema it reads.
#[derive(Debug)]
struct Bound {
    call: Call,
    op: &'static dyn Op,
    /// The input column, or the path to a struct's field ([`resolve_input`]).
    input: Vec<usize>,
    input_field: FieldRef,
    /// The column replaced, or `None` to append.
    replaces: Option<usize>,
    /// The batch's schema after this call.
    schema: SchemaRef,
}

/// One call's run on one batch, for callers that measure ([`Calls::apply_observed`]).
#[derive(Debug)]
pub struct CallRun<'a> {
    pub call: &'a Call,
    pub input: &'a ArrayRef,
    pub output: &'a ArrayRef,
    pub elapsed: Duration,
}

/// Op calls checked against an input schema, ready to run on its batches.
#[derive(Debug)]
pub struct Calls {
    bound: Vec<Bound>,
    input: SchemaRef,
    output: SchemaRef,
}

impl Calls {
    /// Checks `calls`, in order, against batches of `schema`: every op exists, every input
    /// column exists when its call runs, every parameter is valid. Output types come from
    /// [`Op::output_field_in`] with `resources` (those the calls will run with).
    pub fn bind(calls: &[Call], schema: SchemaRef, resources: &dyn crate::Resources) -> Result<Self> {
        let mut current = Arc::clone(&schema);
        let mut bound = Vec::with_capacity(calls.len());
        for call in calls {
            let op = call.resolve()?;
            let (input, input_field) =
                resolve_input(&current, &call.input).ok_or_else(|| OpError::BadArguments {
                    op: op.name(),
                    reason: format!("no input column `{}`", call.input),
                })?;
            let field = Arc::new(op.output_field_in(&input_field, &call.params, &call.output, resources)?);
            let replaces = current.index_of(&call.output).ok();
            let mut fields: Vec<FieldRef> = current.fields().iter().cloned().collect();
            match replaces {
                Some(i) => fields[i] = field,
                None => fields.push(field),
            }
            current = Arc::new(Schema::new_with_metadata(fields, current.metadata().clone()));
            bound.push(Bound {
                call: call.clone(),
                op,
                input,
                input_field,
                replaces,
                schema: Arc::clone(&current),
            });
        }
        Ok(Self {
            bound,
            input: schema,
            output: current,
        })
    }

    /// Each call with its op and the field of the column it reads.
    pub fn bound(&self) -> impl Iterator<Item = (&Call, &'static dyn Op, &FieldRef)> {
        self.bound.iter().map(|b| (&b.call, b.op, &b.input_field))
    }

    /// The schema of the batches the calls read.
    pub fn input_schema(&self) -> SchemaRef {
        Arc::clone(&self.input)
    }

    /// The schema of the batches the calls produce.
    pub fn schema(&self) -> SchemaRef {
        Arc::clone(&self.output)
    }

    pub fn is_empty(&self) -> bool {
        self.bound.is_empty()
    }

    /// Runs every call on `batch`. The `k`-th random call draws its randomness from
    /// [`call_seed`]`(ctx.seed, k)` and the row: deterministic calls are not counted, so
    /// where they run (pushed to a server or not) never changes a random call's draws.
    pub fn apply(&self, batch: RecordBatch, ctx: &Context<'_>) -> Result<RecordBatch> {
        self.apply_observed(batch, ctx, |_| {})
    }

    /// [`Self::apply`], reporting each call's input, output and time to `observe`.
    pub fn apply_observed(
        &self,
        mut batch: RecordBatch,
        ctx: &Context<'_>,
        mut observe: impl FnMut(CallRun<'_>),
    ) -> Result<RecordBatch> {
        let mut random = 0;
        for b in &self.bound {
            let call_ctx = Context {
                seed: call_seed(ctx.seed, random),
                resources: ctx.resources,
            };
            random += usize::from(!b.op.is_deterministic());
            let input = input_array(&batch, &b.input)?;
            let start = Instant::now();
            let out = b.op.apply_in(&input, &b.input_field, &b.call.params, &call_ctx)?;
            observe(CallRun {
                call: &b.call,
                input: &input,
                output: &out,
                elapsed: start.elapsed(),
            });
            let mut columns = batch.columns().to_vec();
            match b.replaces {
                Some(i) => columns[i] = out,
                None => columns.push(out),
            }
            let options =
                arrow::record_batch::RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
            batch = RecordBatch::try_new_with_options(Arc::clone(&b.schema), columns, &options).map_err(
                |source| OpError::Arrow {
                    op: b.op.name(),
                    cause: source,
                },
            )?;
        }
        Ok(batch)
    }
}

/// Runs `calls` on `batch`: [`Calls::bind`] to its schema, then [`Calls::apply`].
pub fn apply_calls(batch: RecordBatch, calls: &[Call], ctx: &Context<'_>) -> Result<RecordBatch> {
    Calls::bind(calls, batch.schema(), ctx.resources)?.apply(batch, ctx)
}

/// The seed of call `k` of a list applied with seed `seed`.
pub fn call_seed(seed: u64, k: usize) -> u64 {
    mix(seed, 0x9E37_79B9_7F4A_7C15u64.wrapping_mul(k as u64 + 1))
}

/// SplitMix64's finalizer over two words: decorrelated seeds from counters (seed, epoch,
/// rank, batch, call).
pub fn mix(a: u64, b: u64) -> u64 {
    let mut z = a ^ b.rotate_left(32) ^ 0x9E37_79B9_7F4A_7C15;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
