//! Ops as DataFusion scalar UDFs, so SQL can call them (`thumbnail(image, 64)`) and
//! fragments can carry them. The adapter is thin: parameters must be literals, the kernel is
//! the one the client runs.
//!
//! A server bounds what a call may produce before anything is allocated: each op declares
//! the most bytes one output value may take from its arguments
//! ([`Op::max_output_bytes_per_row`]); a call above [`OpLimits::max_row_bytes`] is refused
//! at planning (`InvalidArgument`), batches are made small enough that a batch of outputs
//! stays under [`OpLimits::max_batch_bytes`], and each kernel run first reserves its
//! output's bound and what it holds besides ([`Op::working_bytes`]: a video decoder's
//! frames) in the query engine's memory pool (`ResourceExhausted` when the pool cannot hold
//! it), so a hostile call is an error for its caller, never an aborted process.

use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arrow::datatypes::{DataType, FieldRef};
use datafusion::common::ScalarValue;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryLimit, MemoryPool};
use datafusion::logical_expr::{
    ColumnarValue, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};
use std::collections::BTreeMap;

use pushdown_ops::{Context, Op, Resources, Value};

use crate::catalog::Dataset;
use crate::tokenizers::TokenizerCatalog;

/// Resources of op calls on a server: each dataset's `tokenizer.json`, by dataset name, then
/// the server's other tokenizers (`TokenizerCatalog`: given by trainers, or its folder's).
#[derive(Debug)]
pub struct DatasetResources {
    datasets: BTreeMap<String, Arc<Dataset>>,
    default: Option<String>,
    tokenizers: Arc<TokenizerCatalog>,
}

impl DatasetResources {
    /// `default`: the tokenizer a call that names none gets (the request's, else the dataset
    /// being read).
    pub fn new(
        datasets: BTreeMap<String, Arc<Dataset>>,
        default: Option<String>,
        tokenizers: Arc<TokenizerCatalog>,
    ) -> Self {
        Self {
            datasets,
            default,
            tokenizers,
        }
    }

    /// The tokenizer `name` when no dataset is called so.
    fn other_tokenizer(&self, name: &str) -> std::result::Result<Arc<tokenizers::Tokenizer>, String> {
        match self.tokenizers.get(name)? {
            Some(t) => Ok(t),
            None if name.starts_with(pushdown_ops::TOKENIZER_ID_PREFIX) => Err(format!(
                "the tokenizer {name} a trainer gave is not on this server (a restarted server \
                 forgets them; a loader gives its tokenizer again when it plans an epoch)"
            )),
            None => {
                let names = self.tokenizers.names();
                let folder = match names.is_empty() {
                    true => String::new(),
                    false => format!(", nor among the server's tokenizers {names:?}"),
                };
                Err(format!("no dataset '{name}' to take a tokenizer from{folder}"))
            }
        }
    }
}

impl Resources for DatasetResources {
    fn tokenizer(&self, name: Option<&str>) -> std::result::Result<Arc<tokenizers::Tokenizer>, String> {
        let Some(name) = name.or(self.default.as_deref()) else {
            return Err(
                "the query reads several datasets: name the tokenizer's, e.g. tokenize(body, 256, 'text')"
                    .into(),
            );
        };
        let Some(dataset) = self.datasets.get(name) else {
            return self.other_tokenizer(name);
        };
        match &dataset.tokenizer {
            None => Err(format!(
                "dataset '{name}' ships no {}",
                pushdown_ops::TOKENIZER_FILE
            )),
            Some(Err(reason)) => Err(format!("dataset '{name}': {reason}")),
            Some(Ok(t)) => Ok(Arc::clone(t)),
        }
    }
}

/// What op calls of one query may produce, and the tokenizers they may use.
#[derive(Debug, Clone)]
pub struct OpLimits {
    /// The tokenizer calls that name none use (the request's); none: the dataset read's.
    pub tokenizer: Option<String>,
    /// The server's tokenizers that no dataset ships.
    pub tokenizers: Arc<TokenizerCatalog>,
    /// A call whose output value may exceed this many bytes is refused at planning.
    pub max_row_bytes: u64,
    /// Rows per batch are cut so that a batch of the largest call's outputs stays under this.
    pub max_batch_bytes: u64,
    /// Where each kernel run reserves its output's bound first; none: not accounted.
    pub pool: Option<Arc<dyn MemoryPool>>,
    /// The largest per-row bound among the calls planned so far (shared by a query's UDFs).
    pub largest_row_bytes: Arc<AtomicU64>,
}

impl OpLimits {
    /// No caps and no accounting: for code that runs its own trusted queries.
    pub fn unlimited() -> Self {
        Self {
            tokenizer: None,
            tokenizers: Arc::default(),
            max_row_bytes: u64::MAX,
            max_batch_bytes: u64::MAX,
            pool: None,
            largest_row_bytes: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Rows per batch that keep a batch of the largest planned call's outputs under
    /// `max_batch_bytes`: `batch_size` or fewer, at least one.
    pub fn batch_rows(&self, batch_size: usize) -> usize {
        let per_row = self.largest_row_bytes.load(Ordering::Relaxed).max(1);
        let fits = (self.max_batch_bytes / per_row).max(1);
        batch_size.min(usize::try_from(fits).unwrap_or(usize::MAX)).max(1)
    }

    /// Refuses a call of `op` whose declared output per row exceeds the cap, or whose run
    /// (one row's output and what it holds besides) no query's memory here could hold;
    /// records its bound otherwise. `Ok`: the bound per row and the bytes a run holds besides
    /// ([`Op::working_bytes`]); `Err` carries the reason.
    pub fn admit(
        &self,
        op: &dyn Op,
        input: &arrow::datatypes::Field,
        params: &[Value],
    ) -> std::result::Result<(u64, u64), String> {
        let bound = op
            .max_output_bytes_per_row(input, params)
            .map_err(|e| e.to_string())?
            .unwrap_or(0);
        if bound > self.max_row_bytes {
            return Err(format!(
                "produces up to {} per row, over this server's cap of {} per row",
                human_bytes(bound),
                human_bytes(self.max_row_bytes)
            ));
        }
        let working = op.working_bytes(input, params).map_err(|e| e.to_string())?;
        let least = bound.saturating_add(working);
        if let Some(MemoryLimit::Finite(limit)) = self.pool.as_ref().map(|p| p.memory_limit())
            && least > limit as u64
        {
            return Err(format!(
                "holds up to {} while it runs ({} of it besides its output), over the {} this \
                 server lets one query hold",
                human_bytes(least),
                human_bytes(working),
                human_bytes(limit as u64)
            ));
        }
        self.largest_row_bytes.fetch_max(bound, Ordering::Relaxed);
        Ok((bound, working))
    }
}

fn human_bytes(n: u64) -> String {
    const MIB: u64 = 1 << 20;
    if n >= MIB {
        format!("{:.1} MiB", n as f64 / MIB as f64)
    } else {
        format!("{n} bytes")
    }
}

/// Every op as a UDF, resolving resources through `resources`, bounded by `limits`. A
/// random op is registered to be refused by name at planning (it runs in the trainer, after
/// the shuffle), not to be an unknown function.
pub fn udfs(resources: Arc<dyn Resources>, limits: OpLimits) -> Vec<ScalarUDF> {
    pushdown_ops::registry()
        .iter()
        .map(|op| ScalarUDF::new_from_impl(OpUdf::new(*op, Arc::clone(&resources), limits.clone())))
        .collect()
}

struct OpUdf {
    op: &'static dyn Op,
    signature: Signature,
    resources: Arc<dyn Resources>,
    limits: OpLimits,
}

impl std::fmt::Debug for OpUdf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpUdf")
            .field("op", &self.op.name())
            .finish_non_exhaustive()
    }
}

impl OpUdf {
    fn new(op: &'static dyn Op, resources: Arc<dyn Resources>, limits: OpLimits) -> Self {
        Self {
            op,
            signature: Signature::variadic_any(Volatility::Immutable),
            resources,
            limits,
        }
    }

    /// An op's own error, which names the op already: said once.
    fn op_error(&self, e: &pushdown_ops::OpError) -> DataFusionError {
        let text = e.to_string();
        let prefix = format!("{}: ", self.op.name());
        self.error(text.strip_prefix(&prefix).unwrap_or(&text))
    }

    fn error(&self, reason: impl std::fmt::Display) -> DataFusionError {
        DataFusionError::Plan(format!(
            "{}: {reason} (usage: {})",
            self.op.name(),
            self.op.signature()
        ))
    }
}

impl PartialEq for OpUdf {
    fn eq(&self, other: &Self) -> bool {
        self.op.name() == other.op.name()
    }
}

impl Eq for OpUdf {}

impl Hash for OpUdf {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.op.name().hash(state);
    }
}

fn literal(value: &ScalarValue) -> Option<Value> {
    match value {
        ScalarValue::Int8(Some(v)) => Some(Value::Int(i64::from(*v))),
        ScalarValue::Int16(Some(v)) => Some(Value::Int(i64::from(*v))),
        ScalarValue::Int32(Some(v)) => Some(Value::Int(i64::from(*v))),
        ScalarValue::Int64(Some(v)) => Some(Value::Int(*v)),
        ScalarValue::UInt8(Some(v)) => Some(Value::Int(i64::from(*v))),
        ScalarValue::UInt16(Some(v)) => Some(Value::Int(i64::from(*v))),
        ScalarValue::UInt32(Some(v)) => Some(Value::Int(i64::from(*v))),
        ScalarValue::Float32(Some(v)) => Some(Value::Float(f64::from(*v))),
        ScalarValue::Float64(Some(v)) => Some(Value::Float(*v)),
        ScalarValue::Utf8(Some(v)) | ScalarValue::LargeUtf8(Some(v)) | ScalarValue::Utf8View(Some(v)) => {
            Some(Value::Text(v.clone()))
        }
        _ => None,
    }
}

impl ScalarUDFImpl for OpUdf {
    fn name(&self) -> &str {
        self.op.name()
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Err(DataFusionError::Internal("ops use return_field_from_args".into()))
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        if !self.op.is_deterministic() {
            return Err(self.error(
                "a random op runs in the trainer, after the shuffle, never on a server: write it \
                 as a pipeline step (Loader(pipeline=...), `pushdown run PIPELINE.toml`); SQL runs \
                 the deterministic ops",
            ));
        }
        if !self.op.runs_here() {
            return Err(self.error(
                "this server's build does not run it (this build has no video support: FFmpeg's \
                 libraries were not built in); a pipeline's planner keeps it in the trainer",
            ));
        }
        let Some(input) = args.arg_fields.first() else {
            return Err(self.error("missing the input column"));
        };
        let params = args.scalar_arguments[1..]
            .iter()
            .enumerate()
            .map(|(i, v)| {
                v.and_then(literal)
                    .ok_or_else(|| self.error(format!("parameter {} must be a literal", i + 1)))
            })
            .collect::<Result<Vec<_>>>()?;
        let field = self
            .op
            .output_field_in(input, &params, self.op.name(), self.resources.as_ref())
            .map_err(|e| self.op_error(&e))?;
        self.limits
            .admit(self.op, input, &params)
            .map_err(|reason| self.error(reason))?;
        // A resource the call needs and the server lacks is refused here, at planning.
        for need in self.op.needs(&params) {
            match need {
                pushdown_ops::Need::Tokenizer(name) => {
                    if let Err(reason) = self.resources.tokenizer(name.as_deref()) {
                        return Err(DataFusionError::External(Box::new(
                            pushdown_ops::OpError::MissingResource {
                                op: self.op.name(),
                                reason,
                            },
                        )));
                    }
                }
            }
        }
        Ok(Arc::new(field))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let field = args
            .arg_fields
            .first()
            .cloned()
            .ok_or_else(|| self.error("missing the input column"))?;
        let mut values = args.args.into_iter();
        let input = values
            .next()
            .ok_or_else(|| self.error("missing the input column"))?
            .into_array(args.number_rows)?;
        let params = values
            .map(|v| match v {
                ColumnarValue::Scalar(s) => {
                    literal(&s).ok_or_else(|| self.error("parameters must be literals"))
                }
                ColumnarValue::Array(_) => Err(self.error("parameters must be literals")),
            })
            .collect::<Result<Vec<_>>>()?;
        // The output's bound is reserved before the kernel allocates it, and held while it
        // runs: a pool too full for it refuses the batch instead of the process aborting.
        // So is what the run holds besides (a decoder's frames), once.
        let (bound, working) = self
            .limits
            .admit(self.op, &field, &params)
            .map_err(|reason| self.error(reason))?;
        let held = bound.saturating_mul(input.len() as u64).saturating_add(working);
        let _reservation = match &self.limits.pool {
            Some(pool) if held > 0 => {
                let r = MemoryConsumer::new(format!("op {}", self.op.name())).register(pool);
                r.try_grow(usize::try_from(held).unwrap_or(usize::MAX))?;
                Some(r)
            }
            _ => None,
        };
        let out = self
            .op
            .apply_in(
                &input,
                &field,
                &params,
                &Context {
                    seed: 0,
                    resources: self.resources.as_ref(),
                },
            )
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
        Ok(ColumnarValue::Array(out))
    }
}
