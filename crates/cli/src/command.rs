//! The `pushdown` command: serve datasets with pushdown, generate datasets, run and explain
//! pipelines. [`main`] is the whole command, called by the `pushdown` binary and by the Python
//! package's `pushdown` console script (one build gives both).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::mixture::{MixtureFile, read_loader};
use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use pushdown_client::run::{RunOptions, bytes, run};
use pushdown_client::{ConnectOptions, Link, LoaderSource, PushdownClient, StreamOptions, costed_plan};
use pushdown_datasets::{GenOptions, Kind, generate, progress_bar};
use pushdown_planner::Pipeline;
use pushdown_server::{Server, ServerBuilder, ServerConfig, ServerTls, Tokens, open_store, serve_metrics};
use pushdown_task::Task;
use tracing_subscriber::EnvFilter;

#[derive(Debug, Parser)]
#[command(
    name = "pushdown",
    version,
    about = "Run the data-reducing part of ML input pipelines next to the data"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// How log lines are written to stderr: `text` (coloured only on a terminal) or `json`
    /// (one object per line, for log collectors).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "PUSHDOWN_LOG_FORMAT")]
    log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the Parquet datasets under --data over Arrow Flight.
    Serve(ServeArgs),
    /// Write a seeded synthetic dataset as Parquet into OUT/NAME/.
    Gen(GenArgs),
    /// Pull a pipeline's (or a SQL query's) reduced stream and apply the client steps.
    Run(RunArgs),
    /// Print how the planner splits a pipeline between server and client.
    Explain(ExplainArgs),
    /// Generate a small dataset, serve it in-process, run a pipeline, print the savings.
    Demo(DemoArgs),
    /// Write data that is not yet Parquet (an image folder, WebDataset shards, an audio
    /// folder, JSONL) as a dataset the server serves: `pushdown import imagefolder ~/pets
    /// --out /data/pets`.
    Import(ImportArgs),
    /// Ask servers how many servers would remove their clients' stall (the scaling signal:
    /// each server's busy fraction and the wait its loaders report).
    Scaling(ScalingArgs),
}

/// Where the datasets live.
#[derive(Debug, Args)]
struct StorageArgs {
    /// Data root: a folder, or an object-store URL (s3://bucket/prefix, file:///path). Every
    /// sub-folder holding Parquet files is a dataset. S3 settings come from AWS_* variables.
    #[arg(long, env = "PUSHDOWN_DATA")]
    data: String,
    /// Seconds between re-listings of the data root.
    #[arg(long, env = "PUSHDOWN_CATALOG_REFRESH_SECS", default_value_t = 5)]
    catalog_refresh_secs: u64,
}

/// Where the server listens.
#[derive(Debug, Args)]
struct ListenArgs {
    /// Flight (gRPC) address; port 0 picks a free port (printed on stdout).
    #[arg(long, env = "PUSHDOWN_LISTEN", default_value = "127.0.0.1:50051")]
    listen: SocketAddr,
    /// Metrics address: Prometheus text on GET /metrics, the scaling signal as JSON on GET
    /// /scaling; off when not set.
    #[arg(long, env = "PUSHDOWN_METRICS_LISTEN")]
    metrics_listen: Option<SocketAddr>,
    /// Location advertised in endpoints (grpc://host:port); default: none, meaning "this server".
    #[arg(long, env = "PUSHDOWN_ADVERTISE")]
    advertise: Option<String>,
    /// Codec of the streams of clients that cannot choose one (pyarrow and other plain Flight
    /// clients): none, lz4, zstd or adaptive (each batch compressed while the network, not
    /// the server's CPU, holds the stream back). Default: none for peers on loopback,
    /// adaptive for the rest; set it when a local proxy hides where clients are.
    #[arg(long, env = "PUSHDOWN_PLAIN_CLIENT_CODEC")]
    plain_client_codec: Option<pushdown_server::Compression>,
    /// Whether a stream that opens while no other runs also opens the endpoint planned after
    /// it and starts decoding it, so a client reading endpoints in order (pyarrow) finds it
    /// ready. Off: each endpoint is opened when asked for.
    #[arg(long, env = "PUSHDOWN_READ_AHEAD", default_value = "on", value_parser = on_off,
          action = clap::ArgAction::Set, value_name = "on|off")]
    read_ahead: bool,
}

/// `on` or `off`.
fn on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" => Ok(true),
        "off" => Ok(false),
        other => Err(format!("`{other}`: expected on or off")),
    }
}

/// What one server may spend.
#[derive(Debug, Args)]
struct LimitsArgs {
    /// DoGet streams running at once.
    #[arg(long, env = "PUSHDOWN_MAX_STREAMS", default_value_t = 64)]
    max_streams: usize,
    /// Seconds a stream waits for one of --max-streams before it is refused with
    /// ResourceExhausted (clients retry it later, or on another server holding its files).
    #[arg(long, env = "PUSHDOWN_QUEUE_TIMEOUT_SECS", default_value_t = 30)]
    queue_timeout_secs: u64,
    /// Query engine memory pool, in MiB.
    #[arg(long, env = "PUSHDOWN_MEMORY_MIB", default_value_t = 1024)]
    memory_mib: usize,
    /// The most of it one query (one stream) may hold, in MiB; past it the query fails with
    /// ResourceExhausted and the others go on.
    #[arg(long, env = "PUSHDOWN_MAX_QUERY_MEMORY_MIB", default_value_t = 512)]
    max_query_memory_mib: usize,
    /// Longest a stream may run, in seconds.
    #[arg(long, env = "PUSHDOWN_REQUEST_TIMEOUT_SECS", default_value_t = 3600)]
    request_timeout_secs: u64,
    /// Seconds the streams in flight have to finish once the server is asked to stop
    /// (SIGTERM, Ctrl-C); those still open then end with UNAVAILABLE (their clients read on
    /// from another server), which gets 5 s more to reach them. A second signal stops at once.
    #[arg(long, env = "PUSHDOWN_DRAIN_SECS", default_value_t = pushdown_server::DEFAULT_DRAIN.as_secs())]
    drain_secs: u64,
    /// Threads decoding, filtering and encoding (default: all cores). Streams whose ops are
    /// left to their clients (un-reduced) run on as many threads of their own.
    #[arg(long, env = "PUSHDOWN_CPU_THREADS")]
    cpu_threads: Option<usize>,
    /// Streams running their ops here at once before a client that allows it gets its
    /// shards un-reduced and runs the ops itself (default: --cpu-threads; 0: always).
    #[arg(long, env = "PUSHDOWN_REDUCING_STREAMS")]
    reducing_streams: Option<usize>,
    /// How many nice steps the reducing threads (--cpu-threads) run below the server's
    /// others (Linux): when both want the cores, un-reduced streams go first, each a few
    /// percent of a core here that frees a trainer's core. 0: the same priority.
    #[arg(long, env = "PUSHDOWN_REDUCING_NICE", default_value_t = 5,
          value_parser = clap::value_parser!(u8).range(0..=19))]
    reducing_nice: u8,
    /// Row-group ranges read from the store at once, shared by the running streams
    /// (default: 8 for an object store URL, whose round trips would bound a stream, 1 for
    /// local files).
    #[arg(long, env = "PUSHDOWN_STORE_READS_IN_FLIGHT")]
    store_reads_in_flight: Option<usize>,
    /// Target compressed bytes of the projected columns per shard, in MiB.
    #[arg(long, env = "PUSHDOWN_SHARD_MIB", default_value_t = 64)]
    shard_mib: u64,
    /// An op call that may produce more than this per row (MiB) is refused before it runs.
    #[arg(long, env = "PUSHDOWN_MAX_OP_ROW_MIB", default_value_t = 16)]
    max_op_row_mib: u64,
    /// Batches are cut so that one batch of op output stays under this (MiB).
    #[arg(long, env = "PUSHDOWN_MAX_OP_BATCH_MIB", default_value_t = 256)]
    max_op_batch_mib: u64,
    /// Longest SQL text or predicate accepted, in KiB.
    #[arg(long, env = "PUSHDOWN_MAX_SQL_KIB", default_value_t = 64)]
    max_sql_kib: usize,
    /// Seconds of loaders' reports and of this server's CPU use the scaling signal covers.
    #[arg(long, env = "PUSHDOWN_SCALING_WINDOW_SECS", default_value_t = 10)]
    scaling_window_secs: u64,
}

/// Who may connect and what they may read.
#[derive(Debug, Args)]
struct SecurityArgs {
    /// Serve Flight over TLS with this certificate chain (PEM); needs --tls-key.
    #[arg(long, env = "PUSHDOWN_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long, env = "PUSHDOWN_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Mutual TLS: every client must present a certificate signed by this CA (PEM).
    #[arg(long, env = "PUSHDOWN_TLS_CLIENT_CA", requires = "tls_cert")]
    tls_client_ca: Option<PathBuf>,
    /// Bearer tokens, one per line with the datasets it may read (`TOKEN images,clicks` or
    /// `TOKEN *`); requests without a listed token are refused. Default: no authentication.
    #[arg(long, env = "PUSHDOWN_AUTH_TOKENS")]
    auth_tokens: Option<PathBuf>,
}

#[derive(Debug, Args)]
struct ServeArgs {
    #[command(flatten)]
    storage: StorageArgs,
    #[command(flatten)]
    listen: ListenArgs,
    #[command(flatten)]
    limits: LimitsArgs,
    #[command(flatten)]
    security: SecurityArgs,
    /// Named views, served as datasets (TOML: `[[view]] name = "…" sql = "SELECT …"`).
    #[arg(long, env = "PUSHDOWN_CATALOG")]
    catalog: Option<PathBuf>,
    /// A folder of tokenizers by name (`NAME.json`): `tokenize(body, 512, 'NAME')` uses
    /// `DIR/NAME.json` where no dataset is called NAME.
    #[arg(long, env = "PUSHDOWN_TOKENIZERS")]
    tokenizers: Option<PathBuf>,
    #[command(flatten)]
    cache: CacheArgs,
}

/// The fragment cache: reduced shard outputs kept for the next epoch, trial or restart.
#[derive(Debug, Args)]
struct CacheArgs {
    /// Memory for cached shard outputs, in MiB (0: none in memory).
    #[arg(long, env = "PUSHDOWN_CACHE_MEMORY_MIB", default_value_t = 256)]
    cache_memory_mib: u64,
    /// Directory for cached shard outputs that do not fit in memory; they outlive restarts.
    #[arg(long, env = "PUSHDOWN_CACHE_DIR")]
    cache_dir: Option<PathBuf>,
    /// Disk space for --cache-dir, in MiB.
    #[arg(long, env = "PUSHDOWN_CACHE_DISK_MIB", default_value_t = 8192)]
    cache_disk_mib: u64,
    /// Caching for datasets not named by --cache-dataset: auto (when measured to pay), on, off.
    #[arg(long, env = "PUSHDOWN_CACHE", default_value = "auto")]
    cache: pushdown_server::CacheMode,
    /// Forces caching for a dataset or view: `NAME=on` or `NAME=off` (repeatable).
    #[arg(long = "cache-dataset", value_parser = parse_cache_dataset)]
    cache_datasets: Vec<(String, pushdown_server::CacheMode)>,
}

fn parse_cache_dataset(s: &str) -> Result<(String, pushdown_server::CacheMode), String> {
    let (name, mode) = s
        .split_once('=')
        .ok_or_else(|| format!("`{s}`: expected NAME=on|off|auto"))?;
    Ok((name.trim().to_owned(), mode.trim().parse()?))
}

#[derive(Debug, Args)]
struct GenArgs {
    /// Which dataset.
    kind: Kind,
    /// Rows to write.
    #[arg(long, default_value_t = 10_000)]
    rows: usize,
    /// Data root; the dataset goes to OUT/NAME/part-NNNNN.parquet.
    #[arg(long)]
    out: PathBuf,
    /// Dataset (folder) name; default: the kind.
    #[arg(long)]
    name: Option<String>,
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Rows per row group (default: the kind's).
    #[arg(long)]
    row_group_rows: Option<usize>,
    /// Rows per file (default: the kind's).
    #[arg(long)]
    rows_per_file: Option<usize>,
}

/// How a client proves who it is, whom it trusts, and how long it waits for an answer.
#[derive(Debug, Args)]
struct CredentialArgs {
    /// Deadline (seconds) of every call made before streaming: planning, counts, schemas,
    /// profiles, actions, connecting. A server silent that long is passed over (a plan goes
    /// on without it where the others hold its files). Default: `run`'s --stall-timeout,
    /// else 30.
    #[arg(long, env = "PUSHDOWN_CALL_TIMEOUT")]
    call_timeout: Option<f64>,
    /// Bearer token for servers started with --auth-tokens.
    #[arg(long, env = "PUSHDOWN_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// CA certificate (PEM) that https:// servers' certificates must chain to (default: the
    /// system's roots).
    #[arg(long, env = "PUSHDOWN_TLS_CA")]
    tls_ca: Option<PathBuf>,
    /// This client's certificate (PEM), for servers requiring mutual TLS; needs --tls-client-key.
    #[arg(long, env = "PUSHDOWN_TLS_CLIENT_CERT", requires = "tls_client_key")]
    tls_client_cert: Option<PathBuf>,
    #[arg(long, env = "PUSHDOWN_TLS_CLIENT_KEY", requires = "tls_client_cert")]
    tls_client_key: Option<PathBuf>,
}

impl CredentialArgs {
    fn options(&self) -> Result<ConnectOptions> {
        self.options_or(pushdown_client::DEFAULT_CALL_TIMEOUT)
    }

    /// The options, with `call_timeout` as the deadline when --call-timeout is not given.
    fn options_or(&self, call_timeout: Duration) -> Result<ConnectOptions> {
        let path = |p: &Option<PathBuf>| p.as_ref().map(|p| p.to_string_lossy().into_owned());
        let mut options = ConnectOptions::from_parts(
            self.token.clone(),
            path(&self.tls_ca).as_deref(),
            path(&self.tls_client_cert).as_deref(),
            path(&self.tls_client_key).as_deref(),
        )?;
        options.call_timeout = match self.call_timeout {
            Some(s) => seconds(s, "--call-timeout")?,
            None => call_timeout,
        };
        Ok(options)
    }
}

/// A positive number of seconds given as `flag`.
fn seconds(s: f64, flag: &str) -> Result<Duration> {
    Duration::try_from_secs_f64(s)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| anyhow::anyhow!("{flag} must be a positive number of seconds"))
}

/// Which servers, and how to fan out over them.
#[derive(Debug, Args)]
struct ClientArgs {
    /// Server URL (http://host:port), or dns://name:port for every address the name
    /// resolves to; repeat for several servers. Each shard goes to a server holding its file.
    #[arg(long = "server", required = true)]
    servers: Vec<String>,
    /// Shard streams in flight at once, fixed. Default: tuned while the run goes, from 4 up
    /// to what keeps the consumer from waiting (within 1 GiB of read-ahead).
    #[arg(long)]
    concurrency: Option<usize>,
    /// A stream that receives nothing for this long (seconds) is resumed on another server;
    /// also the deadline of the calls before streaming unless --call-timeout is given.
    #[arg(long, default_value_t = 30.0)]
    stall_timeout: f64,
    /// Consecutive transient failures of one shard's stream before the run fails.
    #[arg(long, default_value_t = 3)]
    retries: usize,
    /// The link to the servers (1Gbit, 100Mbit, 125MB, unlimited, …), for placing ops and
    /// choosing the stream codec. Default: found when connecting (unlimited to servers on
    /// this host; off it, each stream's codec follows the send rate its server measures).
    #[arg(long, value_parser = pushdown_planner::parse_bandwidth)]
    bandwidth: Option<f64>,
    #[command(flatten)]
    credentials: CredentialArgs,
}

#[derive(Debug, Args)]
struct RunArgs {
    /// Pipeline file (TOML or JSON).
    #[arg(required_unless_present_any = ["sql", "mixture"], conflicts_with_all = ["sql", "mixture"])]
    pipeline: Option<PathBuf>,
    /// A SQL SELECT over the server's datasets instead of a pipeline.
    #[arg(long, conflicts_with = "mixture")]
    sql: Option<String>,
    /// A mixture of sources by weight instead (a TOML file: `batch_size`, `shuffle_buffer`
    /// and `[[source]]` tables, each with `sql` or `pipeline`, `weight` and optionally
    /// `servers`), read as a loader of world size 1 reads it.
    #[arg(long, conflicts_with = "out")]
    mixture: Option<PathBuf>,
    /// Pack the documents' token ids of a column into blocks of exactly LENGTH tokens, with
    /// their position_ids (`COLUMN:LENGTH[:EOS_ID]`, e.g. `tokens:2048:2`), read as a loader of
    /// world size 1 reads them; `--pack-batch` blocks per batch.
    #[arg(long, conflicts_with_all = ["out", "mixture"], value_parser = parse_pack)]
    pack: Option<pushdown_client::pack::Pack>,
    /// Draw every global batch from one length bucket of a column's token lists, padded to
    /// the batch's longest (`COLUMN:B1,B2,...[:PAD_ID]`, e.g. `tokens:64,256,1024`), read as
    /// a loader of world size 1 reads them; `--pack-batch` rows per batch.
    #[arg(long, conflicts_with_all = ["out", "mixture", "pack"], value_parser = parse_bucket_by)]
    bucket_by: Option<pushdown_client::bucket::BucketBy>,
    /// Blocks (with `--pack`) or rows (with `--bucket-by`) per batch.
    #[arg(long, default_value_t = 8)]
    pack_batch: usize,
    #[command(flatten)]
    client: ClientArgs,
    /// Write the delivered rows to this Parquet file.
    #[arg(long)]
    out: Option<PathBuf>,
    #[arg(long, default_value_t = 1)]
    epochs: usize,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Where a pipeline's ops run: costed (the planner's choice, which may split an op's
    /// shards between the ends), server, trainer, split:F (the servers reduce a fraction F
    /// of the shards) or adaptive (each shard placed when it is requested, by the rates
    /// both ends deliver).
    #[arg(long, default_value = "costed", value_parser = parse_push)]
    placement: pushdown_client::Push,
}

/// `COLUMN:LENGTH[:EOS_ID]`.
fn parse_pack(s: &str) -> Result<pushdown_client::pack::Pack, String> {
    let bad = || format!("--pack {s}: COLUMN:LENGTH[:EOS_ID], e.g. tokens:2048:2");
    let mut parts = s.split(':');
    let (Some(column), Some(length)) = (parts.next(), parts.next()) else {
        return Err(bad());
    };
    let mut pack = pushdown_client::pack::Pack::new(column, length.parse().map_err(|_| bad())?);
    pack.eos_id = parts.next().map(|e| e.parse().map_err(|_| bad())).transpose()?;
    if parts.next().is_some() || column.is_empty() {
        return Err(bad());
    }
    Ok(pack)
}

/// `COLUMN:B1,B2,...[:PAD_ID]`.
fn parse_bucket_by(s: &str) -> Result<pushdown_client::bucket::BucketBy, String> {
    let bad = || format!("--bucket-by {s}: COLUMN:B1,B2,...[:PAD_ID], e.g. tokens:64,256,1024");
    let mut parts = s.split(':');
    let (Some(column), Some(boundaries)) = (parts.next(), parts.next()) else {
        return Err(bad());
    };
    let boundaries = boundaries
        .split(',')
        .map(|b| b.trim().parse().map_err(|_| bad()))
        .collect::<Result<Vec<u32>, _>>()?;
    let mut by = pushdown_client::bucket::BucketBy::new(column, boundaries);
    if let Some(pad) = parts.next() {
        by.pad_id = pad.parse().map_err(|_| bad())?;
    }
    if parts.next().is_some() || column.is_empty() {
        return Err(bad());
    }
    Ok(by)
}

fn parse_push(s: &str) -> Result<pushdown_client::Push, String> {
    s.parse().map_err(|e: pushdown_client::ClientError| e.to_string())
}

#[derive(Debug, Args)]
struct ExplainArgs {
    /// Pipeline file (TOML or JSON).
    pipeline: PathBuf,
    /// Ask this server for the dataset's schema and to profile the fragment's ops on a
    /// sample; ops are then placed by measured cost.
    #[arg(long, conflicts_with = "data", required_unless_present = "data")]
    server: Option<String>,
    /// Or read the schema from a local data root (static placement: every legal op pushed).
    #[arg(long)]
    data: Option<String>,
    /// The link between server and trainer (1Gbit, 10Gbit, 100Mbit, 125MB, unlimited, …).
    /// Default: found from the server's address (unlimited on this host, else assumed
    /// 1 Gbit/s for placement while each stream's codec follows what its server measures).
    #[arg(long, value_parser = pushdown_planner::parse_bandwidth)]
    bandwidth: Option<f64>,
    /// Cores of the trainer host for client-side ops (default: this machine's).
    #[arg(long)]
    client_cores: Option<f64>,
    /// Cores of the server for pushed ops (default: what the server reports).
    #[arg(long)]
    server_cores: Option<f64>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
    #[command(flatten)]
    credentials: CredentialArgs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Format {
    Text,
    Json,
}

#[derive(Debug, Args)]
struct ScalingArgs {
    /// A server to ask (repeatable: each answers for the clients it hears from).
    #[arg(long = "server", required = true)]
    servers: Vec<String>,
    /// Output format (json: one object per line, as GET /scaling on the metrics port).
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
    #[command(flatten)]
    credentials: CredentialArgs,
}

#[derive(Debug, Args)]
struct ImportArgs {
    /// What the inputs are: imagefolder (class sub-folders of images, as torchvision's
    /// ImageFolder), webdataset (tar shards), audiofolder (audio files with a metadata.csv or
    /// metadata.jsonl, or in class sub-folders), jsonl (JSON Lines files).
    #[arg(value_parser = |s: &str| s.parse::<pushdown_import::Kind>())]
    kind: pushdown_import::Kind,
    /// One folder (imagefolder, audiofolder), or the files (shards, JSONL files) and folders
    /// of them. Each a local path or an object-store URL (s3://bucket/prefix, gs://…, az://…,
    /// configured from the variables `pushdown serve --data` reads).
    #[arg(required = true)]
    inputs: Vec<PathBuf>,
    /// The dataset's folder, named as the dataset (a local path or an object-store URL): a
    /// server with `--data` on its parent serves it under that name.
    #[arg(long)]
    out: PathBuf,
    /// The split the rows are (train, validation, test): the files' names carry it and the
    /// server's `split` column reads it.
    #[arg(long, default_value = "train")]
    split: String,
}

#[derive(Debug, Args)]
struct DemoArgs {
    /// Images to generate.
    #[arg(long, default_value_t = 2048)]
    rows: usize,
}

/// Runs the command line `args` (the program's name first, as `std::env::args_os` gives it)
/// and returns the process's exit status: 0 on success (and for `--help`, `--version`), 2 for
/// a command line clap rejects, 1 for a command that failed, its error chain on stderr. It
/// never exits the process itself, so the Python console script can call it.
pub fn main<I, T>(args: I) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            // --help and --version are "errors" that print to stdout and succeed.
            let _ = e.print();
            return u8::try_from(e.exit_code()).unwrap_or(2);
        }
    };
    match run_command(cli) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {}", crate::error_report(&e));
            1
        }
    }
}

fn run_command(cli: Cli) -> Result<()> {
    let default_level = if matches!(cli.command, Command::Serve(_)) {
        "info"
    } else {
        "warn"
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    // `try_init`: a second command in one process (the Python console script's, a test's)
    // keeps the first one's subscriber.
    let _ = match cli.log_format {
        LogFormat::Json => logs.json().try_init(),
        // Colour only where a person reads it: a file or a collector gets plain text.
        LogFormat::Text => logs
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .try_init(),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async move {
        match cli.command {
            Command::Serve(args) => serve(args).await,
            Command::Gen(args) => gen_dataset(args),
            Command::Run(args) => run_pipeline(args).await,
            Command::Explain(args) => explain(args).await,
            Command::Scaling(args) => scaling(args).await,
            Command::Import(args) => import_dataset(args),
            Command::Demo(args) => {
                let mut stdout = std::io::stdout();
                crate::demo::demo(args.rows, true, &mut stdout).await.map(|_| ())
            }
        }
    })
}

async fn serve(args: ServeArgs) -> Result<()> {
    let config = server_config(&args);
    let store = open_store(&args.storage.data)?;
    let builder = Server::builder(store)
        .config(config)
        .drain(Duration::from_secs(args.limits.drain_secs));
    let (builder, tls) = with_catalog_and_security(builder, &args)?;
    let server = builder.open().await?;
    let datasets = server.catalog().snapshot();
    if datasets.is_empty() {
        tracing::warn!(
            data = %args.storage.data,
            "no datasets: a dataset is a folder of Parquet files directly under the storage root \
             (e.g. <data>/cifar-10/train-00000-of-00001.parquet); serving nothing until one appears"
        );
    }
    for (name, dataset) in datasets.iter() {
        tracing::info!(
            dataset = name.as_str(),
            files = dataset.files.len(),
            rows = dataset.num_rows(),
            unreadable = dataset.broken.len(),
            "dataset"
        );
    }
    let listener = tokio::net::TcpListener::bind(args.listen.listen)
        .await
        .with_context(|| format!("binding {}", args.listen.listen))?;
    let addr = listener.local_addr()?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let metrics_task = match args.listen.metrics_listen {
        Some(metrics_addr) => {
            let listener = tokio::net::TcpListener::bind(metrics_addr)
                .await
                .with_context(|| format!("binding {metrics_addr}"))?;
            println!("metrics on http://{}/metrics", listener.local_addr()?);
            let mut rx = stop_rx.clone();
            Some(Task::spawn(serve_metrics(
                listener,
                std::sync::Arc::clone(server.metrics()),
                async move {
                    let _ = rx.wait_for(|stop| *stop).await;
                },
            )))
        }
        None => None,
    };
    if tls {
        tracing::info!("Flight over TLS only");
    }
    warn_if_open(addr, &args.security, tls);
    println!("listening on {addr}");
    let _reload = match (server.tokens(), &args.security.auth_tokens) {
        (Some(tokens), Some(path)) => Some(Task::spawn(reload_tokens_on_sighup(
            std::sync::Arc::clone(tokens),
            path.clone(),
        ))),
        _ => None,
    };
    let _signal = Task::spawn(async move {
        shutdown_signal().await;
        let _ = stop_tx.send(true);
        shutdown_signal().await;
        tracing::warn!("asked again: stopping now, streams in flight cut");
        std::process::exit(1);
    });
    let mut rx = stop_rx;
    server
        .serve(listener, async move {
            let _ = rx.wait_for(|stop| *stop).await;
        })
        .await?;
    if let Some(task) = metrics_task {
        task.await??;
    }
    Ok(())
}

/// The server's configuration from `pushdown serve`'s flags.
fn server_config(args: &ServeArgs) -> ServerConfig {
    let defaults = ServerConfig::default();
    ServerConfig {
        max_concurrent_streams: args.limits.max_streams,
        queue_timeout: Duration::from_secs(args.limits.queue_timeout_secs),
        memory_limit: args.limits.memory_mib << 20,
        max_query_memory: args.limits.max_query_memory_mib << 20,
        request_timeout: Duration::from_secs(args.limits.request_timeout_secs),
        cpu_threads: args.limits.cpu_threads.unwrap_or(defaults.cpu_threads),
        reducing_nice: args.limits.reducing_nice,
        reducing_streams: args.limits.reducing_streams,
        store_reads_in_flight: args
            .limits
            .store_reads_in_flight
            .unwrap_or_else(|| pushdown_server::reads_in_flight_for(&args.storage.data)),
        shard_target_bytes: args.limits.shard_mib << 20,
        max_op_row_bytes: args.limits.max_op_row_mib << 20,
        max_op_batch_bytes: args.limits.max_op_batch_mib << 20,
        max_sql_bytes: args.limits.max_sql_kib << 10,
        scaling_window: Duration::from_secs(args.limits.scaling_window_secs.max(1)),
        catalog_refresh: Duration::from_secs(args.storage.catalog_refresh_secs),
        advertise: args.listen.advertise.clone(),
        plain_client_codec: args.listen.plain_client_codec,
        read_ahead: args.listen.read_ahead,
        cache: pushdown_server::CacheConfig {
            memory_bytes: args.cache.cache_memory_mib << 20,
            disk: args.cache.cache_dir.clone(),
            disk_bytes: args.cache.cache_disk_mib << 20,
            default_mode: args.cache.cache,
            modes: args.cache.cache_datasets.iter().cloned().collect(),
        },
        tokenizers: args.tokenizers.clone(),
        ..defaults
    }
}

/// `builder` with --catalog's views, --auth-tokens and TLS; and whether Flight is served
/// over TLS.
fn with_catalog_and_security(mut builder: ServerBuilder, args: &ServeArgs) -> Result<(ServerBuilder, bool)> {
    if let Some(path) = &args.catalog {
        let views = pushdown_server::Views::load(path)?;
        tracing::info!(views = views.iter().count(), "views from {}", path.display());
        builder = builder.views(views);
    }
    let security = &args.security;
    if let Some(path) = &security.auth_tokens {
        let tokens = Tokens::load(path)?;
        tracing::info!(tokens = tokens.len(), "requests need a bearer token");
        builder = builder.tokens(tokens);
    }
    let tls = match (&security.tls_cert, &security.tls_key) {
        (Some(cert), Some(key)) => {
            let mut tls = ServerTls::from_files(cert, key)?;
            if let Some(ca) = &security.tls_client_ca {
                tls = tls.require_client_certs(pushdown_server::read_pem(ca)?);
            }
            builder = builder.tls(tls);
            true
        }
        _ => false,
    };
    Ok((builder, tls))
}

/// Warns when the server listens beyond this host and anyone may read: no tokens, no
/// client certificates.
fn warn_if_open(addr: std::net::SocketAddr, security: &SecurityArgs, tls: bool) {
    if !addr.ip().is_loopback() && security.auth_tokens.is_none() && security.tls_client_ca.is_none() {
        tracing::warn!(
            %addr,
            tls,
            "serving on a non-loopback address without --auth-tokens: anyone who reaches {addr} \
             reads every dataset (give --auth-tokens FILE, and --tls-cert/--tls-key for a network \
             you do not trust)"
        );
    }
}

/// Reads the tokens file again on every SIGHUP: the next requests are checked against it.
/// A file that does not parse leaves the tokens as they were, and says why.
async fn reload_tokens_on_sighup(tokens: std::sync::Arc<Tokens>, path: PathBuf) {
    #[cfg(unix)]
    {
        let mut hangup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "no SIGHUP handler: tokens reload only with a restart");
                return;
            }
        };
        while hangup.recv().await.is_some() {
            match Tokens::load(&path) {
                Ok(new) => {
                    let count = new.len();
                    tokens.replace(new);
                    tracing::info!(tokens = count, "tokens reloaded from {}", path.display());
                }
                Err(reason) => {
                    tracing::warn!(%reason, "tokens not reloaded: the previous ones stay in force");
                }
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = (tokens, path);
    }
}

/// Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "no SIGTERM handler");
                let _ = ctrl_c.await;
                return;
            }
        };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

fn import_dataset(args: ImportArgs) -> Result<()> {
    let mut options = pushdown_import::ImportOptions::new(args.kind, args.inputs, args.out);
    options.split = args.split;
    options.progress = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let summary = pushdown_import::import(&options)?;
    print!("{summary}");
    Ok(())
}

fn gen_dataset(args: GenArgs) -> Result<()> {
    let name = args.name.unwrap_or_else(|| args.kind.name().to_owned());
    let mut options = GenOptions::new(args.kind, args.rows);
    options.seed = args.seed;
    options.row_group_rows = args.row_group_rows;
    options.rows_per_file = args.rows_per_file;
    let bar = progress_bar(&mut options);
    let generated = generate(&options, &args.out.join(&name))?;
    bar.finish_and_clear();
    println!(
        "wrote {} rows of `{name}` in {} files ({}) to {}",
        generated.rows,
        generated.files.len(),
        bytes(generated.bytes),
        generated.dir.display()
    );
    Ok(())
}

async fn run_pipeline(args: RunArgs) -> Result<()> {
    if let Some(path) = args.mixture.clone() {
        return run_mixture_file(&path, args).await;
    }
    let regrouped_file = match &args.pipeline {
        Some(path) => Pipeline::from_file(path)?.without_regroup().1.is_some(),
        None => false,
    };
    if args.pack.is_some() || args.bucket_by.is_some() || regrouped_file {
        return run_regrouped_source(args).await;
    }
    let source = match (args.pipeline, args.sql) {
        (Some(path), None) => LoaderSource::Pipeline(Pipeline::from_file(&path)?),
        (None, Some(sql)) => LoaderSource::Sql(sql),
        _ => anyhow::bail!("give a pipeline file or --sql, not both"),
    };
    let stall_timeout = seconds(args.client.stall_timeout, "--stall-timeout")?;
    let mut options = RunOptions::new(args.client.servers, source);
    options.out = args.out.clone();
    let loader = &mut options.loader;
    loader.connect = args.client.credentials.options_or(stall_timeout)?;
    loader.link = args.client.bandwidth.map_or_else(Link::auto, Link::bandwidth);
    loader.epochs = args.epochs;
    loader.seed = args.seed;
    loader.push = args.placement;
    let defaults = StreamOptions::default();
    loader.stream = StreamOptions {
        concurrency: args.client.concurrency.unwrap_or(defaults.concurrency),
        max_concurrency: args.client.concurrency.unwrap_or(defaults.max_concurrency),
        stall_timeout,
        max_retries: args.client.retries,
        ..StreamOptions::default()
    };
    let report = run(&options).await?;
    print!("{report}");
    if let Some(out) = args.out {
        println!("wrote {} rows to {}", report.rows, out.display());
    }
    Ok(())
}

/// The loader options of `run --mixture` and `run --pack`.
fn loader_options(
    args: &RunArgs,
    batch_size: Option<usize>,
    shuffle_buffer: Option<usize>,
) -> Result<pushdown_client::LoaderOptions> {
    let stall_timeout = seconds(args.client.stall_timeout, "--stall-timeout")?;
    let defaults = StreamOptions::default();
    Ok(pushdown_client::LoaderOptions {
        batch_size,
        shuffle_buffer,
        seed: args.seed,
        epochs: args.epochs,
        push: args.placement,
        connect: args.client.credentials.options_or(stall_timeout)?,
        link: args.client.bandwidth.map_or_else(Link::auto, Link::bandwidth),
        stream: StreamOptions {
            concurrency: args.client.concurrency.unwrap_or(defaults.concurrency),
            max_concurrency: args.client.concurrency.unwrap_or(defaults.max_concurrency),
            stall_timeout,
            max_retries: args.client.retries,
            ..StreamOptions::default()
        },
        ..pushdown_client::LoaderOptions::default()
    })
}

/// `run --mixture FILE`: the mixture read as a world-size-1 loader reads it.
async fn run_mixture_file(path: &std::path::Path, args: RunArgs) -> Result<()> {
    let (file, sources) = MixtureFile::from_file(path)?;
    let options = loader_options(&args, file.batch_size, file.shuffle_buffer)?;
    let servers = args.client.servers.clone();
    let report = tokio::task::spawn_blocking(move || {
        read_loader(
            pushdown_client::Loader::mixture(&servers, sources, options)?,
            "mixture",
        )
    })
    .await??;
    print!("{report}");
    Ok(())
}

/// `run --pack COLUMN:LENGTH[:EOS]` or `--bucket-by COLUMN:B1,...`, or a pipeline with a
/// `pack` or `bucket_by` step: the query's documents packed into blocks, or its rows batched
/// by length bucket, read as a world-size-1 loader reads them.
async fn run_regrouped_source(args: RunArgs) -> Result<()> {
    let source = match (&args.pipeline, &args.sql) {
        (Some(path), None) => LoaderSource::Pipeline(Pipeline::from_file(path)?),
        (None, Some(sql)) => LoaderSource::Sql(sql.clone()),
        _ => anyhow::bail!("--pack and --bucket-by take the rows of a pipeline or --sql"),
    };
    let step = match &source {
        LoaderSource::Pipeline(p) => p.without_regroup().1,
        LoaderSource::Sql(_) => None,
    };
    if step.is_some() && (args.pack.is_some() || args.bucket_by.is_some()) {
        anyhow::bail!("the pipeline has its own pack or bucket_by step: drop --pack or --bucket-by");
    }
    let what = match (&args.pack, &step) {
        (Some(_), _) | (None, Some(pushdown_planner::Step::Pack(_))) => "packed",
        _ => "bucketed",
    };
    // A pipeline's own step takes its batch size from the pipeline's batch step.
    let batch_size = if step.is_some() {
        None
    } else {
        Some(args.pack_batch)
    };
    let options = loader_options(&args, batch_size, None)?;
    let servers = args.client.servers.clone();
    let (pack, bucket_by) = (args.pack.clone(), args.bucket_by.clone());
    let report = tokio::task::spawn_blocking(move || {
        let loader = match (pack, bucket_by) {
            (Some(pack), _) => pushdown_client::Loader::packed(&servers, source, pack, options)?,
            (None, Some(by)) => pushdown_client::Loader::bucketed(&servers, source, by, options)?,
            // The pipeline's own step regroups it.
            (None, None) => pushdown_client::Loader::new(&servers, source, options)?,
        };
        read_loader(loader, what)
    })
    .await??;
    print!("{report}");
    Ok(())
}

async fn scaling(args: ScalingArgs) -> Result<()> {
    let client = PushdownClient::connect_with(&args.servers, args.credentials.options()?).await?;
    for (url, s) in client.scaling().await? {
        match args.format {
            Format::Json => println!("{}", pushdown_server::scaling_json(&s)),
            Format::Text => println!(
                "{url}: {} of {} server(s) wanted ({}); busy {:.0}% of {} core(s); {} client(s) \
                 waiting {:.0}% of their time over {:.0} s\n  {}",
                s.servers_wanted,
                s.servers,
                s.bottleneck,
                s.busy_fraction * 100.0,
                s.cores,
                s.clients,
                s.wait_fraction * 100.0,
                s.window_seconds,
                s.reason
            ),
        }
    }
    Ok(())
}

async fn explain(args: ExplainArgs) -> Result<()> {
    let pipeline = Pipeline::from_file(&args.pipeline)?;
    match (&args.server, &args.data) {
        (Some(url), _) => {
            let client = PushdownClient::connect_with(&[url], args.credentials.options()?).await?;
            let schema = client.dataset_schema(&pipeline.dataset).await?;
            let link = Link {
                server_cores: args.server_cores,
                client_cores: args.client_cores,
                ..args.bandwidth.map_or_else(Link::auto, Link::bandwidth)
            }
            .resolve(&client.urls())
            .await;
            let costed = costed_plan(&client, &pipeline, &schema, link).await?;
            match args.format {
                Format::Text => print!("link: {link}\n{}", costed.explain()),
                Format::Json => println!("{}", costed.to_json()),
            }
        }
        (None, Some(data)) => {
            let server = Server::builder(open_store(data)?).open().await?;
            let datasets = server.catalog().snapshot();
            let dataset = datasets.get(&pipeline.dataset).with_context(|| {
                format!(
                    "unknown dataset `{}`; known: {:?}",
                    pipeline.dataset,
                    datasets.keys().collect::<Vec<_>>()
                )
            })?;
            let plan = pushdown_planner::plan(&pipeline, &dataset.schema)?;
            match args.format {
                Format::Text => print!("{}", plan.explain()),
                Format::Json => anyhow::bail!("--format json needs --server (the measured costs)"),
            }
        }
        (None, None) => anyhow::bail!("give --server or --data"),
    }
    Ok(())
}
