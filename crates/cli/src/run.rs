//! `pushdown run`: plan a pipeline (or SQL), pull the reduced stream, apply the client steps.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use futures::StreamExt;
use parquet::arrow::ArrowWriter;
use pushdown_client::{ClientSteps, PushdownClient, StreamOptions, StreamTotals, plan_estimate};
pub use pushdown_client::{Link, costed_plan};
use pushdown_planner::{Pipeline, Plan, Step};
use pushdown_protocol::{Compression, PlanEstimate, Query, ScanRequest, StreamStats};

/// What to run.
#[derive(Debug, Clone)]
pub enum Source {
    Pipeline(Pipeline),
    Sql(String),
}

#[derive(Debug, Clone)]
pub struct RunOptions {
    pub servers: Vec<String>,
    /// The link to the servers, for placing ops by measured cost (bytes/s).
    pub bandwidth_bytes_per_s: f64,
    /// Cores of the storage host and the trainer, for placing ops (default: the server's
    /// count, this machine's).
    pub server_cores: Option<f64>,
    pub client_cores: Option<f64>,
    /// Push exactly the first `k` eligible ops instead of the planner's choice (benchmarks
    /// that measure every placement).
    pub push: Option<usize>,
    /// The stream's codec; default: the planner's choice for a pipeline (compress only when
    /// the link bounds the stream), [`Compression::for_link`] for SQL and for a forced
    /// placement (`push`), which is not costed.
    pub compression: Option<Compression>,
    pub source: Source,
    pub out: Option<PathBuf>,
    pub epochs: usize,
    pub seed: u64,
    pub stream: StreamOptions,
}

impl RunOptions {
    /// One epoch of `source` from `servers`, seed 0, over a 1 Gbit/s link as the planner
    /// sees it, the planner's placement, nothing written.
    pub fn new(servers: Vec<String>, source: Source) -> Self {
        Self {
            servers,
            bandwidth_bytes_per_s: 1e9 / 8.0,
            server_cores: None,
            client_cores: None,
            push: None,
            compression: None,
            source,
            out: None,
            epochs: 1,
            seed: 0,
            stream: StreamOptions::default(),
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
    /// Time the consumer spent waiting for the next batch from the network (the rest of
    /// `elapsed` it spent in client steps and writing).
    pub waited: Duration,
    pub epochs: usize,
    /// Summed over epochs.
    pub totals: StreamTotals,
}

impl RunReport {
    pub fn rows_per_second(&self) -> f64 {
        self.rows as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    pub fn server(&self) -> StreamStats {
        self.totals.server
    }
}

/// Runs `options` to the end.
pub async fn run(options: &RunOptions) -> Result<RunReport> {
    let client = PushdownClient::connect(&options.servers).await?;
    let (request, steps, plan, dataset) = match &options.source {
        Source::Pipeline(pipeline) => {
            let schema = client
                .dataset_schema(&pipeline.dataset)
                .await
                .with_context(|| format!("dataset `{}`", pipeline.dataset))?;
            let (plan, compression) = match options.push {
                Some(k) => (
                    pushdown_planner::plan_limited(pipeline, &schema, k)?,
                    Compression::for_link(options.bandwidth_bytes_per_s),
                ),
                None => {
                    let link = Link {
                        bandwidth_bytes_per_s: options.bandwidth_bytes_per_s,
                        server_cores: options.server_cores,
                        client_cores: options.client_cores,
                    };
                    let costed = costed_plan(&client, pipeline, &schema, link).await?;
                    (costed.plan, costed.chosen.compression)
                }
            };
            let mut request = ScanRequest::new(Query::Fragment(plan.fragment.clone()));
            request.stats = true;
            request.compression = options.compression.unwrap_or(compression);
            (
                request,
                plan.client_steps.clone(),
                Some(plan),
                Some(pipeline.dataset.clone()),
            )
        }
        Source::Sql(sql) => {
            let mut request = ScanRequest::new(Query::Sql(sql.clone()));
            request.stats = true;
            request.compression = options
                .compression
                .unwrap_or_else(|| Compression::for_link(options.bandwidth_bytes_per_s));
            (request, Vec::<Step>::new(), None, None)
        }
    };
    let resources: Arc<dyn pushdown_ops::Resources> = match &dataset {
        Some(d) => Arc::new(client.resources_for(&steps, d).await?),
        None => Arc::new(pushdown_ops::NoResources),
    };
    let info = client.plan(&request).await?;
    let estimate = plan_estimate(&info);
    let start = Instant::now();
    let mut totals = StreamTotals::default();
    let (mut rows, mut batches) = (0u64, 0u64);
    let mut waited = Duration::ZERO;
    let mut writer: Option<ArrowWriter<std::fs::File>> = None;
    for epoch in 0..options.epochs.max(1) {
        let mut stream = client.stream(&info, options.stream.clone())?;
        let totals_handle = stream.totals_handle();
        let mut client_steps =
            ClientSteps::new(&steps, stream.schema(), options.seed.wrapping_add(epoch as u64))?
                .with_resources(Arc::clone(&resources));
        if writer.is_none()
            && let Some(path) = &options.out
        {
            let file = std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
            let props = parquet::file::properties::WriterProperties::builder()
                .set_compression(parquet::basic::Compression::ZSTD(Default::default()))
                .build();
            writer = Some(ArrowWriter::try_new(file, client_steps.schema(), Some(props))?);
        }
        let mut deliver = |out: Vec<arrow::record_batch::RecordBatch>| -> Result<()> {
            for b in out {
                rows += b.num_rows() as u64;
                batches += 1;
                if let Some(w) = writer.as_mut() {
                    w.write(&b)?;
                }
            }
            Ok(())
        };
        loop {
            let asked = Instant::now();
            let next = stream.next().await;
            waited += asked.elapsed();
            let Some(batch) = next else { break };
            deliver(client_steps.push(batch?)?)?;
        }
        deliver(client_steps.finish()?)?;
        let epoch_totals = *totals_handle.lock().unwrap_or_else(|p| p.into_inner());
        totals.bytes_received += epoch_totals.bytes_received;
        totals.rows += epoch_totals.rows;
        totals.batches += epoch_totals.batches;
        totals.retries += epoch_totals.retries;
        totals.server += epoch_totals.server;
    }
    if let Some(w) = writer {
        w.close()?;
    }
    Ok(RunReport {
        plan,
        estimate,
        endpoints: info.endpoint.len(),
        compression: request.compression,
        rows,
        batches,
        elapsed: start.elapsed(),
        waited,
        epochs: options.epochs.max(1),
        totals,
    })
}

/// Human-readable byte counts.
pub fn bytes(n: u64) -> String {
    humansize::format_size(n, humansize::BINARY)
}

/// The report as printed by `pushdown run`.
pub fn describe(report: &RunReport) -> String {
    let s = report.server();
    let mut out = String::new();
    if let Some(plan) = &report.plan {
        out.push_str(&plan.explain());
    }
    out.push_str(&format!(
        "delivered {} rows in {} batches from {} shard streams in {:.2?} ({:.0} rows/s)\n",
        report.rows,
        report.batches,
        report.endpoints,
        report.elapsed,
        report.rows_per_second()
    ));
    // Row groups ruled out at planning were never part of a shard (once per epoch, as the
    // server's counts are summed over epochs).
    let planned_out = report.estimate.map_or(0, |e| e.row_groups_pruned) * report.epochs as u64;
    out.push_str(&format!(
        "received {} over the network ({} stream compression); server scanned {} from storage ({} rows, {} of {} row groups pruned)\n",
        bytes(report.totals.bytes_received),
        report.compression,
        bytes(s.bytes_scanned),
        s.rows_scanned,
        s.row_groups_pruned + planned_out,
        s.row_groups + planned_out
    ));
    if report.totals.retries > 0 {
        out.push_str(&format!("resumed {} failed streams\n", report.totals.retries));
    }
    out
}
