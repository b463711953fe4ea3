//! `pushdown run`: plan a pipeline (or SQL), pull the reduced stream, apply the client steps.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use futures::StreamExt;
use parquet::arrow::ArrowWriter;
use pushdown_client::{ClientSteps, PushdownClient, StreamOptions, StreamTotals, plan_estimate};
use pushdown_planner::{CostedPlan, Environment, Pipeline, Plan, Step, plan_with_profile};
use pushdown_protocol::{PlanEstimate, Profile, Query, ScanRequest, StreamStats};

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
    pub source: Source,
    pub out: Option<PathBuf>,
    pub epochs: usize,
    pub seed: u64,
    pub stream: StreamOptions,
}

/// What a run delivered and what it cost.
#[derive(Debug, Clone)]
pub struct RunReport {
    pub plan: Option<Plan>,
    pub estimate: Option<PlanEstimate>,
    pub endpoints: usize,
    pub rows: u64,
    pub batches: u64,
    pub elapsed: Duration,
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
            let plan = costed_plan(
                &client,
                pipeline,
                &schema,
                Link::bandwidth(options.bandwidth_bytes_per_s),
            )
            .await?
            .plan;
            let mut request = ScanRequest::new(Query::Fragment(plan.fragment.clone()));
            request.stats = true;
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
        while let Some(batch) = stream.next().await {
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
        rows,
        batches,
        elapsed: start.elapsed(),
        totals,
    })
}

/// What the cost model may assume; `None` cores mean "what the server reports" and "this
/// machine's".
#[derive(Debug, Clone, Copy)]
pub struct Link {
    pub bandwidth_bytes_per_s: f64,
    pub server_cores: Option<f64>,
    pub client_cores: Option<f64>,
}

impl Link {
    pub fn bandwidth(bandwidth_bytes_per_s: f64) -> Self {
        Self {
            bandwidth_bytes_per_s,
            server_cores: None,
            client_cores: None,
        }
    }
}

/// Plans `pipeline`, placing its ops by the server's measurements of them when it has any.
pub async fn costed_plan(
    client: &PushdownClient,
    pipeline: &Pipeline,
    schema: &arrow::datatypes::Schema,
    link: Link,
) -> Result<CostedPlan> {
    let static_plan = pushdown_planner::plan(pipeline, schema)?;
    let profile = if static_plan.fragment.ops.is_empty() {
        Profile::default()
    } else {
        client
            .profile(&ScanRequest::new(Query::Fragment(static_plan.fragment.clone())))
            .await?
    };
    let env = Environment {
        bandwidth_bytes_per_s: link.bandwidth_bytes_per_s,
        server_cores: link
            .server_cores
            .unwrap_or(f64::from(profile.server_cores.max(1))),
        client_cores: link
            .client_cores
            .unwrap_or(std::thread::available_parallelism().map_or(1, |n| n.get()) as f64),
    };
    Ok(plan_with_profile(pipeline, schema, &profile, &env)?)
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
    out.push_str(&format!(
        "received {} over the network; server scanned {} from storage ({} rows, {} of {} row groups pruned)\n",
        bytes(report.totals.bytes_received),
        bytes(s.bytes_scanned),
        s.rows_scanned,
        s.row_groups_pruned,
        s.row_groups
    ));
    if report.totals.retries > 0 {
        out.push_str(&format!("resumed {} failed streams\n", report.totals.retries));
    }
    out
}
