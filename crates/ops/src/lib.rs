//! Op kernels over Arrow arrays, placement-agnostic.
//!
//! The same kernel runs as a DataFusion scalar UDF in a server (`SELECT thumbnail(image, 64)
//! FROM images`) or directly on record batches in a client, so the planner is free to move
//! it. Every op declares what the planner needs to place it: whether it is deterministic, the
//! parameters it takes after its input column, and the field it produces.
//!
//! ```text
//!  input column ──▶ Op::apply(input, params) ──▶ output column
//!       │                                             │
//!   server: ScalarUDF (pushdown-server::udf)     client, profile: Calls (apply_calls)
//! ```
//!
//! | op | params | output | kind |
//! |---|---|---|---|
//! | `decode_resize(img, w, h)` | width, height | `FixedSizeList<u8>` HWC pixels | deterministic |
//! | `thumbnail(img, max_side[, quality])` | max side, JPEG quality (85) | JPEG bytes | deterministic, reducing |
//! | `hash_bucket(value, n)` | buckets | `Int32` in `0..n` | deterministic, reducing |
//! | `cast_to(value, type)` | `'float32'`, `'int32'`, … | that type | deterministic |
//! | `center_crop(pixels, w, h)` | width, height | pixels `h×w×c` | deterministic |
//! | `grayscale(pixels)` | | pixels `h×w×1` (BT.601 luma) | deterministic |
//! | `normalize(pixels, mean, std)` | mean, std | `f32` tensor `(x/255 − mean)/std` | deterministic, expanding |
//! | `random_crop(pixels, w, h)` | width, height | pixels `h×w×c` | random: trainer only |
//! | `random_flip(pixels, p)` | probability | pixels, mirrored with probability `p` | random: trainer only |
//! | `color_jitter(pixels, s)` | strength | pixels, brightness and contrast ×U[1−s, 1+s] | random: trainer only |
//! | `tokenize(text, max_len[, tokenizer])` | max tokens, tokenizer name (default: the dataset's) | `List<UInt32>` token ids, truncated | deterministic, reducing |
//! | `pad_tokens(tokens, len[, pad_id])` | length, pad id (0) | `FixedSizeList<UInt32, len>` | deterministic |
//! | `random_mask(tokens, p, id)` | probability, mask id | token lists, each id masked with probability `p` | random: trainer only |
//!
//! Nulls map to nulls. A value an op cannot process (an undecodable image) fails the call
//! with an error naming the row: silently dropping or zero-filling training data is worse
//! than stopping.
//!
//! ```
//! use std::sync::Arc;
//! use arrow::array::{Array, ArrayRef, Int32Array, StringArray};
//! use pushdown_ops::{Value, lookup};
//! let op = lookup("hash_bucket").unwrap();
//! let input: ArrayRef = Arc::new(StringArray::from(vec![Some("a"), None, Some("a")]));
//! let out = op.apply(&input, &[Value::Int(10)]).unwrap();
//! let out = out.as_any().downcast_ref::<Int32Array>().unwrap();
//! assert_eq!(out.value(0), out.value(2));
//! assert!(out.is_null(1));
//! assert!((0..10).contains(&out.value(0)));
//! ```

mod call;
mod image_ops;
mod tabular;
mod tensor_ops;
mod text;

use std::fmt;

use arrow::array::ArrayRef;
use arrow::datatypes::Field;

pub use call::{Call, CallRun, Calls, Need, apply_calls, call_seed, mix};
pub use image_ops::{DecodeResize, SHAPE_METADATA_KEY, Thumbnail};
pub use tabular::{Cast, HashBucket};
pub use tensor_ops::{
    CenterCrop, ColorJitter, Grayscale, Normalize, RandomCrop, RandomFlip, RandomMask, shape_of,
};
pub use text::{
    NoResources, PadTokens, Resources, SPECIAL_TOKENS, TOKENIZER_FILE, Tokenize, Tokenizers, load_tokenizer,
    train_tokenizer,
};
/// The tokenizer type of the `tokenizers` crate, as ops use it.
pub use tokenizers::Tokenizer as TokenizerModel;

#[derive(Debug, thiserror::Error)]
pub enum OpError {
    #[error("unknown op `{0}`")]
    UnknownOp(String),
    #[error("{op}: {reason}")]
    BadArguments { op: &'static str, reason: String },
    #[error("{op}: row {row}: {reason}")]
    BadValue {
        op: &'static str,
        row: usize,
        reason: String,
    },
    #[error("{op}: {source}")]
    Arrow {
        op: &'static str,
        #[source]
        source: arrow::error::ArrowError,
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
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Int(i) => write!(f, "{i}"),
            // `{:?}` keeps the point (`1.0`), so the literal reads back as a float.
            Value::Float(x) if x.is_finite() => write!(f, "{x:?}"),
            Value::Float(x) => write!(f, "CAST('{x}' AS DOUBLE)"),
            Value::Text(t) => write!(f, "'{}'", t.replace('\'', "''")),
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

    /// What a call with `params` needs beyond its input and literals (a tokenizer): callers
    /// provide it through [`Context::resources`] without knowing which ops need what.
    fn needs(&self, _params: &[Value]) -> Vec<Need> {
        Vec::new()
    }

    /// A one-line signature, for errors and docs: `thumbnail(image, max_side[, quality])`.
    fn signature(&self) -> &'static str;

    /// The output field for `input` and `params`, named `output`; checks the parameters.
    fn output_field(&self, input: &Field, params: &[Value], output: &str) -> Result<Field>;

    /// The most bytes one output value may take, from the input field and `params` alone
    /// (before any value is seen), or `None` when the output is no larger than its input
    /// value. A server refuses or bounds a call from this before allocating anything; the
    /// default reads it off a fixed-width output field (pixels, padded tokens, numbers).
    fn max_output_bytes_per_row(&self, input: &Field, params: &[Value]) -> Result<Option<u64>> {
        Ok(fixed_width(
            self.output_field(input, params, "output")?.data_type(),
        ))
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

static OPS: [&dyn Op; 13] = [
    &DecodeResize,
    &Thumbnail,
    &HashBucket,
    &Cast,
    &CenterCrop,
    &Grayscale,
    &Normalize,
    &RandomCrop,
    &RandomFlip,
    &ColorJitter,
    &Tokenize,
    &PadTokens,
    &RandomMask,
];

/// Every registered op.
pub fn registry() -> &'static [&'static dyn Op] {
    &OPS
}

/// The op called `name`.
pub fn lookup(name: &str) -> Option<&'static dyn Op> {
    OPS.iter().copied().find(|op| op.name() == name)
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

#[cfg(test)]
mod tests;
