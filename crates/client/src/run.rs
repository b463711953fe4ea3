//! `pushdown run`: a [`Prepared`] query streamed to the end, epoch after epoch, as record
//! batches; optionally written to a Parquet file; reported.
//!
//! It is the loader's sample sequence (same shard order, shuffle windows, batches and
//! client-op randomness for a seed), read by one process with no tensors: a pipeline run
//! with `pushdown run --seed S` yields the rows a [`crate::Loader`] of world size 1 and seed
//! `S` yields, in the same order.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use arrow::array::RecordBatch;
use parquet::arrow::ArrowWriter;
use pushdown_planner::Plan;
use pushdown_protocol::{Compression, PlanEstimate, StreamStats};

use crate::client::PushdownClient;
use crate::error::{ClientError, Result};
use crate::loader::{Begun, EpochAhead, LoaderOptions, LoaderSource, Prepared};
use crate::stream::{SharedTotals, StreamTotals};

/// What to run and where to put it.
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub servers: Vec<String>,
    pub source: LoaderSource,
    /// Seed, epochs, batching, placement, codec, link: the loader's options (rank 0 of 1).
    pub loader: LoaderOptions,
    /// Write the delivered batches here as a Parquet file (zstd).
    pub out: Option<PathBuf>,
}

impl RunOptions {
    /// One epoch of `source` from `servers` with the loader's defaults (seed 0, the planner's
    /// placement over a 1 Gbit/s link), nothing written.
    pub fn new(servers: Vec<String>, source: LoaderSource) -> Self {
        Self {
            servers,
            source,
            loader: LoaderOptions::default(),
            out: None,
        }
    }
}

/// What a run delivered and what it cost.
#[derive(Debug, Clone)]
pub struct RunReport {
    pub plan: Option<Plan>,
    pub estimate: Option<PlanEstimate>,
    pub endpoints: usize,
    /// The stream's codec.
    pub compression: Compression,
    pub rows: u64,
    pub batches: u64,
    pub elapsed: Duration,
    /// Time the consumer spent waiting for the next prepared batch (the rest of `elapsed` it
    /// spent writing).
    pub waited: Duration,
    pub epochs: usize,
    /// Epochs begun with the one started ahead of them (the [`crate::Loader`]'s policy).
    pub epochs_ahead: u64,
    /// Summed over epochs.
    pub totals: StreamTotals,
    /// The fragment ops this client ran on shards the servers left un-reduced.
    pub completed: crate::CompletionTotals,
    /// Rows of the fragment's output (every row passes through each of its ops).
    pub fragment_ops: usize,
    /// What each resource was used for, to name the run's bottleneck.
    pub usage: Usage,
}

/// How busy each resource a run used was, as measured.
#[derive(Debug, Clone, Default)]
pub struct Usage {
    /// CPU seconds this process used during the run, and the cores it may use.
    pub trainer_cpu: Option<f64>,
    pub trainer_cores: usize,
    /// The link's bandwidth the run was planned for (bytes/s; infinite: unlimited).
    pub link_bytes_per_s: f64,
    /// The link as resolved against the servers: the figure and where it came from.
    pub link: Option<crate::Link>,
    /// Each server's CPU use during the run (all its clients'), from the CPU seconds its
    /// scaling signal reports before and after.
    pub servers: Vec<ServerUsage>,
}

#[derive(Debug, Clone)]
pub struct ServerUsage {
    pub url: String,
    /// The share of its cores busy during the run.
    pub busy: f64,
    pub cores: u32,
}

/// The resources of a run, each with the share of its capacity used.
#[derive(Debug, Clone, PartialEq)]
pub struct Shares {
    pub server_cpu: Option<f64>,
    pub link: Option<f64>,
    pub trainer_cpu: Option<f64>,
    /// The share of the run the consumer was not waiting for batches (writing them out).
    pub consumer: f64,
}

/// A resource this busy bounds the run.
const SATURATED: f64 = 0.75;

impl Shares {
    /// The busiest resource, when it is busy enough to bound the run.
    pub fn bottleneck(&self) -> Option<(&'static str, f64)> {
        [
            ("server CPU", self.server_cpu),
            ("link", self.link),
            ("trainer CPU", self.trainer_cpu),
            ("the consumer", Some(self.consumer)),
        ]
        .into_iter()
        .filter_map(|(name, share)| Some((name, share?)))
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .filter(|(_, share)| *share >= SATURATED)
    }
}

impl RunReport {
    pub fn rows_per_second(&self) -> f64 {
        self.rows as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    pub fn server(&self) -> StreamStats {
        self.totals.server
    }

    /// How much of each resource's capacity the run used.
    pub fn shares(&self) -> Shares {
        let secs = self.elapsed.as_secs_f64().max(1e-9);
        let u = &self.usage;
        Shares {
            server_cpu: u.servers.iter().map(|s| s.busy).max_by(f64::total_cmp),
            // A share of a figure only when the figure is the link's: given, not assumed.
            link: (u.link_bytes_per_s.is_finite()
                && u.link_bytes_per_s > 0.0
                && u.link.is_none_or(|l| l.source == crate::LinkSource::Given))
            .then(|| self.totals.bytes_received as f64 / secs / u.link_bytes_per_s),
            trainer_cpu: u
                .trainer_cpu
                .map(|cpu| cpu / (secs * u.trainer_cores.max(1) as f64)),
            consumer: 1.0 - (self.waited.as_secs_f64() / secs).min(1.0),
        }
    }
}

/// Runs `options` to the end.
pub async fn run(options: &RunOptions) -> Result<RunReport> {
    let mut loader = options.loader.clone();
    if loader.world_size != 1 || loader.rank != 0 {
        return Err(ClientError::Invalid("`run` reads as rank 0 of 1".into()));
    }
    loader.epochs = loader.epochs.max(1);
    let client = PushdownClient::connect_with(&options.servers, options.loader.connect.clone()).await?;
    let prepared = Prepared::new(client, options.source.clone(), loader.clone()).await?;
    let mut writer = parquet_writer(options.out.as_deref(), prepared.schema())?;
    let start = Instant::now();
    let cpu_before = process_cpu_seconds();
    let servers_before = server_cpu(prepared.client()).await;
    let totals = SharedTotals::default();
    let (prepared, delivered) = read_epochs(prepared, loader.epochs as u64, &totals, &mut writer).await?;
    if let Some(w) = writer {
        w.close().map_err(ClientError::Output)?;
    }
    let totals = *totals.lock();
    let elapsed = start.elapsed();
    let usage = measure_usage(&prepared, &loader, cpu_before, &servers_before, elapsed).await;
    Ok(RunReport {
        plan: prepared.plan().cloned(),
        estimate: prepared.estimate(),
        endpoints: prepared.endpoints(),
        compression: prepared.compression(),
        rows: delivered.rows,
        batches: delivered.batches,
        elapsed,
        waited: delivered.waited,
        epochs: loader.epochs,
        epochs_ahead: delivered.epochs_ahead,
        totals,
        completed: prepared.completed(),
        fragment_ops: prepared.plan().map_or(0, |p| p.fragment.ops.len()),
        usage,
    })
}

/// A Parquet writer (zstd) of batches of `schema` into `path`, when one is asked for.
fn parquet_writer(
    path: Option<&Path>,
    schema: arrow::datatypes::SchemaRef,
) -> Result<Option<ArrowWriter<std::fs::File>>> {
    match path {
        Some(path) => {
            let file = std::fs::File::create(path)
                .map_err(|e| ClientError::io(format!("creating {}", path.display()), e))?;
            let props = parquet::file::properties::WriterProperties::builder()
                .set_compression(parquet::basic::Compression::ZSTD(Default::default()))
                .build();
            let writer = ArrowWriter::try_new(file, schema, Some(props)).map_err(ClientError::Output)?;
            Ok(Some(writer))
        }
        None => Ok(None),
    }
}

/// What the consumer was handed, and how long it waited for it.
#[derive(Debug, Default)]
struct Delivered {
    rows: u64,
    batches: u64,
    waited: Duration,
    /// Epochs begun with the one started ahead of them.
    epochs_ahead: u64,
}

/// Reads `epochs` epochs of `prepared` to their ends, writing each batch to `writer`.
/// Returns the query as its last epoch was planned, and what was delivered. The next epoch
/// starts ahead as the [`crate::Loader`]'s does: one policy (`loader::ahead`).
async fn read_epochs(
    mut prepared: Prepared,
    epochs: u64,
    totals: &SharedTotals,
    writer: &mut Option<ArrowWriter<std::fs::File>>,
) -> Result<(Prepared, Delivered)> {
    let handle = tokio::runtime::Handle::current();
    let mut delivered = Delivered::default();
    let mut current = prepared.records(0, 0).start(&prepared, totals.clone(), &handle);
    for epoch in 0..epochs {
        let mut ahead: Option<EpochAhead<RecordBatch>> = None;
        loop {
            if ahead.is_none() && epoch + 1 < epochs && current.next_due() {
                let spec = prepared.records(epoch + 1, 0);
                ahead = Some(EpochAhead::start(&prepared, spec, totals.clone(), &handle));
            }
            let asked = Instant::now();
            let next = current.rx.recv().await;
            delivered.waited += asked.elapsed();
            let Some(batch) = next else { break };
            let batch = batch?;
            delivered.rows += batch.num_rows() as u64;
            delivered.batches += 1;
            if let Some(w) = writer.as_mut() {
                w.write(&batch).map_err(ClientError::Output)?;
            }
        }
        if epoch + 1 < epochs {
            let spec = prepared.records(epoch + 1, 0);
            let begun = match ahead {
                Some(ahead) => ahead.begin(epoch + 1, spec.echo, true).await?,
                None => Begun::Dropped,
            };
            current = match begun {
                Begun::Taken(next, produced) => {
                    prepared = next;
                    delivered.epochs_ahead += 1;
                    produced
                }
                Begun::Failed(produced) => produced,
                Begun::Dropped => {
                    prepared = prepared.replan().await?;
                    spec.start(&prepared, totals.clone(), &handle)
                }
            };
        }
    }
    Ok((prepared, delivered))
}

/// How busy this process and each server were over the run's `elapsed`: this process's CPU
/// seconds since `cpu_before`, each server's since `servers_before`.
async fn measure_usage(
    prepared: &Prepared,
    loader: &LoaderOptions,
    cpu_before: Option<f64>,
    servers_before: &[(String, f64, u32)],
    elapsed: Duration,
) -> Usage {
    let trainer_cpu = cpu_before.zip(process_cpu_seconds()).map(|(a, b)| b - a);
    // The servers' own count of their CPU seconds; a server that cannot say is left out.
    let servers = server_cpu(prepared.client())
        .await
        .into_iter()
        .filter_map(|(url, after, cores)| {
            let (_, before, _) = servers_before.iter().find(|(u, ..)| *u == url)?;
            Some(ServerUsage {
                busy: ((after - before) / (elapsed.as_secs_f64().max(1e-9) * f64::from(cores.max(1))))
                    .clamp(0.0, 1.0),
                url,
                cores,
            })
        })
        .collect();
    Usage {
        trainer_cpu,
        trainer_cores: loader.link.trainer_cores().ceil() as usize,
        link_bytes_per_s: prepared.link().bandwidth_bytes_per_s,
        link: Some(prepared.link()),
        servers,
    }
}

/// Each server's CPU seconds so far and its cores (none for a server that cannot say).
async fn server_cpu(client: &PushdownClient) -> Vec<(String, f64, u32)> {
    client
        .scaling_each()
        .await
        .into_iter()
        .filter_map(|(url, s)| s.ok().map(|s| (url, s.cpu_seconds, s.cores)))
        .collect()
}

/// Human-readable byte counts (binary units).
pub fn bytes(n: u64) -> String {
    humansize::format_size(n, humansize::BINARY)
}

impl std::fmt::Display for RunReport {
    /// The report as `pushdown run` prints it: the plan, then what was delivered and what
    /// it cost.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.server();
        if let Some(plan) = &self.plan {
            f.write_str(&plan.explain())?;
        }
        writeln!(
            f,
            "delivered {} rows in {} batches from {} shard streams in {:.2?} ({:.0} rows/s)",
            self.rows,
            self.batches,
            self.endpoints,
            self.elapsed,
            self.rows_per_second()
        )?;
        // Row groups ruled out at planning were never part of a shard (once per epoch, as
        // the server's counts are summed over epochs).
        let planned_out = self.estimate.map_or(0, |e| e.row_groups_pruned) * self.epochs as u64;
        writeln!(
            f,
            "received {} over the network ({} stream compression); server scanned {} from storage ({} rows, {} of {} row groups pruned)",
            bytes(self.totals.bytes_received),
            self.compression,
            bytes(s.bytes_scanned),
            s.rows_scanned,
            s.row_groups_pruned + planned_out,
            s.row_groups + planned_out
        )?;
        if self.fragment_ops > 0 {
            let client = self.completed.rows;
            let server = s.rows_output.saturating_sub(client);
            writeln!(
                f,
                "fragment ops ran on the server for {server} rows, on this client for {client} rows \
                 ({} shard streams left un-reduced; {:.2} s of this client's CPU)",
                self.completed.streams, self.completed.seconds
            )?;
        }
        if self.totals.retries > 0 {
            writeln!(f, "resumed {} failed streams", self.totals.retries)?;
        }
        let shares = self.shares();
        let pct = |s: Option<f64>| s.map_or_else(|| "unknown".to_owned(), |s| format!("{:.0}%", s * 100.0));
        let cores: u32 = self.usage.servers.iter().map(|s| s.cores).max().unwrap_or(0);
        let secs = self.elapsed.as_secs_f64().max(1e-9);
        if let Some(l) = &self.usage.link {
            writeln!(
                f,
                "link: {l}; the streams received {}/s",
                bytes((self.totals.bytes_received as f64 / secs) as u64)
            )?;
        }
        let link = if self.usage.link_bytes_per_s.is_finite() {
            format!("{}/s", bytes(self.usage.link_bytes_per_s as u64))
        } else {
            "an unlimited link".to_owned()
        };
        writeln!(
            f,
            "used: server CPU {} of {cores} core(s), link {} of {link}, \
             trainer CPU {} of {} core(s), consumer busy {}",
            pct(shares.server_cpu),
            pct(shares.link),
            pct(shares.trainer_cpu),
            self.usage.trainer_cores,
            pct(Some(shares.consumer)),
        )?;
        match shares.bottleneck() {
            Some((name, share)) => writeln!(f, "bottleneck: {name} ({:.0}% used)", share * 100.0)?,
            None => writeln!(
                f,
                "bottleneck: none of these is ≥ {:.0}% used (latency: more streams in flight may help)",
                SATURATED * 100.0
            )?,
        }
        Ok(())
    }
}

/// CPU seconds (user + system) this process has used, all threads.
fn process_cpu_seconds() -> Option<f64> {
    cpu_time::ProcessTime::try_now()
        .ok()
        .map(|t| t.as_duration().as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shares(server: Option<f64>, link: Option<f64>, trainer: Option<f64>, consumer: f64) -> Shares {
        Shares {
            server_cpu: server,
            link,
            trainer_cpu: trainer,
            consumer,
        }
    }

    #[test]
    fn the_busiest_resource_is_the_bottleneck_once_it_is_busy_enough() {
        let named = |s: Shares| s.bottleneck().map(|(name, _)| name);
        assert_eq!(
            named(shares(Some(0.98), Some(0.4), Some(0.3), 0.1)),
            Some("server CPU")
        );
        assert_eq!(named(shares(Some(0.5), Some(0.93), Some(0.6), 0.1)), Some("link"));
        assert_eq!(
            named(shares(Some(0.5), None, Some(0.9), 0.2)),
            Some("trainer CPU")
        );
        // A consumer that never waited bounds the run itself (writing the output).
        assert_eq!(
            named(shares(Some(0.2), Some(0.1), Some(0.3), 0.99)),
            Some("the consumer")
        );
        // Nothing busy: a latency-bound run names no resource.
        assert_eq!(named(shares(Some(0.3), Some(0.2), Some(0.3), 0.1)), None);
        assert_eq!(named(shares(None, None, None, 0.1)), None);
    }

    #[test]
    fn shares_come_from_what_the_run_measured() {
        let report = RunReport {
            plan: None,
            estimate: None,
            endpoints: 1,
            compression: Compression::None,
            rows: 1000,
            batches: 4,
            elapsed: Duration::from_secs(2),
            waited: Duration::from_millis(1500),
            epochs: 1,
            epochs_ahead: 0,
            totals: StreamTotals {
                bytes_received: 200_000_000,
                ..Default::default()
            },
            completed: Default::default(),
            fragment_ops: 0,
            usage: Usage {
                trainer_cpu: Some(1.0),
                trainer_cores: 2,
                link_bytes_per_s: 125e6,
                link: Some(crate::Link::bandwidth(125e6)),
                servers: vec![ServerUsage {
                    url: "http://a".into(),
                    busy: 0.5,
                    cores: 4,
                }],
            },
        };
        let s = report.shares();
        assert_eq!(s.server_cpu, Some(0.5));
        assert!((s.link.expect("a finite link") - 0.8).abs() < 1e-9);
        assert!((s.trainer_cpu.expect("measured") - 0.25).abs() < 1e-9);
        assert!((s.consumer - 0.25).abs() < 1e-9);
        assert_eq!(s.bottleneck().map(|(n, _)| n), Some("link"));
        let text = report.to_string();
        assert!(text.contains("bottleneck: link (80% used)"), "{text}");
        assert!(
            text.contains("link: 1000 Mbit/s (given); the streams received 95.37 MiB/s"),
            "{text}"
        );
        // A figure only assumed is no capacity to be a share of.
        let mut assumed = report.clone();
        assumed.usage.link = Some(crate::Link::auto());
        assert_eq!(assumed.shares().link, None);
        assert!(assumed.to_string().contains("assumed for placement"));
    }
}
