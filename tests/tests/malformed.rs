//! One malformed Parquet file is that file's `DataLoss`, never the server's end: every entry
//! of the corpus (`pushdown_tests::malformed`) beside a healthy dataset, at start-up and
//! copied into a running server's data root.

use std::time::Duration;

use arrow::array::{Array, Int64Array};
use arrow::record_batch::RecordBatch;
use arrow_flight::decode::FlightRecordBatchStream;
use arrow_flight::{FlightDescriptor, FlightInfo};
use futures::TryStreamExt;
use pushdown_protocol::ShardTicket;
use pushdown_server::ServerConfig;
use pushdown_tests::Fixture;
use pushdown_tests::malformed::{self, Entry};
use tonic::Code;

fn config() -> ServerConfig {
    ServerConfig {
        shard_max_rows: 100,
        batch_size: 64,
        // Every request lists the store again: a copied file is seen at once.
        catalog_refresh: Duration::ZERO,
        ..ServerConfig::default()
    }
}

async fn info(fx: &Fixture, sql: &str) -> Result<FlightInfo, tonic::Status> {
    pushdown_tests::raw_client(fx.running.url())
        .await
        .get_flight_info(FlightDescriptor::new_cmd(sql.to_owned()))
        .await
        .map(|r| r.into_inner())
}

/// Streams one endpoint; the file its ticket names, and its rows or the failure.
async fn stream(
    fx: &Fixture,
    ticket: &arrow_flight::Ticket,
) -> (String, Result<Vec<RecordBatch>, tonic::Status>) {
    let file = ShardTicket::decode(&ticket.ticket)
        .expect("our ticket")
        .shard
        .map(|s| s.file)
        .unwrap_or_default();
    let mut client = pushdown_tests::raw_client(fx.running.url()).await;
    let result = match client.do_get(ticket.clone()).await {
        Err(status) => Err(status),
        Ok(response) => {
            let frames = response
                .into_inner()
                .map_err(|s| arrow_flight::error::FlightError::Tonic(Box::new(s)));
            FlightRecordBatchStream::new_from_flight_data(frames)
                .try_collect()
                .await
                .map_err(|e| match e {
                    arrow_flight::error::FlightError::Tonic(status) => *status,
                    other => tonic::Status::unknown(other.to_string()),
                })
        }
    };
    (file, result)
}

fn ids(batches: &[RecordBatch]) -> Vec<i64> {
    let mut out = Vec::new();
    for b in batches {
        let ids = b
            .column(0)
            .as_any()
            .downcast_ref::<Int64Array>()
            .expect("id column");
        out.extend(ids.values().iter().copied());
    }
    out
}

/// The healthy dataset answers exactly: both copies of the healthy file, every row.
async fn healthy_answers(fx: &Fixture) {
    let info = info(fx, "SELECT id, text, value FROM healthy")
        .await
        .expect("the healthy dataset plans");
    let mut got = Vec::new();
    for endpoint in &info.endpoint {
        let (_, result) = stream(fx, endpoint.ticket.as_ref().expect("ticket")).await;
        let batches = result.expect("the healthy dataset streams");
        for b in &batches {
            let expected = malformed::healthy_batch();
            let first = b
                .column(0)
                .as_any()
                .downcast_ref::<Int64Array>()
                .expect("id")
                .value(0);
            let want = expected.slice(first as usize, b.num_rows());
            assert_eq!(b.columns(), want.columns(), "healthy rows from {first}");
        }
        got.extend(ids(&batches));
    }
    got.sort_unstable();
    let mut want: Vec<i64> = (0..malformed::ROWS).chain(0..malformed::ROWS).collect();
    want.sort_unstable();
    assert_eq!(got, want);
}

/// A request touching the entry's file fails with `DataLoss` naming it; streams over the
/// dataset's healthy file still answer exactly.
async fn entry_is_data_loss(fx: &Fixture, entry: &Entry) {
    let file = format!("{}.parquet", entry.name);
    let sql = format!("SELECT id, text, value FROM bad_{}", entry.name);
    if !entry.pages_only {
        let status = info(fx, &sql).await.expect_err(entry.defect);
        assert_eq!(status.code(), Code::DataLoss, "{}: {status}", entry.name);
        assert!(status.message().contains(&file), "{}: {status}", entry.name);
        return;
    }
    let info = info(fx, &sql).await.expect("the footer is sound: it plans");
    let mut failed = 0;
    for endpoint in &info.endpoint {
        let (shard_file, result) = stream(fx, endpoint.ticket.as_ref().expect("ticket")).await;
        match result {
            Ok(batches) => {
                // Whatever succeeds is exact: damage never shows as other rows.
                let got = ids(&batches);
                let start = got.first().copied().unwrap_or(0);
                assert_eq!(
                    got,
                    (start..start + got.len() as i64).collect::<Vec<_>>(),
                    "{}",
                    entry.name
                );
            }
            Err(status) => {
                assert_eq!(shard_file, file, "only the damaged file fails: {status}");
                assert_eq!(status.code(), Code::DataLoss, "{}: {status}", entry.name);
                assert!(status.message().contains(&file), "{}: {status}", entry.name);
                failed += 1;
            }
        }
    }
    assert!(
        failed > 0,
        "{}: some stream over the damaged pages must fail",
        entry.name
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_malformed_file_is_its_datasets_data_loss_at_start_up() {
    let mut entries = Vec::new();
    let fx = Fixture::new(config(), |root| entries = malformed::write_corpus(root)).await;
    healthy_answers(&fx).await;
    for entry in &entries {
        entry_is_data_loss(&fx, entry).await;
        healthy_answers(&fx).await;
    }
    let unreadable = entries.iter().filter(|e| !e.pages_only).count() as i64;
    assert_eq!(fx.server.metrics().unreadable_files.get(), unreadable);
    // Each unreadable file was read, logged and counted once, however many refreshes.
    assert_eq!(
        fx.server.metrics().unreadable_files_found.get(),
        unreadable as u64
    );
    let text = fx.server.metrics().encode();
    assert!(
        text.contains(&format!("pushdown_unreadable_files {unreadable}")),
        "{text}"
    );
}

/// The `parquet` fuzz target's find, its bytes as found: a page header that makes Arrow's
/// Parquet reader slice past its column chunk and panic. Streaming it is that file's
/// `DataLoss` (not `Internal`, which clients retry), the panic contained and counted, and the
/// server serves the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_the_parquet_reader_panics_on_is_its_data_loss() {
    const FOUND: &[u8] = include_bytes!("../../fuzz/corpus/parquet/regression-page-past-chunk");
    let fx = Fixture::new(config(), |root| {
        malformed::write_corpus(root);
        std::fs::create_dir_all(root.join("found")).expect("mkdir");
        std::fs::write(root.join("found/found.parquet"), FOUND).expect("write");
    })
    .await;
    let info = info(&fx, "SELECT * FROM found")
        .await
        .expect("its footer is sound");
    let mut failures = Vec::new();
    for endpoint in &info.endpoint {
        if let (_, Err(status)) = stream(&fx, endpoint.ticket.as_ref().expect("ticket")).await {
            failures.push(status);
        }
    }
    assert!(!failures.is_empty(), "the damaged page fails its stream");
    for status in &failures {
        assert_eq!(status.code(), Code::DataLoss, "{status}");
        assert!(
            status.message().contains("found.parquet") && status.message().contains("panicked"),
            "{status}"
        );
    }
    assert_eq!(fx.server.metrics().panics_contained.get(), failures.len() as u64);
    healthy_answers(&fx).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_files_copied_into_a_running_server_hurt_only_their_dataset() {
    let fx = Fixture::new(config(), |root| {
        let healthy = root.join("healthy");
        std::fs::create_dir_all(&healthy).expect("mkdir");
        std::fs::write(healthy.join("a.parquet"), malformed::healthy_file()).expect("write");
        std::fs::write(healthy.join("b.parquet"), malformed::healthy_file()).expect("write");
    })
    .await;
    let good = malformed::healthy_file();
    for entry in malformed::corpus() {
        let dir = fx.root.path().join(format!("bad_{}", entry.name));
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(dir.join("a_good.parquet"), &good).expect("write");
        std::fs::write(dir.join(format!("{}.parquet", entry.name)), &entry.bytes).expect("write");
        healthy_answers(&fx).await;
        entry_is_data_loss(&fx, &entry).await;
    }
    healthy_answers(&fx).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_seen_half_copied_is_read_again_once_complete() {
    let fx = Fixture::new(config(), |root| {
        std::fs::create_dir_all(root.join("healthy")).expect("mkdir");
        std::fs::write(root.join("healthy/a.parquet"), malformed::healthy_file()).expect("write");
    })
    .await;
    let good = malformed::healthy_file();
    let path = fx.root.path().join("healthy/b.parquet");
    std::fs::write(&path, &good[..good.len() / 3]).expect("write");
    let status = info(&fx, "SELECT id FROM healthy")
        .await
        .expect_err("half a file");
    assert_eq!(status.code(), Code::DataLoss, "{status}");
    assert!(status.message().contains("b.parquet"), "{status}");
    std::fs::write(&path, &good).expect("write");
    healthy_answers(&fx).await;
    assert_eq!(fx.server.metrics().unreadable_files.get(), 0);
}

/// Seeded bit flips anywhere in the footer: each file is either refused (`DataLoss` naming
/// it) or served; the server never goes down, and the healthy dataset keeps answering.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeded_footer_bit_flips_never_take_the_server_down() {
    let good = malformed::healthy_file();
    let n = good.len();
    let meta_len = u32::from_le_bytes(good[n - 8..n - 4].try_into().expect("4")) as usize;
    let fx = Fixture::new(config(), |root| {
        std::fs::create_dir_all(root.join("healthy")).expect("mkdir");
        std::fs::write(root.join("healthy/a.parquet"), &good).expect("write");
        std::fs::write(root.join("healthy/b.parquet"), &good).expect("write");
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for i in 0..48 {
            let mut bytes = good.clone();
            for _ in 0..3 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let at = n - 8 - meta_len + (x as usize % meta_len);
                bytes[at] ^= 1 << ((x >> 32) % 8);
            }
            let dir = root.join(format!("flip_{i}"));
            std::fs::create_dir_all(&dir).expect("mkdir");
            std::fs::write(dir.join("f.parquet"), &bytes).expect("write");
        }
    })
    .await;
    let mut refused = 0;
    for i in 0..48 {
        match info(&fx, &format!("SELECT id, text, value FROM flip_{i}")).await {
            Err(status) => {
                // A flip may hit a name (then the column is unknown: InvalidArgument).
                assert!(
                    matches!(status.code(), Code::DataLoss | Code::InvalidArgument),
                    "flip_{i}: {status}"
                );
                refused += 1;
            }
            Ok(info) => {
                for endpoint in &info.endpoint {
                    let (_, result) = stream(&fx, endpoint.ticket.as_ref().expect("ticket")).await;
                    if let Err(status) = result {
                        assert_eq!(status.code(), Code::DataLoss, "flip_{i}: {status}");
                    }
                }
            }
        }
    }
    assert!(refused > 0, "some flips must damage the footer");
    healthy_answers(&fx).await;
}
