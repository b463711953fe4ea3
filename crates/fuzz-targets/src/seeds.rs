//! Valid inputs of each target, made by the encoders the project and Arrow use: the seeds of
//! `fuzz/corpus/<target>/` (written by the corpus test with `PUSHDOWN_WRITE_FUZZ_SEEDS`) and
//! replayed with it.

use std::sync::Arc;

use arrow::array::{Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use arrow::ipc::CompressionType;
use arrow::ipc::writer::IpcWriteOptions;
use arrow_flight::FlightData;
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::sql::{
    CommandGetCatalogs, CommandGetDbSchemas, CommandGetSqlInfo, CommandGetTables,
    CommandPreparedStatementQuery, CommandStatementQuery,
};
use futures::TryStreamExt;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use pushdown_client::LoaderState;
use pushdown_engine::PreparedStatement;
use pushdown_protocol::{
    ClientReport, CountReply, DatasetVersion, PlanEstimate, Profile, Query, ScalingSignal, ScanRequest,
    ShardTicket, StreamStats,
};

use crate::engine::table_file;
use crate::messages::flight_sql_bytes;
use crate::{TARGETS, join_messages};

/// Valid inputs of the target `name` (none for a name that is no target).
pub fn seeds(name: &str) -> Vec<Vec<u8>> {
    match name {
        "ticket" => tickets(),
        "command" => vec![
            ScanRequest::new(Query::Sql("SELECT id, name FROM t WHERE id < 9".into()))
                .encode()
                .to_vec(),
            b"SELECT count(*) FROM t".to_vec(),
        ],
        "messages" => messages(),
        "flight_sql" => flight_sql(),
        "parameters" => vec![join_messages(&encoded(&params(), None))],
        "prepared_handle" => vec![
            prepared("SELECT id FROM t WHERE id > $1 AND name <> $2"),
            PreparedStatement::decode(&prepared("SELECT 1"))
                .map(|p| p.encode().to_vec())
                .unwrap_or_default(),
        ],
        "sql" => vec![
            b"SELECT id, upper(name) FROM t WHERE id % 3 = 1 ORDER BY id DESC LIMIT 5".to_vec(),
            b"SELECT name, count(*) AS n, avg(score) FROM t GROUP BY name HAVING count(*) > 0".to_vec(),
            b"SELECT a.id FROM t a JOIN t b ON a.id = b.id + 1 WHERE a.blob IS NOT NULL".to_vec(),
        ],
        "pipeline" => pipelines(),
        "loader_state" => loader_states(),
        "parquet" => parquet_files(),
        "client_ipc" => client_streams(),
        "tokens" => vec![
            b"# comment\naaaaaaaaaaaaaaaa-team-a  images, clicks\n\nzzzzzzzzzzzzzzzz-platform *  # all\n".to_vec(),
        ],
        "views" => vec![
            concat!(
                "[[view]]\nname = \"thumbs\"\ndescription = \"16-px thumbnails\"\n",
                "sql = \"SELECT id, thumbnail(image, 16) AS image, label FROM images WHERE split = 'train'\"\n\n",
                "[[view]]\nname = \"labels\"\nsql = \"SELECT id, label FROM thumbs WHERE label < 500\"\n",
            )
            .as_bytes()
            .to_vec(),
        ],
        // Its seeds are files other tools wrote, checked in as `fuzz/corpus/audio/seed-*`
        // (ffmpeg's WAV, FLAC, MP3, Vorbis and Opus of a sox sine).
        "audio" => Vec::new(),
        _ => {
            debug_assert!(TARGETS.iter().all(|(n, _)| *n != name));
            Vec::new()
        }
    }
}

fn tickets() -> Vec<Vec<u8>> {
    let request = ScanRequest::new(Query::Sql("SELECT id FROM t WHERE id > 3".into()));
    [(None, 0), (Some(5), 2)]
        .into_iter()
        .map(|(take_rows, skip_rows)| {
            ShardTicket {
                request: request.clone(),
                shard: None,
                skip_rows,
                take_rows,
            }
            .encode()
            .to_vec()
        })
        .collect()
}

fn messages() -> Vec<Vec<u8>> {
    let report = ClientReport {
        client: 7,
        servers: 2,
        elapsed_seconds: 1.5,
        wait_seconds: 0.25,
        ..Default::default()
    };
    let scaling = ScalingSignal {
        servers: 2,
        servers_wanted: 3,
        busy_fraction: 0.5,
        wait_fraction: 0.1,
        ..Default::default()
    };
    let estimate = PlanEstimate {
        rows_upper_bound: 100,
        bytes_to_scan: 4096,
        row_wise: true,
        row_groups_pruned: 1,
    };
    let stats = StreamStats {
        rows_scanned: 10,
        rows_sent: 5,
        bytes_sent: 99,
        ..Default::default()
    };
    let bodies: [Vec<u8>; 10] = [
        report.to_bytes().to_vec(),
        estimate.encode().to_vec(),
        Profile::default().encode().to_vec(),
        DatasetVersion::default().encode().to_vec(),
        scaling.to_bytes().to_vec(),
        CountReply { rows: 12 }.encode().to_vec(),
        stats.encode().to_vec(),
        b"explain".to_vec(),
        b"0.1.0\n0.1.3".to_vec(),
        b"zstd".to_vec(),
    ];
    bodies
        .into_iter()
        .enumerate()
        .map(|(i, body)| [vec![i as u8], body].concat())
        .collect()
}

fn flight_sql() -> Vec<Vec<u8>> {
    vec![
        flight_sql_bytes(CommandStatementQuery {
            query: "SELECT id FROM t".into(),
            transaction_id: None,
        }),
        flight_sql_bytes(CommandPreparedStatementQuery {
            prepared_statement_handle: prepared("SELECT id FROM t WHERE id > $1 AND name <> $2").into(),
        }),
        flight_sql_bytes(CommandGetCatalogs {}),
        flight_sql_bytes(CommandGetDbSchemas::default()),
        flight_sql_bytes(CommandGetTables {
            table_name_filter_pattern: Some("t%".into()),
            include_schema: true,
            ..Default::default()
        }),
        flight_sql_bytes(CommandGetSqlInfo { info: vec![0, 1] }),
    ]
}

/// One row of parameters: an integer and a string.
fn params() -> RecordBatch {
    let schema = Arc::new(Schema::new(vec![
        Field::new("$1", DataType::Int64, false),
        Field::new("$2", DataType::Utf8, true),
    ]));
    RecordBatch::try_new(
        schema,
        vec![
            Arc::new(Int64Array::from(vec![3])),
            Arc::new(StringArray::from(vec![Some("n'4")])),
        ],
    )
    .expect("a batch")
}

/// A handle of `sql` with [`params`] bound.
fn prepared(sql: &str) -> Vec<u8> {
    PreparedStatement::bind(sql.into(), &params())
        .expect("bound")
        .encode()
        .to_vec()
}

/// `batch` as Flight messages (schema, dictionaries, batch), IPC-compressed with `codec`.
fn encoded(batch: &RecordBatch, codec: Option<CompressionType>) -> Vec<FlightData> {
    let options = IpcWriteOptions::default()
        .try_with_compression(codec)
        .expect("options");
    let stream = FlightDataEncoderBuilder::new()
        .with_options(options)
        .build(futures::stream::iter([Ok(batch.clone())]));
    tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime")
        .block_on(stream.try_collect())
        .expect("encoded")
}

fn client_streams() -> Vec<Vec<u8>> {
    let file = table_file(12, None);
    let reader =
        parquet::arrow::arrow_reader::ParquetRecordBatchReader::try_new(bytes::Bytes::from(file), 1024)
            .expect("a reader");
    let batch = reader.into_iter().next().expect("a batch").expect("read");
    let trailer = FlightData {
        app_metadata: StreamStats {
            rows_sent: 12,
            ..Default::default()
        }
        .encode(),
        ..Default::default()
    };
    [
        None,
        Some(CompressionType::ZSTD),
        Some(CompressionType::LZ4_FRAME),
    ]
    .into_iter()
    .map(|codec| {
        let mut messages = encoded(&batch, codec);
        messages.push(trailer.clone());
        join_messages(&messages)
    })
    .collect()
}

fn pipelines() -> Vec<Vec<u8>> {
    [
        concat!(
            "dataset = \"images\"\n[[steps]]\nop = \"filter\"\nexpr = \"label < 100\"\n",
            "[[steps]]\nop = \"map\"\ncall = \"decode_resize\"\ninput = \"image\"\nparams = [64, 64]\noutput = \"pixels\"\n",
            "[[steps]]\nop = \"shuffle\"\nbuffer = 64\n",
            "[[steps]]\nop = \"batch\"\nsize = 8\ndrop_last = true\n"
        ),
        r#"{"dataset":"images","steps":[{"op":"shuffle","buffer":5}]}"#,
        r#"{"dataset":"text","steps":[{"op":"select","columns":["text","label"]},{"op":"batch","size":4}]}"#,
        concat!(
            "dataset = \"text\"\n[[steps]]\nop = \"map\"\ncall = \"tokenize\"\ninput = \"body\"\nparams = [128]\n",
            "[[steps]]\nop = \"pack\"\ncolumn = \"body\"\nlength = 128\neos_id = 2\n",
            "[[steps]]\nop = \"bucket_by\"\ncolumn = \"body\"\nboundaries = [16, 64]\n"
        ),
    ]
    .into_iter()
    .map(|s| s.as_bytes().to_vec())
    .collect()
}

fn loader_states() -> Vec<Vec<u8>> {
    // A `PDL4` state: its order (sources, seed, global batch, window, 4 partitions,
    // drop_last, echo), then epoch, batches, the dataset version and the epoch's echo.
    let head = |magic: &[u8]| {
        let mut out = magic.to_vec();
        for w in [11u64, 7, 96, 4, 4, 1, 1, 2, 31, 0xfeed, 3] {
            out.extend_from_slice(&w.to_le_bytes());
        }
        out
    };
    let with = |magic: &[u8], words: &[u64]| {
        let mut out = head(magic);
        out.extend(words.iter().flat_map(|w| w.to_le_bytes()));
        out
    };
    let plain = head(b"PDL4");
    debug_assert!(LoaderState::from_bytes(&plain).is_ok());
    vec![
        plain,
        // A mixture of 2 sources over the 4 partitions: rows taken of each.
        with(b"PDM1", &[2, 4, 1, 2, 3, 4, 5, 6, 7, 8]),
        // A packed loader: each partition's (rows done, offset); u64::MAX: not known here.
        with(b"PDK1", &[4, 3, 5, 4, 0, u64::MAX, 0, u64::MAX, 0]),
        // A bucketed loader: each partition's first row, its bitmap's words and the bitmap.
        with(b"PDB1", &[4, 9, 1, 0b1011, u64::MAX, 0, 2, 0, u64::MAX, 0]),
    ]
}

fn parquet_files() -> Vec<Vec<u8>> {
    let paged = WriterProperties::builder()
        .set_max_row_group_row_count(Some(8))
        .set_data_page_row_count_limit(4)
        .set_statistics_enabled(EnabledStatistics::Page)
        .set_compression(Compression::ZSTD(ZstdLevel::default()))
        .build();
    let plain = WriterProperties::builder()
        .set_dictionary_enabled(false)
        .set_compression(Compression::SNAPPY)
        .build();
    vec![
        table_file(16, None),
        table_file(40, Some(paged)),
        table_file(10, Some(plain)),
    ]
}
