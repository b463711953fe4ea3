//! What a trainer runs when it reads the data itself: the contenders of the benchmarks and
//! the references of the tests. None of it is part of a server.
//!
//! * [`execute`] runs a request in this process, shard after shard, exactly as its `DoGet`s
//!   would but with no Flight, IPC or socket in between. Over local files it is the ceiling a
//!   remote server is measured against; over an object store reached through a link
//!   (`s3://…`) it is the trainer that fetches Parquet itself (Petastorm, a plain
//!   `pyarrow.dataset` loader).
//! * [`evaluate`] runs a row-wise query over batches that arrive from elsewhere: the trainer
//!   of a service that streams every row and column, filtering and transforming them itself.

use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use datafusion::catalog::streaming::StreamingTable;
use datafusion::error::DataFusionError;
use datafusion::execution::TaskContext;
use datafusion::execution::context::{SessionConfig, SessionContext};
use datafusion::physical_plan::SendableRecordBatchStream;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::PartitionStream;
use futures::stream::{BoxStream, Stream, StreamExt, TryStreamExt};
use parking_lot::Mutex;
use pushdown_engine::{CacheUse, Grant, Node, ServerError};
use pushdown_protocol::{Query, ScanRequest};

type Result<T, E = ServerError> = std::result::Result<T, E>;

/// Record batches of a query, in order.
pub type BatchStream = BoxStream<'static, Result<RecordBatch>>;

/// Runs `request` on `node` in this process: its tickets in order (one per shard, or the
/// whole query), each planned and executed as its `DoGet` would be. Returns the result
/// schema and the batches.
pub async fn execute(node: &Arc<Node>, request: &ScanRequest) -> Result<(SchemaRef, BatchStream)> {
    let all = Arc::new(Grant::All);
    let planned = node.plan(request, &all).await?;
    let node = Arc::clone(node);
    let batches =
        futures::stream::iter(planned.tickets())
            .then(move |t| {
                let (node, all) = (Arc::clone(&node), Arc::clone(&all));
                // Never the server's fragment cache: a trainer reading the files itself has none.
                async move {
                    Ok::<_, ServerError>(node.run_ticket(&t, &all, CacheUse::Bypass).await?.into_stream())
                }
            })
            .try_flatten()
            .boxed();
    Ok((planned.schema, batches))
}

/// Evaluates a row-wise `query` over `dataset`, whose rows arrive as `input` (with `schema`),
/// in this process. Op calls resolve their resources (tokenizers) from `resources`.
pub async fn evaluate<S, E>(
    query: &Query,
    dataset: &str,
    schema: SchemaRef,
    input: S,
    resources: Arc<dyn pushdown_ops::Resources>,
) -> Result<(SchemaRef, BatchStream)>
where
    S: Stream<Item = std::result::Result<RecordBatch, E>> + Send + 'static,
    E: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let config = SessionConfig::new()
        .with_target_partitions(1)
        .with_information_schema(false);
    let ctx = SessionContext::new_with_config(config);
    let partition = OneShot {
        schema: Arc::clone(&schema),
        input: Mutex::new(Some(
            input.map_err(|e| DataFusionError::External(e.into())).boxed(),
        )),
    };
    let table = StreamingTable::try_new(schema, vec![Arc::new(partition)])?;
    ctx.register_table(dataset, Arc::new(table))?;
    for udf in pushdown_engine::udfs(resources, pushdown_engine::OpLimits::unlimited()) {
        ctx.register_udf(udf);
    }
    let df = pushdown_engine::dataframe(&ctx, query).await?;
    let schema: SchemaRef = Arc::new(df.schema().as_arrow().clone());
    let stream = df.execute_stream().await?;
    Ok((schema, stream.map_err(ServerError::from).boxed()))
}

/// A partition whose batches come from a stream that can be read once.
struct OneShot {
    schema: SchemaRef,
    input: Mutex<Option<BoxStream<'static, datafusion::error::Result<RecordBatch>>>>,
}

impl std::fmt::Debug for OneShot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OneShot").finish_non_exhaustive()
    }
}

impl PartitionStream for OneShot {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        let taken = self.input.lock().take();
        let stream = taken.unwrap_or_else(|| {
            futures::stream::once(async {
                Err(DataFusionError::Execution(
                    "the input stream was already consumed".into(),
                ))
            })
            .boxed()
        });
        Box::pin(RecordBatchStreamAdapter::new(Arc::clone(&self.schema), stream))
    }
}
