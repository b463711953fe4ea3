//! The `profile` action: run a fragment on a sample and measure each step.
//!
//! Four measurements, none of which depends on how the dataset happens to be sorted:
//!
//! * the scan: the first `n` and `4 × n` rows of the source columns (before the predicate),
//!   `n` growing ×4 from `rows` until the larger sample takes 20 ms, the dataset ends or
//!   2^20 rows are read, each timed warm (footers cached, pages in the OS cache) so it
//!   measures decoding rather than the first touch of storage; the cost per row is the slope
//!   between the two, so the query's fixed start-up cost is not charged to every row;
//! * the selectivity: the rows that pass the predicate over all rows, counted by the engine
//!   over the whole dataset — it reads only the predicate's columns and skips row groups
//!   their statistics rule out (a sample of the first rows would say 0 for `day = 3` on data
//!   sorted by day). A predicate too costly to count everywhere within
//!   [`COUNT_BUDGET`] (one that reads every clip's header, `audio_seconds(audio) < 20`, over
//!   a large dataset) is counted over the first [`SELECTIVITY_SAMPLE_ROWS`] rows instead;
//! * each op: timed on one thread over the first `rows` rows that *pass* the predicate (the
//!   rows it would really see), fewer where they hold over [`OP_SAMPLE_BYTES`] (audio clips:
//!   a few dozen, so a profile of a decoding op takes seconds, not minutes); its input and
//!   output sizes are the Arrow buffers' bytes per row: what would cross the network before
//!   IPC compression;
//! * the plan: the share of rows the row groups' statistics leave to scan, and the shards
//!   (endpoints) the server deals the fragment into.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use arrow::array::{Array, ArrayRef};
use arrow::compute::concat_batches;
use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use datafusion::logical_expr::Expr;
use datafusion::prelude::{DataFrame, ident, lit};
use pushdown_protocol::{CodecCost, Codecs, Fragment, OpProfile, Profile, Query, ScanRequest};

use crate::auth::Grant;
use crate::catalog::Dataset;
use crate::error::{Result, ServerError};
use crate::query::Engine;
use crate::udf::OpLimits;

const KEEP: &str = "__pushdown_keep";

/// How long the selectivity may take counted over the whole dataset.
const COUNT_BUDGET: std::time::Duration = std::time::Duration::from_secs(3);
/// The rows a selectivity is counted over when the whole dataset would take too long.
const SELECTIVITY_SAMPLE_ROWS: usize = 1024;
/// The most source bytes the ops are timed over (but at least [`MIN_OP_SAMPLE_ROWS`] rows).
const OP_SAMPLE_BYTES: usize = 8 << 20;
const MIN_OP_SAMPLE_ROWS: usize = 8;

fn bytes(a: &ArrayRef) -> f64 {
    a.to_data()
        .get_slice_memory_size()
        .unwrap_or_else(|_| a.get_array_memory_size()) as f64
}

/// What each stream codec does to `array`, through Arrow IPC as a stream sends it: the size
/// of the compressed message over the plain one, and the CPU beyond the plain encoding (or
/// decoding) per Arrow byte, each the best of two runs. `None` when the column cannot be
/// encoded alone (never for the types ops emit) or is empty.
fn codecs(name: &str, array: &ArrayRef) -> Option<Codecs> {
    use arrow::ipc::CompressionType;
    use arrow::ipc::reader::StreamReader;
    use arrow::ipc::writer::{IpcWriteOptions, StreamWriter};
    let arrow_bytes = bytes(array);
    if array.is_empty() || arrow_bytes <= 0.0 {
        return None;
    }
    let batch = RecordBatch::try_from_iter([(name, Arc::clone(array))]).ok()?;
    let run = |codec: Option<CompressionType>| -> Option<(f64, f64, f64)> {
        let options = IpcWriteOptions::default().try_with_compression(codec).ok()?;
        let (mut encode, mut decode, mut len) = (f64::INFINITY, f64::INFINITY, 0usize);
        for _ in 0..2 {
            let mut buf = Vec::new();
            let start = Instant::now();
            let mut writer =
                StreamWriter::try_new_with_options(&mut buf, &batch.schema(), options.clone()).ok()?;
            writer.write(&batch).ok()?;
            writer.finish().ok()?;
            drop(writer);
            encode = encode.min(start.elapsed().as_nanos() as f64);
            let start = Instant::now();
            for read in StreamReader::try_new(std::io::Cursor::new(&buf), None).ok()? {
                read.ok()?;
            }
            decode = decode.min(start.elapsed().as_nanos() as f64);
            len = buf.len();
        }
        Some((len as f64, encode, decode))
    };
    let (plain_len, plain_encode, plain_decode) = run(None)?;
    let cost = |codec| -> Option<CodecCost> {
        let (len, encode, decode) = run(Some(codec))?;
        Some(CodecCost {
            ratio: len / plain_len.max(1.0),
            compress_ns_per_byte: (encode - plain_encode).max(0.0) / arrow_bytes,
            decompress_ns_per_byte: (decode - plain_decode).max(0.0) / arrow_bytes,
        })
    };
    Some(Codecs {
        lz4: cost(CompressionType::LZ4_FRAME)?,
        zstd: cost(CompressionType::ZSTD)?,
    })
}

/// How long the larger scan sample runs, at least (unless the dataset ends first).
const SCAN_SAMPLE_NS: f64 = 20e6;
/// The most rows a scan sample reads, however cheap they are.
const MAX_SCAN_SAMPLE_ROWS: usize = 1 << 20;

/// Rows returned by the first `n` rows of `df`, and the best of two warm runs in ns. The
/// batches are counted and dropped as they come: a large sample is never held whole.
async fn time_first_rows(df: &DataFrame, n: usize) -> Result<(usize, f64)> {
    use futures::TryStreamExt;
    let limited = df.clone().limit(0, Some(n))?;
    let count = || async {
        let stream = limited.clone().execute_stream().await?;
        stream
            .try_fold(0usize, |rows, batch| async move { Ok(rows + batch.num_rows()) })
            .await
    };
    count().await?; // warm
    let mut best = f64::INFINITY;
    let mut got = 0;
    for _ in 0..2 {
        let start = Instant::now();
        got = count().await?;
        best = best.min(start.elapsed().as_nanos() as f64);
    }
    Ok((got, best))
}

/// The scan's cost per row: the slope between two warm samples of the first rows of `sample`,
/// `n` and `4 × n`, with `n` growing from `rows` until the larger takes [`SCAN_SAMPLE_NS`]
/// (a few hundred rows are a fraction of one page, and their slope was mostly page set-up and
/// timer noise: on clicks several times a whole shard's cost per row, see
/// `benches/RESULTS.md`, "Contenders: pushdown against what a user would run instead"). A
/// step is kept only when it read at least twice the rows of the one before: where the
/// dataset ends just past a step, the slope over the few extra rows would be noise. Returns
/// the rows of the larger sample and the cost per row; `None` when the dataset has no rows.
async fn scan_cost(sample: &DataFrame, rows: usize) -> Result<Option<(usize, f64)>> {
    let mut ask = rows.max(1);
    let (mut small_n, mut small_ns) = time_first_rows(sample, ask).await?;
    if small_n == 0 {
        return Ok(None);
    }
    let (mut large_n, mut large_ns) = (small_n, small_ns);
    while large_ns < SCAN_SAMPLE_NS && large_n == ask && large_n < MAX_SCAN_SAMPLE_ROWS {
        ask = (4 * large_n).min(MAX_SCAN_SAMPLE_ROWS);
        let (n, ns) = time_first_rows(sample, ask).await?;
        if n < 2 * large_n {
            break;
        }
        (small_n, small_ns) = (large_n, large_ns);
        (large_n, large_ns) = (n, ns);
    }
    // The slope, floored at a hundredth of the large sample's average so that noise cannot
    // make the scan look free. (A higher floor charges the fixed cost again: on clicks the
    // query's start-up, spread over a 1,024-row sample, is many times the slope per row.)
    let average = large_ns / large_n as f64;
    let per_row = if large_n > small_n && large_ns > small_ns {
        ((large_ns - small_ns) / (large_n - small_n) as f64).max(average / 100.0)
    } else {
        average
    };
    Ok(Some((large_n, per_row)))
}

/// Profiles the fragment of `request` on its first `rows` rows.
pub async fn profile(
    engine: &Engine,
    request: &ScanRequest,
    rows: usize,
    cores: u32,
    grant: &Grant,
) -> Result<Profile> {
    let Query::Fragment(f) = &request.query else {
        return Err(ServerError::BadRequest(
            "profile takes a ScanRequest with a fragment".into(),
        ));
    };
    let datasets = engine.catalog().datasets().await?;
    let ctx = engine.session(1);
    let limits = engine.op_limits(&ctx, request.tokenizer.as_deref());
    // The fragment may read a view: it is sampled through it, over the dataset beneath.
    let checked = engine.check(&request.query, grant)?;
    let referenced = engine
        .register_referenced(&ctx, &datasets, grant, &checked, &limits, |d| {
            engine.full_table(d, false)
        })
        .await?;
    let [dataset] = referenced.as_slice() else {
        return Err(ServerError::BadRequest(format!(
            "`{}` reads {} datasets; profile samples one",
            f.dataset,
            referenced.len()
        )));
    };
    dataset.check_readable()?;
    let table = ctx.table(f.dataset.as_str()).await?;
    let schema: SchemaRef = Arc::new(table.schema().as_arrow().clone());
    let source = source_columns(f, &schema);

    let keep = predicate(&table, f)?;
    let mut exprs: Vec<_> = source.iter().map(ident).collect();
    // The predicate is evaluated with the scan, so its cost is timed as part of it.
    exprs.push(keep.clone().alias(KEEP));
    let sample = table.clone().select(exprs)?;
    let Some((sampled, scan_ns_per_row)) = scan_cost(&sample, rows).await? else {
        return Err(ServerError::BadRequest(format!(
            "dataset `{}` is empty",
            dataset.name
        )));
    };

    let (scanned_fraction, shards) = planned_scan(engine, request, grant).await?;
    let (selectivity, kept) = passing_sample(&table, keep, &source, &schema, rows, dataset).await?;
    let n = kept.num_rows().max(1) as f64;
    let (column_bytes_per_row, column_codecs) = column_costs(&kept, n);
    let ops = profile_ops(f, kept, n, &limits, grant, &datasets, dataset)?;
    Ok(Profile {
        rows_sampled: sampled as u64,
        selectivity,
        scan_ns_per_row,
        column_bytes_per_row,
        ops,
        server_cores: cores,
        column_codecs,
        scanned_fraction,
        shards,
    })
}

/// The source columns the fragment reads: its output columns that are not op outputs, and
/// every op input.
fn source_columns(f: &Fragment, schema: &SchemaRef) -> Vec<String> {
    let outputs: Vec<&str> = f.ops.iter().map(|o| o.output.as_str()).collect();
    let mut source: Vec<String> = Vec::new();
    let mut add = |c: &str| {
        if !source.iter().any(|s| s == c) && schema.index_of(c).is_ok() {
            source.push(c.to_owned());
        }
    };
    for call in &f.ops {
        add(&call.input);
    }
    let all: Vec<String> = schema.fields().iter().map(|f| f.name().clone()).collect();
    let columns = if f.columns.is_empty() { &all } else { &f.columns };
    for c in columns.iter().filter(|c| !outputs.contains(&c.as_str())) {
        add(c);
    }
    source
}

/// The fragment's predicate over `table` (`true` when it has none).
fn predicate(table: &DataFrame, f: &Fragment) -> Result<Expr> {
    Ok(match &f.predicate {
        Some(p) => table
            .parse_sql_expr(p)
            .map_err(|e| ServerError::bad_part(format!("predicate `{p}`"), e))?,
        None => lit(true),
    })
}

/// The share of the dataset's rows the server's plan for the fragment leaves to scan, and
/// the shards it deals the fragment into.
async fn planned_scan(
    engine: &Engine,
    request: &ScanRequest,
    grant: &Grant,
) -> Result<(Option<f64>, Option<u32>)> {
    // What a scan of the whole fragment reads: the rows of the row groups that statistics
    // leave, as the server plans its shards. A filter on sorted data (clicks' `day = 3`)
    // reads only its own rows; charged for every row, the planner would misjudge the server.
    let planned = engine.plan(request, grant).await?;
    let scanned_fraction = match &planned.shape {
        crate::query::Shape::RowWise { dataset, .. } if dataset.num_rows() > 0 => {
            Some((planned.rows_upper_bound as f64 / dataset.num_rows() as f64).clamp(0.0, 1.0))
        }
        _ => None,
    }
    .filter(|f| *f > 0.0);
    // A split placement deals whole shards to each side: with one shard it cannot split.
    let shards = match &planned.shape {
        crate::query::Shape::RowWise { .. } => u32::try_from(planned.tickets().len()).ok(),
        _ => None,
    }
    .filter(|n| *n > 0);
    Ok((scanned_fraction, shards))
}

/// The share of `dataset`'s rows that pass `keep`, and the `source` columns of the first
/// `rows` rows that pass it.
async fn passing_sample(
    table: &DataFrame,
    keep: Expr,
    source: &[String],
    schema: &SchemaRef,
    rows: usize,
    dataset: &Dataset,
) -> Result<(f64, RecordBatch)> {
    // The rows the ops would see: the first `rows` that pass the predicate.
    let passing = table.clone().filter(keep.clone())?;
    let selectivity = match tokio::time::timeout(COUNT_BUDGET, passing.clone().count()).await {
        Ok(count) => count? as f64 / dataset.num_rows().max(1) as f64,
        Err(_) => {
            let first = table.clone().limit(0, Some(SELECTIVITY_SAMPLE_ROWS))?;
            let read = first.clone().count().await?;
            first.filter(keep)?.count().await? as f64 / read.max(1) as f64
        }
    };
    let kept_batches = passing
        .select(source.iter().map(ident).collect::<Vec<_>>())?
        .limit(0, Some(rows.max(1)))?
        .collect()
        .await?;
    let kept_schema = match kept_batches.first() {
        Some(b) => b.schema(),
        None => {
            let indices: Vec<usize> = source.iter().filter_map(|c| schema.index_of(c).ok()).collect();
            Arc::new(
                schema
                    .project(&indices)
                    .map_err(|e| ServerError::Internal(e.to_string()))?,
            )
        }
    };
    let kept =
        concat_batches(&kept_schema, &kept_batches).map_err(|e| ServerError::Internal(e.to_string()))?;
    Ok((selectivity, within_bytes(kept)))
}

/// The first rows of `kept` holding about [`OP_SAMPLE_BYTES`] (at least
/// [`MIN_OP_SAMPLE_ROWS`]): the rows of large values (clips, images) an op is timed over.
fn within_bytes(kept: RecordBatch) -> RecordBatch {
    let rows = kept.num_rows();
    let total: f64 = kept.columns().iter().map(bytes).sum();
    let fit = (OP_SAMPLE_BYTES as f64 / (total / rows.max(1) as f64).max(1.0)) as usize;
    kept.slice(0, rows.min(fit.max(MIN_OP_SAMPLE_ROWS)))
}

/// Arrow bytes per row of each column of `kept` (of `n` rows), and what the stream codecs
/// do to it.
fn column_costs(kept: &RecordBatch, n: f64) -> (BTreeMap<String, f64>, BTreeMap<String, Codecs>) {
    let column_bytes_per_row = kept
        .schema()
        .fields()
        .iter()
        .zip(kept.columns())
        .map(|(field, a)| (field.name().clone(), bytes(a) / n))
        .collect();
    let column_codecs = kept
        .schema()
        .fields()
        .iter()
        .zip(kept.columns())
        .filter_map(|(field, a)| Some((field.name().clone(), codecs(field.name(), a)?)))
        .collect();
    (column_bytes_per_row, column_codecs)
}

/// Each op of `f` run on one thread over `kept` (of `n` rows), timed and measured per row.
fn profile_ops(
    f: &Fragment,
    kept: RecordBatch,
    n: f64,
    limits: &OpLimits,
    grant: &Grant,
    datasets: &BTreeMap<String, Arc<Dataset>>,
    dataset: &Arc<Dataset>,
) -> Result<Vec<OpProfile>> {
    let mut readable = grant.visible(datasets);
    readable.insert(dataset.name.clone(), Arc::clone(dataset));
    let default = limits.tokenizer.clone().or_else(|| Some(dataset.name.clone()));
    let resources = crate::udf::DatasetResources::new(readable, default, Arc::clone(&limits.tokenizers));
    let calls = pushdown_ops::Calls::bind(&f.ops, kept.schema(), &resources)
        .map_err(|e| ServerError::BadQuery(e.to_string()))?;
    // The server's caps hold for the sample too: a call refused at planning never runs here.
    for (call, op, input) in calls.bound() {
        limits
            .admit(op, input, &call.params)
            .map_err(|reason| ServerError::BadQuery(format!("{}: {reason}", call.op)))?;
    }
    let mut ops = Vec::new();
    calls
        .apply_observed(
            kept,
            &pushdown_ops::Context {
                seed: 0,
                resources: &resources,
            },
            |run| {
                ops.push(OpProfile {
                    op: run.call.op.clone(),
                    input: run.call.input.clone(),
                    output: run.call.output.clone(),
                    bytes_in_per_row: bytes(run.input) / n,
                    bytes_out_per_row: bytes(run.output) / n,
                    ns_per_row: run.elapsed.as_nanos() as f64 / n,
                    output_codecs: codecs(&run.call.output, run.output),
                });
            },
        )
        .map_err(|e| ServerError::BadQuery(e.to_string()))?;
    Ok(ops)
}
