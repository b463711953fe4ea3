//! The scaling signal checked against measurement: a trainer that consumes faster than one
//! server can produce waits; the servers' signal says how many servers would remove the
//! wait; the same trainer against that many servers waits again, and the wait removed is
//! measured.
//!
//! Query: `SELECT id, label, thumbnail(image, 64) AS thumb FROM images` (the thumbnail on the
//! server: its CPU is the bottleneck). The trainer is a `Loader` (batch 128, shuffle 256)
//! whose consumer "trains" each batch for a fixed step time (a sleep: the trainer's own
//! cores are not what is measured), chosen so that it would consume `DEMAND` × what one
//! server produces. Servers are `harness serve` processes with one CPU thread, pinned one
//! per core in the far-CPU order (`far_cpu`: CPU 0, 2, 3, …, the trainer's CPU 1 last; on 2
//! cores a second server shares the trainer's, since the trainer's consumer sleeps).

use std::time::{Duration, Instant};

use anyhow::Result;
use pushdown_client::{Loader, LoaderOptions, LoaderSource, PushdownClient};

use crate::process::ServerProcess;
use crate::{Datasets, Options, cores, machine};

const SQL: &str = "SELECT id, label, thumbnail(image, 64) AS thumb FROM images";
const BATCH: usize = 128;
/// Rows per shuffle window: small, so that filling the window at each epoch's start (a wait
/// more servers shorten but never remove) stays a small part of an epoch.
const WINDOW: usize = 256;
/// How much faster than one server the trainer would consume.
const DEMAND: f64 = 1.6;

/// One run of the trainer: rows, seconds, seconds waited after its first batch (and the
/// seconds from before connecting, start-up included).
#[derive(Debug, Clone, Copy)]
struct Run {
    rows: u64,
    elapsed: f64,
    waited: f64,
    total: f64,
}

impl Run {
    fn rate(&self) -> f64 {
        self.rows as f64 / self.elapsed
    }

    fn wait_fraction(&self) -> f64 {
        self.waited / self.elapsed
    }
}

/// Runs the trainer over `urls` for `epochs`, sleeping `step` after each batch.
fn train(urls: &[String], epochs: usize, step: Duration) -> Result<Run> {
    let options = LoaderOptions {
        batch_size: Some(BATCH),
        shuffle_buffer: Some(WINDOW),
        seed: 7,
        epochs,
        ..LoaderOptions::default()
    };
    let begun = Instant::now();
    let mut loader = Loader::new(urls, LoaderSource::Sql(SQL.into()), options)?;
    // Connecting, planning and the first shard are start-up, not a stall: time from the
    // first batch on.
    let first = loader.next().transpose()?.map_or(0, |b| b.rows as u64);
    let start = Instant::now();
    let (mut rows, mut waited) = (first, Duration::ZERO);
    loop {
        std::thread::sleep(step);
        let asked = Instant::now();
        let Some(batch) = loader.next() else { break };
        waited += asked.elapsed();
        rows += batch?.rows as u64;
    }
    Ok(Run {
        rows,
        elapsed: start.elapsed().as_secs_f64(),
        waited: waited.as_secs_f64(),
        total: begun.elapsed().as_secs_f64(),
    })
}

fn server(data: &std::path::Path, cpu: usize, window: u64) -> Result<ServerProcess> {
    ServerProcess::start_with(
        "serve",
        &data.to_string_lossy(),
        "127.0.0.1:0",
        1,
        None,
        Some(&cpu.to_string()),
        &[
            ("PUSHDOWN_CACHE".to_owned(), "off".to_owned()),
            ("PUSHDOWN_SCALING_WINDOW".to_owned(), window.to_string()),
        ],
    )
}

struct Measured {
    /// One server's samples/s, calibrated.
    producible: f64,
    step: Duration,
    epochs: usize,
    one: Run,
    signal: pushdown_protocol::ScalingSignal,
    started: usize,
    many: Run,
    /// The signal the added servers give at the end (should say the stall is gone).
    after: Vec<pushdown_protocol::ScalingSignal>,
}

async fn signals(urls: &[String]) -> Result<Vec<pushdown_protocol::ScalingSignal>> {
    let client = PushdownClient::connect(urls).await?;
    Ok(client.scaling().await?.into_iter().map(|(_, s)| s).collect())
}

async fn measure(data: &std::path::Path, rows: usize, quick: bool) -> Result<Measured> {
    let seconds = if quick { 6.0 } else { 15.0 };
    // The signal's window: the steady part of the one-server run.
    let window = if quick { 4 } else { 10 };
    let first = server(data, crate::far_cpu(0), window)?;
    let one_url = vec![format!("http://{}", first.addr)];
    crate::connect(&one_url[0]).await?;

    // One server's rate, from before connecting to the last row: a single epoch's first
    // batch can come late (the streams in flight share the core), so time it all, over
    // several epochs.
    eprintln!("scale: calibrating one server's rate");
    let urls = one_url.clone();
    let calibration_epochs = if quick { 3 } else { 2 };
    let calibration =
        tokio::task::spawn_blocking(move || train(&urls, calibration_epochs, Duration::ZERO)).await??;
    let producible = calibration.rows as f64 / calibration.total;
    let step = Duration::from_secs_f64(BATCH as f64 / (DEMAND * producible));
    let epochs = ((seconds * DEMAND * producible / rows as f64).ceil() as usize).max(2);

    eprintln!(
        "scale: one server, trainer step {:.1} ms, {epochs} epochs",
        step.as_secs_f64() * 1e3
    );
    let urls = one_url.clone();
    let one = tokio::task::spawn_blocking(move || train(&urls, epochs, step)).await??;
    let signal = signals(&one_url)
        .await?
        .pop()
        .ok_or_else(|| anyhow::anyhow!("no scaling signal"))?;
    drop(first);

    let wanted = signal.servers_wanted as usize;
    let started = wanted.clamp(1, cores());
    eprintln!("scale: the signal asks for {wanted} server(s); starting {started}");
    let servers: Vec<ServerProcess> = (0..started)
        .map(|i| server(data, crate::far_cpu(i), window))
        .collect::<Result<_>>()?;
    let urls: Vec<String> = servers.iter().map(|s| format!("http://{}", s.addr)).collect();
    for u in &urls {
        crate::connect(u).await?;
    }
    let run_urls = urls.clone();
    let many = tokio::task::spawn_blocking(move || train(&run_urls, epochs, step)).await??;
    let after = signals(&urls).await?;
    Ok(Measured {
        producible,
        step,
        epochs,
        one,
        signal,
        started,
        many,
        after,
    })
}

pub async fn suite(options: &Options, data: &Datasets, command: &str) -> Result<String> {
    let rows = data
        .rows
        .iter()
        .find(|(k, ..)| k.name() == "images")
        .map_or(0, |r| r.1);
    let m = measure(&data.root, rows, options.quick).await?;
    let s = &m.signal;
    let removed = 1.0 - m.many.waited / m.one.waited.max(1e-9);
    let mut out = String::new();
    out += "## The scaling signal against measurement\n\n";
    out += &format!(
        "Command: `{command}`  \nMachine: {}. Servers: `harness serve`, 1 CPU thread each, \
         pinned one per core in the far-CPU order (CPU 0, 2, 3, …, the trainer's CPU 1 last, \
         which on 2 cores the second server shares: its consumer sleeps), fragment cache off.  \nData: images, {rows} rows; query `{SQL}` (the \
         thumbnail on the server). Trainer: one `Loader` (batch {BATCH}, shuffle {WINDOW}) whose \
         consumer takes {:.1} ms per batch — {DEMAND}× what one server produced when \
         calibrated ({:.0} samples/s) — for {} epochs; its wait is timed from the first batch \
         on. The loader reports its wait to the servers every second; the signal is read \
         (`scaling` action) at the end of the one-server run.\n\n",
        machine(),
        m.step.as_secs_f64() * 1e3,
        m.producible,
        m.epochs,
    );
    out += "| run | servers | samples/s | trainer wait s | wait share | server busy (signal) | servers wanted (signal) | bottleneck (signal) |\n|---|---:|---:|---:|---:|---:|---:|---|\n";
    out += &format!(
        "| one server | 1 | {:.0} | {:.2} | {:.0}% | {:.0}% | {} | {} |\n",
        m.one.rate(),
        m.one.waited,
        m.one.wait_fraction() * 100.0,
        s.busy_fraction * 100.0,
        s.servers_wanted,
        s.bottleneck
    );
    let busy: Vec<String> = m
        .after
        .iter()
        .map(|a| format!("{:.0}%", a.busy_fraction * 100.0))
        .collect();
    let after_wanted = m.after.iter().map(|a| a.servers_wanted).max().unwrap_or(0);
    let after_bottleneck = m.after.first().map_or("—", |a| a.bottleneck.as_str());
    out += &format!(
        "| the servers the signal asked for | {} | {:.0} | {:.2} | {:.0}% | {} | {after_wanted} | {after_bottleneck} |\n",
        m.started,
        m.many.rate(),
        m.many.waited,
        m.many.wait_fraction() * 100.0,
        busy.join(", "),
    );
    out += &format!(
        "\nThe signal's reasoning (one server): {} (clients' wait share {:.0}%, demand {:.2}×, \
         window {:.0} s).  \n",
        s.reason,
        s.wait_fraction * 100.0,
        s.demand_factor,
        s.window_seconds
    );
    if (m.started as u32) < s.servers_wanted {
        out += &format!(
            "Only {} of the {} servers asked for could have a core of their own on this \
             machine.  \n",
            m.started, s.servers_wanted
        );
    }
    out += &format!(
        "\nTarget: adding the servers the signal asks for removes ≥ 80% of the measured wait: \
         {:.0}% removed — **{}**.\n\n",
        removed * 100.0,
        if removed >= 0.8 { "met" } else { "missed" }
    );
    Ok(out)
}
