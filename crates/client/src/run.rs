//! `pushdown run`: a [`Prepared`] query streamed to the end, epoch after epoch, as record
//! batches; optionally written to a Parquet file; reported.
//!
//! It is the loader's sample sequence (same shard order, shuffle windows, batches and
//! client-op randomness for a seed), read by one process with no tensors: a pipeline run
//! with `pushdown run --seed S` yields the rows a [`crate::Loader`] of world size 1 and seed
//! `S` yields, in the same order.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use parquet::arrow::ArrowWriter;
use pushdown_planner::Plan;
use pushdown_protocol::{Compression, PlanEstimate, StreamStats};

use crate::{
    ClientError, EpochBatches, LoaderOptions, LoaderSource, Prepared, PushdownClient, Result, StreamTotals,
};

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
    /// Summed over epochs.
    pub totals: StreamTotals,
    /// The fragment ops this client ran on shards the servers left un-reduced.
    pub completed: crate::CompletionTotals,
    /// Rows of the fragment's output (every row passes through each of its ops).
    pub fragment_ops: usize,
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
    let mut loader = options.loader.clone();
    if loader.world_size != 1 || loader.rank != 0 {
        return Err(ClientError::Invalid("`run` reads as rank 0 of 1".into()));
    }
    loader.epochs = loader.epochs.max(1);
    let client = PushdownClient::connect_with(&options.servers, options.loader.connect.clone()).await?;
    let mut prepared = Prepared::new(client, options.source.clone(), loader.clone()).await?;
    let mut writer = match &options.out {
        Some(path) => {
            let file = std::fs::File::create(path)
                .map_err(|e| ClientError::Invalid(format!("creating {}: {e}", path.display())))?;
            let props = parquet::file::properties::WriterProperties::builder()
                .set_compression(parquet::basic::Compression::ZSTD(Default::default()))
                .build();
            Some(ArrowWriter::try_new(file, prepared.schema(), Some(props)).map_err(parquet_error)?)
        }
        None => None,
    };
    let start = Instant::now();
    let totals = Arc::new(Mutex::new(StreamTotals::default()));
    let (mut rows, mut batches) = (0u64, 0u64);
    let mut waited = Duration::ZERO;
    let epochs = loader.epochs as u64;
    let mut stream = prepared.epoch(0, 0, Arc::clone(&totals));
    for epoch in 0..epochs {
        // The next epoch reads what the servers list when it starts (files added join it),
        // and starts once this one's last shards are in flight: its streams take up the
        // cores and link this epoch's tail leaves idle. Its batches follow this epoch's.
        let mut ahead: Option<(Prepared, EpochBatches)> = None;
        loop {
            if ahead.is_none() && epoch + 1 < epochs && stream.all_started() {
                let next = prepared.replan().await?;
                let batches = next.epoch(epoch + 1, 0, Arc::clone(&totals));
                ahead = Some((next, batches));
            }
            let asked = Instant::now();
            let next = stream.next().await;
            waited += asked.elapsed();
            let Some(batch) = next else { break };
            let batch = batch?;
            rows += batch.num_rows() as u64;
            batches += 1;
            if let Some(w) = writer.as_mut() {
                w.write(&batch).map_err(parquet_error)?;
            }
        }
        if epoch + 1 < epochs {
            (prepared, stream) = match ahead {
                Some(next) => next,
                None => {
                    let next = prepared.replan().await?;
                    let batches = next.epoch(epoch + 1, 0, Arc::clone(&totals));
                    (next, batches)
                }
            };
        }
    }
    if let Some(w) = writer {
        w.close().map_err(parquet_error)?;
    }
    let totals = *totals.lock().unwrap_or_else(|p| p.into_inner());
    Ok(RunReport {
        plan: prepared.plan().cloned(),
        estimate: prepared.estimate(),
        endpoints: prepared.endpoints(),
        compression: prepared.compression(),
        rows,
        batches,
        elapsed: start.elapsed(),
        waited,
        epochs: loader.epochs,
        totals,
        completed: prepared.completed(),
        fragment_ops: prepared.plan().map_or(0, |p| p.fragment.ops.len()),
    })
}

fn parquet_error(e: parquet::errors::ParquetError) -> ClientError {
    ClientError::Invalid(format!("writing the output: {e}"))
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
        Ok(())
    }
}
