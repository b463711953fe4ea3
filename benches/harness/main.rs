//! The benchmark harness: real servers over real, bandwidth-limited links.
//!
//! ```text
//! cargo run --release -p pushdown-benches --bin harness -- [--quick] placement
//! ```
//!
//! Datasets are generated once into `--data` (default `target/bench-data`, reused when
//! present). Links are veth pairs into a network namespace shaped with `tc tbf` (root and
//! iproute2), falling back to a pacing TCP proxy on loopback. Each suite prints its table
//! and replaces its own section of `benches/RESULTS.md`.

mod audio;
mod cache;
mod ceiling;
mod compare;
mod cpus;
mod feed;
mod finished;
mod fleet;
mod import;
mod link;
mod load;
mod neighbour;
mod order;
mod placement;
mod process;
mod quota;
mod s3;
mod scale;
mod scan;
mod shared;
mod soak;
mod split;
mod text;
mod video;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use pushdown_client::PushdownClient;
use pushdown_datasets::{GenOptions, Kind, generate};

pub use cpus::{HARNESS_CPU, cores, far_cpu};

/// The same allocator as the `pushdown` binary: the in-process contenders run the same engine.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, Parser)]
#[command(about = "pushdown benchmarks over bandwidth-limited links")]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Every legal placement of three pipelines over fixed-bandwidth links, against the
    /// planner's choice.
    Placement {
        #[command(flatten)]
        options: Options,
    },
    /// Pushdown against no pushdown (Parquet from S3: our engine and pyarrow.dataset), finished
    /// batches (tf.data service's design) and local files, on images, clicks, text and TPC-H
    /// lineitem, over loopback, 1 and 10 Gbit/s links (and 100 Mbit/s, supplementary).
    Compare {
        #[command(flatten)]
        options: Options,
    },
    /// The server's scan against DuckDB's over the same files: one thread each on every
    /// workload, and pyarrow's plain Flight client reading endpoints in order (2 threads).
    Scan {
        #[command(flatten)]
        options: Options,
    },
    /// Samples/s with 1, 2 and 4 servers (CPU-bound and link-bound), what a killed or
    /// stalled server costs a running epoch, and one server core shared by 1–8 trainers
    /// (`PUSHDOWN_FLEET=cpu,link,recovery,sharing`: only those parts).
    Fleet {
        #[command(flatten)]
        options: Options,
    },
    /// 64 concurrent clients for a bounded time against one server with tokens and caps:
    /// failed requests, refusals and the server's peak memory against its pool.
    Load {
        #[command(flatten)]
        options: Options,
    },
    /// 4 concurrent trials of the images pipeline against one server, the fragment cache off
    /// and on: server CPU seconds and samples/s per trial.
    Cache {
        #[command(flatten)]
        options: Options,
    },
    /// The scaling signal against measurement: a trainer that waits on one server, the
    /// servers the signal asks for, and the wait they remove.
    Scale {
        #[command(flatten)]
        options: Options,
    },
    /// The images pipeline over 1 Gbit/s with one server core and one trainer core: the op
    /// on the server, on the trainer, split between them (the planner's choice, forced,
    /// adaptive), with the planner's predictions.
    Split {
        #[command(flatten)]
        options: Options,
    },
    /// One server core shared by `PUSHDOWN_TRAINERS` (default 3) trainer processes, each on
    /// a core of its own: the static plan each made alone, adaptive placement, and every
    /// static placement chosen with hindsight (`PUSHDOWN_PLACEMENTS=adaptive,trainer`: only
    /// those cells; `PUSHDOWN_EPOCHS`, default 4).
    Shared {
        #[command(flatten)]
        options: Options,
    },
    /// A trainer that "trains" for a fixed step per batch, fed by pushdown's default options
    /// and by a DataLoader-style contender decoding on the trainer's cores: samples/s, the
    /// consumer's wait, CPU per 1,000 samples on each side, the bottleneck named.
    Feed {
        #[command(flatten)]
        options: Options,
    },
    /// The loader's own ceiling: the feed pipeline's loader on 1 and then 2 cores
    /// (`cpu_affinity`) against a server whose fragment cache is warm (supply almost free):
    /// samples/s, CPU per 1,000 samples, each loader thread's share of a core.
    Ceiling {
        #[command(flatten)]
        options: Options,
    },
    /// `pushdown import` against a pyarrow script doing the same (an image folder, JSONL):
    /// rows/s on the same files and CPU.
    Import {
        #[command(flatten)]
        options: Options,
    },
    /// The feed's trainer with CPU work as its step, the loader's threads unconfined or
    /// confined (`cpu_affinity`) away from the training thread: the step's wall time.
    Neighbour {
        #[command(flatten)]
        options: Options,
    },
    /// The global order against the per-rank order (partitions = world size): W = 1, 4 and 8
    /// ranks against one server, rows/s, server CPU per 1,000 rows, bytes read per epoch.
    Order {
        #[command(flatten)]
        options: Options,
    },
    /// Token streams for language models: packed blocks by pushdown against `tokenizers` and
    /// greedy packing in DataLoader-style workers (tokens/s, trainer CPU per million tokens),
    /// padding shares, a W = 8 straggler simulation, bytes per token.
    Text {
        #[command(flatten)]
        options: Options,
    },
    /// Speech: Whisper's log-mel features computed next to the data (decode, 16 kHz, 80
    /// bins) against soundfile + soxr + `WhisperFeatureExtractor` in DataLoader-style
    /// workers (clips/s, trainer CPU per 1,000 clips, bytes per clip).
    Audio {
        #[command(flatten)]
        options: Options,
    },
    /// Video: 16 frames at 224×224 decoded next to the data from 720p H.264 clips
    /// (`decode_frames`) against PyAV + PIL in DataLoader-style workers (clips/s, trainer CPU
    /// per 1,000 clips, bytes per clip, the server's peak RSS). Needs a build with
    /// `--features pushdown-ops/video`.
    Video {
        #[command(flatten)]
        options: Options,
    },
    /// Two `pushdown serve` processes under mixed load for `--minutes` (loaders, cancelled
    /// streams, malformed requests, bursts past the slots, pyarrow and ADBC), one SIGKILLed
    /// and restarted every `--kill-every` minutes: RSS, descriptors and threads sampled,
    /// every answer checked.
    Soak(soak::SoakArgs),
    /// Internal: the capped, token-guarded server of `load`.
    #[command(hide = true)]
    LoadServe(FarArgs),
    /// Internal: a server for a benchmark (started by the harness, possibly in a namespace).
    #[command(hide = true)]
    Serve(FarArgs),
    /// Internal: a worker that runs whole pipelines and streams finished batches (the
    /// tf.data-service-style contender).
    #[command(hide = true)]
    Finished(FarArgs),
}

/// A far-side process of a benchmark: its data root, address and CPU threads.
#[derive(Debug, clap::Args)]
pub struct FarArgs {
    #[arg(long)]
    data: PathBuf,
    #[arg(long)]
    listen: std::net::SocketAddr,
    #[arg(long, default_value_t = 1)]
    threads: usize,
}

#[derive(Debug, Clone, clap::Args)]
pub struct Options {
    /// Small datasets and one repetition: minutes, for checking the harness.
    #[arg(long)]
    pub quick: bool,
    /// Where datasets are generated (reused when present).
    #[arg(long, default_value = "target/bench-data")]
    pub data: PathBuf,
    /// Use the pacing proxy even where network namespaces are available.
    #[arg(long)]
    pub proxy: bool,
    /// Repetitions of each cell (the best is kept); default 1 with --quick, else 2.
    #[arg(long)]
    pub reps: Option<usize>,
    /// The Markdown file whose section this run replaces.
    #[arg(long, default_value = "benches/RESULTS.md")]
    pub results: PathBuf,
    #[arg(skip)]
    pub reps_resolved: usize,
}

/// A cell shorter than this is repeated (its rows and time summed) until it is not: short
/// runs measure start-up and noise.
pub const MIN_CELL_SECS: f64 = 1.5;

impl Options {
    fn resolve(mut self) -> Self {
        self.reps_resolved = self.reps.unwrap_or(if self.quick { 1 } else { 2 }).max(1);
        self
    }
}

/// The generated datasets of a run.
#[derive(Debug)]
pub struct Datasets {
    pub root: PathBuf,
    pub rows: Vec<(Kind, usize, u64)>,
}

fn datasets(options: &Options, only: Option<Kind>) -> Result<Datasets> {
    let sizes: [(Kind, usize); 4] = if options.quick {
        [
            (Kind::Images, 2048),
            (Kind::Clicks, 24 * 16 * 1024),
            (Kind::Text, 8192),
            (Kind::Lineitem, 500_000),
        ]
    } else {
        [
            (Kind::Images, 8192),
            (Kind::Clicks, 24 * 64 * 1024),
            (Kind::Text, 32 * 1024),
            (Kind::Lineitem, 3_000_000),
        ]
    };
    let root = options.data.join(if options.quick { "quick" } else { "full" });
    let mut rows = Vec::new();
    for (kind, n) in sizes {
        if only.is_some_and(|k| k.name() != kind.name()) {
            continue;
        }
        let dir = root.join(kind.name());
        // The stamp holds the rows written (TPC-H's scale gives about the rows asked for); its
        // name carries the layout, so data written by an older `pushdown gen` is regenerated.
        let stamp = dir.join(format!("_rows_{n}_layout_{}", pushdown_datasets::LAYOUT_VERSION));
        let written = std::fs::read_to_string(&stamp)
            .ok()
            .and_then(|s| s.trim().parse::<usize>().ok());
        let n = match written {
            Some(written) => written,
            None => {
                eprintln!("generating {} ({n} rows) in {}", kind.name(), dir.display());
                let mut gen_options = GenOptions::new(kind, n);
                let bar = pushdown_datasets::progress_bar(&mut gen_options);
                let generated = generate(&gen_options, &dir)?;
                bar.finish_and_clear();
                std::fs::write(&stamp, generated.rows.to_string())?;
                generated.rows
            }
        };
        let bytes = std::fs::read_dir(&dir)?
            .filter_map(|e| e.ok())
            .filter(|e| e.path().extension().is_some_and(|x| x == "parquet"))
            .map(|e| e.metadata().map(|m| m.len()).unwrap_or(0))
            .sum();
        rows.push((kind, n, bytes));
    }
    Ok(Datasets { root, rows })
}

/// A link at `rate` bits/s: a shaped veth into a namespace, else the pacing proxy (whose
/// upstream is set once the server is up).
pub async fn make_link(rate: u64, options: &Options) -> Result<link::Link> {
    if !options.proxy {
        match link::Link::netns(rate) {
            Ok(l) => return Ok(l),
            Err(e) => eprintln!("network namespaces unavailable ({e:#}); using the pacing proxy"),
        }
    }
    Ok(link::Link::pending_proxy(rate))
}

/// Connects, waiting for a just-started server.
pub async fn connect(url: &str) -> Result<PushdownClient> {
    let mut last = None;
    for _ in 0..100 {
        match PushdownClient::connect(&[url]).await {
            Ok(c) => match c
                .action(pushdown_protocol::ActionKind::Health, bytes::Bytes::new())
                .await
            {
                Ok(_) => return Ok(c),
                Err(e) => last = Some(anyhow::Error::from(e)),
            },
            Err(e) => last = Some(anyhow::Error::from(e)),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(last
        .unwrap_or_else(|| anyhow::anyhow!("no server"))
        .context(format!("connecting to {url}")))
}

/// A count from the environment variable `name`, else `default`.
pub fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// `cell` within `PUSHDOWN_CELL_SECONDS` (default 180), else an error naming `what`: a suite
/// never hangs on one cell (what the cell started is dropped, its processes killed).
pub async fn bounded<T>(what: &str, cell: impl std::future::Future<Output = Result<T>>) -> Result<T> {
    let limit = Duration::from_secs(env_or("PUSHDOWN_CELL_SECONDS", 180) as u64);
    tokio::time::timeout(limit, cell)
        .await
        .map_err(|_| anyhow::anyhow!("{what} did not finish in {limit:?} (PUSHDOWN_CELL_SECONDS)"))?
}

/// Appends a table row to `out` and prints it at once: a suite's table shows as its cells
/// complete.
pub fn row(out: &mut String, line: String) {
    eprintln!("  {}", line.trim_end());
    out.push_str(&line);
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    format!(
        "{} cores ({cpu}; {}), Linux {}",
        cores(),
        cpus::topology(),
        std::env::consts::ARCH
    )
}

/// Replaces the text between `<!-- NAME:begin -->` and `<!-- NAME:end -->` in `path`,
/// appending the section when it is not there yet.
fn write_section(path: &Path, name: &str, body: &str) -> Result<()> {
    let (begin, end) = (format!("<!-- {name}:begin -->"), format!("<!-- {name}:end -->"));
    let current = std::fs::read_to_string(path).unwrap_or_default();
    let section = format!("{begin}\n{body}{end}");
    let next = match (current.find(&begin), current.find(&end)) {
        (Some(a), Some(b)) if b > a => format!("{}{section}{}", &current[..a], &current[b + end.len()..]),
        _ => format!("{}\n{section}\n", current.trim_end()),
    };
    std::fs::write(path, next).with_context(|| format!("writing {}", path.display()))
}

fn main() -> Result<()> {
    let args = Args::parse();
    // The in-process servers' and loaders' errors on stderr, as `pushdown serve` writes them
    // (`RUST_LOG=warn` adds the retries a soak or a busy cell provokes by design).
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let (suite, options) = match args.command {
        Command::Serve(far) => return serve(&far.data, far.listen, far.threads),
        Command::Finished(far) => return finished::serve(&far.data, far.listen, far.threads),
        Command::LoadServe(far) => return load::serve(&far),
        Command::Soak(soak) => return run_soak(soak),
        Command::Placement { options } => ("placement", options.resolve()),
        Command::Compare { options } => ("compare", options.resolve()),
        Command::Fleet { options } => ("fleet", options.resolve()),
        Command::Scan { options } => ("scan", options.resolve()),
        Command::Load { options } => ("load", options.resolve()),
        Command::Cache { options } => ("cache", options.resolve()),
        Command::Scale { options } => ("scale", options.resolve()),
        Command::Split { options } => ("split", options.resolve()),
        Command::Shared { options } => ("shared", options.resolve()),
        Command::Feed { options } => ("feed", options.resolve()),
        Command::Ceiling { options } => ("ceiling", options.resolve()),
        Command::Import { options } => ("import", options.resolve()),
        Command::Neighbour { options } => ("neighbour", options.resolve()),
        Command::Order { options } => ("order", options.resolve()),
        Command::Text { options } => ("text", options.resolve()),
        Command::Audio { options } => ("audio", options.resolve()),
        Command::Video { options } => ("video", options.resolve()),
    };
    // The trainer side gets CPU 1; servers are started on CPU 0 (the 2-core suites) or in
    // the far-CPU order (`cpus::far_cpu`).
    let pinned = std::thread::available_parallelism().is_ok_and(|n| n.get() >= 2)
        && process::pin_self(&HARNESS_CPU.to_string());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        if suite == "audio" {
            let command = format!(
                "cargo run --release -p pushdown-benches --bin harness -- audio{}",
                if options.quick { " --quick" } else { "" }
            );
            let body = audio::suite(&options, &command).await?;
            println!("{body}");
            return write_section(&options.results, suite, &body);
        }
        if suite == "video" {
            let command = format!(
                "cargo run --release -p pushdown-benches --features pushdown-ops/video --bin harness -- video{}",
                if options.quick { " --quick" } else { "" }
            );
            let body = video::suite(&options, &command).await?;
            println!("{body}");
            return write_section(&options.results, suite, &body);
        }
        if suite == "import" {
            // Sources from the generated images and text (only those two are generated).
            let images = datasets(&options, Some(Kind::Images))?;
            datasets(&options, Some(Kind::Text))?;
            let command = format!(
                "cargo run --release -p pushdown-benches --bin harness -- import{}",
                if options.quick { " --quick" } else { "" }
            );
            let body = import::suite(&options, &images.root, &command).await?;
            println!("{body}");
            return write_section(&options.results, suite, &body);
        }
        // These suites read images alone: the others are not generated for them.
        let images_only = matches!(suite, "feed" | "ceiling" | "neighbour" | "fleet" | "shared" | "order");
        let only = match suite {
            "text" => Some(Kind::Text),
            _ => images_only.then_some(Kind::Images),
        };
        let data = datasets(&options, only)?;
        let command = format!(
            "cargo run --release -p pushdown-benches --bin harness -- {suite}{}",
            if options.quick { " --quick" } else { "" }
        );
        if suite != "placement" {
            let body = match suite {
                "fleet" => fleet::suite(&options, &data, &command).await?,
                "scan" => scan::suite(&options, &data, &command).await?,
                "load" => load::suite(&options, &data, &command).await?,
                "cache" => cache::suite(&options, &data, &command).await?,
                "scale" => scale::suite(&options, &data, &command).await?,
                "split" => split::suite(&options, &data, &command).await?,
                "shared" => shared::suite(&options, &data, &command).await?,
                "feed" => feed::suite(&options, &data, &command).await?,
                "ceiling" => ceiling::suite(&options, &data, &command).await?,
                "neighbour" => neighbour::suite(&options, &data, &command).await?,
                "order" => order::suite(&options, &data, &command).await?,
                "text" => text::suite(&options, &data, &command).await?,
                _ => compare::suite(&options, &data, &command).await?,
            };
            println!("{body}");
            return write_section(&options.results, suite, &body);
        }
        let rates: &[u64] = &[100_000_000, 1_000_000_000];
        let cells = placement::measure(&options, &data, rates).await?;
        let (table, ok) = placement::report(&cells);
        let sizes: Vec<String> = data
            .rows
            .iter()
            .map(|(k, n, b)| format!("{} {n} rows ({})", k.name(), pushdown_client::run::bytes(*b)))
            .collect();
        let body = format!(
            "## Placement: the planner's choice against every legal placement\n\n\
             Command: `{command}`  \nMachine: {}; server pinned to CPU 0 with 1 thread, trainer to CPU 1{} \
             (the planner is told: 1 server core, 1 trainer core, the link's rate).  \nData: {}.  \n\
             Each cell runs the pipeline to the end (again, until it has run ≥ 1.5 s); rows/s is the best of {} run(s); bytes are counted on the link.\n\n{table}\n\
             Target: the planner's choice within 10% of the best measured placement on every pipeline and link: **{}**.\n\n",
            machine(),
            if pinned { "" } else { " (pinning unavailable: shared cores)" },
            sizes.join(", "),
            options.reps_resolved,
            if ok { "met" } else { "missed" }
        );
        println!("{body}");
        write_section(&options.results, "placement", &body)?;
        Ok(())
    })
}

/// `harness soak`: unpinned (its servers and clients share the machine's cores), its section
/// written whether it passes or not.
fn run_soak(mut args: soak::SoakArgs) -> Result<()> {
    args.options = args.options.resolve();
    let command = format!(
        "cargo build --release -p pushdown-cli -p pushdown-benches && target/release/harness soak --minutes {} --kill-every {}{}",
        args.minutes,
        args.kill_every,
        if args.options.quick { " --quick" } else { "" }
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(soak::suite(&args, &command)).map(drop)
}

/// A server over `data` (a folder or an `s3://` URL) with `threads` CPU threads, reading
/// from the store as `pushdown serve` would. Its fragment cache is off unless
/// `PUSHDOWN_CACHE` says otherwise: benchmarks of computing measure computing (repetitions
/// would otherwise be served from the cache); the `cache` suite turns it on.
/// `PUSHDOWN_SHARD_ROWS` caps the rows of a shard (the `split` suite: many shards to place);
/// `PUSHDOWN_REDUCING_NICE` sets `ServerConfig::reducing_nice`; `PUSHDOWN_CACHE_MIB` the
/// cache's memory budget.
pub async fn open_server(data: &Path, threads: usize) -> Result<pushdown_server::Server> {
    let data = data.to_string_lossy();
    let cache_mode = match std::env::var("PUSHDOWN_CACHE") {
        Ok(mode) => mode.parse().map_err(anyhow::Error::msg)?,
        Err(_) => pushdown_server::CacheMode::Off,
    };
    let scaling_window = match std::env::var("PUSHDOWN_SCALING_WINDOW") {
        Ok(secs) => Duration::from_secs(secs.parse()?),
        Err(_) => pushdown_server::ServerConfig::default().scaling_window,
    };
    let shard_max_rows = match std::env::var("PUSHDOWN_SHARD_ROWS") {
        Ok(rows) => rows.parse()?,
        Err(_) => pushdown_server::ServerConfig::default().shard_max_rows,
    };
    // As `pushdown serve --reducing-nice` (an A/B of the reducing threads' priority).
    let reducing_nice = match std::env::var("PUSHDOWN_REDUCING_NICE") {
        Ok(steps) => steps.parse()?,
        Err(_) => pushdown_server::ServerConfig::default().reducing_nice,
    };
    let config = pushdown_server::ServerConfig {
        cpu_threads: threads,
        reducing_nice,
        scaling_window,
        shard_max_rows,
        store_reads_in_flight: pushdown_server::reads_in_flight_for(&data),
        cache: pushdown_server::CacheConfig {
            default_mode: cache_mode,
            memory_bytes: match std::env::var("PUSHDOWN_CACHE_MIB") {
                Ok(mib) => mib.parse::<u64>()? << 20,
                Err(_) => pushdown_server::CacheConfig::default().memory_bytes,
            },
            ..pushdown_server::CacheConfig::default()
        },
        ..pushdown_server::ServerConfig::default()
    };
    let store = pushdown_server::open_store(&data)?;
    Ok(pushdown_server::Server::builder(store)
        .config(config)
        .open()
        .await?)
}

/// `harness serve`: a server with `threads` CPU threads over `data`; prints its address.
fn serve(data: &Path, listen: std::net::SocketAddr, threads: usize) -> Result<()> {
    // As `pushdown serve` builds it: one I/O worker per CPU the process may run on (one
    // where the harness pins it to a CPU).
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async {
        let server = open_server(data, threads).await?;
        // `PUSHDOWN_METRICS_FILE`: the bytes its store has read, rewritten every 100 ms.
        if let Ok(path) = std::env::var("PUSHDOWN_METRICS_FILE") {
            let metrics = std::sync::Arc::clone(server.metrics());
            pushdown_task::detach(async move {
                loop {
                    let _ = std::fs::write(&path, metrics.store_bytes_read.get().to_string());
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
            });
        }
        let running = server.spawn(listen).await?;
        println!("listening on {}", running.addr());
        use std::io::Write;
        std::io::stdout().flush()?;
        std::future::pending::<()>().await;
        Ok(())
    })
}
