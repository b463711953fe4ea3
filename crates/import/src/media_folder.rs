//! `imagefolder` and `audiofolder`: a folder of media files as a dataset, as `datasets`'
//! builders of those names read one.
//!
//! With a `metadata.csv` or `metadata.jsonl` at the folder's root, each file's row (matched by
//! its `file_name`, the path relative to the folder) gives its other columns; files no row
//! names and rows naming no file are counted. Without one, class sub-folders give `label`
//! (torchvision's `ImageFolder` rule, [`crate::folder`]) with the class names kept in the
//! footer (`label_names`, and the Hub's `ClassLabel`). The media column (`image` or `audio`)
//! is the Hub's `struct<bytes, path>`.

use std::collections::HashMap;
use std::io::Cursor;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use arrow::array::{Array, ArrayRef, Int64Array, RecordBatch, StringArray, UInt32Array};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use indicatif::ProgressBar;

use crate::folder::{self, Entry, Listing};
use crate::place::{Folder, Output};
use crate::summary::{Reason, Summary};
use crate::writer::{DatasetWriter, MediaColumn, footer_metadata, media_type, value_feature};

/// Rows per batch handed to the writer, or fewer where they pass [`BATCH_BYTES`].
const BATCH_ROWS: usize = 256;
const BATCH_BYTES: usize = 16 << 20;

/// Image or audio.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Media {
    /// `imagefolder`.
    Image,
    /// `audiofolder`.
    Audio,
}

impl Media {
    fn column(self) -> &'static str {
        match self {
            Media::Image => "image",
            Media::Audio => "audio",
        }
    }

    fn extensions(self) -> &'static [&'static str] {
        match self {
            Media::Image => folder::IMAGE_EXTENSIONS,
            Media::Audio => folder::AUDIO_EXTENSIONS,
        }
    }

    fn problem(self, bytes: &[u8], name: &str) -> Option<String> {
        let ext = name.rsplit('.').next().unwrap_or("").to_lowercase();
        match self {
            Media::Image => folder::image_problem(bytes, &ext),
            Media::Audio => folder::audio_problem(bytes, &ext),
        }
    }
}

/// Where each file's other columns come from.
enum Labels {
    /// Class folders: the class's index.
    Classes(Vec<String>),
    /// The metadata table (without `file_name`) and each file's row in it.
    Metadata(RecordBatch, HashMap<String, u32>),
    /// Neither: the media column alone.
    None,
}

/// Files read and checked together, while the rows before them are written.
const CHUNK: usize = 64;

/// What became of one listed file.
enum Outcome {
    /// In no class folder, or named by no metadata row.
    NoLabel,
    Unreadable(String),
    /// Why, and the bytes read.
    Corrupt(String, u64),
    /// Its bytes, and its label or metadata row.
    Row(Vec<u8>, u32),
}

/// Imports the folder `input` (a local path, or an object-store prefix) into `out` as `split`.
/// The files are read and checked 64 at a time, on rayon's threads (concurrent GETs
/// from a store), while the writer encodes the chunk before; rows keep the listing's order.
pub fn import(
    input: &Path,
    media: Media,
    out: &Output,
    split: &str,
    summary: &mut Summary,
    bar: &ProgressBar,
) -> Result<()> {
    let folder = Folder::open(input)?;
    let listing = folder::list(&folder, media.extensions())?;
    for other in &listing.others {
        summary.skip(Reason::OtherFile, other, "");
    }
    for (folder, why) in &listing.unreadable {
        summary.skip(Reason::Unreadable, &format!("{folder}/"), why);
    }
    let labels = labels(&folder, &listing, summary)?;
    let (schema, metadata) = schema(media, &labels);
    let mut writer = DatasetWriter::create(out, split, Arc::clone(&schema), metadata)?;
    bar.set_length(listing.files.len() as u64);
    let mut batch = Batch::default();
    std::thread::scope(|scope| -> Result<()> {
        let (send, chunks) = std::sync::mpsc::sync_channel::<Vec<Outcome>>(1);
        let (folder, listing, labels) = (&folder, &listing, &labels);
        scope.spawn(move || {
            for chunk in listing.files.chunks(CHUNK) {
                if send.send(read_and_check(folder, chunk, labels, media)).is_err() {
                    break; // the writer failed: its error is the import's
                }
            }
        });
        for (outcome, entry) in chunks.into_iter().flatten().zip(&listing.files) {
            bar.inc(1);
            let name = &entry.relative;
            match outcome {
                Outcome::NoLabel => summary.skip(Reason::MissingLabel, name, ""),
                Outcome::Unreadable(why) => summary.skip(Reason::Unreadable, name, &why),
                Outcome::Corrupt(why, read) => {
                    summary.bytes_read += read;
                    summary.skip(Reason::Corrupt, name, &why);
                }
                Outcome::Row(bytes, key) => {
                    summary.bytes_read += bytes.len() as u64;
                    batch.push(&bytes, name, key);
                    if batch.keys.len() >= BATCH_ROWS || batch.bytes >= BATCH_BYTES {
                        summary.rows += batch.write(&mut writer, labels)?;
                    }
                }
            }
        }
        Ok(())
    })?;
    summary.rows += batch.write(&mut writer, &labels)?;
    let (files, bytes) = writer.finish()?;
    summary.files = files;
    summary.bytes_written = bytes;
    Ok(())
}

/// A file's bytes as read, and its label or metadata row.
type Read = (std::io::Result<Vec<u8>>, u32);

/// Reads and checks `chunk`'s files (the labelled ones), in order.
fn read_and_check(folder: &Folder, chunk: &[Entry], labels: &Labels, media: Media) -> Vec<Outcome> {
    use rayon::prelude::*;
    let keys: Vec<Option<u32>> = chunk.iter().map(|e| key_of(e, labels)).collect();
    let wanted: Vec<&str> = chunk
        .iter()
        .zip(&keys)
        .filter(|(_, k)| k.is_some())
        .map(|(e, _)| e.relative.as_str())
        .collect();
    let mut read = folder.read_many(&wanted).into_iter();
    // Each file with its bytes and its key, where it has a key.
    let pairs: Vec<(&Entry, Option<Read>)> = chunk
        .iter()
        .zip(keys)
        .map(|(e, k)| (e, k.and_then(|k| read.next().map(|r| (r, k)))))
        .collect();
    pairs
        .into_par_iter()
        .map(|(entry, read)| match read {
            None => Outcome::NoLabel,
            Some((Err(e), _)) => Outcome::Unreadable(e.to_string()),
            Some((Ok(bytes), key)) => match media.problem(&bytes, &entry.relative) {
                Some(problem) => Outcome::Corrupt(problem, bytes.len() as u64),
                None => Outcome::Row(bytes, key),
            },
        })
        .collect()
}

/// The file's label, or its metadata row; `None` where it has neither but should.
fn key_of(entry: &Entry, labels: &Labels) -> Option<u32> {
    match labels {
        Labels::Classes(_) => entry.label.map(|l| l as u32),
        Labels::Metadata(_, rows) => rows.get(&entry.relative).copied(),
        Labels::None => Some(0),
    }
}

fn labels(folder: &Folder, listing: &Listing, summary: &mut Summary) -> Result<Labels> {
    if let Some(table) = read_metadata(folder)? {
        let names = table
            .column_by_name("file_name")
            .and_then(|c| c.as_any().downcast_ref::<StringArray>().cloned())
            .context("metadata: no `file_name` column of text (each row's file, relative to the folder)")?;
        let mut rows = HashMap::new();
        for (i, name) in names.iter().enumerate() {
            let Some(name) = name else { continue };
            let name = name.trim_start_matches("./").to_owned();
            match rows.entry(name) {
                std::collections::hash_map::Entry::Vacant(v) => {
                    v.insert(i as u32);
                }
                // The first row for a file stands; a later one is named.
                std::collections::hash_map::Entry::Occupied(o) => {
                    let detail = format!("second row for `{}`", o.key());
                    summary.skip(Reason::Corrupt, &format!("metadata row {}", i + 1), &detail);
                }
            }
        }
        let listed: std::collections::HashSet<&str> =
            listing.files.iter().map(|e| e.relative.as_str()).collect();
        let mut missing: Vec<&String> = rows.keys().filter(|n| !listed.contains(n.as_str())).collect();
        missing.sort();
        for name in missing {
            summary.skip(
                Reason::MissingFile,
                name,
                "named by the metadata, not in the folder",
            );
        }
        let keep: Vec<usize> = (0..table.num_columns())
            .filter(|&i| table.schema().field(i).name() != "file_name")
            .collect();
        for &i in &keep {
            let name = table.schema().field(i).name().clone();
            anyhow::ensure!(
                name != "image" && name != "audio",
                "metadata: a column named `{name}` would stand beside the media column of that name: rename it"
            );
        }
        return Ok(Labels::Metadata(table.project(&keep)?, rows));
    }
    if listing.classes.is_empty() {
        Ok(Labels::None)
    } else {
        Ok(Labels::Classes(listing.classes.clone()))
    }
}

/// `metadata.jsonl` or `metadata.csv` at the folder's root, as one batch.
fn read_metadata(folder: &Folder) -> Result<Option<RecordBatch>> {
    let name = |file: &str| format!("{}/{file}", folder.name());
    let batches = if let Some(jsonl) = folder.read_optional("metadata.jsonl")? {
        let (schema, _) = arrow::json::reader::infer_json_schema(Cursor::new(&jsonl), None)
            .with_context(|| format!("{}: not JSON lines of one schema", name("metadata.jsonl")))?;
        let reader = arrow::json::ReaderBuilder::new(Arc::new(schema))
            .with_coerce_primitive(true)
            .build(Cursor::new(&jsonl))?;
        reader
            .collect::<Result<Vec<_>, _>>()
            .with_context(|| format!("reading {}", name("metadata.jsonl")))?
    } else if let Some(csv) = folder.read_optional("metadata.csv")? {
        let format = arrow::csv::reader::Format::default().with_header(true);
        let (schema, _) = format
            .infer_schema(Cursor::new(&csv), None)
            .with_context(|| format!("{}: not CSV", name("metadata.csv")))?;
        let reader = arrow::csv::ReaderBuilder::new(Arc::new(schema))
            .with_header(true)
            .build(Cursor::new(&csv))?;
        reader
            .collect::<Result<Vec<_>, _>>()
            .with_context(|| format!("reading {}", name("metadata.csv")))?
    } else {
        return Ok(None);
    };
    let Some(first) = batches.first() else {
        bail!("{}: the metadata file has no rows", folder.name());
    };
    Ok(Some(arrow::compute::concat_batches(&first.schema(), &batches)?))
}

fn schema(media: Media, labels: &Labels) -> (SchemaRef, Vec<parquet::file::metadata::KeyValue>) {
    // Nullable, as `datasets` writes them: it keeps the footer's features only for fields
    // equal to its own, nullability included.
    let mut fields = vec![Field::new(media.column(), media_type(), true)];
    let mut features = serde_json::Map::new();
    let kind = match media {
        Media::Image => "Image",
        Media::Audio => "Audio",
    };
    features.insert(media.column().into(), serde_json::json!({ "_type": kind }));
    let mut extra = Vec::new();
    match labels {
        Labels::Classes(classes) => {
            fields.push(Field::new("label", DataType::Int64, true));
            features.insert(
                "label".into(),
                serde_json::json!({ "names": classes, "_type": "ClassLabel" }),
            );
            extra.push((
                "label_names".to_owned(),
                serde_json::to_string(classes).unwrap_or_default(),
            ));
        }
        Labels::Metadata(table, _) => {
            for f in table.schema().fields() {
                fields.push(f.as_ref().clone().with_nullable(true));
                features.insert(f.name().clone(), value_feature(f.data_type()));
            }
        }
        Labels::None => {}
    }
    (
        Arc::new(Schema::new(fields)),
        footer_metadata(features.into(), extra),
    )
}

/// The rows gathered for the next write.
#[derive(Default)]
struct Batch {
    media: MediaColumn,
    keys: Vec<u32>,
    bytes: usize,
}

impl Batch {
    fn push(&mut self, bytes: &[u8], path: &str, key: u32) {
        // The Hub keeps the file's name in `path` (the folder's relative path here).
        self.media.push(bytes, path);
        self.keys.push(key);
        self.bytes += bytes.len();
    }

    /// Writes the gathered rows; returns how many.
    fn write(&mut self, writer: &mut DatasetWriter, labels: &Labels) -> Result<u64> {
        if self.keys.is_empty() {
            return Ok(0);
        }
        let keys = std::mem::take(&mut self.keys);
        self.bytes = 0;
        let mut columns: Vec<ArrayRef> = vec![self.media.finish()];
        match labels {
            Labels::Classes(_) => columns.push(Arc::new(Int64Array::from_iter_values(
                keys.iter().map(|&k| i64::from(k)),
            ))),
            Labels::Metadata(table, _) => {
                let rows = UInt32Array::from(keys.clone());
                for column in table.columns() {
                    columns.push(arrow::compute::take(column.as_ref(), &rows, None)?);
                }
            }
            Labels::None => {}
        }
        let batch = RecordBatch::try_new(Arc::clone(writer.schema()), columns)?;
        writer.write(&batch)?;
        Ok(keys.len() as u64)
    }
}
