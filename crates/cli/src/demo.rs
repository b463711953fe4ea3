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

use pushdown_client::LoaderSource;
use pushdown_client::run::{RunOptions, RunReport, bytes, run};
use pushdown_datasets::{GenOptions, Kind, generate, progress_bar};

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

/// Runs the demo over `rows` generated images, printing to `out`.
pub async fn demo(rows: usize, progress: bool, out: &mut impl Write) -> Result<DemoReport> {
    let root = tempfile::tempdir()?;
    let mut options = GenOptions::new(Kind::Images, rows);
    let bar = progress.then(|| progress_bar(&mut options));
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
    let mut options = RunOptions::new(vec![running.url()], LoaderSource::Pipeline(pipeline));
    options.loader.seed = 7;
    let report = run(&options).await?;
    writeln!(out, "{report}")?;

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

#[cfg(test)]
mod tests {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn demo_runs_and_saves_bytes() {
        let mut out = Vec::new();
        let report = super::demo(256, false, &mut out).await.expect("demo");
        let text = String::from_utf8(out).expect("utf8");
        assert!(text.contains("fewer bytes"), "{text}");
        assert!(
            report.run.rows > 0 && report.run.rows < 256,
            "label < 100 keeps ~10%: {}",
            report.run.rows
        );
        assert!(
            report.reduction() > 3.0,
            "saved only {:.1}x\n{text}",
            report.reduction()
        );
        // Each row of storage is counted once, however the loader cut the shards into parts
        // (each part's prescan reads from its shard's start).
        let scanned = report.run.server().rows_scanned;
        assert!(
            scanned <= report.dataset_rows as u64 && scanned > 0,
            "the server scanned {scanned} rows of {}\n{text}",
            report.dataset_rows
        );
    }
}
