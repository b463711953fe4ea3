//! Writing a dataset: Parquet files laid out as the Hugging Face Hub lays out a split
//! (`OUT/data/<split>-NNNNN-of-NNNNN.parquet`, so the server's `split` column and `datasets`
//! both read the split from the name), row groups sized by bytes, files rolled over by size,
//! and nothing half-written in the dataset: files are staged under `OUT/_import/<split>-<pid>/`
//! (a `_` folder the server's catalog skips) and renamed into place only when the import is
//! whole; the split's files of an earlier import are removed only after that.
//!
//! The same input writes the same bytes: the writer's properties are fixed, and the footer's
//! metadata is an ordered key-value list (no `ARROW:schema`, whose metadata is a map without
//! order; the Parquet types alone give back every column's Arrow type here).

use std::fs::{self, File};
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use arrow::array::{ArrayRef, BinaryBuilder, StringBuilder, StructArray};
use arrow::datatypes::{DataType, Field, Fields, SchemaRef};
use arrow::record_batch::RecordBatch;
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_writer::ArrowWriterOptions;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::{EnabledStatistics, WriterProperties};

use crate::place::{Output, child};
use object_store::path::Path as Key;

/// A row group's target size, uncompressed: big enough for efficient reads of media, small
/// enough that a filter on a column with statistics skips most of a file.
pub const ROW_GROUP_BYTES: usize = 32 << 20;
/// A file's target size, compressed: a shard a server reads and a reader parallelizes over.
pub const FILE_BYTES: u64 = 512 << 20;
/// Row-group rows at most, however small the rows.
const ROW_GROUP_ROWS: usize = 131_072;
/// Where files wait until the import is whole (hidden from the catalog by its `_`).
pub const STAGING: &str = "_import";

/// The Hub's media struct: `struct<bytes: binary, path: string>` (`datasets`' `Image` and
/// `Audio` features store exactly this).
pub fn media_type() -> DataType {
    DataType::Struct(media_fields())
}

fn media_fields() -> Fields {
    Fields::from(vec![
        Field::new("bytes", DataType::Binary, true),
        Field::new("path", DataType::Utf8, true),
    ])
}

/// Builds a media column row by row.
#[derive(Debug, Default)]
pub struct MediaColumn {
    bytes: BinaryBuilder,
    path: StringBuilder,
    valid: Vec<bool>,
}

impl MediaColumn {
    /// Appends one file's bytes under its path.
    pub fn push(&mut self, bytes: &[u8], path: &str) {
        self.bytes.append_value(bytes);
        self.path.append_value(path);
        self.valid.push(true);
    }

    /// Appends a null (a sample without this member).
    pub fn push_null(&mut self) {
        self.bytes.append_null();
        self.path.append_null();
        self.valid.push(false);
    }

    /// The rows appended since the last call, as one struct array.
    pub fn finish(&mut self) -> ArrayRef {
        let nulls = std::mem::take(&mut self.valid);
        let nulls = (nulls.iter().any(|v| !v)).then(|| nulls.into());
        Arc::new(StructArray::new(
            media_fields(),
            vec![Arc::new(self.bytes.finish()), Arc::new(self.path.finish())],
            nulls,
        ))
    }
}

/// Writes one split of a dataset into `out`.
#[derive(Debug)]
pub struct DatasetWriter {
    out: Output,
    split: String,
    schema: SchemaRef,
    metadata: Vec<KeyValue>,
    /// The file being written, and its path.
    writer: Option<(ArrowWriter<File>, PathBuf)>,
    /// Where files are written: `OUT/_import/<split>-<pid>/`, or for a store a local temporary
    /// folder, each file uploaded to the store's `_import/<split>-<pid>/` once closed.
    staging: PathBuf,
    /// The closed files' sizes, in order.
    staged: Vec<u64>,
    rows: u64,
    finished: bool,
}

impl DatasetWriter {
    /// A writer of `split` into the dataset folder `out`, with `metadata` (ordered key-value
    /// pairs: the Hub's `huggingface` features, `label_names`) in every file's footer. What an
    /// interrupted import of the same split left staged is removed.
    pub fn create(out: &Output, split: &str, schema: SchemaRef, metadata: Vec<KeyValue>) -> Result<Self> {
        valid_split(split)?;
        let ours = |name: &str| name.rsplit_once('-').is_some_and(|(s, _)| s == split);
        let folder = format!("{split}-{}", std::process::id());
        let staging = match out {
            Output::Local(dir) => {
                let root = dir.join(STAGING);
                if let Ok(entries) = fs::read_dir(&root) {
                    for entry in entries.flatten() {
                        if ours(&entry.file_name().to_string_lossy()) {
                            fs::remove_dir_all(entry.path())
                                .with_context(|| format!("removing {}", entry.path().display()))?;
                        }
                    }
                }
                root.join(folder)
            }
            Output::Objects(store, prefix) => {
                let root = child(prefix, STAGING);
                for key in store.list(&root)? {
                    if key.split_once('/').is_some_and(|(f, _)| ours(f)) {
                        store.delete(&child(&root, &key))?;
                    }
                }
                std::env::temp_dir().join(format!("pushdown-import-{folder}"))
            }
        };
        fs::create_dir_all(&staging).with_context(|| format!("creating {}", staging.display()))?;
        Ok(DatasetWriter {
            out: out.clone(),
            split: split.to_owned(),
            schema,
            metadata,
            writer: None,
            staging,
            staged: Vec::new(),
            rows: 0,
            finished: false,
        })
    }

    /// The schema every batch must have.
    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// The `i`th file's key in a store's staging folder.
    fn staged_key(&self, prefix: &Key, i: usize) -> Key {
        let name = format!("{STAGING}/{}-{}/{i:05}.parquet", self.split, std::process::id());
        child(prefix, &name)
    }

    /// Appends `batch`; starts the next file when this one has reached [`FILE_BYTES`].
    pub fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        if self.writer.is_none() {
            let path = self.staging.join(format!("{:05}.parquet", self.staged.len()));
            let file = File::create(&path).with_context(|| format!("creating {}", path.display()))?;
            let props = properties(&self.schema, self.metadata.clone())?;
            // No `ARROW:schema`: pyarrow (and `datasets` through it) then reads the footer's
            // key-value list as the schema's metadata, and the file's bytes do not depend on
            // a map's order.
            let options = ArrowWriterOptions::new()
                .with_properties(props)
                .with_skip_arrow_metadata(true);
            let writer = ArrowWriter::try_new_with_options(file, Arc::clone(&self.schema), options)?;
            self.writer = Some((writer, path));
        }
        let (writer, _) = self.writer.as_mut().context("no open file")?;
        writer.write(batch)?;
        self.rows += batch.num_rows() as u64;
        if writer.bytes_written() as u64 + writer.in_progress_size() as u64 >= FILE_BYTES {
            self.close_file()?;
        }
        Ok(())
    }

    /// Closes the open file; for a store, uploads it to the staging folder there.
    fn close_file(&mut self) -> Result<()> {
        let Some((writer, path)) = self.writer.take() else {
            return Ok(());
        };
        writer.close()?;
        let bytes = fs::metadata(&path)?.len();
        if let Output::Objects(store, prefix) = &self.out {
            store.upload(&path, &self.staged_key(prefix, self.staged.len()))?;
            fs::remove_file(&path)?;
        }
        self.staged.push(bytes);
        Ok(())
    }

    /// Closes the last file and moves the split's files into `out/data/`, named
    /// `<split>-NNNNN-of-NNNNN.parquet` (renamed on disk, copied within a store), then removes
    /// the split's files of an earlier import that these did not replace. Returns their paths
    /// relative to `out` and their total size. With no rows written it fails and leaves the
    /// split's files as they were.
    pub fn finish(mut self) -> Result<(Vec<String>, u64)> {
        self.close_file()?;
        if self.rows == 0 {
            self.discard();
            anyhow::bail!(
                "no rows to write: the split `{}`'s files are left as they were",
                self.split
            );
        }
        let total = self.staged.len();
        let names: Vec<String> = (0..total)
            .map(|i| format!("{}-{i:05}-of-{total:05}.parquet", self.split))
            .collect();
        let prefix = format!("{}-", self.split);
        let stale = |name: &str| {
            name.starts_with(&prefix)
                && is_shard_name(&name[prefix.len()..])
                && !names.iter().any(|n| n == name)
        };
        match &self.out {
            Output::Local(dir) => {
                let data = dir.join("data");
                fs::create_dir_all(&data).with_context(|| format!("creating {}", data.display()))?;
                for (i, name) in names.iter().enumerate() {
                    let staged = self.staging.join(format!("{i:05}.parquet"));
                    fs::rename(&staged, data.join(name))
                        .with_context(|| format!("moving {}", staged.display()))?;
                }
                // The split's files from an earlier import with another file count.
                for entry in fs::read_dir(&data)? {
                    let name = entry?.file_name().to_string_lossy().into_owned();
                    if stale(&name) {
                        fs::remove_file(data.join(&name))?;
                    }
                }
            }
            Output::Objects(store, dataset) => {
                let data = child(dataset, "data");
                for (i, name) in names.iter().enumerate() {
                    store.copy(&self.staged_key(dataset, i), &child(&data, name))?;
                }
                for name in store.list(&data)? {
                    if stale(&name) {
                        store.delete(&child(&data, &name))?;
                    }
                }
            }
        }
        self.discard();
        let bytes = self.staged.iter().sum();
        Ok((names.into_iter().map(|n| format!("data/{n}")).collect(), bytes))
    }

    /// Removes this import's staging folder (on disk, the staging root too, when no other
    /// import uses it; in a store, the files uploaded there).
    fn discard(&mut self) {
        self.finished = true;
        let _ = fs::remove_dir_all(&self.staging);
        match &self.out {
            Output::Local(dir) => {
                let _ = fs::remove_dir(dir.join(STAGING));
            }
            Output::Objects(store, prefix) => {
                for i in 0..self.staged.len() {
                    let _ = store.delete(&self.staged_key(prefix, i));
                }
            }
        }
    }
}

impl Drop for DatasetWriter {
    /// An import that failed leaves its staging folder in the dataset (the next import of the
    /// split removes it), but no temporary folder of a store's outside it.
    fn drop(&mut self) {
        if !self.finished && matches!(self.out, Output::Objects(..)) {
            let _ = fs::remove_dir_all(&self.staging);
        }
    }
}

/// `NNNNN-of-NNNNN.parquet`.
fn is_shard_name(rest: &str) -> bool {
    let Some(rest) = rest.strip_suffix(".parquet") else {
        return false;
    };
    match rest.split_once("-of-") {
        Some((a, b)) => {
            !a.is_empty() && !b.is_empty() && (a.chars().chain(b.chars())).all(|c| c.is_ascii_digit())
        }
        None => false,
    }
}

/// A split name the Hub's file names can carry (letters, digits, `_`, `.`).
fn valid_split(split: &str) -> Result<()> {
    let ok = !split.is_empty()
        && split.len() <= 64
        && split
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
        && !split.starts_with('.');
    anyhow::ensure!(
        ok,
        "split `{split}`: use letters, digits, `_` and `.` (e.g. train, validation, test)"
    );
    Ok(())
}

fn properties(schema: &SchemaRef, metadata: Vec<KeyValue>) -> Result<WriterProperties> {
    let images = image_columns(&metadata);
    let mut props = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(3)?))
        .set_statistics_enabled(EnabledStatistics::Page)
        .set_max_row_group_bytes(Some(ROW_GROUP_BYTES))
        .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
        .set_created_by("pushdown import".into())
        .set_key_value_metadata(Some(metadata));
    // No filter compares encoded media's bytes: no statistics are kept for them.
    for field in schema.fields() {
        if field.data_type() == &media_type() {
            let bytes = parquet::schema::types::ColumnPath::new(vec![field.name().clone(), "bytes".into()]);
            props = props.set_column_statistics_enabled(bytes.clone(), EnabledStatistics::None);
            // Images are entropy-coded already (JPEG, PNG, WebP): zstd took 45% of an image
            // folder's import for 4% fewer bytes, and a decompression on every read after.
            // Audio keeps it: PCM WAV compresses.
            if images.contains(field.name()) {
                props = props.set_column_compression(bytes, Compression::UNCOMPRESSED);
            }
        }
    }
    Ok(props.build())
}

/// The columns the footer's `huggingface` features call `Image`.
fn image_columns(metadata: &[KeyValue]) -> Vec<String> {
    let hub = metadata
        .iter()
        .find(|kv| kv.key == "huggingface")
        .and_then(|kv| serde_json::from_str::<serde_json::Value>(kv.value.as_deref()?).ok());
    let Some(features) = hub.as_ref().and_then(|h| h["info"]["features"].as_object()) else {
        return Vec::new();
    };
    features
        .iter()
        .filter(|(_, f)| f["_type"] == "Image")
        .map(|(name, _)| name.clone())
        .collect()
}

/// The footer's metadata: `huggingface` (the `datasets` features, so `datasets` decodes
/// media columns as `Image`/`Audio` and labels as `ClassLabel`), then any `extra` pairs.
pub fn footer_metadata(features: serde_json::Value, extra: Vec<(String, String)>) -> Vec<KeyValue> {
    let hub = serde_json::json!({ "info": { "features": features } });
    std::iter::once(("huggingface".to_owned(), hub.to_string()))
        .chain(extra)
        .map(|(k, v)| KeyValue::new(k, v))
        .collect()
}

/// `datasets`' feature description of an Arrow type: `Value` for scalars, `Image`/`Audio`
/// where `media` says so.
pub fn value_feature(data_type: &DataType) -> serde_json::Value {
    let dtype = match data_type {
        DataType::Boolean => "bool",
        DataType::Int8 => "int8",
        DataType::Int16 => "int16",
        DataType::Int32 => "int32",
        DataType::Int64 => "int64",
        DataType::UInt8 => "uint8",
        DataType::UInt16 => "uint16",
        DataType::UInt32 => "uint32",
        DataType::UInt64 => "uint64",
        DataType::Float16 => "float16",
        DataType::Float32 => "float32",
        DataType::Float64 => "float64",
        DataType::Utf8 | DataType::LargeUtf8 => "string",
        DataType::Binary | DataType::LargeBinary => "binary",
        DataType::Null => "null",
        DataType::Date32 => "date32",
        DataType::Date64 => "date64",
        DataType::Timestamp(unit, _) => match unit {
            arrow::datatypes::TimeUnit::Second => "timestamp[s]",
            arrow::datatypes::TimeUnit::Millisecond => "timestamp[ms]",
            arrow::datatypes::TimeUnit::Microsecond => "timestamp[us]",
            arrow::datatypes::TimeUnit::Nanosecond => "timestamp[ns]",
        },
        DataType::List(f) | DataType::LargeList(f) => {
            return serde_json::json!({ "feature": value_feature(f.data_type()), "_type": "List" });
        }
        DataType::Struct(fields) => {
            return fields
                .iter()
                .map(|f| (f.name().clone(), value_feature(f.data_type())))
                .collect::<serde_json::Map<_, _>>()
                .into();
        }
        _ => "string",
    };
    serde_json::json!({ "dtype": dtype, "_type": "Value" })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::place::Store;
    use arrow::array::Int64Array;
    use arrow::datatypes::Schema;
    use object_store::memory::InMemory;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

    fn batch(schema: &SchemaRef, from: i64, n: i64) -> RecordBatch {
        let mut media = MediaColumn::default();
        for i in from..from + n {
            media.push(&i.to_le_bytes(), &format!("{i}.bin"));
        }
        RecordBatch::try_new(
            Arc::clone(schema),
            vec![
                media.finish(),
                Arc::new(Int64Array::from_iter_values(from..from + n)),
            ],
        )
        .unwrap()
    }

    fn write_all(out: &Output, schema: &SchemaRef) -> (Vec<String>, u64) {
        let meta = footer_metadata(
            serde_json::json!({"image": {"_type": "Image"}}),
            vec![("k".into(), "v".into())],
        );
        let mut w = DatasetWriter::create(out, "train", Arc::clone(schema), meta).unwrap();
        w.write(&batch(schema, 0, 100)).unwrap();
        w.write(&batch(schema, 100, 50)).unwrap();
        w.finish().unwrap()
    }

    #[test]
    fn writes_the_hub_layout_deterministically_and_leaves_no_staging() {
        let dir = tempfile::tempdir().unwrap();
        let schema = Arc::new(Schema::new(vec![
            Field::new("image", media_type(), true),
            Field::new("label", DataType::Int64, false),
        ]));
        let out = Output::Local(dir.path().to_owned());
        let (files, bytes) = write_all(&out, &schema);
        assert_eq!(files, vec!["data/train-00000-of-00001.parquet"]);
        assert!(bytes > 0);
        assert!(!dir.path().join(STAGING).exists());
        // Nothing to write: an error, and the split's files stay.
        let empty = DatasetWriter::create(&out, "train", Arc::clone(&schema), vec![]).unwrap();
        assert!(empty.finish().is_err());
        assert!(dir.path().join(&files[0]).exists());
        let first = fs::read(dir.path().join(&files[0])).unwrap();
        // A stale file of the same split with another count is replaced, not kept beside.
        fs::write(dir.path().join("data/train-00000-of-00002.parquet"), b"stale").unwrap();
        fs::write(
            dir.path().join("data/test-00000-of-00001.parquet"),
            b"other split",
        )
        .unwrap();
        let (again, _) = write_all(&out, &schema);
        assert_eq!(again, files);
        assert_eq!(
            fs::read(dir.path().join(&files[0])).unwrap(),
            first,
            "same input, same bytes"
        );
        assert!(!dir.path().join("data/train-00000-of-00002.parquet").exists());
        assert!(dir.path().join("data/test-00000-of-00001.parquet").exists());

        let file = File::open(dir.path().join(&files[0])).unwrap();
        let reader = ParquetRecordBatchReaderBuilder::try_new(file).unwrap();
        let kv = reader
            .metadata()
            .file_metadata()
            .key_value_metadata()
            .unwrap()
            .clone();
        assert_eq!(kv[0].key, "huggingface");
        let columns = reader.metadata().row_group(0).columns();
        // (The file keeps the codec, not its level.)
        let zstd: Vec<(String, bool)> = columns
            .iter()
            .map(|c| {
                (
                    c.column_path().string(),
                    matches!(c.compression(), Compression::ZSTD(_)),
                )
            })
            .collect();
        assert_eq!(
            zstd,
            vec![
                ("image.bytes".to_owned(), false),
                ("image.path".to_owned(), true),
                ("label".to_owned(), true),
            ],
            "an image's bytes are stored as they are, the rest compressed"
        );
        assert_eq!(kv[1].key, "k");
        assert_eq!(reader.schema().field(0).data_type(), &media_type());
        let rows: usize = reader.build().unwrap().map(|b| b.unwrap().num_rows()).sum();
        assert_eq!(rows, 150);
    }

    #[test]
    fn writes_the_same_files_into_a_store() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("image", media_type(), true),
            Field::new("label", DataType::Int64, false),
        ]));
        let dir = tempfile::tempdir().unwrap();
        let (local, _) = write_all(&Output::Local(dir.path().to_owned()), &schema);
        let store = Store::from_store(Arc::new(InMemory::new()), "memory://");
        let dataset = Key::from("sets/pets");
        let stale = child(&dataset, "data/train-00000-of-00002.parquet");
        let other = child(&dataset, "data/test-00000-of-00001.parquet");
        let left = child(&dataset, &format!("{STAGING}/train-1/00000.parquet"));
        for key in [&stale, &other, &left] {
            store.put(key, b"earlier").unwrap();
        }
        let out = Output::Objects(Arc::clone(&store), dataset.clone());
        let (files, bytes) = write_all(&out, &schema);
        assert_eq!(files, local);
        let all = store.list(&dataset).unwrap();
        assert_eq!(
            all,
            vec![
                "data/test-00000-of-00001.parquet",
                "data/train-00000-of-00001.parquet"
            ],
            "the stale file of the split and every staged one gone, the other split kept"
        );
        let got = store
            .read_many(&[child(&dataset, &files[0])])
            .pop()
            .unwrap()
            .unwrap();
        assert_eq!(
            got,
            fs::read(dir.path().join(&local[0])).unwrap(),
            "same input, same bytes"
        );
        assert_eq!(bytes, got.len() as u64);
    }

    #[test]
    fn refuses_split_names_the_layout_cannot_carry() {
        let dir = tempfile::tempdir().unwrap();
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false)]));
        for bad in ["", "a/b", "train-1", ".hidden"] {
            assert!(
                DatasetWriter::create(
                    &Output::Local(dir.path().to_owned()),
                    bad,
                    Arc::clone(&schema),
                    vec![]
                )
                .is_err(),
                "{bad}"
            );
        }
        assert!(is_shard_name("00000-of-00003.parquet"));
        assert!(!is_shard_name("extra.parquet"));
    }
}
