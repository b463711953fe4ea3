//! End to end: a real server on 127.0.0.1:0, the real client, `run` (the demo is tested in
//! the CLI crate).

use std::sync::Arc;

use arrow_flight::{Criteria, FlightDescriptor};
use futures::{StreamExt, TryStreamExt};
use pushdown_client::run::{RunOptions, run};
use pushdown_client::{LoaderOptions, LoaderSource};
use pushdown_client::{StreamOptions, plan_estimate};
use pushdown_planner::Pipeline;
use pushdown_protocol::ActionKind;
use pushdown_protocol::{Query, ScanRequest, ShardTicket};
use pushdown_server::serve_metrics;
use pushdown_tests::{Fixture, local_eval, num_rows, rows, sorted_rows};

#[path = "e2e/own_data.rs"]
mod own_data;
#[path = "e2e/shutdown.rs"]
mod shutdown;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipeline_run_writes_the_rows_the_filter_selects() {
    let fx = Fixture::images(300).await;
    let out = fx.root.path().join("out.parquet");
    let pipeline = Pipeline::new("images")
        .shuffle(100)
        .filter("label < 300")
        .select(["id", "label"])
        .batch(16);
    let options = RunOptions {
        out: Some(out.clone()),
        loader: LoaderOptions {
            seed: 3,
            ..LoaderOptions::default()
        },
        ..RunOptions::new(vec![fx.running.url()], LoaderSource::Pipeline(pipeline))
    };
    let report = run(&options).await.expect("run");
    let plan = report.plan.as_ref().expect("plan");
    assert_eq!(plan.fragment.columns, vec!["id", "label"]);
    assert_eq!(plan.fragment.predicate.as_deref(), Some("(label < 300)"));

    let expected = local_eval(fx.root.path(), "SELECT id, label FROM images WHERE label < 300").await;
    let file = std::fs::File::open(&out).expect("out");
    let written: Vec<_> = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
        .expect("parquet")
        .build()
        .expect("reader")
        .collect::<Result<_, _>>()
        .expect("read");
    assert_eq!(sorted_rows(&written), sorted_rows(&expected));
    assert_eq!(report.rows as usize, num_rows(&expected));
    // Shuffled: not in id order.
    assert_ne!(rows(&written), rows(&expected));
    // Batches of 16 but the last.
    assert!(written.iter().rev().skip(1).all(|b| b.num_rows() == 16));

    // Same seed, same sequence; another seed, another.
    let again = run(&options).await.expect("run again");
    assert_eq!(again.rows, report.rows);
    let second: Vec<_> = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(
        std::fs::File::open(&out).expect("out"),
    )
    .expect("parquet")
    .build()
    .expect("reader")
    .collect::<Result<_, _>>()
    .expect("read");
    assert_eq!(rows(&second), rows(&written));
    let mut other = options.clone();
    other.loader.seed = 4;
    run(&other).await.expect("run other seed");
    let third: Vec<_> = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(
        std::fs::File::open(&out).expect("out"),
    )
    .expect("parquet")
    .build()
    .expect("reader")
    .collect::<Result<_, _>>()
    .expect("read");
    assert_ne!(rows(&third), rows(&written));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queries_that_are_not_row_wise_get_one_correct_stream() {
    let fx = Fixture::images(300).await;
    for sql in [
        "SELECT count(*) AS n FROM images",
        "SELECT split, count(*) AS n, max(label) AS m FROM images GROUP BY split ORDER BY split",
        "SELECT id, label FROM images ORDER BY label DESC, id LIMIT 7",
        "SELECT DISTINCT split FROM images ORDER BY split",
        "SELECT a.id FROM images a JOIN images b ON a.id = b.id + 1 WHERE a.id < 20 ORDER BY a.id",
        "SELECT id FROM images WHERE label = (SELECT max(label) FROM images)",
        "SELECT 1 + 1 AS two",
    ] {
        let info = fx
            .client
            .plan(&ScanRequest::new(Query::Sql(sql.into())))
            .await
            .expect(sql);
        assert_eq!(info.endpoint.len(), 1, "{sql}: one endpoint");
        assert!(!plan_estimate(&info).expect("estimate").row_wise);
        let served = fx.sql(sql).await.expect(sql);
        let local = local_eval(fx.root.path(), sql).await;
        assert_eq!(rows(&served), rows(&local), "{sql}");
    }
    // Row-wise queries fan out over shards.
    let info = fx
        .client
        .plan(&ScanRequest::new(Query::Sql(
            "SELECT label FROM images WHERE label % 10 = 0".into(),
        )))
        .await
        .expect("row-wise");
    assert!(info.endpoint.len() > 2, "{} endpoints", info.endpoint.len());
    assert!(plan_estimate(&info).expect("estimate").row_wise);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ticket_resumes_from_an_offset() {
    let fx = Fixture::images(200).await;
    let info = fx
        .client
        .plan(&ScanRequest::new(Query::Sql("SELECT id FROM images".into())))
        .await
        .expect("plan");
    let ticket = info.endpoint[0].ticket.clone().expect("ticket");
    let full = fetch_ticket(&fx, ticket.ticket.clone()).await;
    let mut resumed = ShardTicket::decode(&ticket.ticket).expect("ticket");
    resumed.skip_rows = 37;
    let tail = fetch_ticket(&fx, resumed.encode()).await;
    assert_eq!(rows(&tail), rows(&full)[37..].to_vec());
}

/// `Server::run_ticket` is the `DoGet`'s own path, not a copy of it: the same rows past
/// `skip_rows`, and the same ops left to the client, with the same schema saying so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_ticket_in_process_equals_the_doget_tail() {
    use pushdown_protocol::{Deferral, Fragment, OpCall, Value};
    let fx = Fixture::images(200).await;
    let thumbs = ScanRequest::new(Query::Fragment(Fragment {
        dataset: "images".into(),
        columns: vec!["id".into(), "label".into(), "thumb".into()],
        predicate: Some("label % 3 <> 0".into()),
        ops: vec![OpCall::new("thumbnail", "image", vec![Value::Int(8)], "thumb")],
    }));
    let mut deferred = thumbs.clone();
    deferred.deferral = Deferral::Always { from: 0 };
    for request in [
        ScanRequest::new(Query::Sql("SELECT id, label FROM images".into())),
        thumbs,
        deferred,
    ] {
        let info = fx.client.plan(&request).await.expect("plan");
        for endpoint in &info.endpoint {
            let raw = endpoint.ticket.clone().expect("ticket").ticket;
            let mut ticket = ShardTicket::decode(&raw).expect("ticket");
            let whole = fetch_ticket(&fx, raw).await;
            ticket.skip_rows = 37.min(num_rows(&whole) as u64);
            let over_flight = fetch_ticket(&fx, ticket.encode()).await;
            let in_process: Vec<_> = fx
                .server
                .run_ticket(&ticket)
                .await
                .expect("run_ticket")
                .into_stream()
                .try_collect()
                .await
                .expect("batches");
            let skip = ticket.skip_rows as usize;
            assert_eq!(rows(&over_flight), rows(&whole)[skip..].to_vec());
            assert_eq!(rows(&in_process), rows(&over_flight), "{request:?}");
            if let (Some(a), Some(b)) = (in_process.first(), over_flight.first()) {
                assert_eq!(
                    a.schema().metadata(),
                    b.schema().metadata(),
                    "the deferral, said alike"
                );
                let deferral_said = a
                    .schema()
                    .metadata()
                    .contains_key(pushdown_protocol::DEFERRED_FROM_KEY);
                assert_eq!(deferral_said, request.deferral != Deferral::Never);
            }
        }
    }
}

async fn fetch_ticket(fx: &Fixture, ticket: bytes::Bytes) -> Vec<arrow::record_batch::RecordBatch> {
    fetch_from(fx.running.url(), ticket).await
}

async fn fetch_from(url: String, ticket: bytes::Bytes) -> Vec<arrow::record_batch::RecordBatch> {
    let mut client = pushdown_tests::raw_client(url).await;
    let stream = client
        .do_get(arrow_flight::Ticket::new(ticket))
        .await
        .expect("do_get")
        .into_inner()
        .map_err(|s| arrow_flight::error::FlightError::Tonic(Box::new(s)));
    arrow_flight::decode::FlightRecordBatchStream::new_from_flight_data(stream)
        .try_collect()
        .await
        .expect("batches")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catalog_schema_explain_and_metrics() {
    let fx = Fixture::images(100).await;
    let datasets = fx.client.list_datasets().await.expect("list");
    assert_eq!(datasets.len(), 1);
    assert_eq!(datasets[0].0, "images");
    assert_eq!(datasets[0].1, 100);
    assert_eq!(datasets[0].3.fields().len(), 7);

    let mut raw = pushdown_tests::raw_client(fx.running.url()).await;
    let listed: Vec<_> = raw
        .list_flights(Criteria::default())
        .await
        .expect("list")
        .into_inner()
        .try_collect()
        .await
        .expect("infos");
    assert_eq!(listed.len(), 1);
    // A path descriptor streams the whole dataset.
    let info = raw
        .get_flight_info(FlightDescriptor::new_path(vec!["images".into()]))
        .await
        .expect("path info")
        .into_inner();
    assert_eq!(info.total_records, 100);

    let explained = fx
        .client
        .action(
            ActionKind::Explain,
            "SELECT label FROM images WHERE id < 10".into(),
        )
        .await
        .expect("explain");
    let text = String::from_utf8(explained[0].to_vec()).expect("utf8");
    assert!(text.contains("row-wise") && text.contains("TableScan"), "{text}");
    let health = fx
        .client
        .action(ActionKind::Health, bytes::Bytes::new())
        .await
        .expect("health");
    assert_eq!(&health[0][..], b"ok");
    let unknown = pushdown_tests::raw_client(fx.running.url())
        .await
        .do_action(arrow_flight::Action::new("nope", bytes::Bytes::new()))
        .await
        .expect_err("unknown action");
    assert_eq!(unknown.code(), tonic::Code::InvalidArgument, "{unknown}");
    assert!(unknown.message().contains("health, explain"), "{unknown}");

    // Metrics over HTTP, as Prometheus scrapes them.
    fx.sql("SELECT label FROM images").await.expect("query");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let metrics =
        pushdown_task::Task::spawn(serve_metrics(listener, Arc::clone(fx.server.metrics()), async {
            let _ = stopped.await;
        }));
    let body = http_get(addr, "/metrics").await;
    for name in [
        "pushdown_bytes_scanned_total",
        "pushdown_bytes_sent_total",
        "pushdown_rows_scanned_total",
        "pushdown_rows_sent_total 100",
        "pushdown_row_groups_pruned_total",
        "pushdown_requests_total{method=\"get_flight_info\",outcome=\"ok\"}",
    ] {
        assert!(body.contains(name), "{name} missing from\n{body}");
    }
    let _ = stop.send(());
    metrics.await.expect("join").expect("metrics server");
}

async fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    stream
        .write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .expect("write");
    let mut response = String::new();
    stream.read_to_string(&mut response).await.expect("read");
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    response
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_fan_out_with_bounded_concurrency() {
    let fx = Fixture::images(512).await;
    let request = ScanRequest::new(Query::Sql("SELECT id, label FROM images".into()));
    let info = fx.client.plan(&request).await.expect("plan");
    for concurrency in [1, 3, 16] {
        let mut stream = fx
            .client
            .stream(
                &info,
                StreamOptions {
                    concurrency,
                    ..StreamOptions::default()
                },
            )
            .expect("stream");
        let mut batches = Vec::new();
        while let Some(b) = stream.next().await {
            batches.push(b.expect("batch"));
        }
        assert_eq!(num_rows(&batches), 512, "concurrency {concurrency}");
        let mut ids: Vec<String> = rows(&batches)
            .into_iter()
            .map(|r| r.split(" | ").next().unwrap_or_default().to_owned())
            .collect();
        ids.sort_by_key(|s| s.parse::<i64>().unwrap_or(-1));
        ids.dedup();
        assert_eq!(ids.len(), 512, "every row exactly once");
        assert!(stream.totals().bytes_received > 0);
    }
}

/// The codec of every record batch message of the stream `descriptor` plans to.
async fn codecs(fx: &Fixture, descriptor: FlightDescriptor) -> Vec<Option<arrow::ipc::CompressionType>> {
    let mut raw = pushdown_tests::raw_client(fx.running.url()).await;
    let info = raw.get_flight_info(descriptor).await.expect("info").into_inner();
    let mut out = Vec::new();
    for endpoint in info.endpoint {
        let ticket = endpoint.ticket.expect("ticket");
        let mut stream = raw.do_get(ticket).await.expect("do_get").into_inner();
        while let Some(data) = stream.next().await {
            let data = data.expect("data");
            let Ok(message) = arrow::ipc::root_as_message(&data.data_header) else {
                continue;
            };
            if let Some(batch) = message.header_as_record_batch() {
                out.push(batch.compression().map(|c| c.codec()));
            }
        }
    }
    out
}

/// A plain Flight client (pyarrow's `do_get` with SQL text or a path) cannot choose a codec:
/// on loopback it gets uncompressed streams, since compressing only costs both sides CPU. A
/// client that asks for one gets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_clients_on_loopback_get_uncompressed_streams() {
    let fx = Fixture::images(300).await;
    let sql = "SELECT id, label FROM images WHERE label < 500";
    for descriptor in [
        FlightDescriptor::new_cmd(sql.as_bytes().to_vec()),
        FlightDescriptor::new_path(vec!["images".into()]),
    ] {
        let got = codecs(&fx, descriptor).await;
        assert!(!got.is_empty());
        assert!(got.iter().all(Option::is_none), "{got:?}");
    }
    let mut request = ScanRequest::new(Query::Sql(sql.into()));
    request.compression = pushdown_protocol::Compression::Zstd;
    let got = codecs(&fx, FlightDescriptor::new_cmd(request.encode())).await;
    assert!(!got.is_empty());
    assert!(
        got.iter().all(|c| *c == Some(arrow::ipc::CompressionType::ZSTD)),
        "{got:?}"
    );
}

/// An adaptive stream (what a plain client off this host gets, or any client that asks)
/// starts uncompressed and compresses once the client holds it back: here a client that
/// takes a batch every 15 ms while the server could send far faster. The mix of codecs
/// decodes to the same rows as an uncompressed stream. A server told to use one codec for
/// plain clients (`plain_client_codec`, for peers behind a local proxy) uses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adaptive_streams_compress_while_the_client_holds_them_back() {
    use pushdown_protocol::Compression;
    let config = pushdown_server::ServerConfig {
        batch_size: 16,
        shard_max_rows: 1 << 20,
        plain_client_codec: Some(Compression::Adaptive),
        ..pushdown_tests::small_shards()
    };
    let fx = Fixture::new(config, |root| {
        pushdown_tests::write_images(root, 768);
    })
    .await;
    let sql = "SELECT id, image FROM images";
    // HTTP/2 windows of 64 KiB: the socket, not a megabyte of buffers, holds the stream back.
    let channel = tonic::transport::Channel::from_shared(fx.running.url())
        .expect("url")
        .initial_stream_window_size(64 << 10)
        .initial_connection_window_size(64 << 10)
        .connect()
        .await
        .expect("connect");
    let mut raw = arrow_flight::flight_service_client::FlightServiceClient::new(channel);
    let info = raw
        .get_flight_info(FlightDescriptor::new_cmd(sql.as_bytes().to_vec()))
        .await
        .expect("info")
        .into_inner();
    let (mut seen, mut messages) = (Vec::new(), Vec::new());
    for endpoint in info.endpoint {
        let mut stream = raw
            .do_get(endpoint.ticket.expect("ticket"))
            .await
            .expect("do_get")
            .into_inner();
        while let Some(data) = stream.next().await {
            let data = data.expect("data");
            let message = arrow::ipc::root_as_message(&data.data_header).expect("IPC message");
            if let Some(batch) = message.header_as_record_batch() {
                seen.push(batch.compression().map(|c| c.codec()));
                tokio::time::sleep(std::time::Duration::from_millis(15)).await;
            } else if !messages.is_empty() {
                continue; // one schema for the decoder
            }
            messages.push(data);
        }
    }
    assert!(seen.len() >= 40, "{} batches", seen.len());
    assert_eq!(seen[0], None, "adaptive streams start uncompressed");
    assert!(seen.iter().any(Option::is_some), "never compressed: {seen:?}");
    let got = arrow_flight::utils::flight_data_to_batches(&messages).expect("decodes");
    let plain = fx.local(sql).await;
    assert_eq!(sorted_rows(&got), sorted_rows(&plain));

    let mut fixed = pushdown_server::ServerConfig {
        plain_client_codec: Some(Compression::Lz4),
        ..pushdown_tests::small_shards()
    };
    fixed.batch_size = 100;
    let fx = Fixture::new(fixed, |root| {
        pushdown_tests::write_images(root, 300);
    })
    .await;
    let got = codecs(&fx, FlightDescriptor::new_cmd(sql.as_bytes().to_vec())).await;
    assert!(!got.is_empty());
    assert!(
        got.iter()
            .all(|c| *c == Some(arrow::ipc::CompressionType::LZ4_FRAME)),
        "{got:?}"
    );
}

/// A lone stream decodes its shard's row groups on several cores at once, yet streams them in
/// the order one core would: the same rows in the same order, and the same tail from a
/// resume offset, as a server with one CPU thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_decoded_on_several_cores_streams_in_one_cores_order() {
    let config = |threads| pushdown_server::ServerConfig {
        cpu_threads: threads,
        batch_size: 16,
        ..pushdown_server::ServerConfig::default()
    };
    let wide = Fixture::new(config(4), |root| {
        pushdown_tests::write_images(root, 600);
    })
    .await;
    let spawn = |config| async {
        let store = pushdown_server::open_store(&wide.root.path().to_string_lossy()).expect("store");
        pushdown_server::Server::builder(store)
            .config(config)
            .open()
            .await
            .expect("server")
            .spawn("127.0.0.1:0".parse().unwrap())
            .await
            .expect("spawn")
    };
    let narrow = spawn(config(1)).await;
    // One core, four row-group ranges read at once (as over S3): the same order again.
    let reads_ahead = spawn(pushdown_server::ServerConfig {
        store_reads_in_flight: 4,
        ..config(1)
    })
    .await;
    let request = ScanRequest::new(Query::Sql(
        "SELECT id, label, thumbnail(image, 4) AS t FROM images WHERE label % 3 <> 0".into(),
    ));
    let info = wide.client.plan(&request).await.expect("plan");
    assert!(!info.endpoint.is_empty());
    let mut widest = 0;
    for endpoint in &info.endpoint {
        let bytes = endpoint.ticket.as_ref().expect("ticket").ticket.clone();
        let ticket = ShardTicket::decode(&bytes).expect("ticket");
        let shard = ticket.shard.as_ref().expect("shard");
        widest = widest.max(shard.row_groups.len());
        let many = fetch_from(wide.running.url(), bytes.clone()).await;
        let one = fetch_from(narrow.url(), bytes.clone()).await;
        let ahead = fetch_from(reads_ahead.url(), bytes.clone()).await;
        assert_eq!(rows(&ahead), rows(&one), "{}", shard.label());
        let ids = |batches: &[arrow::record_batch::RecordBatch]| -> Vec<i64> {
            batches
                .iter()
                .flat_map(|b| {
                    let c = b.column_by_name("id").expect("id");
                    arrow::array::AsArray::as_primitive::<arrow::datatypes::Int64Type>(c)
                        .values()
                        .to_vec()
                })
                .collect()
        };
        assert_eq!(ids(&many), ids(&one), "{}", shard.label());
        assert_eq!(rows(&many), rows(&one));
        let mut resumed = ticket.clone();
        resumed.skip_rows = 37;
        let tail = fetch_from(wide.running.url(), resumed.encode()).await;
        assert_eq!(rows(&tail), rows(&one)[37..].to_vec());
    }
    assert!(
        widest >= 4,
        "shards of several row groups, each decoded on its own core"
    );
}

/// A reader taking endpoints one by one, as pyarrow does, finds each next endpoint opened
/// and decoding ahead: the same rows in the same order as a server that does not read ahead.
/// A stream for any other ticket drops what was held, and the ticket is then opened afresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_reader_finds_the_next_endpoint_opened_ahead() {
    // No cache: a shard the cache holds is never read ahead (`io_accounting` checks that).
    let config = |read_ahead| pushdown_server::ServerConfig {
        read_ahead,
        cpu_threads: 2,
        batch_size: 16,
        cache: pushdown_server::CacheConfig {
            default_mode: pushdown_server::CacheMode::Off,
            ..pushdown_server::CacheConfig::default()
        },
        ..pushdown_tests::small_shards()
    };
    let fx = Fixture::new(config(true), |root| {
        pushdown_tests::write_images(root, 500);
    })
    .await;
    let store = pushdown_server::open_store(&fx.root.path().to_string_lossy()).expect("store");
    let plain = pushdown_server::Server::builder(store)
        .config(config(false))
        .open()
        .await
        .expect("server")
        .spawn("127.0.0.1:0".parse().unwrap())
        .await
        .expect("spawn");
    let sql = "SELECT id, label, thumbnail(image, 4) AS t FROM images WHERE label % 3 <> 0";
    let mut raw = pushdown_tests::raw_client(fx.running.url()).await;
    let info = raw
        .get_flight_info(FlightDescriptor::new_cmd(sql.as_bytes().to_vec()))
        .await
        .expect("plan")
        .into_inner();
    let tickets: Vec<bytes::Bytes> = info
        .endpoint
        .iter()
        .map(|e| e.ticket.as_ref().expect("ticket").ticket.clone())
        .collect();
    assert!(tickets.len() >= 3, "{} endpoints", tickets.len());
    let count = |outcome: &str| pushdown_tests::read_aheads(&fx.server, outcome);
    let held = || pushdown_tests::until_read_ahead_held(&fx.server);
    for (i, ticket) in tickets.iter().enumerate() {
        let got = fetch_from(fx.running.url(), ticket.clone()).await;
        let want = fetch_from(plain.url(), ticket.clone()).await;
        assert_eq!(rows(&got), rows(&want), "endpoint {i}");
        assert!(!want.is_empty());
        if i + 1 < tickets.len() {
            held().await;
        }
    }
    assert_eq!(count("taken"), tickets.len() as u64 - 1);
    assert!(
        !fx.server.holds_read_ahead(),
        "the last endpoint has no successor"
    );

    // Out of order: the held endpoint 1 is dropped by a stream for endpoint 2.
    let first = fetch_from(fx.running.url(), tickets[0].clone()).await;
    assert!(!first.is_empty());
    held().await;
    let dropped = count("dropped");
    let third = fetch_from(fx.running.url(), tickets[2].clone()).await;
    assert_eq!(count("dropped"), dropped + 1);
    assert_eq!(
        rows(&third),
        rows(&fetch_from(plain.url(), tickets[2].clone()).await)
    );
    let second = fetch_from(fx.running.url(), tickets[1].clone()).await;
    assert_eq!(
        rows(&second),
        rows(&fetch_from(plain.url(), tickets[1].clone()).await)
    );
}

/// The scaling signal end to end: a real loader reports its consumer's wait; the server
/// answers the `scaling` action, `/scaling` and the metrics from it; bad reports are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loaders_report_their_wait_and_servers_answer_how_many_servers_remove_it() {
    use pushdown_protocol::{ClientReport, ScalingSignal};
    let fx = Fixture::images(256).await;
    let url = fx.running.url();

    // Before any report: one server, nobody waiting.
    let (_, before) = fx.client.scaling().await.expect("scaling").remove(0);
    assert_eq!((before.clients, before.servers, before.servers_wanted), (0, 1, 1));

    // A loader whose consumer takes 20 ms a batch, reporting every 10 ms.
    let loader_url = url.clone();
    let delivered = tokio::task::spawn_blocking(move || {
        let options = LoaderOptions {
            batch_size: Some(16),
            report_every: Some(std::time::Duration::from_millis(10)),
            ..LoaderOptions::default()
        };
        let loader = pushdown_client::Loader::new(
            &[loader_url],
            LoaderSource::Sql("SELECT id, thumbnail(image, 16) AS t FROM images".into()),
            options,
        )
        .expect("loader");
        let mut rows = 0;
        for batch in loader {
            rows += batch.expect("batch").rows;
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        rows
    })
    .await
    .expect("loader thread");
    assert_eq!(delivered, 256);
    // Reports are sent in the background: wait for the loader's to arrive.
    let mut signal = before;
    for _ in 0..100 {
        signal = fx.client.scaling().await.expect("scaling").remove(0).1;
        if signal.clients == 1 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(signal.clients, 1, "{signal:?}");
    assert_eq!(signal.servers, 1);
    assert!((0.0..=1.0).contains(&signal.wait_fraction), "{signal:?}");
    assert!((0.0..=1.0).contains(&signal.busy_fraction), "{signal:?}");
    assert!(signal.demand_factor >= 1.0, "{signal:?}");
    assert!(signal.cores >= 1 && !signal.reason.is_empty(), "{signal:?}");

    // Reports with known numbers: a client of a 3-server fleet waiting half its time wants
    // twice its rate; the signal's arithmetic follows from the busy fraction it measured.
    let report = |client, wait| ClientReport {
        client,
        servers: 3,
        elapsed_seconds: 10.0,
        wait_seconds: wait,
        rows: 100_000,
    };
    let raw = pushdown_tests::raw_client(url.clone()).await;
    for client in [100, 101] {
        let action = arrow_flight::Action::new(ActionKind::Report.name(), report(client, 5.0).to_bytes());
        let results: Vec<_> = raw
            .clone()
            .do_action(action)
            .await
            .expect("report")
            .into_inner()
            .try_collect()
            .await
            .expect("report results");
        assert!(results.is_empty());
    }
    let body = fx
        .client
        .action(ActionKind::Scaling, bytes::Bytes::new())
        .await
        .expect("scaling action");
    let s = ScalingSignal::from_bytes(&body[0]).expect("decode");
    assert_eq!((s.clients, s.servers), (3, 3), "{s:?}");
    assert!(s.demand_factor > 1.5, "two of three clients want 2×: {s:?}");
    match s.bottleneck.as_str() {
        "server_cpu" => assert!(s.servers_wanted >= 4, "{s:?}"),
        "not_server" => assert_eq!(s.servers_wanted, 3, "{s:?}"),
        other => panic!("a stall is either the server's or not: {other} in {s:?}"),
    }

    // Bad reports are the caller's error, named; nothing is recorded.
    for (body, what) in [
        (bytes::Bytes::from_static(b"\xff\xff\xff"), "ClientReport"),
        (report(102, -1.0).to_bytes(), "wait_seconds"),
        (report(103, f64::NAN).to_bytes(), "wait_seconds"),
    ] {
        let err = raw
            .clone()
            .do_action(arrow_flight::Action::new(ActionKind::Report.name(), body))
            .await
            .expect_err("bad report");
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err}");
        assert!(err.message().contains(what), "{err}");
    }
    let (_, after) = fx.client.scaling().await.expect("scaling").remove(0);
    assert_eq!(after.clients, 3, "bad reports are not counted");

    // The same signal over HTTP: JSON on /scaling, gauges on /metrics.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let metrics =
        pushdown_task::Task::spawn(serve_metrics(listener, Arc::clone(fx.server.metrics()), async {
            let _ = stopped.await;
        }));
    let json = http_get(addr, "/scaling").await;
    assert!(json.contains("application/json"), "{json}");
    assert!(json.contains("\"servers\":3,\"servers_wanted\":"), "{json}");
    let text = http_get(addr, "/metrics").await;
    for name in [
        "pushdown_scaling_servers 3",
        "pushdown_scaling_clients 3",
        "pushdown_scaling_servers_wanted ",
        "pushdown_scaling_load_ratio ",
        "pushdown_busy_fraction ",
        "pushdown_client_wait_fraction ",
    ] {
        assert!(text.contains(name), "{name} missing from\n{text}");
    }
    let _ = stop.send(());
    metrics.await.expect("join").expect("metrics server");
}

/// Streams the client is not reading yet never starve the one it is: a 2-thread server, 8
/// streams in flight over one connection, read shard after shard, each shard far larger than
/// what the client reads ahead of it (rows of 64 KiB, 256 KiB read ahead). Each unread
/// stream fills its HTTP/2 window and waits; with a connection window smaller than their sum
/// the head stream got no byte, was cancelled as stalled and resumed into the same wall (the
/// deadlock past 4 streams). Every row arrives, in order, with no stream cancelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_held_back_by_the_client_never_starve_the_one_it_reads() {
    use pushdown_client::Order;
    let (files, rows, row_bytes) = (12, 160, 64 << 10);
    let config = pushdown_server::ServerConfig {
        cpu_threads: 2,
        batch_size: 16,
        shard_max_rows: rows as u64,
        ..pushdown_server::ServerConfig::default()
    };
    let fx = Fixture::new(config, |root| {
        pushdown_tests::write_blobs(root, files, rows, row_bytes)
    })
    .await;
    let mut request = ScanRequest::new(Query::Sql("SELECT id, blob FROM blobs".into()));
    request.compression = pushdown_protocol::Compression::None;
    request.stats = true;
    let info = fx.client.plan(&request).await.expect("plan");
    assert_eq!(info.endpoint.len(), files, "a shard per file");
    let options = StreamOptions {
        concurrency: 8,
        buffered_bytes: 256 << 10,
        order: Order::Sequential,
        // A stall is cancelled quickly, and never retried: a starved stream fails the test.
        stall_timeout: std::time::Duration::from_secs(5),
        max_retries: 0,
        ..StreamOptions::default()
    };
    let mut stream = fx.client.stream(&info, options).expect("stream");
    let mut next_id = 0i64;
    let read = async {
        while let Some(batch) = stream.next().await {
            let batch = batch.expect("no stream fails");
            let ids = batch
                .column(0)
                .as_any()
                .downcast_ref::<arrow::array::Int64Array>()
                .expect("ids");
            for id in ids.values() {
                assert_eq!(*id, next_id, "shard after shard, in order");
                next_id += 1;
            }
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(300), read)
        .await
        .expect("the epoch finishes");
    assert_eq!(next_id as usize, files * rows, "every row");
    let totals = stream.totals();
    assert_eq!(totals.retries, 0, "no stream was cancelled and resumed");
    assert!(totals.bytes_received as usize >= files * rows * row_bytes);
}

/// With default options a trainer on the servers' host gets uncompressed streams: the link
/// is loopback (unlimited), so compressing would only cost both ends CPU. The report says
/// where the link's figure came from.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_options_on_loopback_stream_uncompressed() {
    let fx = Fixture::images(300).await;
    let pipeline = Pipeline::new("images")
        .map("decode_resize", "image", [16i64, 16], "pixels")
        .select(["pixels", "label"])
        .batch(32);
    let options = RunOptions::new(vec![fx.running.url()], LoaderSource::Pipeline(pipeline));
    let report = run(&options).await.expect("run");
    assert_eq!(report.rows, 300);
    assert_eq!(report.compression, pushdown_protocol::Compression::None);
    let link = report.usage.link.expect("resolved");
    assert_eq!(link.source, pushdown_client::LinkSource::Local);
    assert!(link.bandwidth_bytes_per_s.is_infinite());
    let text = report.to_string();
    assert!(
        text.contains("link: unlimited (every server is on this host)"),
        "{text}"
    );
    assert!(pushdown_tests::batches_sent(&fx.server, "none") > 0);
    assert_eq!(pushdown_tests::batches_sent(&fx.server, "zstd"), 0);
    assert_eq!(pushdown_tests::batches_sent(&fx.server, "lz4"), 0);
}

/// Streams in flight tuned while the epoch runs never change the samples: a loader with the
/// default (tuned) concurrency and a slow consumer's opposite, a consumer that never waits,
/// deliver the sequence of one with a single stream in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tuned_streams_in_flight_never_change_the_sequence() {
    let fx = Fixture::images(600).await;
    let sequence = |max_concurrency: usize, concurrency: usize| {
        let url = fx.running.url();
        async move {
            tokio::task::spawn_blocking(move || {
                let options = LoaderOptions {
                    batch_size: Some(32),
                    shuffle_buffer: Some(96),
                    seed: 5,
                    epochs: 2,
                    stream: StreamOptions {
                        concurrency,
                        max_concurrency,
                        buffered_bytes: 1,
                        ..StreamOptions::default()
                    },
                    ..LoaderOptions::default()
                };
                let loader = pushdown_client::Loader::new(
                    &[url],
                    LoaderSource::Sql("SELECT id, thumbnail(image, 8) AS t FROM images".into()),
                    options,
                )
                .expect("loader");
                let mut ids = Vec::new();
                let mut loader = loader;
                for batch in &mut loader {
                    let batch = batch.expect("batch");
                    let values = match batch.column("id").expect("id") {
                        pushdown_client::Column::Tensor { values, .. } => values,
                        pushdown_client::Column::Arrow(values) => values,
                    };
                    let values = values
                        .as_any()
                        .downcast_ref::<arrow::array::Int64Array>()
                        .expect("ids");
                    ids.extend(values.values().iter().copied());
                }
                (ids, loader.stats())
            })
            .await
            .expect("loader thread")
        }
    };
    let (fixed, _) = sequence(1, 1).await;
    let (tuned, stats) = sequence(32, 1).await;
    assert_eq!(fixed.len(), 1200);
    assert_eq!(tuned, fixed, "the same samples in the same order");
    assert!(stats.peak_streams >= 1, "{stats:?}");
}

/// A server that cannot start says which setting to fix, with its cause kept as the error's
/// source: a missing data root, an unreadable or invalid catalog file, a cache directory that
/// is a file, a certificate that is not one, a port already taken.
#[tokio::test]
async fn startup_errors_name_the_setting_and_keep_their_cause() {
    use std::error::Error as _;

    use pushdown_server::{CacheConfig, Server, ServerConfig, ServerTls, StartupError, Views, open_store};

    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("no-such-root");
    let err = open_store(&missing.to_string_lossy()).map(|_| ()).unwrap_err();
    assert!(matches!(err, StartupError::DataRoot { .. }), "{err:?}");
    assert!(err.to_string().contains("no-such-root"), "{err}");
    assert!(
        matches!(&err, StartupError::DataRoot { cause, .. } if cause.kind() == std::io::ErrorKind::NotFound),
        "the io error is kept"
    );
    assert!(err.source().is_none(), "and said once, in the message");

    let err = Views::load(&dir.path().join("views.toml"))
        .map(|_| ())
        .unwrap_err();
    assert!(matches!(err, StartupError::Read { .. }), "{err:?}");
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[[view]]\nname = \"Bad Name\"\nsql = \"SELECT 1\"\n").expect("write");
    let err = Views::load(&bad).map(|_| ()).unwrap_err();
    assert!(matches!(err, StartupError::Views { .. }), "{err:?}");
    assert!(
        err.to_string().contains("bad.toml") && err.to_string().contains("Bad Name"),
        "{err}"
    );

    let fx = Fixture::images(8).await;
    let root = fx.root.path().to_string_lossy().into_owned();
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"not a directory").expect("write");
    let config = ServerConfig {
        cache: CacheConfig {
            disk: Some(file.join("cache")),
            ..CacheConfig::default()
        },
        ..ServerConfig::default()
    };
    let err = Server::builder(open_store(&root).expect("store"))
        .config(config)
        .open()
        .await
        .map(|_| ())
        .unwrap_err();
    assert!(matches!(err, StartupError::CacheDir { .. }), "{err:?}");

    let err = Server::builder(open_store(&root).expect("store"))
        .tls(ServerTls::new("not a certificate", "not a key"))
        .open()
        .await
        .map(|_| ())
        .unwrap_err();
    assert!(matches!(err, StartupError::Tls(_)), "{err:?}");

    let server = Server::builder(open_store(&root).expect("store"))
        .open()
        .await
        .expect("open");
    let running = server
        .clone()
        .spawn("127.0.0.1:0".parse().unwrap())
        .await
        .expect("spawn");
    let err = server.spawn(running.addr()).await.map(|_| ()).unwrap_err();
    assert!(matches!(err, StartupError::Bind { .. }), "{err:?}");
    assert!(err.to_string().contains(&running.addr().to_string()), "{err}");
}

/// A server with one CPU thread (and no read-ahead) over `rows` images in small shards.
async fn one_cpu_thread(rows: usize) -> Fixture {
    let config = pushdown_server::ServerConfig {
        cpu_threads: 1,
        read_ahead: false,
        ..pushdown_tests::small_shards()
    };
    Fixture::new(config, |root| {
        pushdown_tests::write_images(root, rows);
    })
    .await
}

/// Takes `fx`'s one CPU thread, as decoding a reduced shard in one go takes it, until the
/// returned sender sends; await the task after.
fn hold_the_cpu_thread(fx: &Fixture) -> (std::sync::mpsc::Sender<()>, impl std::future::Future<Output = ()>) {
    let (started_tx, started) = std::sync::mpsc::channel();
    let (release, released) = std::sync::mpsc::channel::<()>();
    let holder = fx.server.node().spawn_reducing(async move {
        started_tx.send(()).expect("started");
        let _ = released.recv();
    });
    started
        .recv_timeout(std::time::Duration::from_secs(30))
        .expect("the CPU thread is held");
    (release, async move { holder.await.expect("holder") })
}

/// A stream whose ops the server leaves to its client reduces nothing and runs on threads of
/// its own: it is served while every CPU thread is taken (held here, as decoding a reduced
/// shard in one go holds one), where it used to wait behind each shard being reduced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreduced_stream_does_not_wait_behind_reducing_ones() {
    use pushdown_protocol::{Deferral, Fragment, OpCall, Value};
    let fx = one_cpu_thread(128).await;
    let reduced = ScanRequest::new(Query::Fragment(Fragment {
        dataset: "images".into(),
        columns: vec!["id".into(), "thumb".into()],
        predicate: None,
        ops: vec![OpCall::new("thumbnail", "image", vec![Value::Int(8)], "thumb")],
    }));
    let mut unreduced = reduced.clone();
    unreduced.deferral = Deferral::Always { from: 0 };
    let ticket = |request: &ScanRequest| {
        let client = fx.client.clone();
        let request = request.clone();
        async move {
            let info = client.plan(&request).await.expect("plan");
            info.endpoint[0].ticket.clone().expect("ticket").ticket
        }
    };
    let (reduced, unreduced) = (ticket(&reduced).await, ticket(&unreduced).await);

    let (release, holder) = hold_the_cpu_thread(&fx);

    let url = fx.running.url();
    let served = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        fetch_from(url.clone(), unreduced),
    )
    .await
    .expect("the un-reduced stream is served while the CPU thread is held");
    assert_eq!(num_rows(&served), 128, "its rows");
    assert!(
        served[0]
            .schema()
            .metadata()
            .contains_key(pushdown_protocol::DEFERRED_FROM_KEY),
        "left to the client"
    );
    // The premise: a reduced stream cannot be served meanwhile (the thread it needs is held).
    let waited = tokio::time::timeout(
        std::time::Duration::from_millis(300),
        fetch_from(url.clone(), reduced.clone()),
    )
    .await;
    assert!(waited.is_err(), "a reduced stream waits for the CPU thread");
    release.send(()).expect("release");
    holder.await;
    assert_eq!(num_rows(&fetch_from(url, reduced).await), 128);
}

/// Planning and counting run off the reducing threads: a server whose every CPU thread is
/// taken (held here, as decoding a reduced shard in one go holds one) still plans a request
/// and counts a shard's rows, so a trainer's next epoch is planned while the server reduces
/// the last one's shards. On the CPU runtime a plan waited behind every one of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_is_answered_while_every_reducing_thread_is_taken() {
    use pushdown_protocol::{Fragment, OpCall, Value};
    let fx = one_cpu_thread(256).await;
    let request = ScanRequest::new(Query::Fragment(Fragment {
        dataset: "images".into(),
        columns: vec!["id".into(), "thumb".into()],
        predicate: Some("id < 200".into()),
        ops: vec![OpCall::new("thumbnail", "image", vec![Value::Int(8)], "thumb")],
    }));

    let (release, holder) = hold_the_cpu_thread(&fx);

    let limit = std::time::Duration::from_secs(60);
    let info = tokio::time::timeout(limit, fx.client.plan(&request))
        .await
        .expect("planned while the CPU thread is held")
        .expect("plan");
    assert!(info.endpoint.len() > 1, "several shards: {}", info.endpoint.len());
    let mut counted = 0;
    for endpoint in &info.endpoint {
        counted += tokio::time::timeout(limit, fx.client.count(endpoint))
            .await
            .expect("counted while the CPU thread is held")
            .expect("count");
    }
    assert_eq!(counted, 200, "the rows the filter keeps");
    // The premise: a reduced stream cannot be served meanwhile (the thread it needs is held).
    let ticket = info.endpoint[0].ticket.clone().expect("ticket").ticket;
    let url = fx.running.url();
    let waited = tokio::time::timeout(
        std::time::Duration::from_millis(300),
        fetch_from(url.clone(), ticket.clone()),
    )
    .await;
    assert!(waited.is_err(), "a reduced stream waits for the CPU thread");
    release.send(()).expect("release");
    holder.await;
    let mut rows = 0;
    for endpoint in &info.endpoint {
        let ticket = endpoint.ticket.clone().expect("ticket").ticket;
        rows += num_rows(&fetch_from(url.clone(), ticket).await);
    }
    assert_eq!(rows, 200);
}

/// A stream's trailer says whether another client's stream ran on the server's reducing
/// cores beside it: the adaptive split reads a shard's wait per round of its own trainer's
/// shards only when none did. Streams of one connection are one client; a stream left
/// un-reduced runs elsewhere and is no company.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trailer_says_whether_the_stream_ran_beside_another_clients() {
    use arrow_flight::flight_service_client::FlightServiceClient;
    use pushdown_protocol::{Deferral, Fragment, OpCall, StreamStats, Value};
    use tonic::transport::Channel;
    // Batches of 8 images: a stream opened and not read stops on its HTTP/2 window with most
    // of its shard still to send, its task running.
    let config = pushdown_server::ServerConfig {
        cpu_threads: 1,
        read_ahead: false,
        batch_size: 8,
        ..pushdown_tests::small_shards()
    };
    let fx = Fixture::new(config, |root| {
        pushdown_tests::write_images(root, 128);
    })
    .await;
    let mut request = ScanRequest::new(Query::Fragment(Fragment {
        dataset: "images".into(),
        columns: vec!["id".into(), "image".into(), "thumb".into()],
        predicate: None,
        ops: vec![OpCall::new("thumbnail", "image", vec![Value::Int(8)], "thumb")],
    }));
    request.stats = true;
    let mut unreduced = request.clone();
    unreduced.deferral = Deferral::Always { from: 0 };
    let ticket = |request: ScanRequest| {
        let client = fx.client.clone();
        async move {
            let info = client.plan(&request).await.expect("plan");
            arrow_flight::Ticket::new(info.endpoint[0].ticket.clone().expect("ticket").ticket)
        }
    };
    let (reduced, unreduced) = (ticket(request).await, ticket(unreduced).await);
    type Messages = tonic::Streaming<arrow_flight::FlightData>;
    // A stream opened (naming `reader`, if any) and its first message read: its task runs on
    // the server.
    let open_as = |mut client: FlightServiceClient<Channel>,
                   ticket: arrow_flight::Ticket,
                   reader: Option<u64>| async move {
        let mut request = tonic::Request::new(ticket);
        if let Some(reader) = reader {
            request
                .metadata_mut()
                .insert(pushdown_protocol::READER_HEADER, reader.into());
        }
        let mut messages: Messages = client.do_get(request).await.expect("do_get").into_inner();
        messages
            .message()
            .await
            .expect("schema")
            .expect("a first message");
        messages
    };
    let open = |client, ticket| open_as(client, ticket, None);
    let alone = |mut messages: Messages| async move {
        let mut trailer = None;
        while let Some(data) = messages.message().await.expect("message") {
            if data.data_header.is_empty() {
                trailer = Some(StreamStats::decode(&data.app_metadata).expect("stats"));
            }
        }
        trailer.expect("a trailer").reduced_alone
    };
    // A client each: a connection each, whose window a stream left unread cannot fill.
    let connect = || async {
        let channel = Channel::from_shared(fx.running.url())
            .expect("url")
            .initial_stream_window_size(1 << 16)
            .initial_connection_window_size(1 << 30)
            .connect()
            .await
            .expect("connect");
        FlightServiceClient::new(channel)
    };
    let (one, two) = (connect().await, connect().await);

    assert_eq!(
        alone(open(one.clone(), reduced.clone()).await).await,
        1,
        "a lone stream"
    );
    // Two streams of one client side by side: each ran alone.
    let first = open(one.clone(), reduced.clone()).await;
    let second = open(one.clone(), reduced.clone()).await;
    assert_eq!((alone(second).await, alone(first).await), (1, 1), "one client's");
    // Another client's un-reduced stream runs on threads of its own: no company.
    let held = open(one.clone(), reduced.clone()).await;
    assert_eq!(
        alone(open(two.clone(), unreduced.clone()).await).await,
        0,
        "not reduced there"
    );
    assert_eq!(alone(held).await, 1, "beside an un-reduced stream");
    // Another client's reduced stream beside it: neither ran alone.
    let held = open(one.clone(), reduced.clone()).await;
    assert_eq!(
        alone(open(two.clone(), reduced.clone()).await).await,
        0,
        "beside another's"
    );
    assert_eq!(alone(held).await, 0, "another's came and went meanwhile");
    assert_eq!(
        alone(open(two.clone(), reduced.clone()).await).await,
        1,
        "alone again"
    );
    // A reader the requests name is one client over two connections (a reconnect), and two
    // readers over one connection are two.
    let held = open_as(one.clone(), reduced.clone(), Some(7)).await;
    assert_eq!(
        alone(open_as(two.clone(), reduced.clone(), Some(7)).await).await,
        1,
        "one reader"
    );
    assert_eq!(alone(held).await, 1, "one reader, two connections");
    let held = open_as(one.clone(), reduced.clone(), Some(7)).await;
    assert_eq!(
        alone(open_as(one, reduced, Some(8)).await).await,
        0,
        "another reader"
    );
    assert_eq!(alone(held).await, 0, "two readers, one connection");
}

/// A loader alone on a server: every stream the server reduced for it says it ran alone
/// there, its streams all naming the loader's one reader (one of them naming another would
/// have been company to the rest).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_adaptive_loaders_reduced_streams_say_they_ran_alone() {
    let config = pushdown_server::ServerConfig {
        cpu_threads: 1,
        read_ahead: false,
        ..pushdown_tests::small_shards()
    };
    let fx = Fixture::new(config, |root| {
        pushdown_tests::write_images(root, 512);
    })
    .await;
    let pipeline = Pipeline::new("images")
        .map("decode_resize", "image", [8i64, 8], "pixels")
        .select(["id", "pixels"])
        .batch(32);
    let options = RunOptions {
        loader: LoaderOptions {
            push: pushdown_client::Push::Adaptive(usize::MAX),
            ..LoaderOptions::default()
        },
        ..RunOptions::new(vec![fx.running.url()], LoaderSource::Pipeline(pipeline))
    };
    let report = run(&options).await.expect("run");
    assert_eq!(report.rows, 512);
    let reduced = report.endpoints as u64 - report.completed.streams;
    assert!(reduced > 0, "the server reduced some: {report:?}");
    assert_eq!(report.totals.server.reduced_alone, reduced, "{report:?}");
}
