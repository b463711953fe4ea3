//! `jsonl`: JSON Lines files (one object per line: text and any fields) as a dataset.
//!
//! Two passes: the first parses every line, infers one schema over all of them with Arrow's
//! JSON inference (a field some lines lack is nullable; an integer field with a float in one
//! line is a float) and counts the lines that are not JSON objects, naming each by
//! `file:line`; the second decodes the good lines with Arrow's JSON decoder into batches.
//! Blank lines are not rows.

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::sync::Arc;

use anyhow::{Context, Result};
use arrow::datatypes::SchemaRef;
use indicatif::ProgressBar;

use crate::place::{Input, Output, ReadSeek};
use crate::summary::{Reason, Summary};
use crate::writer::{DatasetWriter, footer_metadata, value_feature};

/// Rows per decoded batch.
const BATCH_ROWS: usize = 4096;

/// The non-blank lines of files, in order, each with its file's index and its 1-based
/// number; a file that cannot be opened or read is one `Err` and the files after it go on.
struct Lines<'a> {
    files: &'a [Input],
    file: usize,
    reader: Option<BufReader<Box<dyn ReadSeek>>>,
    number: usize,
    /// Bytes read so far.
    bytes: u64,
}

/// What [`Lines`] yields: `(file, number, line)`, or `(file, error)`.
type Line = Result<(usize, usize, Vec<u8>), (usize, String)>;

impl<'a> Lines<'a> {
    fn new(files: &'a [Input]) -> Self {
        Lines {
            files,
            file: 0,
            reader: None,
            number: 0,
            bytes: 0,
        }
    }
}

impl Iterator for Lines<'_> {
    type Item = Line;

    fn next(&mut self) -> Option<Line> {
        loop {
            let f = self.file;
            let path = self.files.get(f)?;
            let reader = match self.reader.as_mut() {
                Some(r) => r,
                None => match path.open() {
                    Ok(file) => {
                        self.number = 0;
                        self.reader.insert(BufReader::new(file))
                    }
                    Err(e) => {
                        self.file += 1;
                        return Some(Err((f, e.to_string())));
                    }
                },
            };
            let mut line = Vec::new();
            match reader.read_until(b'\n', &mut line) {
                Ok(0) => {
                    self.reader = None;
                    self.file += 1;
                }
                Ok(n) => {
                    self.bytes += n as u64;
                    self.number += 1;
                    if !line.iter().all(u8::is_ascii_whitespace) {
                        return Some(Ok((f, self.number, line)));
                    }
                }
                Err(e) => {
                    self.reader = None;
                    self.file += 1;
                    return Some(Err((f, e.to_string())));
                }
            }
        }
    }
}

/// Imports `files` into the dataset folder `out` as `split`.
pub fn import(
    files: &[Input],
    out: &Output,
    split: &str,
    summary: &mut Summary,
    bar: &ProgressBar,
) -> Result<()> {
    anyhow::ensure!(!files.is_empty(), "jsonl: no files given");
    let (schema, bad) = infer(files, summary)?;
    let schema: SchemaRef = Arc::new(schema);
    let features: serde_json::Map<_, _> = schema
        .fields()
        .iter()
        .map(|f| (f.name().clone(), value_feature(f.data_type())))
        .collect();
    let mut writer = DatasetWriter::create(
        out,
        split,
        Arc::clone(&schema),
        footer_metadata(features.into(), vec![]),
    )?;
    // Pass 2: decode the good lines, a batch at a time.
    bar.set_length(files.len() as u64);
    let mut lines = Lines::new(files);
    let mut pending = Vec::with_capacity(BATCH_ROWS);
    let mut file = 0;
    for line in lines.by_ref() {
        let Ok((f, number, line)) = line else { continue };
        if f != file {
            bar.inc((f - file) as u64);
            file = f;
        }
        if bad.contains(&(f, number)) || bad.contains(&(f, 0)) {
            continue;
        }
        pending.push((f, number, line));
        if pending.len() >= BATCH_ROWS {
            decode_batch(&pending, files, &schema, &mut writer, summary)?;
            pending.clear();
        }
    }
    decode_batch(&pending, files, &schema, &mut writer, summary)?;
    summary.bytes_read += lines.bytes;
    let (files, bytes) = writer.finish()?;
    summary.files = files;
    summary.bytes_written = bytes;
    Ok(())
}

/// Pass 1: one schema inferred over every object line, streaming; the lines that are not
/// JSON objects named and counted, and returned (`(file, line)`; line 0: the whole file).
fn infer(
    files: &[Input],
    summary: &mut Summary,
) -> Result<(arrow::datatypes::Schema, HashSet<(usize, usize)>)> {
    let mut bad: HashSet<(usize, usize)> = HashSet::new();
    let mut lines = Lines::new(files);
    let objects = std::iter::from_fn(|| {
        loop {
            match lines.next()? {
                Ok((f, number, line)) => match serde_json::from_slice::<serde_json::Value>(&line) {
                    Ok(v) if v.is_object() => return Some(Ok(v)),
                    Ok(_) => {
                        summary.skip(
                            Reason::Corrupt,
                            &format!("{}:{number}", files[f].name),
                            "not a JSON object",
                        );
                        bad.insert((f, number));
                    }
                    Err(e) => {
                        summary.skip(
                            Reason::Corrupt,
                            &format!("{}:{number}", files[f].name),
                            &e.to_string(),
                        );
                        bad.insert((f, number));
                    }
                },
                Err((f, e)) => {
                    summary.skip(Reason::Unreadable, &files[f].name.clone(), &e);
                    bad.insert((f, 0));
                }
            }
        }
    });
    let schema = arrow::json::reader::infer_json_schema_from_iterator(objects).context(
        "jsonl: the objects have no one schema (a field is an object in one line and a scalar in another)",
    )?;
    anyhow::ensure!(
        !schema.fields().is_empty(),
        "jsonl: no JSON objects in the files given"
    );
    Ok((schema, bad))
}

/// Decodes `lines` (file, number, text) into one batch and writes it. Where the batch does
/// not decode (a value of a type the schema cannot take: a list where a number was
/// inferred), each line is decoded alone and the ones that fail are named and counted.
fn decode_batch(
    lines: &[(usize, usize, Vec<u8>)],
    files: &[Input],
    schema: &SchemaRef,
    writer: &mut DatasetWriter,
    summary: &mut Summary,
) -> Result<()> {
    if lines.is_empty() {
        return Ok(());
    }
    let decode = |chunk: &[(usize, usize, Vec<u8>)]| -> Result<Option<arrow::record_batch::RecordBatch>, arrow::error::ArrowError> {
        let mut decoder = arrow::json::ReaderBuilder::new(Arc::clone(schema))
            // Room for every line: a decode never stops short of one's end.
            .with_batch_size(chunk.len() + 1)
            // Inference made a field text where lines mix numbers, booleans and strings.
            .with_coerce_primitive(true)
            .build_decoder()?;
        for (_, _, line) in chunk {
            decoder.decode(line)?;
        }
        decoder.flush()
    };
    if let Ok(batch) = decode(lines) {
        if let Some(batch) = batch {
            summary.rows += batch.num_rows() as u64;
            writer.write(&batch)?;
        }
        return Ok(());
    }
    let mut good = Vec::new();
    for one in lines.chunks(1) {
        match decode(one) {
            Ok(Some(batch)) => good.push(batch),
            Ok(None) => {}
            Err(e) => {
                let (f, number, _) = &one[0];
                summary.skip(
                    Reason::Corrupt,
                    &format!("{}:{number}", files[*f].name),
                    &e.to_string(),
                );
            }
        }
    }
    if !good.is_empty() {
        let batch = arrow::compute::concat_batches(schema, &good)?;
        summary.rows += batch.num_rows() as u64;
        writer.write(&batch)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Array, StringArray};
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

    #[test]
    fn mixed_scalars_become_text_and_lines_that_cannot_decode_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("in.jsonl");
        // `v` mixes numbers and strings (text); `n` is a number except on line 3 (a list).
        std::fs::write(
            &input,
            "{\"v\": 1, \"n\": 1}\n{\"v\": \"two\", \"n\": 2}\n{\"v\": true, \"n\": [3]}\n\n{\"v\": 4.5}\n",
        )
        .unwrap();
        let out = dir.path().join("ds");
        let mut summary = Summary::new("jsonl");
        let (inputs, dataset) = ([Input::local(input)], Output::Local(out.clone()));
        let result = import(&inputs, &dataset, "train", &mut summary, &ProgressBar::hidden());
        // Inference itself refuses number-and-list: a clear error, nothing written.
        if let Err(e) = result {
            assert!(format!("{e:#}").contains("jsonl"), "{e:#}");
            assert!(!out.join("data").exists());
            return;
        }
        assert_eq!(summary.rows + summary.skipped_total(), 4, "{summary}");
        let file = std::fs::File::open(out.join(&summary.files[0])).unwrap();
        let batch = ParquetRecordBatchReaderBuilder::try_new(file)
            .unwrap()
            .build()
            .unwrap()
            .next()
            .unwrap()
            .unwrap();
        // `n` is inferred a list (arrow-json's rule for a scalar beside a list), so the lines
        // with a number there do not decode: each is named, the others are imported.
        let v = batch.column_by_name("v").unwrap();
        let v = v.as_any().downcast_ref::<StringArray>().unwrap();
        let values: Vec<&str> = v.iter().flatten().collect();
        assert_eq!(values, vec!["true", "4.5"]);
        let named = &summary.skipped[&Reason::Corrupt].named;
        assert_eq!(named.len(), 2, "{summary}");
        assert!(
            named[0].contains("in.jsonl:1") && named[1].contains("in.jsonl:2"),
            "{named:?}"
        );
    }
}
