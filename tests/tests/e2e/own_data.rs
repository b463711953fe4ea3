//! Layouts users' own data comes in, served as it is: folder names that are not identifiers
//! (`cifar-10`, `MyPets`), files whose schemas drifted, hive `key=value/` folders and the
//! Hub's `<split>-NNNNN-of-NNNNN.parquet` names as columns pruned at planning. Each is checked
//! against DataFusion reading the same files by itself.

use std::path::Path;
use std::sync::Arc;

use arrow::array::{ArrayRef, Int32Array, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::DataType;
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;
use pushdown_protocol::{Fragment, Query, ScanRequest, ShardTicket};
use pushdown_tests::{Fixture, num_rows, rows, small_shards};
use tonic::Code;

/// Writes `columns` (name, array) as `root/path`, in row groups of 16 rows.
fn write(root: &Path, path: &str, columns: Vec<(&str, ArrayRef)>) {
    let file = root.join(path);
    std::fs::create_dir_all(file.parent().expect("parent")).expect("dir");
    let batch = RecordBatch::try_from_iter(columns).expect("batch");
    let props = WriterProperties::builder()
        .set_max_row_group_row_count(Some(16))
        .build();
    let mut writer = ArrowWriter::try_new(
        std::fs::File::create(file).expect("create"),
        batch.schema(),
        Some(props),
    )
    .expect("writer");
    writer.write(&batch).expect("write");
    writer.close().expect("close");
}

fn ids(range: std::ops::Range<i64>) -> ArrayRef {
    Arc::new(Int64Array::from_iter_values(range))
}

fn labels32(range: std::ops::Range<i32>) -> ArrayRef {
    Arc::new(Int32Array::from_iter_values(range.map(|i| i % 10)))
}

fn labels64(range: std::ops::Range<i64>) -> ArrayRef {
    Arc::new(Int64Array::from_iter_values(range.map(|i| i % 10)))
}

async fn status_of(fx: &Fixture, request: &ScanRequest) -> tonic::Status {
    pushdown_tests::raw_client(fx.running.url())
        .await
        .get_flight_info(arrow_flight::FlightDescriptor::new_cmd(request.encode()))
        .await
        .expect_err("must be refused")
}

fn sql(text: &str) -> ScanRequest {
    ScanRequest::new(Query::Sql(text.into()))
}

fn count(batches: &[RecordBatch]) -> i64 {
    batches[0]
        .column(0)
        .as_any()
        .downcast_ref::<Int64Array>()
        .expect("count")
        .value(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn folders_named_as_the_hub_names_them_are_datasets() {
    let fx = Fixture::new(small_shards(), |root| {
        write(
            root,
            "cifar-10/part-0.parquet",
            vec![("id", ids(0..40)), ("label", labels32(0..40))],
        );
        write(
            root,
            "MyPets/part-0.parquet",
            vec![("id", ids(0..24)), ("label", labels32(0..24))],
        );
    })
    .await;
    // SQL quotes a name that is not an identifier; an unquoted name folds to lower case and
    // still finds `MyPets`; pipelines give the name as it is.
    let got = fx
        .sql("SELECT count(*) FROM \"cifar-10\"")
        .await
        .expect("cifar-10");
    assert_eq!(count(&got), 40);
    for q in [
        "SELECT id FROM MyPets",
        "SELECT id FROM \"MyPets\"",
        "SELECT id FROM mypets",
    ] {
        let got = fx.sql(q).await.unwrap_or_else(|e| panic!("{q}: {e}"));
        assert_eq!(num_rows(&got), 24, "{q}");
    }
    for name in ["cifar-10", "MyPets"] {
        let fragment = ScanRequest::new(Query::Fragment(Fragment {
            dataset: name.into(),
            predicate: Some("label < 5".into()),
            ..Fragment::default()
        }));
        let (got, _) = fx
            .collect(&fragment)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let want = if name == "MyPets" { 14 } else { 20 };
        assert_eq!(num_rows(&got), want, "{name}");
    }
    let listed: Vec<String> = fx
        .client
        .list_datasets()
        .await
        .expect("list")
        .into_iter()
        .map(|(name, ..)| name)
        .collect();
    assert!(
        listed.contains(&"cifar-10".to_owned()) && listed.contains(&"MyPets".to_owned()),
        "{listed:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drifted_files_are_widened_and_null_filled_and_an_incompatible_one_is_named() {
    let fx = Fixture::new(small_shards(), |root| {
        // `label` int32 in the first file, int64 beside a new column in the second.
        write(
            root,
            "drift/a.parquet",
            vec![("id", ids(0..40)), ("label", labels32(0..40))],
        );
        let notes: ArrayRef = Arc::new(StringArray::from_iter_values((40..80).map(|i| format!("n{i}"))));
        write(
            root,
            "drift/b.parquet",
            vec![("label", labels64(40..80)), ("id", ids(40..80)), ("note", notes)],
        );
        // Text where the others hold numbers: cannot join.
        write(
            root,
            "clash/a.parquet",
            vec![("id", ids(0..8)), ("label", labels32(0..8))],
        );
        let text: ArrayRef = Arc::new(StringArray::from_iter_values((8..16).map(|i| format!("l{i}"))));
        write(root, "clash/b.parquet", vec![("id", ids(8..16)), ("label", text)]);
    })
    .await;
    let schema = fx
        .client
        .plan(&sql("SELECT id, label, note FROM drift"))
        .await
        .expect("plan")
        .try_decode_schema()
        .expect("schema");
    assert_eq!(
        schema.field_with_name("label").expect("label").data_type(),
        &DataType::Int64
    );
    assert!(schema.field_with_name("note").expect("note").is_nullable());

    let got = fx
        .sql("SELECT id, label, note FROM drift WHERE label >= 7 ORDER BY id")
        .await
        .expect("drifted files read as one");
    let want: Vec<String> = (0..80)
        .filter(|i| i % 10 >= 7)
        .map(|i| {
            let note = if i < 40 { "∅".to_owned() } else { format!("n{i}") };
            format!("{i} | {} | {note}", i % 10)
        })
        .collect();
    assert_eq!(rows(&got), want);
    // Row-wise, shard by shard, the same rows.
    let got = fx
        .sql("SELECT id, label FROM drift WHERE label >= 7")
        .await
        .expect("row-wise");
    assert_eq!(num_rows(&got), want.len());

    let status = status_of(&fx, &sql("SELECT id FROM clash")).await;
    assert_eq!(status.code(), Code::FailedPrecondition, "{status}");
    let message = status.message();
    assert!(
        message.contains("`b.parquet`") && message.contains("`label` is Utf8 here but Int32 in `a.parquet`"),
        "{message}"
    );
    // Other datasets are untouched.
    assert_eq!(
        num_rows(&fx.sql("SELECT id FROM drift").await.expect("drift")),
        80
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hub_splits_and_hive_folders_are_columns_pruned_at_planning() {
    let fx = Fixture::new(small_shards(), |root| {
        write(
            root,
            "hub/data/train-00000-of-00002.parquet",
            vec![("id", ids(0..32)), ("label", labels32(0..32))],
        );
        write(
            root,
            "hub/data/train-00001-of-00002.parquet",
            vec![("id", ids(32..64)), ("label", labels32(32..64))],
        );
        write(
            root,
            "hub/data/test-00000-of-00001.parquet",
            vec![("id", ids(64..80)), ("label", labels32(64..80))],
        );
        write(root, "hive/lang=en/year=2024/p.parquet", vec![("id", ids(0..16))]);
        write(
            root,
            "hive/lang=fr/year=2024/p.parquet",
            vec![("id", ids(16..48))],
        );
        write(
            root,
            "hive/lang=fr/year=2025/p.parquet",
            vec![("id", ids(48..56))],
        );
    })
    .await;
    let shards = |info: &arrow_flight::FlightInfo| -> Vec<String> {
        info.endpoint
            .iter()
            .map(|e| {
                let ticket = ShardTicket::decode(&e.ticket.as_ref().expect("ticket").ticket).expect("decode");
                ticket.shard.expect("row-wise").file
            })
            .collect()
    };
    let info = fx
        .client
        .plan(&sql("SELECT id, label FROM hub WHERE split = 'train'"))
        .await
        .expect("plan");
    let files = shards(&info);
    assert!(
        !files.is_empty() && files.iter().all(|f| f.contains("/train-")),
        "only the train files are planned: {files:?}"
    );
    let got = fx
        .sql("SELECT count(*) FROM hub WHERE split = 'train'")
        .await
        .expect("train");
    assert_eq!(count(&got), 64);
    let got = fx
        .sql("SELECT split, count(*) AS n FROM hub GROUP BY split ORDER BY split")
        .await
        .expect("by split");
    assert_eq!(rows(&got), vec!["test | 16", "train | 64"]);

    let info = fx
        .client
        .plan(&sql("SELECT id FROM hive WHERE lang = 'fr' AND year = '2024'"))
        .await
        .expect("plan");
    assert_eq!(
        shards(&info)
            .iter()
            .collect::<std::collections::BTreeSet<_>>()
            .len(),
        1
    );
    let got = fx
        .sql("SELECT id, lang, year FROM hive WHERE lang = 'fr' AND id >= 40 ORDER BY id")
        .await
        .expect("hive");
    let want: Vec<String> = (40..56)
        .map(|i| format!("{i} | fr | {}", if i < 48 { 2024 } else { 2025 }))
        .collect();
    assert_eq!(rows(&got), want);
    // A pipeline's predicate prunes the same way.
    let fragment = ScanRequest::new(Query::Fragment(Fragment {
        dataset: "hub".into(),
        predicate: Some("split = 'test'".into()),
        ..Fragment::default()
    }));
    let info = fx.client.plan(&fragment).await.expect("plan");
    assert!(shards(&info).iter().all(|f| f.contains("/test-")));
    let (got, _) = fx.collect(&fragment).await.expect("test split");
    assert_eq!(num_rows(&got), 16);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenize_without_a_tokenizer_is_a_precondition_not_a_retry() {
    let fx = Fixture::new(small_shards(), |root| {
        let body: ArrayRef = Arc::new(StringArray::from_iter_values((0..8).map(|i| format!("doc {i}"))));
        write(
            root,
            "docs/part-0.parquet",
            vec![("id", ids(0..8)), ("body", body)],
        );
    })
    .await;
    let status = status_of(&fx, &sql("SELECT tokenize(body, 16) AS t FROM docs")).await;
    assert_eq!(status.code(), Code::FailedPrecondition, "{status}");
    assert!(status.message().contains("ships no tokenizer.json"), "{status}");
}
