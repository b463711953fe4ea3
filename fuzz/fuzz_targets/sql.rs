//! The SQL entry point: any text is planned by a real server (over a small in-memory
//! dataset) into an answer or an error, never a panic; a planned query's streams run.
#![no_main]

use std::sync::{Arc, LazyLock};

use arrow::array::{Int64Array, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use arrow::record_batch::RecordBatch;
use libfuzzer_sys::fuzz_target;
use object_store::memory::InMemory;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use pushdown_protocol::{Query, ScanRequest};
use pushdown_engine::{CacheUse, Grant, Node};

struct Harness {
    runtime: tokio::runtime::Runtime,
    node: Arc<Node>,
}

static HARNESS: LazyLock<Harness> = LazyLock::new(|| {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("name", DataType::Utf8, true),
    ]));
    let batch = RecordBatch::try_new(
        Arc::clone(&schema),
        vec![
            Arc::new(Int64Array::from_iter_values(0..64)),
            Arc::new(StringArray::from_iter((0..64).map(|i| (i % 3 != 0).then(|| format!("n{i}"))))),
        ],
    )
    .expect("batch");
    let mut bytes = Vec::new();
    let mut writer = parquet::arrow::ArrowWriter::try_new(&mut bytes, schema, None).expect("writer");
    writer.write(&batch).expect("write");
    writer.close().expect("close");
    let store = Arc::new(InMemory::new());
    let node = runtime.block_on(async {
        store
            .put(&"t/part-0.parquet".into(), PutPayload::from(bytes))
            .await
            .expect("put");
        Arc::new(Node::builder(store as Arc<dyn ObjectStore>).open().await.expect("node"))
    });
    Harness { runtime, node }
});

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let h = &*HARNESS;
    h.runtime.block_on(async {
        let request = ScanRequest::new(Query::Sql(text.to_owned()));
        let all = Arc::new(Grant::All);
        if let Ok(planned) = h.node.plan(&request, &all).await {
            for ticket in planned.tickets() {
                if let Ok(mut stream) = h.node.run_ticket(&ticket, &all, CacheUse::Bypass).await {
                    while let Some(item) = stream.next().await {
                        if item.is_err() {
                            break;
                        }
                    }
                }
            }
        }
    });
});
