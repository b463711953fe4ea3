//! Speech features for Whisper-style training (`harness audio`). One server (`harness serve`,
//! 1 CPU thread pinned to CPU 0, fragment cache off) decodes 44.1/48 kHz FLAC and MP3 clips,
//! resamples them to 16 kHz and computes Whisper's 80-bin log-mel features (`log_mel(audio,
//! 16000, 80)`); the trainer (CPU 1) only receives `[B, 80, 3000]` tensors.
//!
//! * **Rate and cost.** The Rust `Loader` with default options against the contender
//!   (`benches/python/bench_audio.py`: pyarrow reading the same Parquet, `soundfile`,
//!   `soxr` and `WhisperFeatureExtractor` in DataLoader-style worker processes on the
//!   trainer's CPU): clips/s and the trainer's CPU seconds per 1,000 clips (target: ≤ 20% of
//!   the contender's).
//! * **Bytes** per clip on the link (zstd Arrow IPC) beside the encoded clip's size.
//!
//! The dataset is made once by `benches/python/make_speech.py` (espeak-ng speech, ffmpeg
//! encoding) into `--data/speech`.

use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use arrow::array::{Array, AsArray};
use pushdown_client::{Column, Loader, LoaderOptions, LoaderSource};
use pushdown_protocol::Compression;

use crate::process::{self, ServerProcess};
use crate::{Options, machine};

const QUERY: &str = "SELECT log_mel(audio, 16000, 80) AS mel FROM speech";
const BATCH: usize = 8;

/// One loader's run: clips delivered, seconds, the trainer's CPU seconds, bytes received.
#[derive(Debug, Clone)]
struct Rate {
    name: String,
    clips: u64,
    seconds: f64,
    cpu: f64,
    bytes: Option<u64>,
    server_cpu: Option<f64>,
}

impl Rate {
    fn per_s(&self) -> f64 {
        self.clips as f64 / self.seconds
    }

    fn cpu_per_thousand(&self) -> f64 {
        self.cpu * 1000.0 / self.clips.max(1) as f64
    }
}

/// The speech dataset, made once.
fn dataset(root: &Path, quick: bool) -> Result<()> {
    let folder = root.join("speech");
    if folder.join("train-00000-of-00001.parquet").exists() {
        return Ok(());
    }
    let status = std::process::Command::new("scripts/setup-media.sh").status()?;
    if !status.success() {
        bail!("scripts/setup-media.sh failed: ffmpeg and espeak-ng make the speech dataset");
    }
    let clips = if quick { "64" } else { "256" };
    let out = std::process::Command::new(".venv/bin/python")
        .args(["benches/python/make_speech.py", "--out"])
        .arg(&folder)
        .args(["--clips", clips])
        .output()
        .context("benches/python/make_speech.py (run scripts/setup-python.sh first)")?;
    if !out.status.success() {
        bail!("make_speech.py: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

/// The encoded clips' mean size and count.
fn encoded_size(root: &Path) -> Result<(f64, usize)> {
    let file = std::fs::File::open(root.join("speech/train-00000-of-00001.parquet"))?;
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReader::try_new(file, 1024)?;
    let (mut bytes, mut clips) = (0usize, 0usize);
    for batch in reader {
        let batch = batch?;
        let audio = batch.column_by_name("audio").context("no audio column")?;
        let values = audio.as_struct().column_by_name("bytes").context("no bytes")?;
        let values = values.as_binary::<i32>();
        bytes += values.values().len();
        clips += values.len();
    }
    Ok((bytes as f64 / clips.max(1) as f64, clips))
}

/// The Rust `Loader`, default options (or the stream's codec forced): one epoch of features.
fn pushdown(url: &str, server: &ServerProcess, compression: Option<Compression>) -> Result<Rate> {
    let options = LoaderOptions {
        batch_size: Some(BATCH),
        report_every: None,
        compression,
        ..LoaderOptions::default()
    };
    let own = || process::cpu_seconds(&std::process::id().to_string()).unwrap_or(0.0);
    let (cpu0, server0, start) = (own(), server.cpu_seconds(), Instant::now());
    let mut loader = Loader::new(&[url], LoaderSource::Sql(QUERY.into()), options)?;
    let mut clips = 0u64;
    for batch in loader.by_ref() {
        let batch = batch?;
        match batch.column("mel") {
            Some(Column::Tensor { shape, .. }) if shape[1..] == [80, 3000] => {}
            other => bail!("mel is not a [B, 80, 3000] tensor: {other:?}"),
        }
        clips += batch.rows as u64;
    }
    Ok(Rate {
        name: match compression {
            None => "pushdown `Loader`, default options (no codec on loopback)".into(),
            Some(c) => format!("pushdown `Loader`, `compression = {c:?}` (as over a link)"),
        },
        clips,
        seconds: start.elapsed().as_secs_f64(),
        cpu: own() - cpu0,
        bytes: Some(loader.stats().bytes_received),
        server_cpu: Some(server.cpu_seconds() - server0),
    })
}

/// `bench_audio.py` pinned to the trainer's CPU.
fn contender(speech: &Path) -> Result<Rate> {
    let args: Vec<String> = [
        "--data",
        &speech.to_string_lossy(),
        "--workers",
        "1",
        "--batch",
        &BATCH.to_string(),
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    let v = process::python_bench("bench_audio.py", &args, "1")?;
    let num = |k: &str| v[k].as_f64().with_context(|| format!("bench_audio.py: no {k}"));
    Ok(Rate {
        name: v["loader"].as_str().unwrap_or("contender").to_owned(),
        clips: num("clips")? as u64,
        seconds: num("seconds")?,
        cpu: num("trainer_cpu_s")?,
        bytes: None,
        server_cpu: None,
    })
}

pub async fn suite(options: &Options, command: &str) -> Result<String> {
    tokio::task::block_in_place(|| dataset(&options.data, options.quick))?;
    let (encoded, clips) = encoded_size(&options.data)?;
    let server = ServerProcess::start_with(
        "serve",
        &options.data.to_string_lossy(),
        "127.0.0.1:0",
        1,
        None,
        Some("0"),
        &[("PUSHDOWN_CACHE".to_owned(), "off".to_owned())],
    )?;
    let url = format!("http://{}", server.addr);
    crate::connect(&url).await?;
    let speech = options.data.join("speech");
    let (mut ours, mut theirs): (Option<Rate>, Option<Rate>) = (None, None);
    for rep in 0..options.reps_resolved {
        let order = if rep % 2 == 0 {
            [true, false]
        } else {
            [false, true]
        };
        for pushdown_first in order {
            let rate = if pushdown_first {
                tokio::task::block_in_place(|| pushdown(&url, &server, None))?
            } else {
                contender(&speech)?
            };
            eprintln!(
                "audio: {}: {:.1} clips/s, {:.2} trainer CPU s per 1,000 clips",
                rate.name,
                rate.per_s(),
                rate.cpu_per_thousand()
            );
            let best = if pushdown_first { &mut ours } else { &mut theirs };
            if best.as_ref().is_none_or(|b| b.per_s() < rate.per_s()) {
                *best = Some(rate);
            }
        }
    }
    let (ours, theirs) = (
        ours.context("no pushdown run")?,
        theirs.context("no contender run")?,
    );
    let zstd = tokio::task::block_in_place(|| pushdown(&url, &server, Some(Compression::Zstd)))?;
    Ok(report(&[&theirs, &ours, &zstd], encoded, clips, options, command))
}

/// `rates`: the contender, then pushdown with default options, then pushdown with zstd.
fn report(rates: &[&Rate; 3], encoded: f64, clips: usize, options: &Options, command: &str) -> String {
    let [theirs, ours, zstd] = *rates;
    let mut out = String::from("## Speech: Whisper's log-mel features next to the data\n\n");
    out += &format!(
        "Command: `{command}`  \nMachine: {}. One server (`harness serve`, 1 CPU thread pinned to CPU 0, \
         fragment cache off) runs `{QUERY}` (decode, mono, 16 kHz, 80-bin log-mel, 30 s padded); \
         the trainer is CPU 1.  \nData: speech, {clips} clips (espeak-ng speech read from Python's \
         docstrings, 2–15 s, 44.1/48 kHz, half FLAC, half MP3; `benches/python/make_speech.py`), \
         {:.0} KiB per clip encoded. Batches of {BATCH}; best of {} run(s), the loaders alternating.\n\n",
        machine(),
        encoded / 1024.0,
        options.reps_resolved
    );
    let share = ours.cpu_per_thousand() / theirs.cpu_per_thousand().max(1e-9);
    out += "| loader | clips | clips/s | trainer CPU s / 1,000 clips | server CPU s / 1,000 clips | bytes per clip on the link |\n|---|---:|---:|---:|---:|---:|\n";
    for rate in [theirs, ours, zstd] {
        out += &format!(
            "| {} | {} | {:.1} | {:.2} | {} | {} |\n",
            rate.name,
            rate.clips,
            rate.per_s(),
            rate.cpu_per_thousand(),
            rate.server_cpu.map_or("—".into(), |c| format!(
                "{:.1}",
                c * 1000.0 / rate.clips.max(1) as f64
            )),
            rate.bytes.map_or(
                format!("{:.0} (the encoded clip, read locally)", encoded),
                |b| format!(
                    "{:.0} ({:.2}× the encoded clip)",
                    b as f64 / rate.clips.max(1) as f64,
                    b as f64 / rate.clips.max(1) as f64 / encoded
                )
            ),
        );
    }
    out += &format!(
        "\nTarget: pushdown's trainer CPU per 1,000 clips ≤ 20% of the contender's: **{}** ({:.1}%). \
         The contender's clips/s is its one worker decoding, resampling and computing features on \
         the trainer's core; pushdown's is the server's one core doing the same, the trainer \
         only receiving tensors. The features are 80 × 3,000 `float32` (938 KiB) per clip, 30 s \
         padded: {:.1}× the encoded clip uncompressed (the default on loopback), {:.2}× with zstd \
         (the padded frames are constant), what a link between hosts carries.\n\n",
        if share <= 0.2 { "met" } else { "missed" },
        share * 100.0,
        ours.bytes.unwrap_or(0) as f64 / ours.clips.max(1) as f64 / encoded,
        zstd.bytes.unwrap_or(0) as f64 / zstd.clips.max(1) as f64 / encoded,
    );
    out
}
