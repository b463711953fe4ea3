//! Video clips decoded next to the data (`harness video`). One server (`harness serve`, 1 CPU
//! thread pinned to CPU 0, fragment cache off) decodes 720p H.264 clips and keeps 16 frames
//! at 224×224 (`decode_frames(video, 16, 224, 224)`: the frames shown at the centres of 16
//! equal segments, resized to cover and center-cropped); the trainer (CPU 1) only receives
//! `[B, 16, 224, 224, 3]` tensors.
//!
//! * **Rate and cost.** The Rust `Loader` with default options against the contender
//!   (`benches/python/bench_video.py`: pyarrow reading the same Parquet, PyAV decoding and
//!   PIL resizing the same frames in DataLoader-style worker processes on the trainer's CPU):
//!   clips/s and the trainer's CPU seconds per 1,000 clips (target: ≤ 10% of the
//!   contender's).
//! * **Bytes** per clip on the link (raw and zstd Arrow IPC) beside the encoded clip's size.
//! * **Memory**: the server's peak RSS over a run (its idle RSS beside it).
//!
//! The dataset is made once by `benches/python/make_video.py` (scikit-image photographs
//! filmed by a panning, zooming camera; ffmpeg's libx264) into `--data/videos`. The server
//! needs FFmpeg's libraries: build with `--features pushdown-ops/video`.

use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use arrow::array::{Array, AsArray};
use pushdown_client::{Column, Loader, LoaderOptions, LoaderSource};
use pushdown_protocol::Compression;

use crate::process::{self, ServerProcess};
use crate::{Options, machine};

const QUERY: &str = "SELECT decode_frames(video, 16, 224, 224) AS frames FROM videos";
const BATCH: usize = 8;
const FILE: &str = "videos/train-00000-of-00001.parquet";

/// One loader's run: clips delivered, seconds, the trainer's CPU seconds, bytes received, and
/// the server's CPU seconds and peak RSS.
#[derive(Debug, Clone)]
struct Rate {
    name: String,
    clips: u64,
    seconds: f64,
    cpu: f64,
    bytes: Option<u64>,
    server_cpu: Option<f64>,
    server_peak_rss: Option<u64>,
}

impl Rate {
    fn per_s(&self) -> f64 {
        self.clips as f64 / self.seconds
    }

    fn cpu_per_thousand(&self) -> f64 {
        self.cpu * 1000.0 / self.clips.max(1) as f64
    }
}

/// The video dataset, made once.
fn dataset(root: &Path, quick: bool) -> Result<()> {
    if root.join(FILE).exists() {
        return Ok(());
    }
    let status = std::process::Command::new("scripts/setup-media.sh").status()?;
    if !status.success() {
        bail!("scripts/setup-media.sh failed: ffmpeg makes the video dataset");
    }
    let clips = if quick { "16" } else { "64" };
    let out = std::process::Command::new(".venv/bin/python")
        .args(["benches/python/make_video.py", "--out"])
        .arg(root.join("videos"))
        .args(["--clips", clips])
        .output()
        .context("benches/python/make_video.py (run scripts/setup-python.sh first)")?;
    if !out.status.success() {
        bail!("make_video.py: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

/// The encoded clips' mean size and count.
fn encoded_size(root: &Path) -> Result<(f64, usize)> {
    let file = std::fs::File::open(root.join(FILE))?;
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReader::try_new(file, 1024)?;
    let (mut bytes, mut clips) = (0usize, 0usize);
    for batch in reader {
        let batch = batch?;
        let video = batch.column_by_name("video").context("no video column")?;
        let values = video.as_struct().column_by_name("bytes").context("no bytes")?;
        let values = values.as_binary::<i32>();
        bytes += values.values().len();
        clips += values.len();
    }
    Ok((bytes as f64 / clips.max(1) as f64, clips))
}

/// The Rust `Loader`, default options (or the stream's codec forced): one epoch of clips.
fn pushdown(url: &str, server: &ServerProcess, compression: Option<Compression>) -> Result<Rate> {
    let options = LoaderOptions {
        batch_size: Some(BATCH),
        report_every: None,
        compression,
        ..LoaderOptions::default()
    };
    let own = || process::cpu_seconds(&std::process::id().to_string()).unwrap_or(0.0);
    process::reset_peak_rss(&server.pid());
    let (cpu0, server0, start) = (own(), server.cpu_seconds(), Instant::now());
    let mut loader = Loader::new(&[url], LoaderSource::Sql(QUERY.into()), options)?;
    let mut clips = 0u64;
    for batch in loader.by_ref() {
        let batch = batch?;
        match batch.column("frames") {
            Some(Column::Tensor { shape, .. }) if shape[1..] == [16, 224, 224, 3] => {}
            other => bail!("frames are not a [B, 16, 224, 224, 3] tensor: {other:?}"),
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
        server_peak_rss: process::peak_rss(&server.pid()),
    })
}

/// `bench_video.py` pinned to the trainer's CPU.
fn contender(videos: &Path) -> Result<Rate> {
    let args: Vec<String> = [
        "--data",
        &videos.to_string_lossy(),
        "--workers",
        "1",
        "--batch",
        &BATCH.to_string(),
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    let v = process::python_bench("bench_video.py", &args, "1")?;
    let num = |k: &str| v[k].as_f64().with_context(|| format!("bench_video.py: no {k}"));
    Ok(Rate {
        name: v["loader"].as_str().unwrap_or("contender").to_owned(),
        clips: num("clips")? as u64,
        seconds: num("seconds")?,
        cpu: num("trainer_cpu_s")?,
        bytes: None,
        server_cpu: None,
        server_peak_rss: None,
    })
}

pub async fn suite(options: &Options, command: &str) -> Result<String> {
    if !pushdown_ops::VIDEO {
        bail!("the video suite needs FFmpeg's libraries: build with `--features pushdown-ops/video`");
    }
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
    let idle_rss = process::current_rss(&server.pid()).unwrap_or(0);
    let videos = options.data.join("videos");
    let (mut ours, mut theirs): (Option<Rate>, Option<Rate>) = (None, None);
    for rep in 0..options.reps_resolved {
        for pushdown_first in [rep % 2 == 0, rep % 2 != 0] {
            let rate = if pushdown_first {
                tokio::task::block_in_place(|| pushdown(&url, &server, None))?
            } else {
                contender(&videos)?
            };
            eprintln!(
                "video: {}: {:.2} clips/s, {:.2} trainer CPU s per 1,000 clips",
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
    let data = Data {
        encoded,
        clips,
        idle_rss,
    };
    Ok(report(&[&theirs, &ours, &zstd], &data, options, command))
}

/// What the report says of the dataset and the idle server.
struct Data {
    encoded: f64,
    clips: usize,
    idle_rss: u64,
}

/// `rates`: the contender, then pushdown with default options, then pushdown with zstd.
fn report(rates: &[&Rate; 3], data: &Data, options: &Options, command: &str) -> String {
    let [theirs, ours, zstd] = *rates;
    let (encoded, clips) = (data.encoded, data.clips);
    let mut out = String::from("## Video: sampled frames decoded next to the data\n\n");
    out += &format!(
        "Command: `{command}`  \nMachine: {}. One server (`harness serve`, 1 CPU thread pinned to CPU 0, \
         fragment cache off, FFmpeg {}) runs `{QUERY}`; the trainer is CPU 1.  \nData: {clips} \
         clips, 1280×720 H.264 at 30 fps, 3–6 s, filmed from scikit-image's photographs by a \
         panning, zooming camera (`benches/python/make_video.py`), {:.0} KiB per clip encoded. \
         Batches of {BATCH}; best of {} run(s), the loaders alternating.\n\n",
        machine(),
        ffmpeg_version(),
        encoded / 1024.0,
        options.reps_resolved
    );
    let share = ours.cpu_per_thousand() / theirs.cpu_per_thousand().max(1e-9);
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    out += "| loader | clips | clips/s | trainer CPU s / 1,000 clips | server CPU s / 1,000 clips | bytes per clip on the link | server peak RSS |\n|---|---:|---:|---:|---:|---:|---:|\n";
    for rate in [theirs, ours, zstd] {
        out += &format!(
            "| {} | {} | {:.2} | {:.1} | {} | {} | {} |\n",
            rate.name,
            rate.clips,
            rate.per_s(),
            rate.cpu_per_thousand(),
            rate.server_cpu.map_or("—".into(), |c| format!(
                "{:.1}",
                c * 1000.0 / rate.clips.max(1) as f64
            )),
            rate.bytes.map_or(
                format!("{encoded:.0} (the encoded clip, read locally)"),
                |b| format!(
                    "{:.0} ({:.2}× the encoded clip)",
                    b as f64 / rate.clips.max(1) as f64,
                    b as f64 / rate.clips.max(1) as f64 / encoded
                )
            ),
            rate.server_peak_rss
                .map_or("—".into(), |r| format!("{:.0} MiB", mib(r))),
        );
    }
    out += &format!(
        "\nTarget: pushdown's trainer CPU per 1,000 clips ≤ 10% of the contender's: **{}** ({:.1}%). \
         The contender's clips/s is its one worker decoding and resizing on the trainer's core; \
         pushdown's is the server's one core doing the same, the trainer only receiving tensors. \
         16 frames of 224×224×3 are 2.3 MiB per clip: {:.1}× the encoded clip uncompressed (the \
         default on loopback), {:.2}× with zstd. The server idles at {:.0} MiB; its peak over a \
         run (the loader's default streams at once, each decoding a clip) is in the last column.\n\n",
        if share <= 0.1 { "met" } else { "missed" },
        share * 100.0,
        ours.bytes.unwrap_or(0) as f64 / ours.clips.max(1) as f64 / encoded,
        zstd.bytes.unwrap_or(0) as f64 / zstd.clips.max(1) as f64 / encoded,
        mib(data.idle_rss),
    );
    out
}

/// The FFmpeg the server links (`pkg-config`'s libavcodec version), for the report.
fn ffmpeg_version() -> String {
    std::process::Command::new("pkg-config")
        .args(["--modversion", "libavcodec"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map_or("(version unknown)".into(), |o| {
            format!("libavcodec {}", String::from_utf8_lossy(&o.stdout).trim())
        })
}
