//! `harness soak`: two real servers (`pushdown serve`, budgets set by flags) under mixed load
//! for `--minutes`, one of them SIGKILLed and restarted on its ports every `--kill-every`
//! minutes. Load comes in phases (`--phase-secs`), each followed by a quiet pause
//! (`--quiet-secs`); in each phase, at once:
//!
//! * two loaders reading epoch after epoch over both servers, each epoch's ids compared with
//!   the fault-free sequence read before the soak began;
//! * two clients opening streams and cancelling them after 0–3 batches;
//! * malformed requests at a fixed rate (5/s), each with the status it must get;
//! * one burst of 3 × `--max-streams` streams held open on the first server, the excess
//!   waiting then refused with `RESOURCE_EXHAUSTED`;
//! * pyarrow's plain Flight client and ADBC's Flight SQL driver (Python processes), answers
//!   compared with the fault-free ones.
//!
//! Every `--sample-secs` (and at the end of each quiet pause) each server's RSS, peak RSS,
//! open file descriptors, threads, in-flight streams, cache bytes and contained panics are
//! written to `OUT/samples.csv`; `benches/python/plot_soak.py` draws them (`OUT/soak.png`).
//! The run fails when an epoch is not exact, a request gets another status than its own (a
//! killed server's outage excepted), a server panics, descriptors or threads do not come
//! back to the baseline in a quiet pause, or, on runs of 20 minutes or more, the never-killed
//! server's RSS grows more than 5% from minute 10 to the end.

mod clients;
mod servers;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clients::{Judge, Tally};
use pushdown_datasets::{GenOptions, Kind, generate};
use pushdown_task::Task;
use servers::{Probe, Served};

use crate::Options;

/// Descriptors or threads a quiet pause may hold over its life's baseline (a metrics
/// scrape's socket, a blocking thread finishing).
const SLACK: u64 = 2;
/// The RSS growth allowed from minute 10 to the end.
const RSS_GROWTH: f64 = 0.05;

#[derive(Debug, Clone, clap::Args)]
pub struct SoakArgs {
    #[command(flatten)]
    pub options: Options,
    /// Minutes of load (the last phase's quiet pause follows).
    #[arg(long, default_value_t = 60.0)]
    pub minutes: f64,
    /// Minutes between SIGKILLs of the second server (restarted at once on its ports).
    #[arg(long, default_value_t = 10.0)]
    pub kill_every: f64,
    /// Seconds of each load phase.
    #[arg(long, default_value_t = 240)]
    pub phase_secs: u64,
    /// Seconds of the quiet pause after each phase (descriptors and threads must be back to
    /// the baseline by its end).
    #[arg(long, default_value_t = 20)]
    pub quiet_secs: u64,
    /// Seconds between samples.
    #[arg(long, default_value_t = 10)]
    pub sample_secs: u64,
    /// Where samples.csv, the servers' logs and the plot go.
    #[arg(long, default_value = "benches/results/soak")]
    pub out: PathBuf,
}

/// One server at one moment of the run.
#[derive(Debug, Clone)]
struct Sample {
    minute: f64,
    server: usize,
    life: u32,
    /// `load`, `quiet` (the end of a quiet pause: the checked points) or `pause`.
    phase: &'static str,
    probe: Probe,
}

/// The run's shared state: the servers (the second replaced at each restart), the samples,
/// whether a phase is loading, and the judge of failures.
struct Run {
    servers: parking_lot::Mutex<Vec<Served>>,
    samples: parking_lot::Mutex<Vec<Sample>>,
    loading: AtomicBool,
    judge: Arc<Judge>,
    start: Instant,
    data: PathBuf,
    logs: PathBuf,
}

impl Run {
    fn urls(&self) -> Vec<String> {
        self.servers.lock().iter().map(Served::url).collect()
    }

    async fn sample(&self, phase: &'static str) {
        let targets: Vec<(u32, std::net::SocketAddr, u32)> = self
            .servers
            .lock()
            .iter()
            .map(|s| (s.pid(), s.metrics, s.life))
            .collect();
        for (server, (pid, metrics, life)) in targets.into_iter().enumerate() {
            if let Some(probe) = servers::probe(pid, metrics).await {
                let minute = self.start.elapsed().as_secs_f64() / 60.0;
                let sample = Sample {
                    minute,
                    server,
                    life,
                    phase,
                    probe,
                };
                self.samples.lock().push(sample);
            }
        }
    }

    /// SIGKILLs the second server and starts it again on its ports.
    async fn restart(self: &Arc<Self>) -> Result<()> {
        let (ports, life) = {
            let mut servers = self.servers.lock();
            let s = &mut servers[1];
            s.kill();
            ((s.addr.port(), s.metrics.port()), s.life + 1)
        };
        self.judge.down(1);
        let run = Arc::clone(self);
        let mut last = None;
        for _ in 0..20 {
            let run = Arc::clone(&run);
            match tokio::task::spawn_blocking(move || Served::start(1, life, &run.data, &run.logs, ports))
                .await?
            {
                Ok(served) => {
                    let url = served.url();
                    self.servers.lock()[1] = served;
                    crate::connect(&url).await?;
                    self.judge.up(1);
                    return Ok(());
                }
                // The port may still be held by the killed process's sockets for a moment.
                Err(e) => last = Some(e),
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        Err(last
            .unwrap_or_else(|| anyhow::anyhow!("no restart"))
            .context("restarting server 1"))
    }
}

/// Small datasets of the soak's own (images, clicks), generated once.
fn soak_data(options: &Options) -> Result<PathBuf> {
    let sizes = if options.quick {
        [(Kind::Images, 256), (Kind::Clicks, 16_384)]
    } else {
        [(Kind::Images, 2048), (Kind::Clicks, 200_000)]
    };
    let root = options
        .data
        .join(if options.quick { "soak-quick" } else { "soak" });
    for (kind, n) in sizes {
        let dir = root.join(kind.name());
        let stamp = dir.join(format!("_rows_{n}_layout_{}", pushdown_datasets::LAYOUT_VERSION));
        if !stamp.exists() {
            eprintln!("generating {} ({n} rows) in {}", kind.name(), dir.display());
            generate(&GenOptions::new(kind, n), &dir)?;
            std::fs::write(&stamp, n.to_string())?;
        }
    }
    Ok(root)
}

/// What every answer must equal, read before any fault.
struct Reference {
    epochs: Arc<Vec<Vec<i64>>>,
    plain: String,
    adbc: String,
}

async fn reference(urls: &[String]) -> Result<Reference> {
    let epochs = clients::reference_epochs(urls)
        .await
        .context("the fault-free epochs")?;
    let url = urls[0].clone();
    let (plain, adbc) = tokio::task::spawn_blocking(move || {
        anyhow::Ok((
            clients::python_reference("plain", &url, clients::PLAIN_SQL)?,
            clients::python_reference("adbc", &url, clients::ADBC_SQL)?,
        ))
    })
    .await??;
    Ok(Reference {
        epochs: Arc::new(epochs),
        plain,
        adbc,
    })
}

/// One load phase until `until`: every client kind at once; their tallies by kind.
async fn phase(run: &Arc<Run>, reference: &Reference, until: Instant) -> BTreeMap<&'static str, Tally> {
    let urls = run.urls();
    let judge = &run.judge;
    let seconds = until.saturating_duration_since(Instant::now()).as_secs_f64();
    // `PUSHDOWN_SOAK_CLIENTS=loader,cancel,malformed,burst,plain,adbc`: only those (to study one).
    let only = std::env::var("PUSHDOWN_SOAK_CLIENTS").ok();
    let wants = |kind: &str| only.as_deref().is_none_or(|o| o.split(',').any(|k| k == kind));
    let mut tasks: Vec<(&'static str, Task<Tally>)> = Vec::new();
    for k in 0..2u64 {
        if wants("loader") {
            let loader = clients::loader(
                urls.clone(),
                Arc::clone(&reference.epochs),
                until,
                Arc::clone(judge),
            );
            tasks.push(("loader epochs", Task::spawn(loader)));
        }
        if wants("cancel") {
            let canceller = clients::canceller(k + 1, urls.clone(), until, Arc::clone(judge));
            tasks.push(("cancelled streams", Task::spawn(canceller)));
        }
    }
    if wants("malformed") {
        let every = Duration::from_millis(200);
        let malformed = clients::malformed(urls.clone(), every, until, Arc::clone(judge));
        tasks.push(("malformed requests", Task::spawn(malformed)));
    }
    if wants("burst") {
        let (url, judge) = (urls[0].clone(), Arc::clone(judge));
        let burst = async move {
            tokio::time::sleep(Duration::from_secs_f64(seconds / 2.0)).await;
            let hold = Duration::from_secs(servers::QUEUE_TIMEOUT_SECS + 3);
            clients::burst(url, 3 * servers::MAX_STREAMS, hold, judge).await
        };
        tasks.push(("burst past the slots", Task::spawn(burst)));
    }
    let python = [
        (
            "pyarrow plain client",
            "plain",
            clients::PLAIN_SQL,
            reference.plain.clone(),
        ),
        (
            "ADBC Flight SQL",
            "adbc",
            clients::ADBC_SQL,
            reference.adbc.clone(),
        ),
    ];
    for (name, mode, sql, expect) in python.into_iter().filter(|p| wants(p.1)) {
        let client = clients::python_client(mode, urls.clone(), sql, expect, seconds, Arc::clone(judge));
        tasks.push((name, Task::spawn(client)));
    }
    let mut tallies: BTreeMap<&'static str, Tally> = BTreeMap::new();
    for (name, task) in tasks {
        let tally = task.await.unwrap_or_else(|e| Tally {
            unexpected: 1,
            first_unexpected: Some(format!("the client's task: {e}")),
            ..Tally::default()
        });
        tallies.entry(name).or_default().add(&tally);
    }
    tallies
}

/// Starts both servers on free ports.
async fn start_servers(data: &Path, logs: &Path) -> Result<Vec<Served>> {
    let mut servers = Vec::new();
    for index in 0..2 {
        let (data, logs) = (data.to_owned(), logs.to_owned());
        servers
            .push(tokio::task::spawn_blocking(move || Served::start(index, 0, &data, &logs, (0, 0))).await??);
    }
    for s in &servers {
        crate::connect(&s.url()).await?;
    }
    Ok(servers)
}

/// The whole run: servers, reference, sampler and killer, phases and pauses; the samples and
/// the tallies.
/// What a run leaves: its samples, each client kind's tally, the second server's restarts,
/// and the rows of a loader's epoch.
struct Outcome {
    samples: Vec<Sample>,
    tallies: BTreeMap<&'static str, Tally>,
    restarts: u32,
    epoch_rows: usize,
}

async fn soak(args: &SoakArgs) -> Result<Outcome> {
    let data = soak_data(&args.options)?;
    let logs = args.out.join("logs");
    std::fs::create_dir_all(&logs)?;
    let servers = start_servers(&data, &logs).await?;
    let run = Arc::new(Run {
        servers: parking_lot::Mutex::new(servers),
        samples: parking_lot::Mutex::new(Vec::new()),
        loading: AtomicBool::new(false),
        judge: Arc::new(Judge::default()),
        start: Instant::now(),
        data,
        logs,
    });
    let reference = reference(&run.urls()).await?;
    let quiet = Duration::from_secs(args.quiet_secs);
    tokio::time::sleep(quiet).await;
    run.sample("quiet").await;
    let (sampler, killer) = (
        background_sampler(&run, args.sample_secs),
        background_killer(&run, args.kill_every),
    );
    let end = Instant::now() + Duration::from_secs_f64(args.minutes * 60.0);
    let mut tallies: BTreeMap<&'static str, Tally> = BTreeMap::new();
    let mut phases = 0;
    while Instant::now() < end {
        let until = end.min(Instant::now() + Duration::from_secs(args.phase_secs));
        run.loading.store(true, Ordering::Relaxed);
        for (name, tally) in phase(&run, &reference, until).await {
            tallies.entry(name).or_default().add(&tally);
        }
        run.loading.store(false, Ordering::Relaxed);
        phases += 1;
        eprintln!(
            "  phase {phases} done at minute {:.1}",
            run.start.elapsed().as_secs_f64() / 60.0
        );
        tokio::time::sleep(quiet).await;
        run.sample("quiet").await;
    }
    // Dropped, both stop.
    drop((sampler, killer));
    let samples = run.samples.lock().clone();
    let restarts = run.servers.lock()[1].life;
    Ok(Outcome {
        samples,
        tallies,
        restarts,
        epoch_rows: reference.epochs[0].len(),
    })
}

fn background_sampler(run: &Arc<Run>, every: u64) -> Task<()> {
    let run = Arc::clone(run);
    Task::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(every.max(1))).await;
            let phase = if run.loading.load(Ordering::Relaxed) {
                "load"
            } else {
                "pause"
            };
            run.sample(phase).await;
        }
    })
}

fn background_killer(run: &Arc<Run>, minutes: f64) -> Task<()> {
    let run = Arc::clone(run);
    Task::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs_f64((minutes * 60.0).max(1.0))).await;
            eprintln!(
                "  SIGKILL server 1 at minute {:.1}",
                run.start.elapsed().as_secs_f64() / 60.0
            );
            if let Err(e) = run.restart().await {
                eprintln!("  {e:#}");
                return;
            }
        }
    })
}

fn write_samples(path: &Path, samples: &[Sample]) -> Result<()> {
    let mut csv = String::from(
        "minute,server,life,phase,rss_bytes,peak_rss_bytes,fds,threads,streams,cache_bytes,panics\n",
    );
    for s in samples {
        let p = &s.probe;
        csv.push_str(&format!(
            "{:.3},{},{},{},{},{},{},{},{},{},{}\n",
            s.minute,
            s.server,
            s.life,
            s.phase,
            p.rss,
            p.peak_rss,
            p.fds,
            p.threads,
            p.streams,
            p.cache_bytes,
            p.panics
        ));
    }
    std::fs::write(path, csv).with_context(|| format!("writing {}", path.display()))
}

/// Lines of the servers' logs that report a panic.
fn panics_logged(logs: &Path) -> Result<Vec<String>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(logs)? {
        let path = entry?.path();
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        found.extend(
            text.lines()
                .filter(|l| l.contains("panicked"))
                .map(|l| format!("{name}: {l}")),
        );
    }
    Ok(found)
}

pub async fn suite(args: &SoakArgs, command: &str) -> Result<String> {
    let Outcome {
        samples,
        tallies,
        restarts,
        epoch_rows,
    } = soak(args).await?;
    let csv = args.out.join("samples.csv");
    write_samples(&csv, &samples)?;
    let plot = args.out.join("soak.png");
    let plotted = std::process::Command::new(clients::python()?)
        .args([
            "benches/python/plot_soak.py",
            &csv.to_string_lossy(),
            &plot.to_string_lossy(),
        ])
        // Without matplotlib (CI's environment) the report says there is no plot.
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    let panics = panics_logged(&args.out.join("logs"))?;
    let report = report::Report {
        args,
        command,
        samples: &samples,
        tallies: &tallies,
        restarts,
        epoch_rows,
        panics: &panics,
        plot: plotted.then_some(plot.as_path()),
    };
    let (body, failures) = report.render();
    println!("{body}");
    crate::write_section(&args.options.results, "soak", &body)?;
    if !failures.is_empty() {
        bail!("the soak failed: {}", failures.join("; "));
    }
    Ok(body)
}

mod report;
