//! The loader as a noisy neighbour: the feed's trainer, whose step is CPU work on the
//! training thread (what launching an accelerator's kernels is), with the loader's threads
//! free to run anywhere the process may or confined (`LoaderOptions::cpu_affinity`) to CPUs
//! other than the training thread's.
//!
//! * The server: `harness serve` on the first half of the CPUs (one thread per CPU).
//! * The training thread: pinned to the last CPU. Each step is the same fixed work, sized to
//!   take [`STEP_MS`] on an idle CPU; steps run back to back, so the loader is busy the
//!   whole run (the most a neighbour can disturb).
//! * Cells: the training thread alone (batches already made: the baseline step), the loader
//!   unconfined (its threads on every CPU, the training thread's included), and confined to
//!   the others (on 2 cores that is the server's CPU; on more, the trainer's other CPUs).
//! * Reported: the step's median, 90th and 99th percentile wall time, the median against the
//!   baseline, samples/s delivered and the share of time the training thread waited for a
//!   batch.

use std::hint::black_box;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use pushdown_client::affinity::confine_current_thread;
use pushdown_client::{Loader, LoaderOptions, LoaderSource};

use crate::process::{ServerProcess, pin_self};
use crate::{Datasets, Options, machine};

/// The training step's length on an idle CPU.
const STEP_MS: f64 = 5.0;

/// One run: each step's wall time, samples, wall time, and time spent waiting for batches.
struct Cell {
    name: String,
    steps: Vec<f64>,
    rows: u64,
    elapsed: f64,
    waited: f64,
}

impl Cell {
    fn quantile(&self, q: f64) -> f64 {
        let mut s = self.steps.clone();
        s.sort_by(f64::total_cmp);
        s[((s.len() - 1) as f64 * q).round() as usize]
    }
}

/// Fixed CPU work: `n` rounds of an integer hash the compiler cannot drop.
fn work(n: u64) -> u64 {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for i in 0..n {
        x = black_box(x.rotate_left(5) ^ i).wrapping_mul(0x100_0000_01b3);
    }
    x
}

/// Rounds of [`work`] that take `STEP_MS` on this (idle) thread: the median of 15 tries.
fn calibrate() -> u64 {
    let n = 1_000_000u64;
    let mut per_round: Vec<f64> = (0..15)
        .map(|_| {
            let t = Instant::now();
            black_box(work(n));
            t.elapsed().as_secs_f64() / n as f64
        })
        .collect();
    per_round.sort_by(f64::total_cmp);
    (STEP_MS / 1000.0 / per_round[7]).round() as u64
}

pub async fn suite(options: &Options, data: &Datasets, command: &str) -> Result<String> {
    let cpus = crate::cpus::online_cpus();
    anyhow::ensure!(cpus.len() >= 2, "the neighbour suite needs 2 CPUs or more");
    // The process may run anywhere again (the harness pinned itself to one CPU); the training
    // thread pins itself.
    let all = cpus.iter().map(usize::to_string).collect::<Vec<_>>().join(",");
    pin_self(&all);
    let half = (cpus.len() / 2).max(1);
    let (server_cpus, trainer_cpus) = cpus.split_at(half);
    let training = *trainer_cpus.last().context("no trainer CPU")?;
    let mut confined: Vec<usize> = trainer_cpus.iter().copied().filter(|&c| c != training).collect();
    let shared_with_server = confined.is_empty();
    if shared_with_server {
        confined = server_cpus.to_vec();
    }
    let list = |c: &[usize]| c.iter().map(usize::to_string).collect::<Vec<_>>().join(",");
    let server = ServerProcess::start(&data.root, "127.0.0.1:0", half, None, Some(&list(server_cpus)))?;
    let url = format!("http://{}", server.addr);

    let rounds = tokio::task::spawn_blocking(move || -> Result<u64> {
        confine_current_thread(&[training])?;
        Ok(calibrate())
    })
    .await??;
    eprintln!("neighbour: training thread on CPU {training}, {rounds} rounds of work per {STEP_MS} ms step");
    let mut cells = Vec::new();
    for rep in 0..options.reps_resolved {
        let alone = run(&url, training, rounds, None, true).await?;
        let free = run(&url, training, rounds, None, false).await?;
        let kept = run(&url, training, rounds, Some(confined.clone()), false).await?;
        for (name, cell) in [
            ("the training thread alone (batches made beforehand)", alone),
            ("pushdown.Loader, threads unconfined (default)", free),
            (
                if shared_with_server {
                    "pushdown.Loader, cpu_affinity = the other CPU (the server's)"
                } else {
                    "pushdown.Loader, cpu_affinity = the trainer's other CPUs"
                },
                kept,
            ),
        ] {
            eprintln!(
                "neighbour rep {rep}: {name}: step median {:.2} ms, p99 {:.2} ms, {:.0} samples/s",
                cell.quantile(0.5) * 1e3,
                cell.quantile(0.99) * 1e3,
                cell.rows as f64 / cell.elapsed
            );
            cells.push(Cell {
                name: name.to_owned(),
                ..cell
            });
        }
    }
    Ok(report(&cells, command, server_cpus, training, &confined, options))
}

/// The feed's pipeline for two epochs, the training thread stepping `rounds` of work per
/// batch; `prefetched`: the batches are all read first and the steps timed alone.
async fn run(
    url: &str,
    training: usize,
    rounds: u64,
    cpus: Option<Vec<usize>>,
    prefetched: bool,
) -> Result<Cell> {
    let options = LoaderOptions {
        seed: 1,
        epochs: 2,
        cpu_affinity: cpus,
        ..LoaderOptions::default()
    };
    let url = url.to_owned();
    tokio::task::spawn_blocking(move || -> Result<Cell> {
        confine_current_thread(&[training])?;
        let open = || {
            Loader::new(
                std::slice::from_ref(&url),
                LoaderSource::Pipeline(crate::feed::pipeline()),
                options.clone(),
            )
        };
        let (mut steps, mut rows, mut waited) = (Vec::new(), 0u64, 0.0);
        let mut step = |n: u64| {
            let t = Instant::now();
            black_box(work(rounds));
            steps.push(t.elapsed().as_secs_f64());
            rows += n;
        };
        let start;
        if prefetched {
            let batches = open()?
                .map(|b| b.map(|b| b.rows as u64))
                .collect::<Result<Vec<_>, _>>()?;
            // The loader's threads are gone: the steps run alone.
            std::thread::sleep(Duration::from_millis(500));
            start = Instant::now();
            batches.into_iter().for_each(&mut step);
        } else {
            let mut loader = open()?;
            start = Instant::now();
            let mut asked = Instant::now();
            for batch in &mut loader {
                waited += asked.elapsed().as_secs_f64();
                step(batch?.rows as u64);
                asked = Instant::now();
            }
        }
        Ok(Cell {
            name: String::new(),
            steps,
            rows,
            elapsed: start.elapsed().as_secs_f64(),
            waited,
        })
    })
    .await?
}

fn report(
    cells: &[Cell],
    command: &str,
    server_cpus: &[usize],
    training: usize,
    confined: &[usize],
    options: &Options,
) -> String {
    let baseline = cells.first().map_or(1.0, |c| c.quantile(0.5));
    let mut table = String::from(
        "| run | training step, median (ms) | p90 (ms) | p99 (ms) | median vs alone | samples/s | training thread waits |\n\
         |---|---:|---:|---:|---:|---:|---:|\n",
    );
    for c in cells {
        table += &format!(
            "| {} | {:.2} | {:.2} | {:.2} | {:.2}× | {:.0} | {:.1}% |\n",
            c.name,
            c.quantile(0.5) * 1e3,
            c.quantile(0.9) * 1e3,
            c.quantile(0.99) * 1e3,
            c.quantile(0.5) / baseline,
            c.rows as f64 / c.elapsed.max(1e-9),
            c.waited / c.elapsed.max(1e-9) * 100.0,
        );
    }
    format!(
        "## The loader as a noisy neighbour: the training thread's step, loader confined or not\n\n\
         Command: `{command}`  \nMachine: {}; server `harness serve` on CPU(s) {server_cpus:?}; the training \
         thread pinned to CPU {training}; `cpu_affinity` = {confined:?}.  \nPipeline: the feed's \
         (`decode_resize(image,128,128) → select → random_flip → shuffle 4096 → batch 256`), two epochs, \
         default options. Each training step is the same CPU work, {STEP_MS} ms on an idle CPU, run back \
         to back. {} run(s) of each, in turn.\n\n{table}\n",
        machine(),
        options.reps_resolved,
    )
}
