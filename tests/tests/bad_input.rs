//! Bad input gets a clear error, loses nothing, and the server stays up.

use std::io::Write;
use std::time::Duration;

use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::{FlightDescriptor, Ticket};
use futures::StreamExt;
use pushdown_protocol::{Fragment, Query, ScanRequest, Shard, ShardTicket};
use pushdown_tests::{Fixture, num_rows, small_shards, write_images};
use tonic::Code;

async fn raw(fx: &Fixture) -> FlightServiceClient<tonic::transport::Channel> {
    pushdown_tests::raw_client(fx.running.url()).await
}

async fn info_error(fx: &Fixture, command: impl Into<bytes::Bytes>) -> tonic::Status {
    raw(fx)
        .await
        .get_flight_info(FlightDescriptor::new_cmd(command.into()))
        .await
        .expect_err("must fail")
}

async fn still_serves(fx: &Fixture) {
    let batches = fx
        .sql("SELECT label FROM images WHERE id < 10")
        .await
        .expect("server still up");
    assert_eq!(num_rows(&batches), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_datasets_are_not_found_with_the_known_ones() {
    let fx = Fixture::images(64).await;
    let status = info_error(&fx, "SELECT * FROM nope").await;
    assert_eq!(status.code(), Code::NotFound, "{status}");
    assert!(
        status.message().contains("`nope`") && status.message().contains("images"),
        "{status}"
    );

    let fragment = ScanRequest::new(Query::Fragment(Fragment {
        dataset: "nope".into(),
        ..Fragment::default()
    }));
    let status = info_error(&fx, fragment.encode()).await;
    assert_eq!(status.code(), Code::NotFound, "{status}");

    let status = raw(&fx)
        .await
        .get_schema(FlightDescriptor::new_path(vec!["nope".into()]))
        .await
        .expect_err("unknown path");
    assert_eq!(status.code(), Code::NotFound);
    still_serves(&fx).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_sql_is_invalid_argument_with_the_parser_message() {
    let fx = Fixture::images(64).await;
    let status = info_error(&fx, "SELEC label FROM images").await;
    assert_eq!(status.code(), Code::InvalidArgument, "{status}");
    assert_eq!(
        status.message(),
        "invalid query: Expected: an SQL statement, found: SELEC at Line: 1, Column: 1"
    );
    // What the client says of it: the server, the kind of failure in words, the message once.
    let said = fx.sql("SELEC label FROM images").await.expect_err("bad SQL");
    assert_eq!(
        said,
        format!(
            "server {}: invalid argument: invalid query: Expected: an SQL statement, found: SELEC at Line: 1, Column: 1",
            fx.running.url()
        )
    );

    // An op's own complaint names the op once, and says how to call it.
    let status = info_error(&fx, "SELECT decode_resize(label, 2, 2) FROM images").await;
    assert_eq!(status.code(), Code::InvalidArgument, "{status}");
    assert_eq!(status.message().matches("decode_resize").count(), 2, "{status}");
    assert!(
        status.message().starts_with(
            "invalid query: decode_resize: expects encoded images (binary, or the Hub's \
             struct<bytes: binary, path: string>), got Int32 (usage: decode_resize("
        ),
        "{status}"
    );

    let status = info_error(&fx, "SELECT nope FROM images").await;
    assert_eq!(status.code(), Code::InvalidArgument, "{status}");
    assert!(status.message().to_lowercase().contains("nope"), "{status}");

    let bad_predicate = ScanRequest::new(Query::Fragment(Fragment {
        dataset: "images".into(),
        columns: vec!["label".into()],
        predicate: Some("label <".into()),
        ops: vec![],
    }));
    let status = info_error(&fx, bad_predicate.encode()).await;
    assert_eq!(status.code(), Code::InvalidArgument, "{status}");

    let subquery = ScanRequest::new(Query::Fragment(Fragment {
        dataset: "images".into(),
        columns: vec![],
        predicate: Some("label IN (SELECT label FROM images)".into()),
        ops: vec![],
    }));
    let status = info_error(&fx, subquery.encode()).await;
    assert_eq!(status.code(), Code::InvalidArgument, "{status}");
    still_serves(&fx).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_read_only_queries_over_the_catalog() {
    let fx = Fixture::images(64).await;
    let outside = fx.root.path().join("outside.parquet");
    pushdown_tests::write_images(&fx.root.path().join("elsewhere"), 8);
    let statements = [
        "CREATE TABLE t AS SELECT 1".to_string(),
        "DROP TABLE images".into(),
        "INSERT INTO images SELECT * FROM images".into(),
        format!("COPY images TO '{}'", outside.display()),
        "SET datafusion.execution.batch_size = 1".into(),
        format!(
            "CREATE EXTERNAL TABLE x STORED AS PARQUET LOCATION '{}'",
            fx.root.path().display()
        ),
        "SELECT 1; SELECT 2".into(),
    ];
    for sql in &statements {
        let status = info_error(&fx, sql.clone()).await;
        assert_eq!(status.code(), Code::InvalidArgument, "{sql}: {status}");
    }
    assert!(!outside.exists(), "COPY wrote a file");

    // File paths are not tables.
    for sql in [
        "SELECT * FROM '/etc/passwd'".to_string(),
        format!(
            "SELECT * FROM '{}/elsewhere/images/part-00000.parquet'",
            fx.root.path().display()
        ),
    ] {
        let status = info_error(&fx, sql.clone()).await;
        assert!(
            matches!(status.code(), Code::NotFound | Code::InvalidArgument),
            "{sql}: {status}"
        );
    }
    still_serves(&fx).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_and_forged_tickets_are_rejected() {
    let fx = Fixture::images(64).await;
    let mut client = raw(&fx).await;
    for garbage in [&b"\xff\xff\xff"[..], b"", b"SELECT 1"] {
        let status = client
            .do_get(Ticket::new(garbage.to_vec()))
            .await
            .expect_err("garbage");
        assert_eq!(status.code(), Code::InvalidArgument, "{status}");
    }
    let request = ScanRequest::new(Query::Sql("SELECT label FROM images".into()));
    for (file, code) in [
        ("../../../etc/passwd", Code::NotFound),
        ("part-00099.parquet", Code::NotFound),
    ] {
        let forged = ShardTicket {
            request: request.clone(),
            shard: Some(Shard {
                dataset: "images".into(),
                file: file.into(),
                row_groups: 0..1,
                rows: 1,
                version: Default::default(),
                bytes: 0,
            }),
            skip_rows: 0,
            take_rows: None,
        };
        let status = client
            .do_get(Ticket::new(forged.encode()))
            .await
            .expect_err("forged");
        assert_eq!(status.code(), code, "{file}: {status}");
    }
    // A real shard, as the server minted it, to forge from.
    let info = fx.client.plan(&request).await.expect("plan");
    let real = ShardTicket::decode(&info.endpoint[0].ticket.as_ref().expect("ticket").ticket).expect("ours");
    let real_shard = real.shard.clone().expect("row-wise");
    // The file at another version (rewritten since planning, or another server's copy).
    let mut forged = real.clone();
    if let Some(s) = &mut forged.shard {
        s.version.hash = "0000000000000000".into();
    }
    let status = client
        .do_get(Ticket::new(forged.encode()))
        .await
        .expect_err("version");
    assert_eq!(status.code(), Code::FailedPrecondition, "{status}");
    assert!(status.message().contains(&real_shard.file), "{status}");
    // A real file but row groups it does not have.
    let forged = ShardTicket {
        request: request.clone(),
        shard: Some(Shard {
            row_groups: 0..99,
            ..real_shard.clone()
        }),
        skip_rows: 0,
        take_rows: None,
    };
    let status = client
        .do_get(Ticket::new(forged.encode()))
        .await
        .expect_err("range");
    assert_eq!(status.code(), Code::InvalidArgument, "{status}");
    // A shard ticket whose query is not row-wise would give partial answers: refused.
    let forged = ShardTicket {
        request: ScanRequest::new(Query::Sql("SELECT count(*) FROM images".into())),
        shard: Some(real_shard.clone()),
        skip_rows: 0,
        take_rows: None,
    };
    let status = client
        .do_get(Ticket::new(forged.encode()))
        .await
        .expect_err("aggregate");
    assert_eq!(status.code(), Code::InvalidArgument, "{status}");
    // Nor a volatile one: its rows differ per run, so a shard of it cannot be resumed.
    let forged = ShardTicket {
        request: ScanRequest::new(Query::Sql("SELECT label FROM images WHERE random() < 0.5".into())),
        shard: Some(real_shard.clone()),
        skip_rows: 0,
        take_rows: None,
    };
    let status = client
        .do_get(Ticket::new(forged.encode()))
        .await
        .expect_err("volatile");
    assert_eq!(status.code(), Code::InvalidArgument, "{status}");
    // A whole query's stream has no total order: it cannot be resumed part-way.
    let forged = ShardTicket {
        request: ScanRequest::new(Query::Sql("SELECT count(*) FROM images".into())),
        shard: None,
        skip_rows: 3,
        take_rows: None,
    };
    let status = client
        .do_get(Ticket::new(forged.encode()))
        .await
        .expect_err("aggregate");
    assert_eq!(status.code(), Code::InvalidArgument, "{status}");
    still_serves(&fx).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_parquet_fails_that_request_only() {
    let fx = Fixture::new(small_shards(), |root| {
        write_images(root, 64);
        // A truncated file: no footer.
        let broken = root.join("broken");
        std::fs::create_dir_all(&broken).expect("dir");
        let good = std::fs::read(root.join("images/part-00000.parquet")).expect("read");
        std::fs::write(broken.join("part-0.parquet"), &good[..good.len() / 2]).expect("write");
        // A file with an intact footer but garbage pages.
        let mangled = root.join("mangled");
        std::fs::create_dir_all(&mangled).expect("dir");
        let mut bytes = good.clone();
        for b in &mut bytes[8..good.len() / 2] {
            *b = b.wrapping_mul(31).wrapping_add(7);
        }
        let mut f = std::fs::File::create(mangled.join("part-0.parquet")).expect("create");
        f.write_all(&bytes).expect("write");
    })
    .await;

    let status = info_error(&fx, "SELECT * FROM broken").await;
    assert_eq!(status.code(), Code::DataLoss, "{status}");
    assert!(status.message().contains("part-0.parquet"), "{status}");

    // The mangled file plans (its footer is fine) but its stream fails with an error,
    // never a silent short stream.
    let result = fx.sql("SELECT id, image FROM mangled").await;
    assert!(result.is_err(), "mangled pages must fail the stream");
    still_serves(&fx).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_stops_the_servers_work() {
    // One 512-row shard (~8 MB of images): far more than the client's flow-control window,
    // so the server cannot have finished when the client goes away.
    let config = pushdown_server::ServerConfig {
        shard_max_rows: 1 << 20,
        ..small_shards()
    };
    let fx = Fixture::new(config, |root| {
        let mut options = pushdown_datasets::GenOptions::new(pushdown_datasets::Kind::Images, 512);
        options.rows_per_file = Some(512);
        options.row_group_rows = Some(64);
        pushdown_datasets::generate(&options, &root.join("images")).expect("images");
    })
    .await;
    let info = fx
        .client
        .plan(&ScanRequest::new(Query::Sql("SELECT image FROM images".into())))
        .await
        .expect("plan");
    let mut client = raw(&fx).await;
    let ticket = info.endpoint[0].ticket.clone().expect("ticket");
    let mut stream = client.do_get(ticket).await.expect("do_get").into_inner();
    let first = stream.next().await.expect("a message").expect("ok");
    assert!(!first.data_header.is_empty());
    drop(stream);
    drop(client);

    // The producer notices and the stream slot is released (bounded wait, no fixed sleep).
    let gauge = || {
        fx.server
            .metrics()
            .encode()
            .lines()
            .find(|l| l.starts_with("pushdown_active_streams "))
            .map(|l| l.trim_start_matches("pushdown_active_streams ").trim().to_owned())
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while gauge().as_deref() != Some("0") {
        assert!(
            tokio::time::Instant::now() < deadline,
            "stream still active: {:?}",
            gauge()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let metrics = fx.server.metrics().encode();
    assert!(
        metrics.contains("pushdown_requests_total{method=\"do_get\",outcome=\"cancelled\"} 1"),
        "{metrics}"
    );
    still_serves(&fx).await;
}

/// Profiling a dataset with no rows is a named error, at once: the scan sample cannot grow
/// (it once asked for 0 rows forever, holding a stream slot until the request timeout).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn profiling_an_empty_dataset_is_a_named_error() {
    use std::sync::Arc;

    use arrow::array::{Int64Array, RecordBatch};
    use arrow::datatypes::{DataType, Field, Schema};

    let fx = Fixture::new(small_shards(), |root| {
        write_images(root, 64);
        let dir = root.join("empty");
        std::fs::create_dir_all(&dir).expect("dir");
        let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
        let file = std::fs::File::create(dir.join("part-0.parquet")).expect("file");
        let mut writer =
            parquet::arrow::ArrowWriter::try_new(file, Arc::clone(&schema), None).expect("writer");
        let none =
            RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(Vec::<i64>::new()))]).expect("batch");
        writer.write(&none).expect("write");
        writer.close().expect("close");
    })
    .await;
    let request = ScanRequest::new(Query::Fragment(Fragment {
        dataset: "empty".into(),
        columns: vec!["id".into()],
        ..Fragment::default()
    }));
    let answer = tokio::time::timeout(Duration::from_secs(120), fx.client.profile(&request))
        .await
        .expect("the profile answers instead of spinning");
    let error = answer.expect_err("nothing to sample").to_string();
    assert!(error.contains("empty"), "{error}");
    still_serves(&fx).await;
}
