//! The shared harness of the end-to-end tests: seeded datasets in scratch folders, a real
//! server on `127.0.0.1:0`, the real client, and a local evaluation to compare against.

pub mod malformed;

use std::path::Path;
use std::sync::Arc;

use arrow::array::{
    ArrayRef, BooleanArray, Decimal128Array, DictionaryArray, Float64Array, Int32Array, Int64Array,
    ListArray, StringArray, TimestampMicrosecondArray,
};
use arrow::datatypes::{DataType, Field, Int32Type, Schema, TimeUnit};
use arrow::record_batch::RecordBatch;
use arrow::util::display::{ArrayFormatter, FormatOptions};
use futures::StreamExt;
use parquet::arrow::ArrowWriter;
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use pushdown_client::{ConnectOptions, PushdownClient, StreamOptions, StreamTotals};
use pushdown_datasets::{GenOptions, Kind, generate};
use pushdown_protocol::{Query, ScanRequest};
use pushdown_server::{RunningServer, Server, ServerBuilder, ServerConfig, open_store};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// A data root in a scratch folder, a server over it, and a client.
pub struct Fixture {
    pub root: tempfile::TempDir,
    pub server: Server,
    pub running: RunningServer,
    pub client: PushdownClient,
}

impl Fixture {
    /// Serves whatever `write` puts under the data root.
    pub async fn new(config: ServerConfig, write: impl FnOnce(&Path)) -> Self {
        Self::secured(config, write, |b| b, ConnectOptions::default()).await
    }

    /// [`Self::new`] with the server's builder finished by `secure` (tokens, TLS) and the
    /// client connecting with `connect`.
    pub async fn secured(
        config: ServerConfig,
        write: impl FnOnce(&Path),
        secure: impl FnOnce(ServerBuilder) -> ServerBuilder,
        connect: ConnectOptions,
    ) -> Self {
        let root = tempfile::tempdir().expect("scratch dir");
        write(root.path());
        let store = open_store(&root.path().to_string_lossy()).expect("store");
        let server = secure(Server::builder(store).config(config).record_reads())
            .open()
            .await
            .expect("server opens");
        let running = server
            .clone()
            .spawn("127.0.0.1:0".parse().unwrap())
            .await
            .expect("binds");
        let client = PushdownClient::connect_with(&[running.url()], connect)
            .await
            .expect("connects");
        // Reads made while opening the catalog are not any query's.
        server.store().take_requests();
        Self {
            root,
            server,
            running,
            client,
        }
    }

    /// A small images dataset: `rows` rows, 64-row row groups, 256-row files.
    pub async fn images(rows: usize) -> Self {
        Self::new(small_shards(), |root| {
            write_images(root, rows);
        })
        .await
    }

    /// Images (`rows`, as [`Self::images`]) and a text dataset of `text_rows` rows (with its
    /// trained `tokenizer.json`) side by side.
    pub async fn images_and_text(rows: usize, text_rows: usize) -> Self {
        Self::new(small_shards(), |root| {
            write_images(root, rows);
            let mut options = GenOptions::new(Kind::Text, text_rows);
            options.row_group_rows = Some(64);
            options.rows_per_file = Some(256);
            generate(&options, &root.join("text")).expect("text");
        })
        .await
    }

    /// A speech dataset (`speech`: WAV clips of 0.5–10 s at 8–48 kHz in the Hub's `Audio`
    /// struct, one clip per page) of `rows` rows, in 16-row row groups and 64-row files.
    pub async fn speech(rows: usize) -> Self {
        Self::new(small_shards(), |root| {
            write_speech(root, rows);
        })
        .await
    }

    /// Runs a request to the end (one stream at a time, so batches come in endpoint order).
    pub async fn collect(&self, request: &ScanRequest) -> Result<(Vec<RecordBatch>, StreamTotals), String> {
        collect_with(
            &self.client,
            request,
            StreamOptions {
                concurrency: 1,
                ..StreamOptions::default()
            },
        )
        .await
    }

    pub async fn sql(&self, sql: &str) -> Result<Vec<RecordBatch>, String> {
        self.collect(&ScanRequest::new(Query::Sql(sql.into())))
            .await
            .map(|(b, _)| b)
    }

    /// The same query, evaluated locally by DataFusion straight from the files.
    pub async fn local(&self, sql: &str) -> Vec<RecordBatch> {
        local_eval(self.root.path(), sql).await
    }

    /// Bytes the server read from the store since the last call (I/O accounting).
    pub fn bytes_read(&self) -> u64 {
        self.server
            .store()
            .take_requests()
            .iter()
            .map(|r| r.range.end - r.range.start)
            .sum()
    }

    /// Bytes of the files under `images/`.
    pub fn images_bytes(&self) -> u64 {
        std::fs::read_dir(self.root.path().join("images"))
            .expect("dir")
            .map(|e| e.expect("entry").metadata().expect("meta").len())
            .sum()
    }

    /// `SELECT count(*) FROM images WHERE predicate`, evaluated locally.
    pub async fn local_count(&self, predicate: &str) -> u64 {
        let batches = self
            .local(&format!("SELECT count(*) FROM images WHERE {predicate}"))
            .await;
        batches[0]
            .column(0)
            .as_any()
            .downcast_ref::<Int64Array>()
            .expect("count is Int64")
            .value(0) as u64
    }
}

/// Server settings that make many small shards out of small test files.
pub fn small_shards() -> ServerConfig {
    ServerConfig {
        shard_max_rows: 128,
        batch_size: 100,
        ..ServerConfig::default()
    }
}

pub fn write_images(root: &Path, rows: usize) -> u64 {
    let mut options = GenOptions::new(Kind::Images, rows);
    options.row_group_rows = Some(64);
    options.rows_per_file = Some(256);
    generate(&options, &root.join("images")).expect("images").bytes
}

pub fn write_speech(root: &Path, rows: usize) -> u64 {
    let mut options = GenOptions::new(Kind::Speech, rows);
    options.row_group_rows = Some(16);
    options.rows_per_file = Some(64);
    generate(&options, &root.join("speech")).expect("speech").bytes
}

/// The `videos` dataset: `rows` H.264 MP4 clips that ffmpeg encodes from its own test
/// pattern (`testsrc2`: moving shapes and a frame counter), 1–3 s at 10–30 fps, 96–160 px
/// wide, in a binary `video` column beside an `id`; one file, 4-row row groups, one clip
/// per page (as `pushdown gen speech` lays out its clips).
pub fn write_videos(root: &Path, rows: usize) {
    let clips = (0..rows).map(|r| {
        let source = format!(
            "testsrc2=size={}x{}:rate={}:duration={}",
            96 + 32 * (r % 3),
            72 + 16 * (r % 2),
            [10, 24, 30][r % 3],
            1 + r % 3
        );
        encode_video(&source, &[], "mp4")
    });
    write_video_table(root, clips.collect(), 4);
}

/// The `videos` dataset of [`write_videos`]'s layout with `rows` larger clips: 320×240
/// at 25 fps, 1–6 s long (clip `r`: `1 + r % 6` s, 90 kB a second), in turn an MP4 with its
/// `moov` after the media (FFmpeg's default), a `+faststart` MP4 and a Matroska file; 8-row
/// row groups.
pub fn write_timed_videos(root: &Path, rows: usize) {
    let clips = (0..rows).map(|r| {
        let source = format!("testsrc2=size=320x240:rate=25:duration={}", 1 + r % 6);
        let h264 = ["-preset", "ultrafast"];
        match r % 3 {
            0 => encode_video(&source, &h264, "mp4"),
            1 => encode_video(
                &source,
                &[&h264[..], &["-movflags", "+faststart"]].concat(),
                "mp4",
            ),
            _ => encode_video(&source, &h264, "mkv"),
        }
    });
    write_video_table(root, clips.collect(), 8);
}

/// `ffmpeg` encoding the lavfi `source` with H.264 (and `args`) into an `ext` file.
fn encode_video(source: &str, args: &[&str], ext: &str) -> Vec<u8> {
    let scratch = tempfile::tempdir().expect("scratch");
    let path = scratch.path().join(format!("clip.{ext}"));
    let status = std::process::Command::new("ffmpeg")
        .args([
            "-v", "error", "-f", "lavfi", "-i", source, "-c:v", "libx264", "-pix_fmt", "yuv420p",
        ])
        .args(args)
        .arg(&path)
        .status()
        .expect("ffmpeg (scripts/setup-media.sh installs it)");
    assert!(status.success(), "ffmpeg {source}");
    std::fs::read(&path).expect("clip")
}

/// `clips` as `videos/part-0.parquet`: `id`, `video` (binary), one clip per page,
/// uncompressed, without a dictionary, in `group_rows`-row row groups.
fn write_video_table(root: &Path, clips: Vec<Vec<u8>>, group_rows: usize) {
    use arrow::array::BinaryArray;
    let dir = root.join("videos");
    std::fs::create_dir_all(&dir).expect("videos dir");
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("video", DataType::Binary, false),
    ]));
    let batch = RecordBatch::try_new(
        Arc::clone(&schema),
        vec![
            Arc::new(Int64Array::from_iter_values(0..clips.len() as i64)),
            Arc::new(BinaryArray::from_iter_values(&clips)),
        ],
    )
    .expect("videos batch");
    let props = WriterProperties::builder()
        .set_max_row_group_row_count(Some(group_rows))
        .set_write_batch_size(1)
        .set_column_data_page_size_limit("video".into(), 1)
        .set_column_compression("video".into(), parquet::basic::Compression::UNCOMPRESSED)
        .set_column_dictionary_enabled("video".into(), false)
        .set_column_statistics_enabled("video".into(), EnabledStatistics::None)
        .build();
    let file = std::fs::File::create(dir.join("part-0.parquet")).expect("create");
    let mut writer = ArrowWriter::try_new(file, schema, Some(props)).expect("writer");
    writer.write(&batch).expect("write");
    writer.close().expect("close");
}

pub async fn collect_with(
    client: &PushdownClient,
    request: &ScanRequest,
    options: StreamOptions,
) -> Result<(Vec<RecordBatch>, StreamTotals), String> {
    let info = client.plan(request).await.map_err(|e| e.to_string())?;
    let mut stream = client.stream(&info, options).map_err(|e| e.to_string())?;
    let mut batches = Vec::new();
    while let Some(b) = stream.next().await {
        batches.push(b.map_err(|e| e.to_string())?);
    }
    Ok((batches, stream.totals()))
}

/// Evaluates `sql` with DataFusion over the data root's folders, one partition.
pub async fn local_eval(root: &Path, sql: &str) -> Vec<RecordBatch> {
    use datafusion::prelude::{ParquetReadOptions, SessionConfig, SessionContext};
    let mut config = SessionConfig::new().with_target_partitions(1);
    // Same reading of strings as the server (no view types).
    config.options_mut().execution.parquet.schema_force_view_types = false;
    let ctx = SessionContext::new_with_config(config);
    for entry in std::fs::read_dir(root).expect("root") {
        let path = entry.expect("entry").path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_owned();
        if path.is_dir() {
            let options = ParquetReadOptions {
                file_extension: ".parquet",
                ..Default::default()
            };
            ctx.register_parquet(name.as_str(), path.to_string_lossy().as_ref(), options)
                .await
                .expect("register");
        }
    }
    ctx.sql(sql)
        .await
        .expect("local plan")
        .collect()
        .await
        .expect("local run")
}

/// Every row rendered as text, sorted: equality as multisets of rows.
pub fn sorted_rows(batches: &[RecordBatch]) -> Vec<String> {
    let mut rows = rows(batches);
    rows.sort();
    rows
}

/// Every row rendered as text, in order.
pub fn rows(batches: &[RecordBatch]) -> Vec<String> {
    let options = FormatOptions::default().with_null("∅");
    let mut out = Vec::new();
    for batch in batches {
        let formatters: Vec<_> = batch
            .columns()
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &options).expect("formatter"))
            .collect();
        for r in 0..batch.num_rows() {
            out.push(
                formatters
                    .iter()
                    .map(|f| f.value(r).to_string())
                    .collect::<Vec<_>>()
                    .join(" | "),
            );
        }
    }
    out
}

/// The `blobs` dataset: `files` files of `rows` rows, each row an `id` and a `blob` of
/// `row_bytes` bytes (the id's low byte repeated: tiny on disk, large once decoded), in row
/// groups of 16 rows. Streams of it are many megabytes from a few kilobytes of Parquet.
pub fn write_blobs(root: &Path, files: usize, rows: usize, row_bytes: usize) {
    use arrow::array::BinaryArray;
    let dir = root.join("blobs");
    std::fs::create_dir_all(&dir).expect("blobs dir");
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("blob", DataType::Binary, false),
    ]));
    let props = WriterProperties::builder()
        .set_compression(parquet::basic::Compression::ZSTD(Default::default()))
        .set_dictionary_enabled(false)
        .set_max_row_group_row_count(Some(16))
        .build();
    for f in 0..files {
        let ids: Vec<i64> = (0..rows).map(|r| (f * rows + r) as i64).collect();
        let blobs: Vec<Vec<u8>> = ids.iter().map(|&id| vec![id as u8; row_bytes]).collect();
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![
                Arc::new(Int64Array::from(ids)),
                Arc::new(BinaryArray::from_iter_values(blobs.iter())),
            ],
        )
        .expect("blobs batch");
        let file = std::fs::File::create(dir.join(format!("part-{f:03}.parquet"))).expect("create");
        let mut writer =
            ArrowWriter::try_new(file, Arc::clone(&schema), Some(props.clone())).expect("writer");
        writer.write(&batch).expect("write");
        writer.close().expect("close");
    }
}

pub fn num_rows(batches: &[RecordBatch]) -> usize {
    batches.iter().map(|b| b.num_rows()).sum()
}

/// The `edge` dataset: nulls, unicode, dictionaries, timestamps, decimals, lists, NaN, in
/// three files of several row groups each, with page statistics. Returns its schema.
pub fn write_edge_cases(root: &Path, seed: u64) -> Arc<Schema> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("i", DataType::Int32, true),
        Field::new("f", DataType::Float64, true),
        Field::new("s", DataType::Utf8, true),
        Field::new(
            "cat",
            DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)),
            true,
        ),
        Field::new("ts", DataType::Timestamp(TimeUnit::Microsecond, None), true),
        Field::new("d", DataType::Decimal128(10, 2), true),
        Field::new(
            "l",
            DataType::List(Arc::new(Field::new("item", DataType::Int32, true))),
            true,
        ),
        Field::new("b", DataType::Boolean, true),
    ]));
    let dir = root.join("edge");
    std::fs::create_dir_all(&dir).expect("edge dir");
    let words = [
        "",
        "a",
        "abc",
        "héllo",
        "日本語",
        "🦀 crab",
        "Ünïcödé",
        "z",
        "tab\tsep",
        "quote'd",
    ];
    let cats = ["red", "green", "blue", "ünï"];
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut id = 0i64;
    for file in 0..3 {
        let props = WriterProperties::builder()
            .set_statistics_enabled(EnabledStatistics::Page)
            .set_max_row_group_row_count(Some(97))
            .set_data_page_row_count_limit(20)
            .set_write_batch_size(10)
            .set_column_bloom_filter_enabled("s".into(), true)
            .build();
        let f = std::fs::File::create(dir.join(format!("part-{file}.parquet"))).expect("file");
        let mut writer = ArrowWriter::try_new(f, Arc::clone(&schema), Some(props)).expect("writer");
        for _ in 0..3 {
            let n = rng.random_range(50..120);
            // Ids rise through the files, so id filters prune row groups.
            let ids: Vec<i64> = (id..id + n).collect();
            id += n;
            let null = |rng: &mut ChaCha8Rng| rng.random_bool(0.15);
            let i: Int32Array = (0..n)
                .map(|_| (!null(&mut rng)).then(|| rng.random_range(-50..50)))
                .collect();
            let fl: Float64Array = (0..n)
                .map(|_| {
                    if null(&mut rng) {
                        None
                    } else if rng.random_bool(0.05) {
                        Some(f64::NAN)
                    } else {
                        Some(rng.random_range(-10.0..10.0))
                    }
                })
                .collect();
            let s: StringArray = (0..n)
                .map(|_| (!null(&mut rng)).then(|| words[rng.random_range(0..words.len())]))
                .collect();
            let cat: DictionaryArray<Int32Type> = (0..n)
                .map(|_| (!null(&mut rng)).then(|| cats[rng.random_range(0..cats.len())]))
                .collect();
            let ts: TimestampMicrosecondArray = (0..n)
                .map(|_| {
                    (!null(&mut rng)).then(|| 1_700_000_000_000_000 + rng.random_range(0..100_000_000_000i64))
                })
                .collect();
            let d = Decimal128Array::from(
                (0..n)
                    .map(|_| (!null(&mut rng)).then(|| rng.random_range(-100_000..100_000) as i128))
                    .collect::<Vec<_>>(),
            )
            .with_precision_and_scale(10, 2)
            .expect("decimal");
            let l = ListArray::from_iter_primitive::<Int32Type, _, _>((0..n).map(|_| {
                (!null(&mut rng)).then(|| {
                    (0..rng.random_range(0..5))
                        .map(|_| (!rng.random_bool(0.1)).then(|| rng.random_range(0..10)))
                        .collect::<Vec<_>>()
                })
            }));
            let b: BooleanArray = (0..n)
                .map(|_| (!null(&mut rng)).then(|| rng.random_bool(0.5)))
                .collect();
            let columns: Vec<ArrayRef> = vec![
                Arc::new(Int64Array::from(ids)),
                Arc::new(i),
                Arc::new(fl),
                Arc::new(s),
                Arc::new(cat),
                Arc::new(ts),
                Arc::new(d),
                Arc::new(l),
                Arc::new(b),
            ];
            let batch = RecordBatch::try_new(Arc::clone(&schema), columns).expect("batch");
            writer.write(&batch).expect("write");
        }
        writer.close().expect("close");
    }
    schema
}

/// A plain Flight client (no pushdown code), for protocol-level tests.
pub async fn raw_client(
    url: String,
) -> arrow_flight::flight_service_client::FlightServiceClient<tonic::transport::Channel> {
    let channel = tonic::transport::Channel::from_shared(url)
        .expect("url")
        .connect()
        .await
        .expect("connect");
    arrow_flight::flight_service_client::FlightServiceClient::new(channel)
}

/// Certificates made for one test run (PEM): a CA, a server certificate it signed for
/// `localhost` and `127.0.0.1`, and a client certificate it signed (mutual TLS).
pub struct TestPki {
    pub ca: String,
    pub server_cert: String,
    pub server_key: String,
    pub client_cert: String,
    pub client_key: String,
}

impl TestPki {
    pub fn new() -> Self {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "pushdown test CA");
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca_key = KeyPair::generate().expect("CA key");
        let ca = ca_params.self_signed(&ca_key).expect("CA certificate").pem();
        let issuer = Issuer::new(ca_params, ca_key);
        let leaf = |names: Vec<String>| {
            let params = CertificateParams::new(names).expect("params");
            let key = KeyPair::generate().expect("key");
            let cert = params.signed_by(&key, &issuer).expect("signed");
            (cert.pem(), key.serialize_pem())
        };
        let (server_cert, server_key) = leaf(vec!["localhost".into(), "127.0.0.1".into()]);
        let (client_cert, client_key) = leaf(vec!["trainer-1".into()]);
        Self {
            ca,
            server_cert,
            server_key,
            client_cert,
            client_key,
        }
    }
}

impl Default for TestPki {
    fn default() -> Self {
        Self::new()
    }
}

/// How many of `server`'s read-aheads ended in `outcome` (`pushdown_read_ahead_streams_total`).
pub fn read_aheads(server: &Server, outcome: &str) -> u64 {
    let key = format!("pushdown_read_ahead_streams_total{{outcome=\"{outcome}\"}} ");
    server
        .metrics()
        .encode()
        .lines()
        .find_map(|l| l.strip_prefix(&key))
        .map_or(0, |n| n.trim().parse().expect("count"))
}

/// Record batches `server` has sent in `codec` (none, lz4, zstd).
pub fn batches_sent(server: &Server, codec: &str) -> u64 {
    let key = format!("pushdown_batches_sent_total{{codec=\"{codec}\"}} ");
    server
        .metrics()
        .encode()
        .lines()
        .find_map(|l| l.strip_prefix(&key))
        .map_or(0, |n| n.trim().parse().expect("count"))
}

/// Waits (20 s at most) until `server` holds a stream opened ahead.
pub async fn until_read_ahead_held(server: &Server) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !server.holds_read_ahead() {
        assert!(std::time::Instant::now() < deadline, "nothing opened ahead");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}
