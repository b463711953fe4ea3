//! The ordered-partition executor: a plan's partitions decoded ahead within a byte budget
//! and yielded in order.

use std::sync::Arc;

use datafusion::physical_plan::ExecutionPlan;

/// What the partitions of one stream may hold in finished batches, in KiB, in equal shares
/// (at least 1 MiB each; each may also have one batch waiting for room, so the bound is
/// approximate). With 2 cores, 16 MiB each: a 131,072-row row group of a lineitem projection
/// (7 MB) fits, so a partition ahead finishes and frees its core.
pub(super) const AHEAD_KIB: u32 = 32 * 1024;

/// The plan's partitions one after another, as if one partition had read them all. Up to
/// `window` partitions past the one being sent decode ahead, each on its own task and each
/// holding at most its share of `AHEAD_KIB` of finished batches: a shard cut into row groups uses
/// `window` cores while its rows leave in order. Nothing of partition `i + 1` is emitted
/// before partition `i` ends, so a stream's rows, and the offsets it resumes from, do not
/// depend on the parallelism.
pub fn ordered_stream(
    plan: Arc<dyn ExecutionPlan>,
    ctx: Arc<datafusion::execution::TaskContext>,
    window: usize,
) -> datafusion::error::Result<datafusion::physical_plan::SendableRecordBatchStream> {
    let n = datafusion::physical_plan::ExecutionPlanProperties::output_partitioning(&plan).partition_count();
    let window = window.clamp(1, n.max(1));
    let share = (AHEAD_KIB / u32::try_from(window).unwrap_or(u32::MAX)).max(1024);
    ordered_stream_within(plan, ctx, window, share)
}

/// [`ordered_stream`] with `ahead_kib` for what each partition ahead may hold.
pub(super) fn ordered_stream_within(
    plan: Arc<dyn ExecutionPlan>,
    ctx: Arc<datafusion::execution::TaskContext>,
    window: usize,
    ahead_kib: u32,
) -> datafusion::error::Result<datafusion::physical_plan::SendableRecordBatchStream> {
    let n = datafusion::physical_plan::ExecutionPlanProperties::output_partitioning(&plan).partition_count();
    if n <= 1 {
        return datafusion::physical_plan::execute_stream(plan, ctx);
    }
    let schema = plan.schema();
    // Opened up front, so a partition that cannot start fails the open, not the stream.
    let partitions = (0..n)
        .map(|i| plan.execute(i, Arc::clone(&ctx)))
        .collect::<datafusion::error::Result<Vec<_>>>()?;
    Ok(ordered_partitions(schema, partitions, window, ahead_kib))
}

/// [`ordered_stream_within`] over partitions already opened.
pub(super) fn ordered_partitions(
    schema: arrow::datatypes::SchemaRef,
    partitions: Vec<datafusion::physical_plan::SendableRecordBatchStream>,
    window: usize,
    ahead_kib: u32,
) -> datafusion::physical_plan::SendableRecordBatchStream {
    use futures::StreamExt;
    // The partitions started, in order; the bound keeps the one being sent plus `window`.
    let window = window.clamp(1, partitions.len().max(1));
    let (started_tx, started_rx) = tokio::sync::mpsc::channel::<Ahead>(window);
    let starter = pushdown_task::Task::spawn(async move {
        for mut partition in partitions {
            // A slot first: no partition starts before there is room for it.
            let Ok(slot) = started_tx.reserve().await else {
                return;
            };
            let budget = Arc::new(tokio::sync::Semaphore::new(ahead_kib as usize));
            let (tx, batches) = tokio::sync::mpsc::unbounded_channel();
            let task = pushdown_task::Task::spawn(async move {
                while let Some(item) = partition.next().await {
                    let kib = item
                        .as_ref()
                        .map_or(1, |b| b.get_array_memory_size() / 1024)
                        .clamp(1, ahead_kib as usize) as u32;
                    let Ok(held) = Arc::clone(&budget).acquire_many_owned(kib).await else {
                        return;
                    };
                    if tx.send((item, held)).is_err() {
                        return;
                    }
                }
            });
            slot.send(Ahead { batches, task });
        }
    });
    let stream = tokio_stream::wrappers::ReceiverStream::new(started_rx)
        .flat_map(|ahead| {
            futures::stream::unfold(Some(ahead), |ahead| async move {
                let mut ahead = ahead?;
                // The batch leaves the budget as it is taken.
                if let Some((item, _held)) = ahead.batches.recv().await {
                    return Some((item, Some(ahead)));
                }
                // The partition's task ended: a panic in it must end the stream with an
                // error, never look like the partition's last batch.
                match ahead.task.await {
                    Ok(()) => None,
                    Err(e) => Some((
                        Err(datafusion::error::DataFusionError::Execution(format!(
                            "a partition's task failed: {e}"
                        ))),
                        None,
                    )),
                }
            })
        })
        .map(move |item| {
            // The stream owns the starter: dropping it stops every partition.
            let _owner = &starter;
            item
        });
    Box::pin(datafusion::physical_plan::stream::RecordBatchStreamAdapter::new(
        schema, stream,
    ))
}

/// A partition decoding ahead: its batches in order, each holding its share of the budget
/// until taken, and its task. Dropping it stops the partition.
pub(super) struct Ahead {
    pub(super) batches: tokio::sync::mpsc::UnboundedReceiver<(
        datafusion::error::Result<arrow::record_batch::RecordBatch>,
        tokio::sync::OwnedSemaphorePermit,
    )>,
    pub(super) task: pushdown_task::Task<()>,
}

#[cfg(test)]
mod ordered_tests {
    use std::sync::Arc;

    use arrow::array::{AsArray, Int64Array};
    use arrow::datatypes::{DataType, Field, Int64Type, Schema};
    use arrow::record_batch::RecordBatch;
    use datafusion::datasource::memory::MemorySourceConfig;
    use datafusion::execution::TaskContext;
    use futures::StreamExt;

    use super::{ordered_partitions, ordered_stream_within};

    /// `parts` partitions of `batches` batches of `rows` rows each, numbered in order.
    fn numbered(parts: i64, batches: i64, rows: i64) -> Arc<dyn datafusion::physical_plan::ExecutionPlan> {
        let schema = Arc::new(Schema::new(vec![Field::new("n", DataType::Int64, false)]));
        let partitions: Vec<Vec<RecordBatch>> = (0..parts)
            .map(|p| {
                (0..batches)
                    .map(|b| {
                        let first = (p * batches + b) * rows;
                        let column = Int64Array::from_iter_values(first..first + rows);
                        RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(column)]).expect("batch")
                    })
                    .collect()
            })
            .collect();
        MemorySourceConfig::try_new_exec(&partitions, schema, None).expect("plan")
    }

    async fn numbers(
        stream: datafusion::physical_plan::SendableRecordBatchStream,
        take: Option<usize>,
    ) -> Vec<i64> {
        let batches = stream.take(take.unwrap_or(usize::MAX));
        batches
            .map(|b| {
                b.expect("batch")
                    .column(0)
                    .as_primitive::<Int64Type>()
                    .values()
                    .to_vec()
            })
            .concat()
            .await
    }

    /// More partitions than the window, each holding more than its budget: every row, in
    /// partition order, whatever the window.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn partitions_ahead_keep_the_order_within_their_budget() {
        let plan = numbered(9, 5, 700);
        let all: Vec<i64> = (0..9 * 5 * 700).collect();
        for window in [1, 2, 3, 16] {
            // 1 KiB: each partition ahead holds one batch at a time.
            let stream =
                ordered_stream_within(Arc::clone(&plan), Arc::new(TaskContext::default()), window, 1)
                    .expect("stream");
            assert_eq!(numbers(stream, None).await, all, "window {window}");
        }
    }

    /// What decodes ahead is bounded: a reader that stops after one batch finds only the
    /// started partitions (the one being sent and `window` more) each holding its budget
    /// (plus the batch waiting for room), never the whole shard decoded; and every row still
    /// arrives, in order, once it reads on.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn partitions_ahead_hold_no_more_than_their_budget() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let (parts, batches, rows, window) = (6_i64, 8_i64, 1024_i64, 2_usize);
        let plan = numbered(parts, batches, rows);
        let schema = plan.schema();
        let ctx = Arc::new(TaskContext::default());
        let produced = Arc::new(AtomicUsize::new(0));
        let partitions = (0..parts as usize)
            .map(|i| {
                let produced = Arc::clone(&produced);
                let stream = plan
                    .execute(i, Arc::clone(&ctx))
                    .expect("partition")
                    .inspect(move |_| {
                        produced.fetch_add(1, Ordering::SeqCst);
                    });
                Box::pin(datafusion::physical_plan::stream::RecordBatchStreamAdapter::new(
                    Arc::clone(&schema),
                    stream,
                )) as datafusion::physical_plan::SendableRecordBatchStream
            })
            .collect();
        // 1,024 Int64 rows are 8 KiB: a 16 KiB budget holds two batches per partition.
        let mut stream = ordered_partitions(Arc::clone(&schema), partitions, window, 16);
        let first = stream.next().await.expect("a batch").expect("batch");
        assert_eq!(first.num_rows(), rows as usize);
        // The partitions ahead decode while the reader waits.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while produced.load(Ordering::SeqCst) < 1 + 2 * window {
            assert!(std::time::Instant::now() < deadline, "nothing decoded ahead");
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        let held = produced.load(Ordering::SeqCst);
        let bound = 1 + (window + 1) * (2 + 1);
        assert!(
            held <= bound,
            "{held} batches decoded for a reader that took 1 (at most {bound})"
        );
        let rest = numbers(stream, None).await;
        let all: Vec<i64> = (rows..parts * batches * rows).collect();
        assert_eq!(rest, all);
    }

    /// A partition whose task panics ends the stream with an error, never as if its rows
    /// had simply ended.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_panicking_partition_ends_the_stream_with_an_error() {
        use datafusion::physical_plan::test::exec::PanicExec;
        let schema = Arc::new(Schema::new(vec![Field::new("n", DataType::Int64, false)]));
        // Each partition panics after a few (empty) batches.
        let panics = Arc::new(
            PanicExec::new(schema, 2)
                .with_partition_panic(0, 2)
                .with_partition_panic(1, 1),
        );
        let stream =
            ordered_stream_within(panics, Arc::new(TaskContext::default()), 2, 1024).expect("stream");
        let items: Vec<_> = stream.collect().await;
        assert!(
            items.iter().any(|i| i.is_err()),
            "{} items, none an error",
            items.len()
        );
    }

    /// A reader that stops early drops the stream; the partitions decoding ahead, and those
    /// not started yet, stop with it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn dropping_the_stream_stops_every_partition() {
        use datafusion::physical_plan::test::exec::BlockingExec;
        let schema = Arc::new(Schema::new(vec![Field::new("n", DataType::Int64, false)]));
        let blocking = Arc::new(BlockingExec::new(schema, 5));
        let refs = blocking.refs();
        let mut stream =
            ordered_stream_within(blocking, Arc::new(TaskContext::default()), 2, 1).expect("stream");
        // Every partition opened: each holds a reference until it ends.
        assert!(refs.strong_count() >= 5, "{}", refs.strong_count());
        let waited = tokio::time::timeout(std::time::Duration::from_millis(50), stream.next()).await;
        assert!(waited.is_err(), "a blocking partition yields nothing");
        drop(stream);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while refs.strong_count() > 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "{} partitions left running",
                refs.strong_count()
            );
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }
}
