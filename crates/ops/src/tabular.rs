//! Tabular ops: categorical hashing and casts.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Int32Builder};
use arrow::compute::{CastOptions, cast_with_options};
use arrow::datatypes::{DataType, Field};

use crate::op::{Op, OpError, Result, Value, expect_params, int_param};

/// `hash_bucket(value, n)`: a stable hash of the value's text, modulo `n`, as `Int32`.
///
/// The hash is XXH3-64 of the UTF-8 bytes (integers hash their decimal text), stable across
/// processes, versions and machines, so server and client agree and a model trained today
/// sees the same buckets tomorrow.
#[derive(Debug)]
pub struct HashBucket;

impl Op for HashBucket {
    fn name(&self) -> &'static str {
        "hash_bucket"
    }

    fn signature(&self) -> &'static str {
        "hash_bucket(value, buckets)"
    }

    fn output_field(&self, input: &Field, params: &[Value], output: &str) -> Result<Field> {
        expect_params(self.name(), params, 1, 1)?;
        int_param(self.name(), params, 0, "buckets", 1..=i32::MAX as i64, None)?;
        if !hashable(input.data_type()) {
            return Err(OpError::BadArguments {
                op: self.name(),
                reason: format!("cannot hash values of type {}", input.data_type()),
            });
        }
        Ok(Field::new(output, DataType::Int32, input.is_nullable()))
    }

    fn apply_field(
        &self,
        input: &ArrayRef,
        _field: &Field,
        params: &[Value],
        _seed: u64,
    ) -> Result<ArrayRef> {
        let n = int_param(self.name(), params, 0, "buckets", 1..=i32::MAX as i64, None)? as u64;
        let text = cast_with_options(input, &DataType::Utf8, &CastOptions::default()).map_err(|source| {
            OpError::Arrow {
                op: self.name(),
                cause: source,
            }
        })?;
        let text = text.as_string::<i32>();
        let mut out = Int32Builder::with_capacity(text.len());
        for v in text.iter() {
            out.append_option(v.map(|s| (xxhash_rust::xxh3::xxh3_64(s.as_bytes()) % n) as i32));
        }
        Ok(Arc::new(out.finish()))
    }
}

fn hashable(t: &DataType) -> bool {
    match t {
        DataType::Dictionary(_, v) => hashable(v),
        t => t.is_integer() || matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View),
    }
}

/// `cast_to(value, 'type')`: Arrow's cast (`float16`, `float32`, `float64`, `int8` … `int64`,
/// `uint8` … `uint64`, `utf8`). A list (token ids, `List<UInt32>`) or fixed-size list
/// (padded tokens, pixels) has its values cast and keeps its shape: `cast_to(tokens, 'int64')`
/// gives `List<Int64>`, what embeddings and losses take. Values that do not fit fail the
/// call, never wrap silently.
#[derive(Debug)]
pub struct Cast;

impl Cast {
    fn target(params: &[Value]) -> Result<DataType> {
        expect_params("cast_to", params, 1, 1)?;
        let Some(Value::Text(name)) = params.first() else {
            return Err(OpError::BadArguments {
                op: "cast_to",
                reason: "the target type must be a string literal such as 'float32'".into(),
            });
        };
        Ok(match name.to_ascii_lowercase().as_str() {
            "float32" | "f32" => DataType::Float32,
            "float64" | "f64" => DataType::Float64,
            "int8" | "i8" => DataType::Int8,
            "int16" | "i16" => DataType::Int16,
            "int32" | "i32" => DataType::Int32,
            "int64" | "i64" => DataType::Int64,
            "uint8" | "u8" => DataType::UInt8,
            "uint16" | "u16" => DataType::UInt16,
            "uint32" | "u32" => DataType::UInt32,
            "uint64" | "u64" => DataType::UInt64,
            "float16" | "f16" | "half" => DataType::Float16,
            "utf8" | "string" => DataType::Utf8,
            other => {
                return Err(OpError::BadArguments {
                    op: "cast_to",
                    reason: format!("unknown target type '{other}'"),
                });
            }
        })
    }
}

impl Cast {
    /// `target` in `input`'s shape: a list's values are cast, the list kept.
    fn shaped(input: &DataType, target: DataType) -> DataType {
        let values = |f: &arrow::datatypes::FieldRef| {
            std::sync::Arc::new(f.as_ref().clone().with_data_type(target.clone()))
        };
        match input {
            DataType::List(f) if f.data_type().is_primitive() => DataType::List(values(f)),
            DataType::LargeList(f) if f.data_type().is_primitive() => DataType::LargeList(values(f)),
            DataType::FixedSizeList(f, n) if f.data_type().is_primitive() => {
                DataType::FixedSizeList(values(f), *n)
            }
            _ => target,
        }
    }
}

impl Op for Cast {
    fn name(&self) -> &'static str {
        "cast_to"
    }

    fn signature(&self) -> &'static str {
        "cast_to(value, 'float32' | 'int32' | …)"
    }

    fn output_field(&self, input: &Field, params: &[Value], output: &str) -> Result<Field> {
        let target = Self::shaped(input.data_type(), Self::target(params)?);
        if !arrow::compute::can_cast_types(input.data_type(), &target) {
            return Err(OpError::BadArguments {
                op: "cast_to",
                reason: format!("cannot cast {} to {target}", input.data_type()),
            });
        }
        Ok(Field::new(output, target, input.is_nullable()))
    }

    fn apply_field(
        &self,
        input: &ArrayRef,
        _field: &Field,
        params: &[Value],
        _seed: u64,
    ) -> Result<ArrayRef> {
        let target = Self::shaped(input.data_type(), Self::target(params)?);
        let options = CastOptions {
            safe: false,
            ..CastOptions::default()
        };
        cast_with_options(input, &target, &options).map_err(|source| OpError::Arrow {
            op: "cast_to",
            cause: source,
        })
    }
}
