//! `harness import`: `pushdown import` against a pyarrow script doing the same work
//! (`benches/python/import_pyarrow.py`: the files listed in the same order, read, written as
//! zstd Parquet), on the same files: an image folder (the generated
//! images' JPEGs in ten class folders) and JSONL (the generated text's rows in eight files).
//! Both sides run on the same CPUs; the table gives rows/s and the ratio.
//!
//! What differs, by design: `pushdown import` checks every image's header (a corrupt file is
//! named, not imported) and writes the Hub's footer metadata; the pyarrow script checks
//! nothing, as a converter written in a hurry does not.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use arrow::array::{Array, BinaryArray, Int32Array};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

use crate::{Options, row};

/// The source files, written once from the generated datasets under `root`.
fn sources(root: &Path) -> Result<(PathBuf, Vec<PathBuf>)> {
    let base = root.join("import-src");
    let folder = base.join("imagefolder");
    let jsonl = base.join("jsonl");
    let stamp = base.join("_written");
    if !stamp.exists() {
        let _ = fs::remove_dir_all(&base);
        for path in parquet_files(&root.join("images"))? {
            let reader = ParquetRecordBatchReaderBuilder::try_new(fs::File::open(&path)?)?.build()?;
            for batch in reader {
                let batch = batch?;
                let ids = batch.column_by_name("id").context("images: no id")?;
                let ids = arrow::compute::cast(ids, &arrow::datatypes::DataType::Int64)?;
                let ids = ids
                    .as_any()
                    .downcast_ref::<arrow::array::Int64Array>()
                    .context("id")?;
                let images = batch.column_by_name("image").context("images: no image")?;
                let images = images.as_any().downcast_ref::<BinaryArray>().context("image")?;
                let labels = batch.column_by_name("label").context("images: no label")?;
                let labels = labels.as_any().downcast_ref::<Int32Array>().context("label")?;
                for i in 0..batch.num_rows() {
                    let class = folder.join(format!("class{:02}", labels.value(i) % 10));
                    fs::create_dir_all(&class)?;
                    fs::write(class.join(format!("{:07}.jpg", ids.value(i))), images.value(i))?;
                }
            }
        }
        fs::create_dir_all(&jsonl)?;
        let mut writers: Vec<_> = (0..8)
            .map(|i| {
                fs::File::create(jsonl.join(format!("part-{i}.jsonl")))
                    .map(arrow::json::LineDelimitedWriter::new)
            })
            .collect::<std::io::Result<_>>()?;
        let mut n = 0;
        for path in parquet_files(&root.join("text"))? {
            for batch in ParquetRecordBatchReaderBuilder::try_new(fs::File::open(&path)?)?.build()? {
                writers[n % 8].write(&batch?)?;
                n += 1;
            }
        }
        for mut w in writers {
            w.finish()?;
        }
        fs::write(&stamp, "")?;
    }
    let mut files: Vec<PathBuf> = fs::read_dir(&jsonl)?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<_>>()?;
    files.sort();
    Ok((folder, files))
}

fn parquet_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .with_context(|| format!("listing {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "parquet"))
        .collect();
    files.sort();
    Ok(files)
}

/// One side's best run: rows, seconds, bytes written.
struct Cell {
    rows: u64,
    secs: f64,
    written: u64,
}

fn ours(kind: pushdown_import::Kind, inputs: &[PathBuf], out: &Path, reps: usize) -> Result<Cell> {
    let mut best: Option<Cell> = None;
    for _ in 0..reps {
        let start = Instant::now();
        let summary = pushdown_import::import(&pushdown_import::ImportOptions::new(
            kind,
            inputs.to_vec(),
            out.to_owned(),
        ))?;
        let secs = start.elapsed().as_secs_f64();
        anyhow::ensure!(
            summary.skipped_total() == 0,
            "the benchmark's inputs are clean: {summary}"
        );
        if best.as_ref().is_none_or(|b| secs < b.secs) {
            best = Some(Cell {
                rows: summary.rows,
                secs,
                written: summary.bytes_written,
            });
        }
    }
    best.context("no repetition")
}

fn pyarrow(kind: &str, inputs: &[PathBuf], out: &Path, reps: usize, cpus: &str) -> Result<Cell> {
    let mut args = vec![
        kind.to_owned(),
        "--out".to_owned(),
        out.display().to_string(),
        "--reps".to_owned(),
        reps.to_string(),
    ];
    args.extend(inputs.iter().map(|p| p.display().to_string()));
    let v = crate::process::python_bench("import_pyarrow.py", &args, cpus)?;
    let num = |k: &str| {
        v[k].as_f64()
            .with_context(|| format!("import_pyarrow.py: no {k}"))
    };
    Ok(Cell {
        rows: num("rows")? as u64,
        secs: num("seconds")?,
        written: num("bytes_written")? as u64,
    })
}

/// Runs the suite; returns its section of `benches/RESULTS.md`.
pub async fn suite(options: &Options, root: &Path, command: &str) -> Result<String> {
    let (folder, jsonl) = sources(root)?;
    let out = root.join("import-out");
    // The harness runs pinned to HARNESS_CPU; the script gets the same one.
    let cpus = crate::HARNESS_CPU.to_string();
    let mut table = String::from(
        "| input | rows | pushdown import rows/s | pyarrow script rows/s | ratio | Parquet written (ours / pyarrow) |\n|---|---:|---:|---:|---:|---:|\n",
    );
    let cases: [(&str, pushdown_import::Kind, Vec<PathBuf>); 2] = [
        (
            "imagefolder (JPEGs, 10 classes)",
            pushdown_import::Kind::ImageFolder,
            vec![folder],
        ),
        ("jsonl (text rows, 8 files)", pushdown_import::Kind::Jsonl, jsonl),
    ];
    for (name, kind, inputs) in cases {
        let a = ours(kind, &inputs, &out.join("ours"), options.reps_resolved)?;
        let b = pyarrow(
            kind.name(),
            &inputs,
            &out.join("pyarrow"),
            options.reps_resolved,
            &cpus,
        )?;
        anyhow::ensure!(
            a.rows == b.rows,
            "{name}: {} rows against pyarrow's {}",
            a.rows,
            b.rows
        );
        let (ra, rb) = (a.rows as f64 / a.secs, b.rows as f64 / b.secs);
        row(
            &mut table,
            format!(
                "| {name} | {} | {ra:.0} | {rb:.0} | {:.2}× | {} / {} |\n",
                a.rows,
                ra / rb,
                pushdown_client::run::bytes(a.written),
                pushdown_client::run::bytes(b.written),
            ),
        );
    }
    let _ = fs::remove_dir_all(&out);
    Ok(format!(
        "## Import: `pushdown import` against a pyarrow script\n\n\
         `{command}` on {}. Same files, same CPUs ({cpus}), best of {} run(s) each; the ratio is \
         ours over pyarrow's rows/s. `pushdown import` also checks each image's header and \
         writes the Hub's footer metadata; the script (`benches/python/import_pyarrow.py`) \
         checks nothing.\n\n{table}\n",
        crate::machine(),
        options.reps_resolved,
    ))
}
