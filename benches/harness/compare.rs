//! The product's claim, measured: pushdown against what a user would run instead, on the
//! same data and the same link, in one run.
//!
//! Contenders, each running the whole workload to the end:
//!
//! * **pushdown**: a server process on the far side of the link, the planner's placement;
//! * **no pushdown**: the datasets in a real S3-compatible server (s3s-fs's storage,
//!   `tools/s3-server`) on the far side;
//!   the trainer runs the same engine itself, fetching Parquet byte ranges over the link
//!   (column chunks it needs, row groups the statistics keep: a good `pyarrow.dataset`
//!   loader);
//! * **full-row service**: the server process streams every row and column; the trainer
//!   filters and transforms;
//! * **local**: the same engine in the trainer on local files: no network, no IPC.
//!
//! The server (or the S3 server) is pinned to CPU 0, the trainer (this process) to CPU 1.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use futures::{Stream, StreamExt};
use pushdown_client::run::{RunOptions, run};
use pushdown_client::{LoaderOptions, LoaderSource, Push, PushdownClient, RowSteps, StreamOptions};
use pushdown_planner::{Pipeline, Plan};
use pushdown_protocol::{CodecInputs, Compression, LinkKnown, Profiled, Query, ScanRequest, choose_codec};
use pushdown_server::{Server, ServerConfig};

use crate::link::{Kind, Link};
use crate::process::{ServerProcess, cpu_seconds, peak_rss, reset_peak_rss};
use crate::s3::S3Server;
use crate::{Datasets, Options};

/// A workload: its pipeline, and its scan part (projection and filter) as SQL.
#[derive(Debug, Clone)]
pub struct Workload {
    pub name: &'static str,
    pub pipeline: Pipeline,
    pub scan: String,
}

/// The TPC-H Q6 predicate.
const Q6: &str = "l_shipdate >= DATE '1994-01-01' AND l_shipdate < DATE '1995-01-01' \
                  AND l_discount BETWEEN 0.05 AND 0.07 AND l_quantity < 24";

/// The placement benchmark's pipelines with the filters (10% of the images, one day
/// of clicks, pruned by statistics: rows are in day order), and TPC-H `lineitem` with Q6's
/// projection and filter, its money columns cast to `float32` features.
pub fn workloads() -> Vec<Workload> {
    let mut workloads: Vec<Workload> = crate::placement::pipelines_filtered("label < 100", "day = 3")
        .into_iter()
        .map(|(name, pipeline)| {
            let scan = match name {
                "images" => "SELECT image, label FROM images WHERE label < 100",
                "clicks" => "SELECT label, i1, i2, i3, i4, c1, c2, c3, c4, c5 FROM clicks WHERE day = 3",
                _ => "SELECT body FROM text WHERE lang = 'en' AND quality > 0.5",
            };
            Workload {
                name,
                pipeline,
                scan: scan.into(),
            }
        })
        .collect();
    let mut lineitem = Pipeline::new("lineitem").filter(Q6);
    for (column, feature) in [
        ("l_quantity", "quantity"),
        ("l_extendedprice", "price"),
        ("l_discount", "discount"),
        ("l_tax", "tax"),
    ] {
        lineitem = lineitem.map("cast_to", column, ["float32"], feature);
    }
    workloads.push(Workload {
        name: "lineitem",
        pipeline: lineitem
            .select(["quantity", "price", "discount", "tax"])
            .batch(4096),
        scan: format!("SELECT l_quantity, l_extendedprice, l_discount, l_tax FROM lineitem WHERE {Q6}"),
    });
    workloads
}

pub const PUSHDOWN: &str = "pushdown";
/// The supplementary slow link.
const SLOW_LINK_BITS: u64 = 100_000_000;
/// Epochs per pushdown run: one connection and one `GetFlightInfo` serve them all.
const EPOCHS_PER_RUN: usize = 4;
/// Pushdown on a server beside the S3 server, reading from it (a server beside a gateway).
pub const PUSHDOWN_S3: &str = "pushdown, server reading S3";
pub const NO_PUSHDOWN: &str = "no pushdown: our engine, S3";
pub const NO_PUSHDOWN_PYARROW: &str = "no pushdown: pyarrow.dataset, S3";
pub const FINISHED: &str = "finished batches (tf.data service style)";
pub const LOCAL: &str = "local (no network)";

/// One contender on one workload and link.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Cell {
    pub workload: &'static str,
    pub link: String,
    pub rate_bits: Option<u64>,
    pub contender: &'static str,
    pub samples: u64,
    pub samples_per_s: f64,
    pub secs: f64,
    /// Counted on the link where there is one; else what the trainer received.
    pub wire_bytes: u64,
    /// The far side's server process (pushdown's, or the finished-batch worker).
    pub server_cpu_s: Option<f64>,
    /// The S3 server's.
    pub store_cpu_s: Option<f64>,
    pub trainer_cpu_s: f64,
    pub server_peak_rss: Option<u64>,
    pub trainer_peak_rss: Option<u64>,
    /// Fraction of the trainer's time spent waiting for data to arrive.
    pub waited: f64,
    /// For pushdown: how many of the pipeline's ops the planner placed on the server.
    pub ops_pushed: Option<usize>,
    /// For pushdown: the share of shards those ops ran on at the server (below 1: split).
    pub server_fraction: Option<f64>,
    /// For pushdown: the stream codec the planner chose.
    pub compression: Option<String>,
    /// The resource that bounds the cell, from what was measured ([`Cell::name_bottleneck`]).
    pub bottleneck: String,
}

impl Cell {
    pub fn bytes_per_sample(&self) -> f64 {
        self.wire_bytes as f64 / self.samples.max(1) as f64
    }

    /// The fraction of a shaped link's rate the cell used.
    /// [`Cell::link_use`] as a percentage, `–` on loopback.
    fn link_use_text(&self) -> String {
        self.link_use()
            .map_or("–".to_owned(), |u| format!("{:.0}%", u * 100.0))
    }

    pub fn link_use(&self) -> Option<f64> {
        self.rate_bits
            .map(|rate| self.wire_bytes as f64 * 8.0 / self.secs.max(1e-9) / rate as f64)
    }

    /// The busiest resource: the far core (the server and the S3 server share CPU 0), the
    /// trainer's core, or the link, each as the fraction of the cell's time it was busy.
    /// Below 70% nothing is saturated: the contender waits on round trips or its own
    /// pipeline's structure (named "latency").
    fn name_bottleneck(&self) -> String {
        let secs = self.secs.max(1e-9);
        let far = self.server_cpu_s.unwrap_or(0.0) + self.store_cpu_s.unwrap_or(0.0);
        let far_name = match (self.server_cpu_s, self.store_cpu_s) {
            (Some(_), Some(_)) => "far CPU (server + S3)",
            (None, Some(_)) => "S3 server CPU",
            _ => "server CPU",
        };
        let mut uses = vec![(far_name, far / secs), ("trainer CPU", self.trainer_cpu_s / secs)];
        if let Some(link) = self.link_use() {
            uses.push(("link", link));
        }
        let (name, busy) = uses
            .into_iter()
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .unwrap_or(("none", 0.0));
        if busy < 0.7 {
            format!("latency ({name} {:.0}%)", busy * 100.0)
        } else {
            format!("{name} {:.0}%", busy * 100.0)
        }
    }
}

/// What one run of a contender returns.
struct Outcome {
    samples: u64,
    /// Bytes the trainer received (when the link cannot count them).
    received: u64,
    waited: Duration,
    /// The run's own time (a contender in a child process leaves out its start-up).
    elapsed: Duration,
    /// CPU seconds of trainer-side child processes (the harness's own are counted apart).
    child_cpu_s: f64,
}

/// Applies the trainer's row-wise steps (its ops and selects) to `batches` and counts the
/// samples. The shuffle window and batching, which cost every contender the same, are left
/// out of the contenders: that favours them, never us (the finished-batch service, which
/// shuffles and batches on the far side, is the exception, and pays for it there).
async fn drive<S, E>(
    mut batches: S,
    plan: &Plan,
    schema: SchemaRef,
    resources: Arc<dyn pushdown_ops::Resources>,
) -> Result<(u64, Duration)>
where
    S: Stream<Item = std::result::Result<RecordBatch, E>> + Unpin,
    E: std::error::Error + Send + Sync + 'static,
{
    let steps = RowSteps::new(&row_steps(plan), schema, 1, resources)?;
    let (mut samples, mut waited) = (0u64, Duration::ZERO);
    for key in 0u64.. {
        let asked = Instant::now();
        let next = batches.next().await;
        waited += asked.elapsed();
        let Some(batch) = next else { break };
        samples += steps.apply(batch?, key)?.num_rows() as u64;
    }
    Ok((samples, waited))
}

/// The plan's client steps that apply row by row (ops and selects).
fn row_steps(plan: &Plan) -> Vec<pushdown_planner::Step> {
    plan.client_steps
        .iter()
        .filter(|s| {
            matches!(
                s,
                pushdown_planner::Step::Select { .. } | pushdown_planner::Step::Map(_)
            )
        })
        .cloned()
        .collect()
}

/// The same engine in this process over `server`'s store, everything the planner may push
/// run here.
async fn in_process(server: &Server, plan: &Plan) -> Result<Outcome> {
    let start = Instant::now();
    let read0 = server.metrics().store_bytes_read.get();
    let request = ScanRequest::new(Query::Fragment(plan.fragment.clone()));
    let (schema, batches) = pushdown_baselines::execute(server.node(), &request).await?;
    let (samples, waited) = drive(batches, plan, schema, Arc::new(pushdown_ops::NoResources)).await?;
    Ok(Outcome {
        samples,
        received: server.metrics().store_bytes_read.get() - read0,
        waited,
        elapsed: start.elapsed(),
        child_cpu_s: 0.0,
    })
}

/// `benches/python/pyarrow_dataset.py` in a child process (pinned with this one to the
/// trainer's core): pyarrow.dataset over the S3 server, the pipeline's ops by
/// `pushdown.Transform`. It runs epochs until `MIN_CELL_SECS` have passed.
async fn pyarrow_dataset(host: SocketAddr, workload: &Workload) -> Result<Outcome> {
    let venv = crate::s3::venv()?;
    let script = std::env::current_dir()?.join("benches/python/pyarrow_dataset.py");
    let mut command = std::process::Command::new(venv.join("python"));
    command
        .arg(script)
        .args(["--endpoint", &host.to_string()])
        .args(["--bucket", crate::s3::BUCKET])
        .args(["--key", crate::s3::KEY])
        .args(["--secret", crate::s3::SECRET])
        .args(["--workload", workload.name])
        .args(["--pipeline", &serde_json::to_string(&workload.pipeline)?])
        .args(["--min-secs", &crate::MIN_CELL_SECS.to_string()]);
    let out = tokio::task::spawn_blocking(move || command.output())
        .await?
        .context("running benches/python/pyarrow_dataset.py")?;
    if !out.status.success() {
        anyhow::bail!(
            "pyarrow.dataset contender failed (PUSHDOWN_PY_PROFILE=release scripts/setup-python.sh --bench installs it): {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).context("the contender's JSON line")?;
    let secs = |k: &str| v[k].as_f64().with_context(|| format!("{k} in {v}"));
    Ok(Outcome {
        samples: v["samples"].as_u64().context("samples")?,
        received: v["received"].as_u64().context("received")?,
        waited: Duration::from_secs_f64(secs("waited")?),
        elapsed: Duration::from_secs_f64(secs("secs")?),
        child_cpu_s: secs("cpu_s")?,
    })
}

/// The finished-batch service's trainer: reads `EPOCHS_PER_RUN` epochs of finished batches.
async fn finished_batches(addr: SocketAddr, link: &Link, workload: &Workload) -> Result<Outcome> {
    let pipeline = workload.pipeline.clone();
    let compression = choose_codec(CodecInputs {
        forced: None,
        link: LinkKnown::Given(link.rate_bytes()),
        profiled: Profiled::No,
    });
    let received = tokio::task::spawn_blocking(move || {
        crate::finished::receive(addr, &pipeline, 1, EPOCHS_PER_RUN, compression)
    })
    .await??;
    Ok(Outcome {
        samples: received.samples,
        received: received.bytes,
        waited: received.waited,
        elapsed: received.elapsed,
        child_cpu_s: 0.0,
    })
}

/// A placement the planner chose: the ops pushed, the share of shards they run on at the
/// server (below 1: the rest are finished by the trainer), and the stream codec.
#[derive(Debug, Clone, Copy)]
struct Placed {
    pushed: usize,
    server_fraction: f64,
    compression: Compression,
}

impl Placed {
    fn describe(self, cell: &mut Cell) {
        cell.ops_pushed = Some(self.pushed);
        cell.server_fraction = Some(self.server_fraction);
        cell.compression = Some(self.compression.to_string());
    }
}

/// The planner's placement for `workload` over `link` (told 1 server core, 1 trainer core and
/// the link's rate), split placements included. Planning (profiling a sample on the server)
/// happens once per job, not per epoch, so it is not part of the timed runs.
async fn placement(client: &PushdownClient, link: &Link, workload: &Workload) -> Result<Placed> {
    let schema = client.dataset_schema(&workload.pipeline.dataset).await?;
    let env = one_core_each(link.rate_bytes());
    let costed = pushdown_client::costed_plan(client, &workload.pipeline, &schema, env).await?;
    Ok(Placed {
        pushed: costed.chosen.pushed,
        server_fraction: costed.chosen.server_fraction,
        compression: costed.chosen.compression,
    })
}

async fn pushdown(url: &str, link: &Link, workload: &Workload, placed: Placed) -> Result<Outcome> {
    let start = Instant::now();
    let report = run(&RunOptions {
        loader: LoaderOptions {
            link: one_core_each(link.rate_bytes()),
            push: Push::placed(placed.pushed, placed.server_fraction),
            compression: Some(placed.compression),
            // A trainer plans and connects once and streams epoch after epoch.
            epochs: EPOCHS_PER_RUN,
            seed: 1,
            ..LoaderOptions::default()
        },
        ..RunOptions::new(
            vec![url.to_owned()],
            LoaderSource::Pipeline(workload.pipeline.clone()),
        )
    })
    .await?;
    Ok(Outcome {
        samples: report.rows,
        received: report.totals.bytes_received,
        waited: report.waited,
        elapsed: start.elapsed(),
        child_cpu_s: 0.0,
    })
}

/// The far side of `link`, and what to account there: a server process (pushdown's, or the
/// finished-batch worker), the S3 server, both (they share the far core), or neither.
struct Far<'a> {
    server: Option<String>,
    store: Option<String>,
    link: &'a Link,
}

/// Runs `contender` `reps` times; keeps the fastest (noise only slows runs down).
async fn measure<F, Fut>(
    options: &Options,
    workload: &'static str,
    contender: &'static str,
    far: Far<'_>,
    mut once: F,
) -> Result<Cell>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Outcome>>,
{
    let mut best: Option<Cell> = None;
    for _ in 0..options.reps_resolved {
        for pid in far.server.iter().chain(&far.store) {
            reset_peak_rss(pid);
        }
        reset_peak_rss("self");
        let cpu = |pid: &Option<String>| pid.as_deref().and_then(cpu_seconds);
        let (wire0, server0, store0, trainer0) = (
            far.link.bytes(),
            cpu(&far.server),
            cpu(&far.store),
            cpu_seconds("self"),
        );
        let mut outcome = Outcome {
            samples: 0,
            received: 0,
            waited: Duration::ZERO,
            elapsed: Duration::ZERO,
            child_cpu_s: 0.0,
        };
        while outcome.elapsed.as_secs_f64() < crate::MIN_CELL_SECS {
            let o = once()
                .await
                .with_context(|| format!("{workload}: {contender} over {}", far.link.describe()))?;
            outcome.samples += o.samples;
            outcome.received += o.received;
            outcome.waited += o.waited;
            outcome.elapsed += o.elapsed;
            outcome.child_cpu_s += o.child_cpu_s;
        }
        let secs = outcome.elapsed.as_secs_f64();
        let wire_bytes = match (far.link.bytes(), wire0) {
            (Some(b), Some(a)) => b - a,
            _ => outcome.received,
        };
        let delta = |pid: &Option<String>, before: Option<f64>| cpu(pid).zip(before).map(|(b, a)| b - a);
        let mut cell = Cell {
            workload,
            link: far.link.describe(),
            rate_bits: far.link.rate_bits,
            contender,
            samples: outcome.samples,
            samples_per_s: outcome.samples as f64 / secs,
            secs,
            wire_bytes,
            server_cpu_s: delta(&far.server, server0),
            store_cpu_s: delta(&far.store, store0),
            trainer_cpu_s: cpu_seconds("self").zip(trainer0).map_or(f64::NAN, |(b, a)| b - a)
                + outcome.child_cpu_s,
            server_peak_rss: far.server.as_deref().and_then(peak_rss),
            trainer_peak_rss: peak_rss("self"),
            waited: outcome.waited.as_secs_f64() / secs,
            ops_pushed: None,
            server_fraction: None,
            compression: None,
            bottleneck: String::new(),
        };
        cell.bottleneck = cell.name_bottleneck();
        if best.as_ref().is_none_or(|b| cell.samples_per_s > b.samples_per_s) {
            best = Some(cell);
        }
    }
    let cell = best.context("no repetitions")?;
    eprintln!(
        "  {:8} {:24} {:45} {:>10.0} samples/s  {:>10} on the wire  {}",
        cell.workload,
        cell.link,
        cell.contender,
        cell.samples_per_s,
        pushdown_client::run::bytes(cell.wire_bytes),
        cell.bottleneck
    );
    Ok(cell)
}

/// The engine in this process with one CPU thread; `reads_in_flight` row-group ranges read
/// at once (8 for S3, as `pushdown serve` does: a trainer's loader tuned for S3 keeps
/// requests in flight).
async fn in_process_server(
    store: Arc<dyn object_store::ObjectStore>,
    reads_in_flight: usize,
) -> Result<Server> {
    let config = ServerConfig {
        cpu_threads: 1,
        store_reads_in_flight: reads_in_flight,
        // Contenders compute every repetition: nothing served from the fragment cache.
        cache: pushdown_server::CacheConfig {
            default_mode: pushdown_server::CacheMode::Off,
            ..pushdown_server::CacheConfig::default()
        },
        ..ServerConfig::default()
    };
    Ok(Server::builder(store).config(config).open().await?)
}

/// Where a far-side process of `link` listens: `port` in the namespace, else any loopback port.
fn far_listen(link: &Link, port: u16) -> String {
    match link.kind {
        Kind::Netns => format!("10.233.0.2:{port}"),
        _ => "127.0.0.1:0".to_owned(),
    }
}

/// Every contender on every workload over `link`.
pub async fn over_link(options: &Options, data: &Datasets, link: Link) -> Result<Vec<Cell>> {
    let ns = link.namespace();
    let server = ServerProcess::start(&data.root, &far_listen(&link, 50551), 1, ns, Some("0"))?;
    let link = match link.kind {
        Kind::Proxy => Link::proxy(link.rate_bits.unwrap_or(0), server.addr).await?,
        _ => link,
    };
    let url = link.client_url(server.addr);
    let client = crate::connect(&url).await?;
    // The pacing proxy forwards to one server: the contenders that need more (S3, the
    // finished-batch worker) run over real links only.
    let real_link = link.kind != Kind::Proxy;

    // The same files in S3 on the far side; a pushdown server beside it reading from it; the
    // finished-batch worker.
    let s3_addr: SocketAddr = match link.kind {
        Kind::Netns => "10.233.0.2:50552".parse()?,
        _ => "127.0.0.1:50552".parse()?,
    };
    let store_server = S3Server::start(s3_addr, ns, Some("0"))?;
    let datasets: Vec<&str> = workloads().iter().map(|w| w.name).collect();
    store_server.upload(&data.root, &datasets).await?;
    let s3 = in_process_server(store_server.store()?, 8).await?;
    let local = in_process_server(pushdown_server::open_store(&data.root.to_string_lossy())?, 1).await?;
    let (beside_s3, worker) = if real_link {
        let beside = ServerProcess::start_with(
            "serve",
            &format!("s3://{}", crate::s3::BUCKET),
            &far_listen(&link, 50553),
            1,
            ns,
            Some("0"),
            &store_server.env(),
        )?;
        let worker = ServerProcess::start_with(
            "finished",
            &data.root.to_string_lossy(),
            &far_listen(&link, 50554),
            1,
            ns,
            Some("0"),
            &[],
        )?;
        (Some(beside), Some(worker))
    } else {
        (None, None)
    };
    let beside_url = beside_s3.as_ref().map(|p| link.client_url(p.addr));
    let beside_client = match &beside_url {
        Some(u) => Some(crate::connect(u).await?),
        None => None,
    };
    let worker_addr = match &worker {
        Some(w) => Some(far_addr(&link, w.addr)?),
        None => None,
    };

    let mut cells = Vec::new();
    for workload in workloads() {
        let schema = client.dataset_schema(&workload.pipeline.dataset).await?;
        // The trainer running everything itself: every op the planner may push, in-process.
        let all = pushdown_planner::plan_limited(&workload.pipeline, &schema, usize::MAX)?;
        let w = &workload;
        let name = workload.name;
        let far = |server: Option<&ServerProcess>, store: bool| Far {
            server: server.map(ServerProcess::pid),
            store: store.then(|| store_server.pid()),
            link: &link,
        };
        let placed = placement(&client, &link, w).await?;
        let mut cell = measure(options, name, PUSHDOWN, far(Some(&server), false), || {
            pushdown(&url, &link, w, placed)
        })
        .await?;
        placed.describe(&mut cell);
        cells.push(cell);
        if let (Some(beside), Some(beside_url), Some(beside_client)) =
            (&beside_s3, &beside_url, &beside_client)
        {
            let placed = placement(beside_client, &link, w).await?;
            let mut cell = measure(options, name, PUSHDOWN_S3, far(Some(beside), true), || {
                pushdown(beside_url, &link, w, placed)
            })
            .await?;
            placed.describe(&mut cell);
            cells.push(cell);
        }
        if real_link {
            cells.push(
                measure(options, name, NO_PUSHDOWN, far(None, true), || {
                    in_process(&s3, &all)
                })
                .await?,
            );
            match measure(options, name, NO_PUSHDOWN_PYARROW, far(None, true), || {
                pyarrow_dataset(s3_addr, w)
            })
            .await
            {
                Ok(cell) => cells.push(cell),
                Err(e) => eprintln!("  {name}: the pyarrow.dataset contender skipped: {e:#}"),
            }
        }
        if let (Some(worker), Some(addr)) = (&worker, worker_addr) {
            cells.push(
                measure(options, name, FINISHED, far(Some(worker), false), || {
                    finished_batches(addr, &link, w)
                })
                .await?,
            );
        }
        if link.kind == Kind::Loopback {
            cells.push(
                measure(options, name, LOCAL, far(None, false), || {
                    in_process(&local, &all)
                })
                .await?,
            );
        }
    }
    Ok(cells)
}

/// The address a trainer reaches a far-side process listening on `addr` at.
fn far_addr(link: &Link, addr: SocketAddr) -> Result<SocketAddr> {
    let url = link.client_url(addr);
    let host = url.strip_prefix("http://").unwrap_or(&url);
    host.parse().with_context(|| format!("far address {host:?}"))
}

/// Peak RSS of a server process serving `streams` concurrent streams of every column of the
/// images that pass the filter.
pub async fn rss_under_streams(data: &Datasets, streams: usize) -> Result<(u64, u64)> {
    let server = ServerProcess::start(&data.root, "127.0.0.1:0", 1, None, Some("0"))?;
    let url = format!("http://{}", server.addr);
    let client = crate::connect(&url).await?;
    reset_peak_rss(&server.pid());
    let info = client
        .plan(&ScanRequest::new(Query::Sql(
            "SELECT * FROM images WHERE label < 100".into(),
        )))
        .await?;
    let mut tasks = Vec::new();
    for _ in 0..streams {
        let (client, info) = (client.clone(), info.clone());
        tasks.push(pushdown_task::Task::spawn(async move {
            let options = StreamOptions {
                concurrency: 1,
                ..StreamOptions::default()
            };
            let mut stream = client.stream(&info, options)?;
            let mut rows = 0u64;
            while let Some(b) = stream.next().await {
                rows += b?.num_rows() as u64;
                // A slow trainer: streams stay open, so their buffers add up.
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Ok::<_, anyhow::Error>(rows)
        }));
    }
    let mut rows = 0;
    for t in tasks {
        rows += t.await??;
    }
    Ok((peak_rss(&server.pid()).unwrap_or(0), rows))
}

/// DuckDB's scan of a workload, one thread on CPU 0.
pub struct DuckScan {
    /// Rows of the dataset per second over the same files as the server.
    pub rows_per_s: f64,
    pub rows_out: u64,
    /// The same over a copy written by DuckDB's own Parquet writer (its default layout).
    pub own_layout_rows_per_s: Option<f64>,
}

/// Runs `benches/python/duckdb_scan.py` on a workload's scan query, DuckDB with one thread
/// on CPU 0; with `own_layout`, also over DuckDB's own copy of the dataset.
pub fn duckdb_scan(data: &Path, workload: &Workload, reps: usize, own_layout: bool) -> Result<DuckScan> {
    let venv = crate::s3::venv()?;
    let script = std::env::current_dir()?.join("benches/python/duckdb_scan.py");
    let mut command = std::process::Command::new("taskset");
    command
        .args(["-c", "0"])
        .arg(venv.join("python"))
        .arg(script)
        .arg("--data")
        .arg(data)
        .arg("--sql")
        .arg(&workload.scan)
        .arg("--reps")
        .arg(reps.to_string());
    if own_layout {
        command.arg("--own-layout");
    }
    let out = command
        .output()
        .context("running benches/python/duckdb_scan.py")?;
    if !out.status.success() {
        anyhow::bail!("duckdb: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value = serde_json::from_str(text.trim()).context("duckdb output")?;
    let secs = v["secs"].as_f64().context("secs")?;
    let rows_in = v["rows_in"].as_f64().context("rows_in")?;
    Ok(DuckScan {
        rows_per_s: rows_in / secs,
        rows_out: v["rows_out"].as_u64().context("rows_out")?,
        own_layout_rows_per_s: v["own_layout_secs"].as_f64().map(|s| rows_in / s),
    })
}

/// The server's scan speed on the same query: a server process pinned to CPU 0 with one
/// thread, the rows received by a client over loopback. `(rows in the dataset per second,
/// rows out)`.
pub async fn server_scan(
    data: &Datasets,
    workload: &Workload,
    rows_in: u64,
    reps: usize,
) -> Result<(f64, u64)> {
    let server = ServerProcess::start(&data.root, "127.0.0.1:0", 1, None, Some("0"))?;
    let url = format!("http://{}", server.addr);
    crate::connect(&url).await?;
    let mut best: Option<(f64, u64)> = None;
    for _ in 0..reps.max(1) {
        let report = run(&RunOptions {
            loader: LoaderOptions {
                link: one_core_each(f64::INFINITY),
                seed: 1,
                ..LoaderOptions::default()
            },
            ..RunOptions::new(vec![url.clone()], LoaderSource::Sql(workload.scan.clone()))
        })
        .await?;
        let rate = rows_in as f64 / report.elapsed.as_secs_f64();
        if best.is_none_or(|b| rate > b.0) {
            best = Some((rate, report.rows));
        }
    }
    best.context("no repetitions")
}

/// One verdict of the targets table.
struct Target {
    what: String,
    measured: String,
    needed: String,
    met: bool,
}

/// Runs the whole comparison and returns the Markdown section.
pub async fn suite(options: &Options, data: &Datasets, command: &str) -> Result<String> {
    let mut cells = Vec::new();
    // 100 Mbit/s is supplementary: there the no-pushdown trainer is bound by the link, the
    // byte-ratio target's premise.
    for rate in [
        None,
        Some(1_000_000_000u64),
        Some(10_000_000_000),
        Some(SLOW_LINK_BITS),
    ] {
        let link = match rate {
            None => Link::loopback(),
            Some(r) => crate::make_link(r, options).await?,
        };
        cells.extend(over_link(options, data, link).await?);
    }
    let mut targets = Vec::new();
    for w in workloads() {
        let find = |link_rate: Option<u64>, contender: &str| {
            cells
                .iter()
                .find(|c| c.workload == w.name && c.rate_bits == link_rate && c.contender == contender)
        };
        for (rate, label) in [
            (1_000_000_000, "1 Gbit/s"),
            (SLOW_LINK_BITS, "100 Mbit/s (supplementary)"),
        ] {
            // Against the faster of the two no-pushdown loaders.
            let np = [NO_PUSHDOWN, NO_PUSHDOWN_PYARROW]
                .into_iter()
                .filter_map(|c| find(Some(rate), c))
                .max_by(|a, b| a.samples_per_s.total_cmp(&b.samples_per_s));
            let (Some(pd), Some(np)) = (find(Some(rate), PUSHDOWN), np) else {
                continue;
            };
            // Bytes per sample: cells run for different numbers of epochs.
            let ratio = np.bytes_per_sample() / pd.bytes_per_sample().max(1e-9);
            let needed = 0.8 * ratio * np.samples_per_s;
            targets.push(Target {
                what: format!("{}: pushdown at {label} ≥ 0.8 × (no-pushdown bytes ÷ pushdown bytes, per sample) × no-pushdown samples/s (the faster no-pushdown loader)", w.name),
                measured: format!(
                    "{:.0} samples/s (link use: pushdown {}, {} {})",
                    pd.samples_per_s,
                    pd.link_use_text(),
                    np.contender,
                    np.link_use_text()
                ),
                needed: format!("{needed:.0} (= 0.8 × {ratio:.2} × {:.0})", np.samples_per_s),
                met: pd.samples_per_s >= needed,
            });
        }
        if let (Some(pd), Some(local)) = (find(None, PUSHDOWN), find(None, LOCAL)) {
            let needed = 0.9 * local.samples_per_s;
            targets.push(Target {
                what: format!("{}: pushdown on loopback ≥ 0.9 × local", w.name),
                measured: format!("{:.0} samples/s", pd.samples_per_s),
                needed: format!("{needed:.0}"),
                met: pd.samples_per_s >= needed,
            });
        }
    }
    let streams = 64;
    let (rss, rows) = rss_under_streams(data, streams).await?;
    targets.push(Target {
        what: format!("server peak RSS with {streams} concurrent streams (`SELECT * FROM images WHERE label < 100`, {rows} rows in all)"),
        measured: pushdown_client::run::bytes(rss),
        needed: "≤ 1 GiB".into(),
        met: rss <= 1 << 30,
    });

    let results_dir = options.results.parent().unwrap_or(Path::new(".")).join("results");
    std::fs::create_dir_all(&results_dir)?;
    let json = results_dir.join("compare.json");
    std::fs::write(&json, serde_json::to_string_pretty(&cells)?)?;
    let plotted = plot(&json, &results_dir);

    let sizes: Vec<String> = data
        .rows
        .iter()
        .map(|(k, n, b)| format!("{} {n} rows ({})", k.name(), pushdown_client::run::bytes(*b)))
        .collect();
    let mut out = format!(
        "## Contenders: pushdown against what a user would run instead\n\n\
         Command: `{command}`  \nMachine: {}; the server (or the S3 server) pinned to CPU 0 with one thread, the trainer to CPU 1.  \n\
         Data: {}.  \nEach cell runs the workload to the end (again, until it has run ≥ 1.5 s); samples/s is the best of {} run(s); bytes are counted on the link \
         (loopback: what the trainer received, or read from the store); \"waited\" is the fraction of the trainer's time spent \
         waiting for data; \"bottleneck\" is the busiest of the far core (server and S3 server share CPU 0), the trainer's core and the link, \
         busy for that fraction of the cell's time (below 70%: \"latency\", nothing saturated).\n\n\
         Contenders: **pushdown** (the planner's placement; a server over local files, and a server beside the S3 server reading from it); \
         **no pushdown** from S3 (s3s-fs's storage with TCP_NODELAY, SigV4 checked, objects on disk) with projection, statistics pruning and concurrent range reads: \
         this project's engine in the trainer, and `pyarrow.dataset` (pre-buffered coalesced reads, 4 files and 16 batches read ahead, \
         the ops by `pushdown.Transform`: the same kernels); **finished batches**, tf.data service's design: the whole pipeline, \
         augmentation, shuffle and batching included, on the far core, finished tensors over the link; **local**: the engine on local files.\n\n",
        crate::machine(),
        sizes.join(", "),
        options.reps_resolved,
    );
    for w in workloads() {
        out.push_str(&format!("### {}\n\n", w.name));
        out.push_str("| link | contender | samples/s | bytes per sample | link use | server CPU s | S3 server CPU s | trainer CPU s | waited | bottleneck | server peak RSS |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|\n");
        let opt_secs = |s: Option<f64>| s.map_or("–".to_owned(), |s| format!("{s:.2}"));
        for c in cells.iter().filter(|c| c.workload == w.name) {
            out.push_str(&format!(
                "| {} | {} | {:.0} | {:.0} | {} | {} | {} | {:.2} | {:.0}% | {} | {} |\n",
                c.link,
                match (c.ops_pushed, &c.compression) {
                    (Some(k), Some(codec)) => format!(
                        "{} ({k} op(s) on the server{}, {codec})",
                        c.contender,
                        crate::placement::on_shards(c.server_fraction.unwrap_or(1.0))
                    ),
                    _ => c.contender.to_owned(),
                },
                c.samples_per_s,
                c.bytes_per_sample(),
                c.link_use_text(),
                opt_secs(c.server_cpu_s),
                opt_secs(c.store_cpu_s),
                c.trainer_cpu_s,
                c.waited * 100.0,
                c.bottleneck,
                c.server_peak_rss
                    .map_or("–".to_owned(), pushdown_client::run::bytes),
            ));
        }
        out.push('\n');
        out.push_str(&summary(&cells, w.name));
    }
    out.push_str("### Targets\n\n| target | measured | needed | |\n|---|---:|---:|---|\n");
    for t in &targets {
        out.push_str(&format!(
            "| {} | {} | {} | {} |\n",
            t.what,
            t.measured,
            t.needed,
            if t.met { "met" } else { "**missed**" }
        ));
    }
    out.push('\n');
    if plotted {
        out.push_str("![samples per second](results/compare-samples.png)\n\n![bytes on the wire per sample](results/compare-bytes.png)\n\n");
    } else {
        out.push_str("(Plots need matplotlib: `scripts/setup-python.sh --bench`.)\n\n");
    }
    Ok(out)
}

/// Per link: pushdown against the fastest other contender that crosses the link, in words.
fn summary(cells: &[Cell], workload: &str) -> String {
    let mut out = String::new();
    let mut links: Vec<(&str, Option<u64>)> = Vec::new();
    for c in cells.iter().filter(|c| c.workload == workload) {
        if !links.iter().any(|(l, _)| *l == c.link) {
            links.push((&c.link, c.rate_bits));
        }
    }
    for (link, _) in links {
        let here: Vec<&Cell> = cells
            .iter()
            .filter(|c| c.workload == workload && c.link == link)
            .collect();
        let Some(pd) = here.iter().find(|c| c.contender == PUSHDOWN) else {
            continue;
        };
        let Some(best) = here
            .iter()
            .filter(|c| ![PUSHDOWN, PUSHDOWN_S3, LOCAL].contains(&c.contender))
            .max_by(|a, b| a.samples_per_s.total_cmp(&b.samples_per_s))
        else {
            continue;
        };
        let ratio = pd.samples_per_s / best.samples_per_s.max(1e-9);
        out.push_str(&format!(
            "* {link}: pushdown {} the best other contender, {} ({ratio:.2}×); pushdown bound by {}, {} by {}.\n",
            if ratio >= 1.05 {
                "beats"
            } else if ratio > 0.95 {
                "ties"
            } else {
                "loses to"
            },
            best.contender,
            pd.bottleneck,
            best.contender,
            best.bottleneck,
        ));
    }
    out.push('\n');
    out
}

pub(crate) fn dataset_rows(data: &Datasets, name: &str) -> u64 {
    data.rows
        .iter()
        .find(|(k, _, _)| k.name() == name)
        .map_or(0, |(_, n, _)| *n as u64)
}

/// Renders the PNGs with matplotlib, when installed.
fn plot(json: &Path, dir: &Path) -> bool {
    let Ok(venv) = crate::s3::venv() else { return false };
    std::process::Command::new(venv.join("python"))
        .arg("benches/python/plot_compare.py")
        .arg(json)
        .arg(dir)
        .status()
        .is_ok_and(|s| s.success())
}

/// The same scan by the server's engine in this process (no Flight, no IPC): separates the
/// engine's speed from the transport's. Rows in the dataset per second.
pub(crate) async fn engine_scan(
    data: &Datasets,
    workload: &Workload,
    rows_in: u64,
    reps: usize,
) -> Result<f64> {
    let server = in_process_server(pushdown_server::open_store(&data.root.to_string_lossy())?, 1).await?;
    let request = ScanRequest::new(Query::Sql(workload.scan.clone()));
    let mut best = 0.0f64;
    for _ in 0..reps.max(1) {
        let start = Instant::now();
        let (_, mut batches) = pushdown_baselines::execute(server.node(), &request).await?;
        while let Some(b) = batches.next().await {
            b?;
        }
        best = best.max(rows_in as f64 / start.elapsed().as_secs_f64());
    }
    Ok(best)
}

/// The planner's view of a link of `bytes_per_s` between one server core and one trainer core.
pub(crate) fn one_core_each(bytes_per_s: f64) -> pushdown_client::Link {
    pushdown_client::Link {
        server_cores: Some(1.0),
        client_cores: Some(1.0),
        ..pushdown_client::Link::bandwidth(bytes_per_s)
    }
}
