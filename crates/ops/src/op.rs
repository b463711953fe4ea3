//! The op contract: what the planner needs to place an op (determinism, parameters,
//! output field, size bound) and its kernel; the literal [`Value`] type and the
//! parameter checks every op shares.

use std::fmt;

use arrow::array::ArrayRef;
use arrow::datatypes::Field;

use crate::resources::{Need, Resources};

/// Field metadata carrying the `height,width,channels` of pixel tensors, so later ops (and
/// tensor conversion) know the shape of a flat `FixedSizeList<u8>`.
pub const SHAPE_METADATA_KEY: &str = "pushdown.shape";
/// Field metadata naming a tensor's element type where Arrow has none: `bfloat16`, whose
/// values travel as their `UInt16` bits.
pub const DTYPE_METADATA_KEY: &str = "pushdown.dtype";

#[derive(Debug, thiserror::Error)]
pub enum OpError {
    #[error("unknown op `{0}`")]
    UnknownOp(String),
    #[error("{op}: {reason}")]
    BadArguments { op: &'static str, reason: String },
    /// A resource the call needs (a tokenizer) is not there: the server's configuration,
    /// the same on every retry.
    #[error("{op}: {reason}")]
    MissingResource { op: &'static str, reason: String },
    #[error("{op}: row {row}: {reason}")]
    BadValue {
        op: &'static str,
        row: usize,
        reason: String,
    },
    #[error("{op}: {cause}")]
    Arrow {
        op: &'static str,
        cause: arrow::error::ArrowError,
    },
}

pub type Result<T, E = OpError> = std::result::Result<T, E>;

/// A literal parameter of an op call: the one literal type of pipelines (`params = [64]`),
/// wire messages and kernels. In a pipeline file it is written as a bare TOML/JSON value.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(untagged)]
pub enum Value {
    Int(i64),
    Float(f64),
    Text(String),
    /// A list of numbers (per-channel means: `[0.485, 0.456, 0.406]`). SQL and the wire
    /// carry it as its text, `'[0.485, 0.456, 0.406]'` ([`Value::text`]), which the ops
    /// taking lists read back.
    List(Vec<f64>),
}

impl Value {
    /// The value as wire and SQL text carry a list: `[0.485, 0.456, 0.406]`; other values as
    /// written.
    pub fn text(&self) -> String {
        match self {
            Value::List(xs) => {
                let items: Vec<String> = xs.iter().map(|x| format!("{x:?}")).collect();
                format!("[{}]", items.join(", "))
            }
            Value::Text(t) => t.clone(),
            other => other.to_string(),
        }
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Int(i) => write!(f, "{i}"),
            // `{:?}` keeps the point (`1.0`), so the literal reads back as a float.
            Value::Float(x) if x.is_finite() => write!(f, "{x:?}"),
            Value::Float(x) => write!(f, "CAST('{x}' AS DOUBLE)"),
            Value::Text(t) => write!(f, "'{}'", t.replace('\'', "''")),
            Value::List(_) => write!(f, "'{}'", self.text()),
        }
    }
}

impl From<i64> for Value {
    fn from(v: i64) -> Self {
        Value::Int(v)
    }
}

impl From<f64> for Value {
    fn from(v: f64) -> Self {
        Value::Float(v)
    }
}

impl From<&str> for Value {
    fn from(v: &str) -> Self {
        Value::Text(v.to_owned())
    }
}

/// What a call of an op may use beyond its literal parameters.
#[derive(Clone, Copy)]
pub struct Context<'a> {
    /// Random ops draw row `i`'s randomness from `(seed, i)`; deterministic ops ignore it.
    pub seed: u64,
    /// Named resources (tokenizers) the call may resolve.
    pub resources: &'a dyn Resources,
}

impl fmt::Debug for Context<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("seed", &self.seed)
            .finish_non_exhaustive()
    }
}

/// One op: its properties and its kernel.
pub trait Op: Send + Sync + fmt::Debug {
    fn name(&self) -> &'static str;

    /// The same input gives the same output, whatever the seed or epoch. Only deterministic
    /// ops may run on a server.
    fn is_deterministic(&self) -> bool {
        true
    }

    /// Whether this build runs the op: false where it lacks a library the op needs (the
    /// video ops without FFmpeg's); such an op keeps its name and refuses every call, and a
    /// server lists only the ops it runs (the `ops` action), so a planner places the rest in
    /// the trainer.
    fn runs_here(&self) -> bool {
        true
    }

    /// What a call with `params` needs beyond its input and literals (a tokenizer): callers
    /// provide it through [`Context::resources`] without knowing which ops need what.
    fn needs(&self, _params: &[Value]) -> Vec<Need> {
        Vec::new()
    }

    /// A one-line signature, for errors and docs: `thumbnail(image, max_side[, quality])`.
    fn signature(&self) -> &'static str;

    /// The output field for `input` and `params`, named `output`; checks the parameters.
    fn output_field(&self, input: &Field, params: &[Value], output: &str) -> Result<Field>;

    /// [`Self::output_field`] where the call's resources are at hand: what servers and
    /// clients plan with. An op whose output type depends on a resource (`tokenize`: 16-bit
    /// ids when the tokenizer's vocabulary fits) overrides this one.
    fn output_field_in(
        &self,
        input: &Field,
        params: &[Value],
        output: &str,
        _resources: &dyn crate::Resources,
    ) -> Result<Field> {
        self.output_field(input, params, output)
    }

    /// The most bytes one output value may take, from the input field and `params` alone
    /// (before any value is seen), or `None` when the output is no larger than its input
    /// value. A server refuses or bounds a call from this before allocating anything; the
    /// default reads it off a fixed-width output field (pixels, padded tokens, numbers).
    fn max_output_bytes_per_row(&self, input: &Field, params: &[Value]) -> Result<Option<u64>> {
        Ok(fixed_width(
            self.output_field(input, params, "output")?.data_type(),
        ))
    }

    /// The most bytes a run of the op holds besides its outputs, however many rows it takes
    /// (it takes them one at a time): a video decoder's reference frames. A server reserves
    /// it once per run beside the outputs' bound; the op refuses a row that would need more.
    fn working_bytes(&self, input: &Field, params: &[Value]) -> Result<u64> {
        let _ = (input, params);
        Ok(0)
    }

    /// Applies the op to a column described by `field` (its metadata carries tensor shapes).
    /// Random ops draw row `i`'s randomness from `(seed, i)` alone; deterministic ops ignore
    /// `seed`.
    fn apply_field(&self, input: &ArrayRef, field: &Field, params: &[Value], seed: u64) -> Result<ArrayRef>;

    /// [`Self::apply_field`] with resources: what servers and clients call. Ops that need a
    /// resource (a tokenizer) override this one.
    fn apply_in(
        &self,
        input: &ArrayRef,
        field: &Field,
        params: &[Value],
        ctx: &Context<'_>,
    ) -> Result<ArrayRef> {
        self.apply_field(input, field, params, ctx.seed)
    }

    /// [`Self::apply_field`] for a column whose field carries no metadata, with seed 0.
    fn apply(&self, input: &ArrayRef, params: &[Value]) -> Result<ArrayRef> {
        let field = Field::new("input", input.data_type().clone(), true);
        self.apply_field(input, &field, params, 0)
    }
}

/// The bytes of one value of `data_type` when every value has the same size (primitives and
/// fixed-size lists of them), else `None`.
pub fn fixed_width(data_type: &arrow::datatypes::DataType) -> Option<u64> {
    use arrow::datatypes::DataType;
    match data_type {
        DataType::FixedSizeList(item, n) => Some(fixed_width(item.data_type())?.saturating_mul(*n as u64)),
        DataType::FixedSizeBinary(n) => Some(*n as u64),
        DataType::Boolean => Some(1),
        other => other.primitive_width().map(|w| w as u64),
    }
}

/// Parameter `i` as an integer in `range`.
pub(crate) fn int_param(
    op: &'static str,
    params: &[Value],
    i: usize,
    what: &str,
    range: std::ops::RangeInclusive<i64>,
    default: Option<i64>,
) -> Result<i64> {
    let v = match (params.get(i), default) {
        (Some(Value::Int(v)), _) => *v,
        (None, Some(d)) => d,
        (other, _) => {
            return Err(OpError::BadArguments {
                op,
                reason: format!("{what} must be an integer literal, got {other:?}"),
            });
        }
    };
    if !range.contains(&v) {
        return Err(OpError::BadArguments {
            op,
            reason: format!("{what} must be in {}..={}, got {v}", range.start(), range.end()),
        });
    }
    Ok(v)
}

/// Parameter `i` as `n` numbers: one number (the same for each), or a list of `n` given as
/// a list value, `'[a, b, c]'` or `'a, b, c'` (SQL's and the wire's form of a list).
pub(crate) fn floats_param(
    op: &'static str,
    params: &[Value],
    i: usize,
    what: &str,
    n: usize,
) -> Result<Vec<f32>> {
    let bad = |got: String| OpError::BadArguments {
        op,
        reason: format!("{what} must be a number or a list of {n} numbers, got {got}"),
    };
    let parsed: Vec<f64> = match params.get(i) {
        Some(Value::Int(v)) => vec![*v as f64; n],
        Some(Value::Float(v)) => vec![*v; n],
        Some(Value::List(xs)) => xs.clone(),
        Some(Value::Text(t)) => {
            let inner = t.trim().trim_start_matches('[').trim_end_matches(']');
            inner
                .split(',')
                .map(|x| x.trim().parse::<f64>().map_err(|_| bad(format!("'{t}'"))))
                .collect::<Result<_>>()?
        }
        None => return Err(bad("nothing".into())),
    };
    if parsed.len() != n || parsed.iter().any(|x| !x.is_finite()) {
        return Err(bad(format!("{parsed:?}")));
    }
    Ok(parsed.into_iter().map(|x| x as f32).collect())
}

pub(crate) fn expect_params(op: &'static str, params: &[Value], min: usize, max: usize) -> Result<()> {
    if params.len() < min || params.len() > max {
        let want = if min == max {
            format!("{min}")
        } else {
            format!("{min} to {max}")
        };
        return Err(OpError::BadArguments {
            op,
            reason: format!(
                "takes {want} parameters after the input column, got {}",
                params.len()
            ),
        });
    }
    Ok(())
}
