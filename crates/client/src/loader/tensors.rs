//! Batches as a trainer consumes them: columns as tensors where the schema allows.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray};
use arrow::datatypes::DataType;
use arrow::record_batch::RecordBatch;

use crate::error::{ClientError, Result};

/// One column of a batch: a contiguous tensor where the schema allows, else Arrow.
#[derive(Debug, Clone)]
pub enum Column {
    /// Row-major values of a primitive type; `shape[0]` is the batch's rows. `bfloat16`:
    /// the values are `UInt16` bits of bfloat16 numbers (the field's `pushdown.dtype`), for
    /// the trainer to view as its bfloat16 type.
    Tensor {
        shape: Vec<usize>,
        values: ArrayRef,
        bfloat16: bool,
    },
    /// Variable-length or nullable values, as Arrow (nulls kept).
    Arrow(ArrayRef),
}

/// A batch as a trainer consumes it.
#[derive(Debug, Clone)]
pub struct TensorBatch {
    pub rows: usize,
    pub columns: Vec<(String, Column)>,
    /// The batch's index in its epoch, and the epoch.
    pub index: u64,
    pub epoch: u64,
    /// A packed or bucketed loader's: where the packer or bucketer of each of the rank's
    /// partitions is after this batch.
    pub parts: Vec<(u64, crate::order::PartPos)>,
}

impl TensorBatch {
    /// Fixed-shape integer and float columns (scalars, `FixedSizeList`s with their
    /// `pushdown.shape`) become tensors, nullable or not; everything else stays Arrow.
    /// Decided by the schema ([`Column::is_tensor`]), so a column has one type in every
    /// batch: a null where a tensor is due is an error naming the column and the row
    /// ([`ClientError::NullInTensor`]), never a switch to Arrow.
    pub fn from_record_batch(batch: &RecordBatch, epoch: u64, index: u64) -> Result<Self> {
        let rows = batch.num_rows();
        let columns = batch
            .schema()
            .fields()
            .iter()
            .zip(batch.columns())
            .map(|(field, array)| Ok((field.name().clone(), to_column(field, array, rows, index)?)))
            .collect::<Result<_>>()?;
        Ok(Self {
            rows,
            columns,
            index,
            epoch,
            parts: Vec::new(),
        })
    }

    pub fn column(&self, name: &str) -> Option<&Column> {
        self.columns.iter().find(|(n, _)| n == name).map(|(_, c)| c)
    }
}

impl Column {
    /// Whether a column of `field` arrives as a tensor: a fixed-width integer or
    /// `f32`/`f64` (what numpy and torch hold), or a `FixedSizeList` of them, whether the
    /// schema calls it nullable or not (pyarrow, pandas, Spark and `datasets` call every
    /// column nullable). Dates, decimals, `f16`, strings, lists and the rest arrive as Arrow.
    pub fn is_tensor(field: &arrow::datatypes::Field) -> bool {
        fn numeric(t: &DataType) -> bool {
            t.is_integer() || matches!(t, DataType::Float16 | DataType::Float32 | DataType::Float64)
        }
        match field.data_type() {
            DataType::FixedSizeList(item, _) => numeric(item.data_type()),
            t => numeric(t),
        }
    }
}

/// The first null of a tensor column's `array` (a row, or a value inside a row's list).
pub(super) fn first_null(array: &ArrayRef) -> Option<usize> {
    if let Some(nulls) = array.logical_nulls().filter(|n| n.null_count() > 0) {
        return nulls.iter().position(|valid| !valid);
    }
    if let DataType::FixedSizeList(_, n) = array.data_type() {
        let list = array.as_fixed_size_list();
        let values = list
            .values()
            .slice(list.offset() * *n as usize, list.len() * *n as usize);
        let nulls = values.logical_nulls().filter(|n| n.null_count() > 0)?;
        return nulls
            .iter()
            .position(|valid| !valid)
            .map(|i| i / (*n as usize).max(1));
    }
    None
}

pub(super) fn to_column(
    field: &arrow::datatypes::Field,
    array: &ArrayRef,
    rows: usize,
    batch: u64,
) -> Result<Column> {
    if !Column::is_tensor(field) {
        return Ok(Column::Arrow(Arc::clone(array)));
    }
    if let Some(row) = first_null(array) {
        return Err(ClientError::NullInTensor {
            column: field.name().clone(),
            batch,
            row,
        });
    }
    Ok(match array.data_type() {
        DataType::FixedSizeList(_, n) => {
            let list = array.as_fixed_size_list();
            let n = *n as usize;
            let values = list.values();
            let values = if values.len() == rows * n {
                Arc::clone(values)
            } else {
                values.slice(list.offset() * n, rows * n)
            };
            let dims: Option<Vec<usize>> = field
                .metadata()
                .get(pushdown_ops::SHAPE_METADATA_KEY)
                .and_then(|s| s.split(',').map(|d| d.trim().parse().ok()).collect());
            let mut shape = vec![rows];
            match dims {
                Some(d) if d.iter().product::<usize>() == n => shape.extend(d),
                _ => shape.push(n),
            }
            let bfloat16 = field
                .metadata()
                .get(pushdown_ops::DTYPE_METADATA_KEY)
                .is_some_and(|t| t == "bfloat16");
            Column::Tensor {
                shape,
                values,
                bfloat16,
            }
        }
        _ => Column::Tensor {
            shape: vec![rows],
            values: Arc::clone(array),
            bfloat16: false,
        },
    })
}
