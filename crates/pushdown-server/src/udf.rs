//! Ops as DataFusion scalar UDFs, so SQL can call them (`thumbnail(image, 64)`) and
//! fragments can carry them. The adapter is thin: parameters must be literals, the kernel is
//! the one the client runs.

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use arrow::datatypes::{DataType, FieldRef};
use datafusion::common::ScalarValue;
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::{
    ColumnarValue, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};
use std::collections::BTreeMap;

use pushdown_ops::{Context, Op, Resources, Value};

use crate::catalog::Dataset;

/// Resources of op calls on a server: each dataset's `tokenizer.json`, by dataset name.
#[derive(Debug)]
pub struct DatasetResources {
    datasets: BTreeMap<String, Arc<Dataset>>,
    default: Option<String>,
}

impl DatasetResources {
    /// `default`: the dataset whose resources a call that names none gets (the one being read).
    pub fn new(datasets: BTreeMap<String, Arc<Dataset>>, default: Option<String>) -> Self {
        Self { datasets, default }
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
        let dataset = self
            .datasets
            .get(name)
            .ok_or_else(|| format!("no dataset '{name}' to take a tokenizer from"))?;
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

/// Every deterministic op as a UDF, resolving resources through `resources`.
pub fn udfs(resources: Arc<dyn Resources>) -> Vec<ScalarUDF> {
    pushdown_ops::registry()
        .iter()
        .filter(|op| op.is_deterministic())
        .map(|op| ScalarUDF::new_from_impl(OpUdf::new(*op, Arc::clone(&resources))))
        .collect()
}

struct OpUdf {
    op: &'static dyn Op,
    signature: Signature,
    resources: Arc<dyn Resources>,
}

impl std::fmt::Debug for OpUdf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpUdf")
            .field("op", &self.op.name())
            .finish_non_exhaustive()
    }
}

impl OpUdf {
    fn new(op: &'static dyn Op, resources: Arc<dyn Resources>) -> Self {
        Self {
            op,
            signature: Signature::variadic_any(Volatility::Immutable),
            resources,
        }
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
            .output_field(input, &params, self.op.name())
            .map_err(|e| self.error(e))?;
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
