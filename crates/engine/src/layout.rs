//! How the files of one dataset make one table: their schemas merged, and the columns their
//! paths give.
//!
//! **Schemas.** Files written at different times rarely agree to the bit: one has `label`
//! as int32 and the next as int64, a later one adds a column, pyarrow marks a column nullable
//! where Spark did not. [`SchemaMerge`] folds the files' schemas, in path order, into the
//! dataset's: a column is matched by name; integers widen to the wider type (a signed type
//! wide enough for an unsigned one), floats to the wider float, small integers with floats to
//! float64, strings and binaries to their large forms when one file has them; lists and
//! structs widen member by member. A column some file lacks, or any file calls nullable, is
//! nullable, and reads as null where missing (the scan casts each file's columns to the
//! dataset's types, by name). A file whose column cannot be widened into the others' type
//! (text where the others have numbers) is *incompatible*: it does not join the dataset and
//! requests over the dataset are refused, naming the file, the column and both types.
//!
//! **Paths.** A file's path inside the dataset gives columns that hold the same value for
//! every row of the file ([`path_partitions`]):
//! * hive folders `key=value/` give the column `key` (`__HIVE_DEFAULT_PARTITION__` is null);
//! * the Hugging Face Hub's file names `<split>-NNNNN-of-NNNNN.parquet` give `split`.
//!
//! They are nullable `Utf8` columns after the files' own (null for a file whose path does not
//! give them), and a filter on them drops whole files at planning. A file column of the same
//! name wins over the path's.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::datatypes::{DataType, Field, FieldRef, Fields, Schema, SchemaRef};

/// The column the Hub's `<split>-NNNNN-of-NNNNN.parquet` names give.
pub const SPLIT_COLUMN: &str = "split";
/// What hive writers put for a null partition value.
const HIVE_NULL: &str = "__HIVE_DEFAULT_PARTITION__";

/// The dataset's schema so far, folded from its files' in path order.
#[derive(Debug, Default)]
pub struct SchemaMerge {
    fields: Vec<Field>,
    /// The file each column was first seen in: what an incompatible file is compared with.
    first_in: Vec<String>,
    /// How many merged files have each column.
    present: Vec<usize>,
    files: usize,
    metadata: HashMap<String, String>,
}

impl SchemaMerge {
    /// Folds `file`'s schema in, or says (in words) why `path` cannot join the files before it;
    /// the merge is unchanged then.
    pub fn add(&mut self, path: &str, file: &Schema) -> Result<(), String> {
        let mut fields = self.fields.clone();
        let mut added = Vec::new();
        let mut seen = Vec::new();
        for f in file.fields() {
            match fields.iter().position(|m| m.name() == f.name()) {
                Some(i) => {
                    let widened = widen(fields[i].data_type(), f.data_type()).ok_or_else(|| {
                        format!(
                            "column `{}` is {} here but {} in `{}`, and neither widens to the other",
                            f.name(),
                            f.data_type(),
                            fields[i].data_type(),
                            self.first_in[i]
                        )
                    })?;
                    let nullable = fields[i].is_nullable() || f.is_nullable();
                    fields[i] = fields[i].clone().with_data_type(widened).with_nullable(nullable);
                    seen.push(i);
                }
                None => added.push(f.as_ref().clone()),
            }
        }
        if self.files == 0 {
            self.metadata = file.metadata().clone();
        }
        for i in seen {
            self.present[i] += 1;
        }
        for f in added {
            fields.push(f);
            self.first_in.push(path.to_owned());
            self.present.push(1);
        }
        self.fields = fields;
        self.files += 1;
        Ok(())
    }

    /// The merged schema: a column some file lacks is nullable.
    pub fn schema(&self) -> SchemaRef {
        let fields: Vec<Field> = self
            .fields
            .iter()
            .zip(&self.present)
            .map(|(f, &n)| {
                let nullable = f.is_nullable() || n < self.files;
                f.clone().with_nullable(nullable)
            })
            .collect();
        Arc::new(Schema::new_with_metadata(fields, self.metadata.clone()))
    }
}

/// The type both `a` and `b` cast to without loss, if there is one (see the module docs).
pub fn widen(a: &DataType, b: &DataType) -> Option<DataType> {
    use DataType::*;
    if a == b {
        return Some(a.clone());
    }
    let int_width = |t: &DataType| match t {
        Int8 | UInt8 => Some(8),
        Int16 | UInt16 => Some(16),
        Int32 | UInt32 => Some(32),
        Int64 | UInt64 => Some(64),
        _ => None,
    };
    let signed_of = |bits| match bits {
        8 => Int8,
        16 => Int16,
        32 => Int32,
        _ => Int64,
    };
    Some(match (a, b) {
        (Null, t) | (t, Null) => t.clone(),
        (x, y) if x.is_integer() && y.is_integer() => {
            let (wx, wy) = (int_width(x)?, int_width(y)?);
            match (x.is_signed_integer(), y.is_signed_integer()) {
                (true, true) | (false, false) => {
                    if wx >= wy {
                        x.clone()
                    } else {
                        y.clone()
                    }
                }
                // A signed type holds an unsigned one only when it is wider.
                (true, false) if wx > wy => x.clone(),
                (false, true) if wy > wx => y.clone(),
                (true, false) | (false, true) if wx.max(wy) < 64 => signed_of(wx.max(wy) * 2),
                _ => return None,
            }
        }
        (x, y) if x.is_floating() && y.is_floating() => {
            if x.primitive_width() >= y.primitive_width() {
                x.clone()
            } else {
                y.clone()
            }
        }
        // Integers of up to 32 bits are exact in a double (pandas writes an integer column
        // with a missing value as floats).
        (i, f) | (f, i) if i.is_integer() && f.is_floating() && int_width(i)? <= 32 => Float64,
        (Utf8 | LargeUtf8 | Utf8View, Utf8 | LargeUtf8 | Utf8View) => {
            if matches!(a, LargeUtf8) || matches!(b, LargeUtf8) {
                LargeUtf8
            } else {
                Utf8
            }
        }
        (Binary | LargeBinary | BinaryView, Binary | LargeBinary | BinaryView) => {
            if matches!(a, LargeBinary) || matches!(b, LargeBinary) {
                LargeBinary
            } else {
                Binary
            }
        }
        (List(x), List(y)) => List(widen_member(x, y)?),
        (LargeList(x) | List(x), LargeList(y) | List(y)) => LargeList(widen_member(x, y)?),
        (FixedSizeList(x, n), FixedSizeList(y, m)) if n == m => FixedSizeList(widen_member(x, y)?, *n),
        (Struct(x), Struct(y)) => Struct(widen_struct(x, y)?),
        _ => return None,
    })
}

fn widen_member(x: &FieldRef, y: &FieldRef) -> Option<FieldRef> {
    let t = widen(x.data_type(), y.data_type())?;
    Some(Arc::new(
        x.as_ref()
            .clone()
            .with_data_type(t)
            .with_nullable(x.is_nullable() || y.is_nullable()),
    ))
}

/// Structs with the same members (in any order) widen member by member, in `x`'s order.
fn widen_struct(x: &Fields, y: &Fields) -> Option<Fields> {
    if x.len() != y.len() {
        return None;
    }
    x.iter()
        .map(|fx| {
            let (_, fy) = y.find(fx.name())?;
            widen_member(fx, fy)
        })
        .collect::<Option<Vec<_>>>()
        .map(Fields::from)
}

/// The columns `path` (relative to the dataset's folder) gives, in path order: hive folders
/// `key=value/`, then the Hub's split from the file name. A key given twice keeps its first
/// value.
pub fn path_partitions(path: &str) -> Vec<(String, Option<String>)> {
    let mut parts: Vec<&str> = path.split('/').collect();
    let file = parts.pop().unwrap_or_default();
    let mut found: Vec<(String, Option<String>)> = Vec::new();
    let mut give = |key: &str, value: Option<&str>| {
        if !found.iter().any(|(k, _)| k == key) {
            found.push((key.to_owned(), value.map(str::to_owned)));
        }
    };
    for folder in parts {
        if let Some((key, value)) = folder.split_once('=')
            && is_partition_key(key)
        {
            let value = (value != HIVE_NULL && !value.is_empty()).then_some(value);
            give(key, value);
        }
    }
    if let Some(split) = hub_split(file) {
        give(SPLIT_COLUMN, Some(split));
    }
    found
}

/// `train` of `train-00000-of-00004.parquet`.
fn hub_split(file: &str) -> Option<&str> {
    let stem = file.strip_suffix(".parquet")?;
    let (left, total) = stem.rsplit_once("-of-")?;
    let (split, index) = left.rsplit_once('-')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    (digits(total) && digits(index) && !split.is_empty()).then_some(split)
}

fn is_partition_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 128
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.')
}

/// The path columns of a dataset's files: every key some file's path gives, in the order first
/// seen, except those the files hold as columns themselves.
pub fn partition_fields<'a>(paths: impl IntoIterator<Item = &'a str>, file_schema: &Schema) -> Vec<FieldRef> {
    let mut keys: Vec<String> = Vec::new();
    for path in paths {
        for (key, _) in path_partitions(path) {
            if !keys.contains(&key) && file_schema.field_with_name(&key).is_err() {
                keys.push(key);
            }
        }
    }
    keys.into_iter()
        .map(|k| Arc::new(Field::new(k, DataType::Utf8, true)))
        .collect()
}

/// `path`'s values of `fields` (null where its path gives none).
pub fn partition_values(path: &str, fields: &[FieldRef]) -> Vec<Option<String>> {
    let given = path_partitions(path);
    fields
        .iter()
        .map(|f| {
            given
                .iter()
                .find(|(k, _)| k == f.name())
                .and_then(|(_, v)| v.clone())
        })
        .collect()
}

/// The conjuncts of a scan's filters that read only path columns, evaluated on each file's
/// values: a file none of whose rows can pass is not read at all (nor planned as a shard).
#[derive(Debug, Default)]
pub struct PartitionFilter {
    schema: Option<SchemaRef>,
    predicates: Vec<Arc<dyn datafusion::physical_expr::PhysicalExpr>>,
}

impl PartitionFilter {
    /// From `filters` over a table whose path columns are `partitions`. A conjunct that does
    /// not plan (it reads other columns, or calls what cannot run here) keeps every file.
    pub fn new(
        state: &dyn datafusion::catalog::Session,
        partitions: &Fields,
        filters: &[datafusion::logical_expr::Expr],
    ) -> Self {
        use datafusion::common::tree_node::{Transformed, TreeNode};
        use datafusion::logical_expr::Expr;
        if partitions.is_empty() {
            return Self::default();
        }
        let schema = Arc::new(Schema::new(partitions.clone()));
        let Ok(df_schema) = datafusion::common::DFSchema::try_from(Arc::clone(&schema)) else {
            return Self::default();
        };
        let mut predicates = Vec::new();
        for conjunct in filters
            .iter()
            .flat_map(datafusion::logical_expr::utils::split_conjunction)
        {
            let refs = conjunct.column_refs();
            if refs.is_empty() || refs.iter().any(|c| partitions.find(&c.name).is_none()) {
                continue;
            }
            // The table's qualifier is not the partition schema's.
            let unqualified = conjunct.clone().transform_up(|e| match e {
                Expr::Column(c) => Ok(Transformed::yes(Expr::Column(
                    datafusion::common::Column::new_unqualified(c.name),
                ))),
                other => Ok(Transformed::no(other)),
            });
            if let Ok(expr) = unqualified
                && let Ok(physical) = state.create_physical_expr(expr.data, &df_schema)
            {
                predicates.push(physical);
            }
        }
        Self {
            schema: Some(schema),
            predicates,
        }
    }

    /// Whether a file with these path values may hold rows that pass (a predicate that is
    /// false or null for them rules the file out).
    pub fn admits(&self, values: &[Option<String>]) -> bool {
        let Some(schema) = &self.schema else {
            return true;
        };
        if self.predicates.is_empty() {
            return true;
        }
        let columns: Vec<arrow::array::ArrayRef> = values
            .iter()
            .map(|v| Arc::new(arrow::array::StringArray::from(vec![v.clone()])) as arrow::array::ArrayRef)
            .collect();
        let Ok(batch) = arrow::record_batch::RecordBatch::try_new(Arc::clone(schema), columns) else {
            return true;
        };
        self.predicates.iter().all(|p| {
            let Ok(value) = p.evaluate(&batch).and_then(|v| v.into_array(1)) else {
                return true;
            };
            use arrow::array::{Array, AsArray};
            match value.as_boolean_opt() {
                Some(b) => b.is_valid(0) && b.value(0),
                None => true,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_floats_and_strings_widen_without_loss() {
        use DataType::*;
        assert_eq!(widen(&Int32, &Int64), Some(Int64));
        assert_eq!(widen(&Int64, &Int8), Some(Int64));
        assert_eq!(widen(&UInt8, &Int8), Some(Int16));
        assert_eq!(widen(&UInt16, &Int32), Some(Int32));
        assert_eq!(widen(&UInt64, &Int64), None);
        assert_eq!(widen(&Float32, &Float64), Some(Float64));
        assert_eq!(widen(&Int32, &Float32), Some(Float64));
        assert_eq!(widen(&Int64, &Float64), None);
        assert_eq!(widen(&Utf8, &LargeUtf8), Some(LargeUtf8));
        assert_eq!(widen(&Utf8, &Int64), None);
        assert_eq!(widen(&Binary, &Utf8), None);
        let list = |t: DataType, n: bool| List(Arc::new(Field::new("item", t, n)));
        assert_eq!(
            widen(&list(Int32, false), &list(Int64, true)),
            Some(list(Int64, true))
        );
        assert_eq!(widen(&list(Utf8, false), &list(Int64, true)), None);
    }

    #[test]
    fn files_merge_by_name_and_an_incompatible_one_is_named() {
        let a = Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("label", DataType::Int32, false),
        ]);
        let b = Schema::new(vec![
            Field::new("label", DataType::Int64, false),
            Field::new("id", DataType::Int64, false),
            Field::new("extra", DataType::Utf8, false),
        ]);
        let c = Schema::new(vec![Field::new("label", DataType::Utf8, true)]);
        let mut merge = SchemaMerge::default();
        merge.add("a.parquet", &a).expect("first");
        merge.add("b.parquet", &b).expect("widened");
        let err = merge.add("c.parquet", &c).expect_err("text into numbers");
        assert!(
            err.contains("`label` is Utf8 here but Int64 in `a.parquet`"),
            "{err}"
        );
        let schema = merge.schema();
        let fields: Vec<_> = schema
            .fields()
            .iter()
            .map(|f| (f.name().as_str(), f.data_type().clone(), f.is_nullable()))
            .collect();
        assert_eq!(
            fields,
            vec![
                ("id", DataType::Int64, false),
                ("label", DataType::Int64, false),
                ("extra", DataType::Utf8, true),
            ],
            "a column one file lacks is nullable; the refused file changed nothing"
        );
    }

    #[test]
    fn paths_give_hive_keys_and_hub_splits() {
        assert_eq!(
            path_partitions("data/train-00000-of-00004.parquet"),
            vec![("split".to_owned(), Some("train".to_owned()))]
        );
        assert_eq!(
            path_partitions("lang=en/year=__HIVE_DEFAULT_PARTITION__/part-0.parquet"),
            vec![
                ("lang".to_owned(), Some("en".to_owned())),
                ("year".to_owned(), None)
            ]
        );
        assert_eq!(
            path_partitions("split=test/validation-00001-of-00002.parquet"),
            vec![("split".to_owned(), Some("test".to_owned()))],
            "the folder's key comes first"
        );
        assert!(path_partitions("part-0.parquet").is_empty());
        assert!(path_partitions("a-of-b.parquet").is_empty());
        let file = Schema::new(vec![Field::new("lang", DataType::Utf8, true)]);
        let fields = partition_fields(["lang=en/x.parquet", "test-00000-of-00001.parquet"], &file);
        assert_eq!(
            fields.iter().map(|f| f.name().as_str()).collect::<Vec<_>>(),
            vec!["split"],
            "a column of the files wins over the path's"
        );
        assert_eq!(
            partition_values("lang=en/x.parquet", &fields),
            vec![None],
            "a path without a split"
        );
    }
}
