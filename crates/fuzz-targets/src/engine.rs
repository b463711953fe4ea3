//! What the engine reads from outside: SQL through a real `Node` (the allow-list, the size
//! caps, planning and the streams), Parquet files as the engine opens them, tokens files and
//! views files.

use std::sync::{Arc, LazyLock};

use arrow::array::{BinaryArray, Float64Array, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use object_store::memory::InMemory;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use pushdown_engine::{CacheUse, Grant, Node, Tokens, Views};
use pushdown_protocol::{Query, ScanRequest};

use crate::count_contained_panics;

/// A node over an in-memory store, and the runtime that drives it.
struct Harness {
    runtime: tokio::runtime::Runtime,
    store: Arc<InMemory>,
    node: Arc<Node>,
}

impl Harness {
    /// A node whose store holds `files` (path, Parquet bytes).
    fn new(files: Vec<(&str, Vec<u8>)>) -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime");
        let store = Arc::new(InMemory::new());
        let node = runtime.block_on(async {
            for (path, bytes) in files {
                store
                    .put(&path.into(), PutPayload::from(bytes))
                    .await
                    .expect("put");
            }
            let store = Arc::clone(&store) as Arc<dyn ObjectStore>;
            Arc::new(Node::builder(store).open().await.expect("a node"))
        });
        Self { runtime, store, node }
    }

    /// Plans `sql` and reads every stream of its plan to the end or its first error.
    async fn run(&self, sql: &str) {
        let request = ScanRequest::new(Query::Sql(sql.to_owned()));
        let all = Arc::new(Grant::All);
        let Ok(planned) = self.node.plan(&request, &all).await else {
            return;
        };
        for ticket in planned.tickets() {
            if let Ok(mut stream) = self.node.run_ticket(&ticket, &all, CacheUse::Bypass).await {
                while let Some(item) = stream.next().await {
                    if item.is_err() {
                        break;
                    }
                }
            }
        }
    }
}

/// A small table of every column kind the datasets use: ids, nullable text, floats, bytes.
pub(crate) fn table_file(
    rows: i64,
    properties: Option<parquet::file::properties::WriterProperties>,
) -> Vec<u8> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("name", DataType::Utf8, true),
        Field::new("score", DataType::Float64, true),
        Field::new("blob", DataType::Binary, true),
    ]));
    let batch = RecordBatch::try_new(
        Arc::clone(&schema),
        vec![
            Arc::new(Int64Array::from_iter_values(0..rows)),
            Arc::new(StringArray::from_iter(
                (0..rows).map(|i| (i % 3 != 0).then(|| format!("n{i}"))),
            )),
            Arc::new(Float64Array::from_iter(
                (0..rows).map(|i| (i % 5 != 0).then_some(i as f64 / 4.0)),
            )),
            Arc::new(BinaryArray::from_iter(
                (0..rows).map(|i| (i % 7 != 0).then(|| vec![i as u8; 3])),
            )),
        ],
    )
    .expect("a batch");
    let mut bytes = Vec::new();
    let mut writer = parquet::arrow::ArrowWriter::try_new(&mut bytes, schema, properties).expect("a writer");
    writer.write(&batch).expect("write");
    writer.close().expect("close");
    bytes
}

static SQL: LazyLock<Harness> =
    LazyLock::new(|| Harness::new(vec![("t/part-0.parquet", table_file(64, None))]));

/// SQL text: planned by a real node (over a small in-memory dataset `t`) into an answer or
/// an error; a planned query's streams run to their end or an error.
pub fn sql(data: &[u8]) {
    count_contained_panics();
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    SQL.runtime.block_on(SQL.run(text));
}

static PARQUET: LazyLock<Harness> =
    LazyLock::new(|| Harness::new(vec![("p/part-0.parquet", table_file(16, None))]));

/// A Parquet file as the engine opens it: the bytes replace dataset `p`'s one file, the node
/// rescans its catalog (footer checks and decoding), then every row is read (pages) with a
/// filter on its first column (statistics and pruning). A file that cannot be read is that
/// dataset's error, never a panic.
pub fn parquet(data: &[u8]) {
    count_contained_panics();
    let h = &*PARQUET;
    h.runtime.block_on(async {
        let put = h
            .store
            .put(&"p/part-0.parquet".into(), PutPayload::from(data.to_vec()))
            .await;
        if put.is_err() || h.node.refresh(&Grant::All).await.is_err() {
            return;
        }
        h.run("SELECT * FROM p").await;
        h.run("SELECT count(*) FROM p WHERE id > 3").await;
    });
}

/// A tokens file: parsed to the callers it names or an error naming the line; each line's
/// first word then authenticates as a bearer token and a handshake's header.
pub fn tokens(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let Ok(tokens) = Tokens::parse(&text) else {
        return;
    };
    for line in text.lines().take(16) {
        let word = line.split_whitespace().next().unwrap_or_default();
        let _ = tokens.authenticate(Some(&format!("Bearer {word}")));
        let _ = tokens.handshake(Some(line), word.as_bytes());
        let _ = tokens.handshake(None, line.as_bytes());
    }
}

/// A views file (TOML): parsed to its views, each SQL-checked, or an error.
pub fn views(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = Views::from_toml(text);
}

/// Any bytes as an audio clip: its duration, its PCM and its log-mel features, each a value
/// or an error naming the row. A decoder's panic (outside bytes reach symphonia and
/// opus-decoder) is the ops' own error for the row, contained where it happens.
pub fn audio(data: &[u8]) {
    use pushdown_ops::Value;
    let input: arrow::array::ArrayRef = Arc::new(BinaryArray::from_iter_values([data]));
    let calls: [(&str, Vec<Value>); 3] = [
        ("audio_seconds", vec![]),
        ("decode_audio", vec![Value::Int(16_000), Value::Int(2)]),
        (
            "log_mel",
            vec![
                Value::Int(16_000),
                Value::Int(80),
                Value::Int(400),
                Value::Int(160),
                Value::Int(1),
            ],
        ),
    ];
    for (name, params) in calls {
        if let Some(op) = pushdown_ops::lookup(name) {
            let _ = op.apply(&input, &params);
        }
    }
}
