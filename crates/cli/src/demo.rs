//! `pushdown demo`: the product in one command, on an embedded default.
//!
//! Generates a small images dataset in a temporary folder, starts a server in-process on a
//! free port, runs `filter label < 100 → select [image, label] → shuffle → batch` through
//! the planner, the server and the client, and prints what crossed the network against
//! what a loader without pushdown would have fetched (every file, whole).

use std::io::Write;

use anyhow::Result;
use pushdown_planner::Pipeline;
use pushdown_server::{Server, ServerConfig, open_store};

use crate::run::{RunOptions, RunReport, Source, bytes, describe, run};
use pushdown_datasets::{GenOptions, Kind, generate};

/// What the demo measured.
#[derive(Debug)]
pub struct DemoReport {
    pub dataset_bytes: u64,
    pub dataset_rows: usize,
    pub run: RunReport,
}

impl DemoReport {
    /// How many times fewer bytes crossed the network than whole files would have.
    pub fn reduction(&self) -> f64 {
        self.dataset_bytes as f64 / self.run.totals.bytes_received.max(1) as f64
    }
}

/// The demo's pipeline.
pub fn pipeline() -> Pipeline {
    Pipeline::new("images")
        .filter("label < 100")
        .select(["image", "label"])
        .shuffle(1024)
        .batch(64)
}

/// A terminal progress bar wired into `options`: generation advances it.
pub fn with_progress_bar(options: &mut GenOptions) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(options.rows as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} rows ({per_sec}, {eta} left)")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_message(format!("generating {}", options.kind.name()));
    let advance = bar.clone();
    options.progress = Some(std::sync::Arc::new(move |rows| advance.inc(rows)));
    bar
}

/// Runs the demo over `rows` generated images, printing to `out`.
pub async fn demo(rows: usize, progress: bool, out: &mut impl Write) -> Result<DemoReport> {
    let root = tempfile::tempdir()?;
    let mut options = GenOptions::new(Kind::Images, rows);
    let bar = progress.then(|| with_progress_bar(&mut options));
    let generated = generate(&options, &root.path().join("images"))?;
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    writeln!(
        out,
        "generated `images`: {} rows in {} files ({}) under {}",
        generated.rows,
        generated.files.len(),
        bytes(generated.bytes),
        root.path().display()
    )?;

    let server = Server::builder(open_store(&root.path().to_string_lossy())?)
        .config(ServerConfig::default())
        .open()
        .await?;
    let running = server.spawn("127.0.0.1:0".parse()?).await?;
    writeln!(out, "server listening on {}", running.url())?;

    let pipeline = pipeline();
    writeln!(out, "\npipeline:\n{}", indent(&pipeline.to_toml()))?;
    let report = run(&RunOptions {
        seed: 7,
        ..RunOptions::new(vec![running.url()], Source::Pipeline(pipeline))
    })
    .await?;
    writeln!(out, "{}", describe(&report))?;

    let demo = DemoReport {
        dataset_bytes: generated.bytes,
        dataset_rows: generated.rows,
        run: report,
    };
    writeln!(out, "what crossed the network:")?;
    writeln!(
        out,
        "  without pushdown (fetch every file):  {:>10}  ({} rows, every column)",
        bytes(demo.dataset_bytes),
        demo.dataset_rows
    )?;
    writeln!(
        out,
        "  with pushdown:                         {:>10}  ({} rows, 2 columns)",
        bytes(demo.run.totals.bytes_received),
        demo.run.rows
    )?;
    writeln!(out, "  saved: {:.1}x fewer bytes", demo.reduction())?;
    running.shutdown().await?;
    Ok(demo)
}

fn indent(text: &str) -> String {
    text.lines().map(|l| format!("  {l}\n")).collect()
}
