//! One server core shared by several trainers, the normal deployment: a `harness serve`
//! process with one thread, and `PUSHDOWN_TRAINERS` (default 3) `pushdown run` processes
//! started together, each on a core of its own, pinned in the far-CPU order (`far_cpu`: a
//! physical core each, the harness's own CPU 1 last, wrapping when the machine has fewer),
//! over a 1 Gbit/s link. Each trainer plans alone, so a static plan assumes the server's
//! core is its own.
//!
//! Cells: the static plan each trainer made alone (`--placement costed`), adaptive placement,
//! and every static placement a user could have picked with hindsight (all on the server,
//! all on the trainers, 25/50/75% splits). Total rows/s is every trainer's rows over the time
//! until the last one finished.

use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::link::Link;
use crate::process::ServerProcess;
use crate::quota::CpuQuota;
use crate::{Datasets, Options, env_or, machine};

const RATE: u64 = 1_000_000_000;

struct Cell {
    label: String,
    placement: &'static str,
    rows_per_s: f64,
    rows: u64,
    trainer_rows: u64,
    server_cpu: f64,
    secs: f64,
}

/// What one `pushdown run` printed: rows delivered, and rows whose fragment ops it ran
/// itself (`None`: no op was pushed, so it ran them all).
fn parse_report(text: &str) -> Result<(u64, Option<u64>)> {
    let number_after = |line: &str, word: &str| -> Option<u64> {
        let rest = &line[line.find(word)? + word.len()..];
        rest.split_whitespace().next()?.parse().ok()
    };
    let rows = text
        .lines()
        .find_map(|l| number_after(l, "delivered "))
        .with_context(|| format!("no `delivered` line in {text:?}"))?;
    let own = text.lines().find_map(|l| number_after(l, "on this client for "));
    Ok((rows, own))
}

/// How the participants get "a core each": pinned to cores of their own, or (a machine with
/// fewer cores than participants) each held to the same share of a core by a CFS quota.
enum Shape {
    Pinned {
        cpus: Vec<String>,
    },
    Quota {
        server: CpuQuota,
        trainers: Vec<CpuQuota>,
    },
    /// Neither: trainers pinned to shared cores (not the target shape).
    Degenerate {
        cpus: Vec<String>,
    },
}

impl Shape {
    fn new(trainers: usize) -> Self {
        let cores = crate::cores();
        // The server on the first far CPU, trainer k on the (k+1)-th: the harness's own core
        // (its pacing proxy) goes to a trainer only where the machine has no other.
        let spare = cores.saturating_sub(1).max(1);
        let cpus: Vec<String> = (0..trainers)
            .map(|k| crate::far_cpu(1 + k % spare).to_string())
            .collect();
        if cores > trainers {
            return Shape::Pinned { cpus };
        }
        // Every participant the same share, 10% of the machine left to the harness, the link
        // and the kernel.
        let share = (0.9 * cores as f64 / (trainers + 1) as f64).min(1.0);
        let quotas = CpuQuota::new("server", share).and_then(|server| {
            let trainers = (0..trainers)
                .map(|k| CpuQuota::new(&format!("trainer{k}"), share))
                .collect::<Result<Vec<_>>>()?;
            Ok(Shape::Quota { server, trainers })
        });
        match quotas {
            Ok(shape) => shape,
            Err(e) => {
                eprintln!("  no CPU quota ({e:#}): trainers share cores");
                Shape::Degenerate { cpus }
            }
        }
    }

    fn describe(&self) -> String {
        match self {
            Shape::Pinned { cpus } => format!(
                "the server pinned to CPU {} with one thread; trainers (`pushdown run` processes, started together) on CPUs {}{}",
                crate::far_cpu(0),
                cpus.join(", "),
                if cpus.contains(&crate::HARNESS_CPU.to_string()) {
                    format!(
                        " (CPU {} shared with the harness and its pacing proxy: the machine has no core to spare)",
                        crate::HARNESS_CPU
                    )
                } else {
                    String::new()
                }
            ),
            Shape::Quota { server, trainers } => format!(
                "**a simulated shape**: the server (one thread) and each of the {} trainers (`pushdown run` processes, started together) held to {:.2} of a core by a CFS quota of its own (cgroup cpu controller, 10 ms periods), unpinned: one server core shared by trainers with a core each, at {:.2}× the speed",
                trainers.len(),
                server.cores,
                server.cores
            ),
            Shape::Degenerate { cpus } => format!(
                "the server pinned to CPU {} with one thread; trainers on CPUs {} (shared: not the target shape)",
                crate::far_cpu(0),
                cpus.join(", ")
            ),
        }
    }

    /// The command line of trainer `k`.
    fn trainer(&self, k: usize, argv: Vec<String>) -> Vec<String> {
        match self {
            Shape::Pinned { cpus } | Shape::Degenerate { cpus } => {
                let mut out = vec!["taskset".to_owned(), "-c".to_owned(), cpus[k].clone()];
                out.extend(argv);
                out
            }
            Shape::Quota { trainers, .. } => trainers[k].wrap(&argv),
        }
    }

    fn shaped(&self) -> bool {
        !matches!(self, Shape::Degenerate { .. })
    }
}

pub async fn suite(options: &Options, data: &Datasets, command: &str) -> Result<String> {
    let trainers = env_or("PUSHDOWN_TRAINERS", 3).max(1);
    let epochs = env_or("PUSHDOWN_EPOCHS", 4).max(1);
    let shard_rows = env_or("PUSHDOWN_SHARD_ROWS", 512);
    let deadline = Duration::from_secs(env_or("PUSHDOWN_CELL_SECONDS", 180) as u64);
    let shape = Shape::new(trainers);
    let link = crate::make_link(RATE, options).await?;
    let server_cpu = crate::far_cpu(0).to_string();
    let mut argv = ServerProcess::argv(
        "serve",
        &data.root.to_string_lossy(),
        link.server_listen(),
        1,
        link.namespace(),
        (!matches!(shape, Shape::Quota { .. })).then_some(server_cpu.as_str()),
    )?;
    if let Shape::Quota { server, .. } = &shape {
        argv = server.wrap(&argv);
    }
    let server = ServerProcess::start_argv(
        &argv,
        &[("PUSHDOWN_SHARD_ROWS".to_owned(), shard_rows.to_string())],
    )?;
    let link = match link.kind {
        crate::link::Kind::Proxy => Link::proxy(RATE, server.addr).await?,
        _ => link,
    };
    let url = link.client_url(server.addr);
    let (_, pipeline) = crate::placement::pipelines()
        .into_iter()
        .find(|(n, _)| *n == "images")
        .context("the images pipeline")?;
    let file = data.root.join("shared-images.toml");
    std::fs::write(&file, pipeline.to_toml()).with_context(|| format!("writing {}", file.display()))?;
    let exe = std::env::current_exe()?
        .parent()
        .context("the harness's folder")?
        .join("pushdown");
    if !exe.exists() {
        bail!(
            "{} is missing: build it with `cargo build --release -p pushdown-cli`",
            exe.display()
        );
    }
    let logs = data.root.join("shared-logs");
    std::fs::create_dir_all(&logs)?;
    let specs: [(&str, &'static str); 7] = [
        ("static plan each trainer made alone", "costed"),
        ("adaptive", "adaptive"),
        ("static: all on the server", "server"),
        ("static: all on the trainers", "trainer"),
        ("static: 25% of shards on the server", "split:0.25"),
        ("static: 50% on the server", "split:0.5"),
        ("static: 75% on the server", "split:0.75"),
    ];
    // `PUSHDOWN_PLACEMENTS=adaptive,trainer`: only those cells (an A/B of one change).
    let only: Option<Vec<String>> = std::env::var("PUSHDOWN_PLACEMENTS")
        .ok()
        .map(|list| list.split(',').map(|p| p.trim().to_owned()).collect());
    let specs = specs
        .into_iter()
        .filter(|(_, placement)| only.as_ref().is_none_or(|o| o.iter().any(|p| p == placement)));
    let run = Run {
        shape: &shape,
        exe: &exe,
        file: &file,
        url: &url,
        epochs,
        trainers,
        deadline,
        logs: &logs,
    };
    eprintln!("  {}", header().replace('\n', "\n  "));
    let mut cells = Vec::new();
    for (label, placement) in specs {
        let mut best: Option<Cell> = None;
        for rep in 0..options.reps_resolved {
            let server0 = server.cpu_seconds();
            let cell = run.cell(label, placement, rep).await?;
            let cell = Cell {
                server_cpu: server.cpu_seconds() - server0,
                ..cell
            };
            if best.as_ref().is_none_or(|b| cell.rows_per_s > b.rows_per_s) {
                best = Some(cell);
            }
        }
        let cell = best.context("no repetitions")?;
        eprintln!("  {}", row(&cell));
        cells.push(cell);
    }
    drop(server);
    Ok(report(
        command, &link, trainers, &shape, epochs, shard_rows, options, &cells,
    ))
}

/// A trainer process, killed if still running when dropped (a cell past its deadline).
struct Trainer(Option<std::process::Child>);

impl Drop for Trainer {
    fn drop(&mut self) {
        if let Some(child) = self.0.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// What every cell's trainers share.
struct Run<'a> {
    shape: &'a Shape,
    exe: &'a std::path::Path,
    file: &'a std::path::Path,
    url: &'a str,
    epochs: usize,
    trainers: usize,
    deadline: Duration,
    logs: &'a std::path::Path,
}

impl Run<'_> {
    /// Starts every trainer together and waits for them all; past the deadline the suite
    /// fails naming the cell (the trainers are killed).
    async fn cell(&self, label: &str, placement: &'static str, rep: usize) -> Result<Cell> {
        let start = Instant::now();
        let mut children = Vec::new();
        for k in 0..self.trainers {
            let argv: Vec<String> = [
                self.exe.to_string_lossy().as_ref(),
                "run",
                &self.file.to_string_lossy(),
                "--server",
                self.url,
                "--bandwidth",
                "1Gbit",
                "--concurrency",
                "16",
                "--epochs",
                &self.epochs.to_string(),
                "--seed",
                &k.to_string(),
                "--placement",
                placement,
            ]
            .map(str::to_owned)
            .into();
            let argv = self.shape.trainer(k, argv);
            let log = self
                .logs
                .join(format!("{}-{rep}-trainer{k}.log", placement.replace(':', "-")));
            let child = std::process::Command::new(&argv[0])
                .args(&argv[1..])
                .env("RUST_LOG", "warn,pushdown_client::completion=debug")
                .stdout(Stdio::piped())
                .stderr(std::fs::File::create(&log)?)
                .spawn()
                .context("starting a trainer")?;
            children.push(Trainer(Some(child)));
        }
        let (mut rows, mut own) = (0, 0);
        for mut trainer in children {
            let out = loop {
                if start.elapsed() > self.deadline {
                    bail!(
                        "the `{placement}` cell ({label}) did not finish in {:?} (PUSHDOWN_CELL_SECONDS); trainer logs in {}",
                        self.deadline,
                        self.logs.display()
                    );
                }
                if trainer.0.as_mut().context("a trainer")?.try_wait()?.is_some() {
                    break trainer.0.take().context("a trainer")?.wait_with_output()?;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            };
            if !out.status.success() {
                bail!(
                    "a trainer ({placement}) failed; its log is in {}",
                    self.logs.display()
                );
            }
            let (r, o) = parse_report(&String::from_utf8_lossy(&out.stdout))?;
            rows += r;
            own += o.unwrap_or(r);
        }
        let secs = start.elapsed().as_secs_f64();
        Ok(Cell {
            label: label.to_owned(),
            placement,
            rows_per_s: rows as f64 / secs,
            rows,
            trainer_rows: own,
            server_cpu: 0.0,
            secs,
        })
    }
}

fn header() -> &'static str {
    "| placement | `--placement` | total rows/s | rows | decoded on the trainers | server CPU s | seconds |\n\
     |---|---|---:|---:|---:|---:|---:|"
}

fn row(c: &Cell) -> String {
    format!(
        "| {} | `{}` | {:.0} | {} | {:.0}% | {:.2} | {:.2} |",
        c.label,
        c.placement,
        c.rows_per_s,
        c.rows,
        100.0 * c.trainer_rows as f64 / c.rows.max(1) as f64,
        c.server_cpu,
        c.secs
    )
}

#[expect(
    clippy::too_many_arguments,
    reason = "the run's shape, printed with its cells"
)]
fn report(
    command: &str,
    link: &Link,
    trainers: usize,
    shape: &Shape,
    epochs: usize,
    shard_rows: usize,
    options: &Options,
    cells: &[Cell],
) -> String {
    let mut out = format!(
        "## One server core shared by {trainers} trainers\n\n\
         Command: `{command}`  \nMachine: {}; {}; link {}.  \n\
         Pipeline: images (`label < 500`, decode_resize 64×64, random crop and flip, batches of 256); {epochs} epochs per trainer, seeds 0..{trainers}; shards of {shard_rows} rows; 16 streams in flight each. Total rows/s: every trainer's rows over the time until the last finished; the best of {} run(s).\n\n",
        machine(),
        shape.describe(),
        link.describe(),
        options.reps_resolved,
    );
    let shaped = shape.shaped();
    if !shaped {
        out.push_str(&format!(
            "**Not the target shape:** this machine has {} core(s), so the {trainers} trainers share CPUs (each has less than a core). The targets below need at least {} cores.\n\n",
            crate::cores(),
            trainers + 1
        ));
    }
    if let Shape::Quota { server, .. } = shape {
        out.push_str(&format!(
            "**Simulated shape:** this machine has {} core(s); the issue's shape (a core per participant) is kept by CPU quotas of {:.2} of a core each. Latency differs from real cores (a throttled process may wait up to 10 ms for its share); confirm on a machine with ≥ {} cores.\n\n",
            crate::cores(),
            server.cores,
            trainers + 1
        ));
    }
    out.push_str(header());
    out.push('\n');
    for c in cells {
        out.push_str(&row(c));
        out.push('\n');
    }
    let rate = |p: &str| cells.iter().find(|c| c.placement == p).map(|c| c.rows_per_s);
    let hindsight = cells
        .iter()
        .filter(|c| c.placement != "costed" && c.placement != "adaptive")
        .max_by(|a, b| a.rows_per_s.total_cmp(&b.rows_per_s));
    let verdict = |ok: bool| {
        if !shaped {
            "not measurable here"
        } else if ok {
            "met"
        } else {
            "missed"
        }
    };
    // A run of some cells (`PUSHDOWN_PLACEMENTS`) judges only what it measured.
    let Some(adaptive) = rate("adaptive") else {
        return out;
    };
    out.push('\n');
    if let Some(alone) = rate("costed") {
        out.push_str(&format!(
            "* Adaptive: {adaptive:.0} rows/s = **{:.2}×** the static plan each trainer made alone ({alone:.0}); target ≥ 1.3×: **{}**.\n",
            adaptive / alone.max(1e-9),
            verdict(adaptive >= 1.3 * alone),
        ));
    }
    if let Some(best) = hindsight {
        out.push_str(&format!(
            "* Adaptive against the best static placement chosen with hindsight ({}: {:.0}): **{:.2}×**; target ≥ 0.95×: **{}**.\n",
            best.label,
            best.rows_per_s,
            adaptive / best.rows_per_s.max(1e-9),
            verdict(adaptive >= 0.95 * best.rows_per_s),
        ));
    }
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_run_report_gives_rows_and_the_trainers_share() {
        let text = "delivered 6102 rows in 24 batches from 4 shard streams in 1.33s (4600 rows/s)\n\
                    fragment ops ran on the server for 3066 rows, on this client for 3036 rows (6 shard streams left un-reduced; 1.57 s of this client's CPU)\n";
        assert_eq!(super::parse_report(text).unwrap(), (6102, Some(3036)));
        assert_eq!(
            super::parse_report("delivered 5 rows in 1 batches").unwrap(),
            (5, None)
        );
        assert!(super::parse_report("nothing").is_err());
    }
}
