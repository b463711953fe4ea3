//! A server asked to stop: the streams in flight finish within its drain deadline, those
//! still open then end with `UNAVAILABLE` (never a stream that just stops, which would look
//! complete), and the server stops, however stalled its clients.

use std::time::Duration;

use arrow_flight::Ticket;
use arrow_flight::decode::FlightRecordBatchStream;
use arrow_flight::error::FlightError;
use futures::{StreamExt, TryStreamExt};
use pushdown_server::{RunningServer, Server, ServerConfig};
use pushdown_tests::{Fixture, raw_client};

/// A `DoGet`'s messages as the client receives them.
type Frames = futures::stream::BoxStream<'static, Result<arrow_flight::FlightData, FlightError>>;

/// A server of `noise` draining for `drain` when stopped, and the ticket of its one shard:
/// 512 rows of 64 KiB, a 32 MiB stream whatever the codec, far more than the channel, HTTP/2
/// windows and socket buffers hold, so a client that stops reading holds its stream open.
/// The fixture's own client is closed: only the test's streams hold the server.
async fn noise_server(drain: Duration) -> (tempfile::TempDir, Server, RunningServer, Ticket) {
    let fx = Fixture::secured(
        ServerConfig {
            cache: pushdown_server::CacheConfig {
                default_mode: pushdown_server::CacheMode::Off,
                ..pushdown_server::CacheConfig::default()
            },
            ..ServerConfig::default()
        },
        |root| write_noise(root, 512, 64 << 10),
        |b| b.drain(drain),
        pushdown_client::ConnectOptions::default(),
    )
    .await;
    let sql = pushdown_protocol::ScanRequest::new(pushdown_protocol::Query::Sql(
        "SELECT id, blob FROM noise".into(),
    ));
    let info = raw_client(fx.running.url())
        .await
        .get_flight_info(arrow_flight::FlightDescriptor::new_cmd(sql.encode()))
        .await
        .expect("plans")
        .into_inner();
    assert_eq!(info.endpoint.len(), 1, "one shard");
    let ticket = info.endpoint[0].ticket.clone().expect("a ticket");
    let Fixture {
        root,
        server,
        running,
        client,
    } = fx;
    drop(client);
    (root, server, running, ticket)
}

/// `noise`: one file of `rows` rows, an `id` and a `blob` of `row_bytes` seeded random
/// bytes (which no codec shrinks), in row groups of 16 rows.
fn write_noise(root: &std::path::Path, rows: usize, row_bytes: usize) {
    use arrow::array::{BinaryArray, Int64Array, RecordBatch};
    use rand::{RngCore, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    let blobs: Vec<Vec<u8>> = (0..rows)
        .map(|_| {
            let mut blob = vec![0; row_bytes];
            rng.fill_bytes(&mut blob);
            blob
        })
        .collect();
    let batch = RecordBatch::try_from_iter([
        (
            "id",
            std::sync::Arc::new(Int64Array::from_iter_values(0..rows as i64)) as _,
        ),
        (
            "blob",
            std::sync::Arc::new(BinaryArray::from_iter_values(&blobs)) as _,
        ),
    ])
    .expect("noise batch");
    std::fs::create_dir_all(root.join("noise")).expect("noise dir");
    let file = std::fs::File::create(root.join("noise/part-0.parquet")).expect("create");
    let props = parquet::file::properties::WriterProperties::builder()
        .set_max_row_group_row_count(Some(16))
        .build();
    let mut writer = parquet::arrow::ArrowWriter::try_new(file, batch.schema(), Some(props)).expect("writer");
    writer.write(&batch).expect("write");
    writer.close().expect("close");
}

/// A `DoGet` of `ticket` whose first message (the schema) has been read; the caller decides
/// when to read the rest.
async fn opened(url: String, ticket: &Ticket) -> Frames {
    let mut frames = raw_client(url)
        .await
        .do_get(ticket.clone())
        .await
        .expect("opens")
        .into_inner();
    let schema = frames.message().await.expect("the schema").expect("a message");
    futures::stream::once(async move { Ok(schema) })
        .chain(frames.map_err(|s| FlightError::Tonic(Box::new(s))))
        .boxed()
}

/// Rows of the stream, or how it failed.
async fn rows(frames: Frames) -> Result<usize, FlightError> {
    let batches: Vec<_> = FlightRecordBatchStream::new_from_flight_data(frames)
        .try_collect()
        .await?;
    Ok(batches.iter().map(|b| b.num_rows()).sum())
}

/// DoGet streams that ended with `outcome`, once they are `want` (a stream is counted as its
/// task ends, just after its client has its last message); a hang detector.
async fn streams_ended(metrics: &pushdown_server::Metrics, outcome: &'static str, want: u64) -> u64 {
    for _ in 0..200 {
        if metrics.requests_of("do_get", outcome) >= want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    metrics.requests_of("do_get", outcome)
}

/// A stream being read when the server is asked to stop is served whole: the drain lets it
/// finish, and then the server stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_in_flight_finishes_whole_when_the_server_stops() {
    let (_root, server, running, ticket) = noise_server(Duration::from_secs(600)).await;
    let whole = rows(opened(running.url(), &ticket).await).await.expect("reads");
    let reading = opened(running.url(), &ticket).await;
    // Asked to stop while the second read is under way (its server side waits for it).
    let (stopped, got) = tokio::join!(
        tokio::time::timeout(Duration::from_secs(300), running.shutdown()),
        rows(reading)
    );
    stopped
        .expect("stops once its streams are done")
        .expect("stops cleanly");
    assert_eq!(got.expect("the stream in flight is not cut"), whole);
    assert!(whole > 0);
    assert_eq!(streams_ended(server.metrics(), "ok", 2).await, 2);
    assert_eq!(server.metrics().requests_of("do_get", "shutting_down"), 0);
}

/// A client that stops reading does not hold a stopping server past its drain deadline
/// (before: for the stream's whole `request_timeout`, an hour by default); its stream ends
/// with `UNAVAILABLE`, saying why, after what was already sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_client_does_not_hold_a_stopping_server_past_its_drain() {
    let (_root, server, running, ticket) = noise_server(Duration::from_secs(1)).await;
    let stalled = opened(running.url(), &ticket).await;
    // A hang detector, not a timing.
    tokio::time::timeout(Duration::from_secs(300), running.shutdown())
        .await
        .expect("a stalled client held the stopping server")
        .expect("stops cleanly");
    let ended = rows(stalled)
        .await
        .expect_err("the stream must not look complete");
    let FlightError::Tonic(status) = &ended else {
        panic!("ended with {ended}, not a status");
    };
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status}");
    assert!(status.message().contains("shutting down"), "{status}");
    assert_eq!(streams_ended(server.metrics(), "shutting_down", 1).await, 1);
}
