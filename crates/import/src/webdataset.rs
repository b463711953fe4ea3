//! `webdataset`: tar shards as the `webdataset` library reads them, one row per sample.
//!
//! The library's rule (`tariterators.py`): a member `dir/key.ext.more` belongs to the sample
//! `dir/key` (the path up to the first `.` of its file name: `base_plus_ext`'s regular
//! expression) under the extension `ext.more`, lower-cased; consecutive members with one key
//! make one sample; `__*__` metadata at the top and anything not a regular file are skipped.
//! Where the library raises (a key's extension given twice), the sample is counted corrupt. Here a row is `__key__`, `__url__` (the shard), then one column per extension, in
//! name order, typed by its last part: images and audio as the Hub's `struct<bytes, path>`,
//! `txt` as text, `json` as its JSON text (checked), `cls`/`index`/`id` as integers, anything
//! else as bytes. A sample with a corrupt member (an image or audio file its reader refuses,
//! text that is not UTF-8, bad JSON, a non-integer class) is counted and skipped whole.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use anyhow::{Context, Result};
use arrow::array::{ArrayRef, BinaryBuilder, Int64Builder, RecordBatch, StringBuilder};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use indicatif::ProgressBar;

use crate::folder;
use crate::place::{Input, Output};
use crate::summary::{Reason, Summary};
use crate::writer::{DatasetWriter, MediaColumn, footer_metadata, media_type};

const BATCH_ROWS: usize = 256;
const BATCH_BYTES: usize = 16 << 20;

/// How a member's bytes become a column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Typed {
    Image,
    Audio,
    Text,
    Json,
    Class,
    Bytes,
}

impl Typed {
    fn of(ext: &str) -> Typed {
        let last = ext.rsplit('.').next().unwrap_or(ext);
        match last {
            "jpg" | "jpeg" | "png" | "webp" | "gif" | "bmp" | "tif" | "tiff" => Typed::Image,
            "wav" | "flac" | "mp3" | "ogg" | "opus" => Typed::Audio,
            "txt" | "text" | "caption" => Typed::Text,
            "json" => Typed::Json,
            "cls" | "cls2" | "index" | "id" => Typed::Class,
            _ => Typed::Bytes,
        }
    }

    fn data_type(self) -> DataType {
        match self {
            Typed::Image | Typed::Audio => media_type(),
            Typed::Text | Typed::Json => DataType::Utf8,
            Typed::Class => DataType::Int64,
            Typed::Bytes => DataType::Binary,
        }
    }

    fn feature(self) -> serde_json::Value {
        match self {
            Typed::Image => serde_json::json!({ "_type": "Image" }),
            Typed::Audio => serde_json::json!({ "_type": "Audio" }),
            Typed::Text | Typed::Json => serde_json::json!({ "dtype": "string", "_type": "Value" }),
            Typed::Class => serde_json::json!({ "dtype": "int64", "_type": "Value" }),
            Typed::Bytes => serde_json::json!({ "dtype": "binary", "_type": "Value" }),
        }
    }
}

/// The library's `base_plus_ext`, `^((?:.*/|)[^.]+)[.]([^/]*)$`: `("dir/key", "ext")`, or
/// `None` where the expression does not match.
fn base_plus_ext(path: &str) -> Option<(&str, &str)> {
    // The extension holds no `/`: the dot is the first after the last slash.
    let slash = path.rfind('/').map_or(0, |i| i + 1);
    let dot = path[slash..].find('.')? + slash;
    let head = &path[..dot];
    // `head` must end in `[^.]+` that starts at its beginning or just after a `/`.
    let start = head.rfind('.').map_or(0, |i| i + 1);
    let ok = !head.is_empty() && (start == 0 || head[start..head.len() - 1].contains('/'));
    ok.then(|| (head, &path[dot + 1..]))
}

/// The library's `skip_meta`, `__[^/]*__($|/)` from the start: `__index__`, `__meta__/x`.
fn is_meta(path: &str) -> bool {
    let first = path.split('/').next().unwrap_or(path);
    first.len() >= 4 && first.starts_with("__") && first.ends_with("__")
}

/// Python's `TarInfo.isreg()`: regular files, contiguous files, GNU sparse files.
fn is_regular(kind: tar::EntryType) -> bool {
    matches!(
        kind,
        tar::EntryType::Regular | tar::EntryType::Continuous | tar::EntryType::GNUSparse
    )
}

/// One sample: its key and its members by extension.
struct Sample {
    key: String,
    members: BTreeMap<String, Vec<u8>>,
    /// An extension given twice (the library raises on it).
    duplicate: Option<String>,
}

/// One tar member as `(key, extension, bytes)`; `Ok(None)` where it is not a sample's member
/// (not a regular file, metadata, a name without a key and extension: counted); `Err` where
/// its bytes cannot be read (counted): the shard ends there.
fn member<R: std::io::Read>(
    entry: &mut tar::Entry<'_, R>,
    shard: &str,
    summary: &mut Summary,
) -> Result<Option<(String, String, Vec<u8>)>, ()> {
    if !is_regular(entry.header().entry_type()) {
        return Ok(None);
    }
    let path = entry
        .path()
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    if is_meta(&path) {
        return Ok(None);
    }
    let Some((key, ext)) = base_plus_ext(&path).filter(|(_, ext)| !ext.is_empty()) else {
        summary.skip(
            Reason::OtherFile,
            &format!("{shard}:{path}"),
            "no sample key and extension in its name",
        );
        return Ok(None);
    };
    let (key, ext) = (key.to_owned(), ext.to_lowercase());
    // The header's size is the tar's word: reserve no more than a sane member's.
    let mut bytes = Vec::with_capacity((entry.size() as usize).min(1 << 26));
    if let Err(e) = std::io::Read::read_to_end(entry, &mut bytes) {
        summary.skip(
            Reason::Corrupt,
            &format!("{shard}:{path}"),
            &format!("tar stops here: {e}"),
        );
        return Err(());
    }
    Ok(Some((key, ext, bytes)))
}

/// Calls `each` with every sample of `shard`, in order (the library's `group_by_keys`).
fn samples(
    shard: &Input,
    summary: &mut Summary,
    mut each: impl FnMut(Sample, &mut Summary) -> Result<()>,
) -> Result<()> {
    let name = shard.name.clone();
    let file = match shard.open() {
        Ok(f) => f,
        Err(e) => {
            summary.skip(Reason::Unreadable, &name, &e.to_string());
            return Ok(());
        }
    };
    let mut archive = tar::Archive::new(std::io::BufReader::new(file));
    let mut current: Option<Sample> = None;
    let entries = match archive.entries() {
        Ok(e) => e,
        Err(e) => {
            summary.skip(Reason::Corrupt, &name, &e.to_string());
            return Ok(());
        }
    };
    let mut cut = false;
    for entry in entries {
        let mut entry = match entry {
            Ok(e) => e,
            Err(e) => {
                // A truncated or damaged tar: the samples before it stay imported.
                summary.skip(Reason::Corrupt, &name, &format!("tar stops here: {e}"));
                cut = true;
                break;
            }
        };
        let (key, ext, bytes) = match member(&mut entry, &name, summary) {
            Ok(Some(m)) => m,
            Ok(None) => continue,
            Err(()) => {
                cut = true;
                break;
            }
        };
        summary.bytes_read += bytes.len() as u64;
        if current.as_ref().is_none_or(|s| s.key != key) {
            if let Some(done) = current.take() {
                each(done, summary)?;
            }
            current = Some(Sample {
                key,
                members: BTreeMap::new(),
                duplicate: None,
            });
        }
        if let Some(s) = current.as_mut()
            && s.members.insert(ext.clone(), bytes).is_some()
        {
            s.duplicate.get_or_insert(ext);
        }
    }
    match current.take() {
        // The sample the cut fell in may lack members: named, not imported.
        Some(partial) if cut => {
            let detail = "cut short by the tar's damage (its later members are lost)";
            summary.skip(Reason::Corrupt, &format!("{name}:{}", partial.key), detail);
        }
        Some(done) => each(done, summary)?,
        None => {}
    }
    Ok(())
}

/// The extensions the shards hold (a first pass over the members' names).
fn extensions(shards: &[Input]) -> Result<BTreeSet<String>> {
    let mut found = BTreeSet::new();
    for shard in shards {
        let Ok(file) = shard.open() else { continue };
        let mut archive = tar::Archive::new(file);
        let Ok(entries) = archive.entries_with_seek() else {
            continue;
        };
        for entry in entries {
            let Ok(entry) = entry else { break };
            if !is_regular(entry.header().entry_type()) {
                continue;
            }
            let path = entry
                .path()
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_default();
            if is_meta(&path) {
                continue;
            }
            if let Some((_, ext)) = base_plus_ext(&path).filter(|(_, ext)| !ext.is_empty()) {
                found.insert(ext.to_lowercase());
            }
        }
    }
    Ok(found)
}

/// Imports `shards` into the dataset folder `out` as `split`.
pub fn import(
    shards: &[Input],
    out: &Output,
    split: &str,
    summary: &mut Summary,
    bar: &ProgressBar,
) -> Result<()> {
    anyhow::ensure!(!shards.is_empty(), "webdataset: no shards given");
    let columns: Vec<(String, Typed)> = extensions(shards)?
        .into_iter()
        .map(|e| {
            let t = Typed::of(&e);
            (e, t)
        })
        .collect();
    let mut fields = vec![
        Field::new("__key__", DataType::Utf8, false),
        Field::new("__url__", DataType::Utf8, false),
    ];
    let mut features = serde_json::Map::new();
    features.insert(
        "__key__".into(),
        serde_json::json!({ "dtype": "string", "_type": "Value" }),
    );
    features.insert(
        "__url__".into(),
        serde_json::json!({ "dtype": "string", "_type": "Value" }),
    );
    for (ext, typed) in &columns {
        fields.push(Field::new(ext, typed.data_type(), true));
        features.insert(ext.clone(), typed.feature());
    }
    let schema: SchemaRef = Arc::new(Schema::new(fields));
    let mut writer = DatasetWriter::create(
        out,
        split,
        Arc::clone(&schema),
        footer_metadata(features.into(), vec![]),
    )
    .context("webdataset")?;
    bar.set_length(shards.len() as u64);
    let mut batch = Batch::new(&columns);
    for shard in shards {
        let url = &shard.name;
        samples(shard, summary, |sample, summary| {
            if let Some(problem) = sample_problem(&sample) {
                summary.skip(Reason::Corrupt, &format!("{url}:{}", sample.key), &problem);
                return Ok(());
            }
            batch.push(&sample, url, &columns);
            if batch.rows >= BATCH_ROWS || batch.bytes >= BATCH_BYTES {
                summary.rows += batch.write(&mut writer)?;
            }
            Ok(())
        })?;
        bar.inc(1);
    }
    summary.rows += batch.write(&mut writer)?;
    let (files, bytes) = writer.finish()?;
    summary.files = files;
    summary.bytes_written = bytes;
    Ok(())
}

/// What is wrong with a sample's members, if anything.
fn sample_problem(sample: &Sample) -> Option<String> {
    if let Some(ext) = &sample.duplicate {
        return Some(format!(".{ext}: given twice for one key"));
    }
    for (ext, bytes) in &sample.members {
        let last = ext.rsplit('.').next().unwrap_or(ext);
        let problem = match Typed::of(ext) {
            Typed::Image => folder::image_problem(bytes, last),
            Typed::Audio => folder::audio_problem(bytes, last),
            Typed::Text => std::str::from_utf8(bytes).err().map(|e| e.to_string()),
            Typed::Json => serde_json::from_slice::<serde::de::IgnoredAny>(bytes)
                .err()
                .map(|e| e.to_string()),
            Typed::Class => parse_class(bytes).err(),
            Typed::Bytes => None,
        };
        if let Some(p) = problem {
            return Some(format!(".{ext}: {p}"));
        }
    }
    None
}

/// A `.cls` member: a decimal integer, surrounding whitespace allowed (as `int(text)`).
fn parse_class(bytes: &[u8]) -> Result<i64, String> {
    let text = std::str::from_utf8(bytes).map_err(|e| e.to_string())?;
    text.trim()
        .parse::<i64>()
        .map_err(|_| format!("not an integer: {:?}", text.trim()))
}

/// One column's rows being gathered.
enum Builder {
    Media(MediaColumn),
    Text(StringBuilder),
    Class(Int64Builder),
    Bytes(BinaryBuilder),
}

struct Batch {
    key: StringBuilder,
    url: StringBuilder,
    columns: Vec<Builder>,
    rows: usize,
    bytes: usize,
}

impl Batch {
    fn new(columns: &[(String, Typed)]) -> Batch {
        Batch {
            key: StringBuilder::new(),
            url: StringBuilder::new(),
            columns: columns
                .iter()
                .map(|(_, t)| match t {
                    Typed::Image | Typed::Audio => Builder::Media(MediaColumn::default()),
                    Typed::Text | Typed::Json => Builder::Text(StringBuilder::new()),
                    Typed::Class => Builder::Class(Int64Builder::new()),
                    Typed::Bytes => Builder::Bytes(BinaryBuilder::new()),
                })
                .collect(),
            rows: 0,
            bytes: 0,
        }
    }

    /// Appends a checked sample ([`sample_problem`] found nothing).
    fn push(&mut self, sample: &Sample, url: &str, columns: &[(String, Typed)]) {
        self.key.append_value(&sample.key);
        self.url.append_value(url);
        for ((ext, _), builder) in columns.iter().zip(&mut self.columns) {
            let member = sample.members.get(ext);
            self.bytes += member.map_or(0, Vec::len);
            match (builder, member) {
                (Builder::Media(m), Some(b)) => {
                    let name = sample.key.rsplit('/').next().unwrap_or(&sample.key);
                    m.push(b, &format!("{name}.{ext}"));
                }
                (Builder::Media(m), None) => m.push_null(),
                (Builder::Text(t), Some(b)) => t.append_value(String::from_utf8_lossy(b)),
                (Builder::Text(t), None) => t.append_null(),
                (Builder::Class(c), Some(b)) => c.append_option(parse_class(b).ok()),
                (Builder::Class(c), None) => c.append_null(),
                (Builder::Bytes(x), Some(b)) => x.append_value(b),
                (Builder::Bytes(x), None) => x.append_null(),
            }
        }
        self.rows += 1;
    }

    fn write(&mut self, writer: &mut DatasetWriter) -> Result<u64> {
        if self.rows == 0 {
            return Ok(0);
        }
        let mut arrays: Vec<ArrayRef> = vec![Arc::new(self.key.finish()), Arc::new(self.url.finish())];
        for builder in &mut self.columns {
            arrays.push(match builder {
                Builder::Media(m) => m.finish(),
                Builder::Text(t) => Arc::new(t.finish()),
                Builder::Class(c) => Arc::new(c.finish()),
                Builder::Bytes(x) => Arc::new(x.finish()),
            });
        }
        writer.write(&RecordBatch::try_new(Arc::clone(writer.schema()), arrays)?)?;
        let rows = self.rows as u64;
        self.rows = 0;
        self.bytes = 0;
        Ok(rows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_names_as_the_library_does() {
        assert_eq!(base_plus_ext("a/b/000001.jpg"), Some(("a/b/000001", "jpg")));
        assert_eq!(base_plus_ext("000001.seg.png"), Some(("000001", "seg.png")));
        assert_eq!(base_plus_ext("dir.x/000001.txt"), Some(("dir.x/000001", "txt")));
        assert_eq!(base_plus_ext("README"), None);
        assert_eq!(base_plus_ext(".hidden"), None);
        // `[^.]+` may cross a `/`, as the library's expression lets it.
        assert_eq!(base_plus_ext("dir/.hidden"), Some(("dir/", "hidden")));
        assert_eq!(base_plus_ext("a.b/c/.x"), Some(("a.b/c/", "x")));
        assert_eq!(base_plus_ext("a.b/.x"), None);
        assert_eq!(base_plus_ext("key."), Some(("key", "")));
        assert!(is_meta("__index__") && is_meta("__meta__/x.json") && !is_meta("a/__x__"));
        assert_eq!(Typed::of("seg.png"), Typed::Image);
        assert_eq!(parse_class(b" 7\n"), Ok(7));
        assert!(parse_class(b"seven").is_err());
    }
}
