//! A corpus of malformed Parquet files, each damaged the way files are damaged in practice
//! (cut short, overwritten in the wrong place, bits flipped on disk), built from one healthy
//! file so every defect is the only one in its file.
//!
//! The corpus is the input of the tests that hold servers to "one bad file is that file's
//! `DataLoss`, never the server's end": [`write_corpus`] writes every entry into its own
//! dataset beside a healthy one, and the `malformed-corpus` binary does the same for the
//! Python tests that start the real `pushdown serve` (from local disk and from S3).

use std::path::Path;
use std::sync::Arc;

use arrow::array::{ArrayRef, Float64Array, Int64Array, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use arrow::record_batch::RecordBatch;
use bytes::Bytes;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, Repetition, ZstdLevel};
use parquet::file::metadata::{
    PageIndexPolicy, ParquetMetaData, ParquetMetaDataReader, ParquetMetaDataWriter,
};
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::types::Type;

/// Rows of the healthy file, in row groups of [`GROUP_ROWS`].
pub const ROWS: i64 = 300;
pub const GROUP_ROWS: usize = 100;
/// Levels of the deeply nested schema entry: past any thread's stack for the Parquet crate's
/// recursive schema decoder: before the footer walk, this file (1.3 MB) overflowed the 8 MiB
/// main-thread stack of a release `pushdown serve` at start-up and aborted it.
pub const DEEP_SCHEMA_LEVELS: usize = 100_000;

/// One malformed file: its name (also its dataset's, after `bad_`) and what is wrong.
#[derive(Debug, Clone)]
pub struct Entry {
    pub name: &'static str,
    pub defect: &'static str,
    pub bytes: Vec<u8>,
    /// Whether the footer is sound and only the pages are damaged: planning works, and the
    /// streams over this file fail.
    pub pages_only: bool,
}

/// The healthy file's rows: `id` 0..300, `text` and `value` derived from it.
pub fn healthy_batch() -> RecordBatch {
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("text", DataType::Utf8, false),
        Field::new("value", DataType::Float64, true),
    ]));
    let ids: Vec<i64> = (0..ROWS).collect();
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from(ids.clone())),
        Arc::new(StringArray::from_iter_values(
            ids.iter()
                .map(|i| format!("row {i} of the healthy file, category {}", i % 7)),
        )),
        Arc::new(Float64Array::from_iter(
            ids.iter().map(|&i| (i % 11 != 0).then_some(i as f64 * 0.5)),
        )),
    ];
    RecordBatch::try_new(schema, columns).expect("healthy batch")
}

/// The healthy file: three row groups, zstd pages, dictionaries, statistics and page indexes.
pub fn healthy_file() -> Vec<u8> {
    let batch = healthy_batch();
    let props = WriterProperties::builder()
        .set_max_row_group_row_count(Some(GROUP_ROWS))
        .set_compression(Compression::ZSTD(ZstdLevel::default()))
        .set_statistics_enabled(EnabledStatistics::Page)
        .build();
    let mut out = Vec::new();
    let mut writer = ArrowWriter::try_new(&mut out, batch.schema(), Some(props)).expect("writer");
    writer.write(&batch).expect("write");
    writer.close().expect("close");
    out
}

fn metadata_len(file: &[u8]) -> usize {
    let n = file.len();
    u32::from_le_bytes(file[n - 8..n - 4].try_into().expect("4 bytes")) as usize
}

fn with_footer_len(file: &[u8], len: u32) -> Vec<u8> {
    let mut out = file.to_vec();
    let n = out.len();
    out[n - 8..n - 4].copy_from_slice(&len.to_le_bytes());
    out
}

/// The file's metadata (footer only), decoded.
fn footer(file: &[u8]) -> ParquetMetaData {
    ParquetMetaDataReader::new()
        .with_page_index_policy(PageIndexPolicy::Skip)
        .parse_and_finish(&Bytes::copy_from_slice(file))
        .expect("healthy footer")
}

/// The file with its metadata replaced by `metadata` (pages and page indexes kept).
fn with_metadata(file: &[u8], metadata: &ParquetMetaData) -> Vec<u8> {
    let start = file.len() - 8 - metadata_len(file);
    let mut out = file[..start].to_vec();
    ParquetMetaDataWriter::new(&mut out, metadata)
        .finish()
        .expect("metadata");
    out
}

/// The file with `edit` applied to the first column chunk of the first row group.
fn with_first_chunk(
    file: &[u8],
    edit: impl FnOnce(
        parquet::file::metadata::ColumnChunkMetaDataBuilder,
    ) -> parquet::file::metadata::ColumnChunkMetaDataBuilder,
) -> Vec<u8> {
    let metadata = footer(file);
    let mut groups = metadata.row_groups().to_vec();
    let first = groups.remove(0);
    let mut columns = first.columns().to_vec();
    let chunk = columns.remove(0);
    columns.insert(0, edit(chunk.into_builder()).build().expect("chunk"));
    let first = first
        .into_builder()
        .set_column_metadata(columns)
        .build()
        .expect("row group");
    groups.insert(0, first);
    let edited = metadata.into_builder().set_row_groups(groups).build();
    with_metadata(file, &edited)
}

/// The offset of the first data page of the first column chunk.
fn first_data_page(file: &[u8]) -> usize {
    footer(file).row_group(0).column(0).data_page_offset() as usize
}

/// `file` with its first data page's header claiming the most compressed bytes its
/// `compressed_page_size` field can hold in its own width: more than the column chunk has.
/// The header is Thrift's compact protocol: `type`, `uncompressed_page_size` and
/// `compressed_page_size` are fields 1–3, each an i32 (field byte `0x15`) as a zigzag varint.
fn page_claiming_past_its_chunk(file: &[u8]) -> Vec<u8> {
    let mut bytes = file.to_vec();
    let mut at = first_data_page(file);
    let varint_end = |bytes: &[u8], from: usize| {
        from + bytes[from..]
            .iter()
            .position(|b| b & 0x80 == 0)
            .expect("a varint")
            + 1
    };
    for _ in 0..2 {
        assert_eq!(bytes[at], 0x15, "an i32 field");
        at = varint_end(&bytes, at + 1);
    }
    assert_eq!(bytes[at], 0x15, "compressed_page_size");
    let (start, end) = (at + 1, varint_end(&bytes, at + 1));
    for (i, b) in bytes[start..end].iter_mut().enumerate() {
        // All 7-bit groups set; the sign bit of zigzag clear: the largest positive value.
        *b = if i + 1 < end - start { 0xff } else { 0x7e };
    }
    bytes
}

/// A valid file whose schema nests `levels` groups, with no rows, written by the Parquet
/// crate (on a thread whose stack holds its recursion).
pub fn deep_schema_file(levels: usize) -> Vec<u8> {
    std::thread::Builder::new()
        .name("deep-schema".into())
        .stack_size(4 << 30)
        .spawn(move || write_deep_schema_file(levels))
        .expect("thread")
        .join()
        .expect("written")
}

fn write_deep_schema_file(levels: usize) -> Vec<u8> {
    let mut node = Type::primitive_type_builder("leaf", parquet::basic::Type::INT32)
        .with_repetition(Repetition::OPTIONAL)
        .build()
        .expect("leaf");
    for level in 0..levels {
        // Required groups: optional ones would overflow the i16 definition levels first.
        node = Type::group_type_builder(&format!("g{level}"))
            .with_repetition(Repetition::REQUIRED)
            .with_fields(vec![Arc::new(node)])
            .build()
            .expect("group");
    }
    let schema = Type::group_type_builder("schema")
        .with_fields(vec![Arc::new(node)])
        .build()
        .expect("schema");
    let mut out = Vec::new();
    let writer = SerializedFileWriter::new(&mut out, Arc::new(schema), Default::default()).expect("writer");
    writer.close().expect("close");
    out
}

/// Every malformed entry, built from [`healthy_file`].
pub fn corpus() -> Vec<Entry> {
    let good = healthy_file();
    let n = good.len();
    let meta_len = metadata_len(&good);
    let meta_start = n - 8 - meta_len;
    let first_offset = footer(&good).row_group(0).column(0).data_page_offset();
    let entry = |name, defect, bytes| Entry {
        name,
        defect,
        bytes,
        pages_only: false,
    };
    let mut entries = vec![
        entry(
            "footer_claims_2gib",
            "the footer's length claims ~2 GiB of metadata in a file of a few KiB",
            with_footer_len(&good, 0x7fff_fff0),
        ),
        entry(
            "footer_claims_file_size",
            "the footer's length claims exactly the file's size",
            with_footer_len(&good, n as u32),
        ),
        entry(
            "footer_negative_length",
            "the footer's length is -1 as a signed 32-bit integer",
            with_footer_len(&good, u32::MAX),
        ),
        entry(
            "footer_zero_length",
            "the footer's length is 0",
            with_footer_len(&good, 0),
        ),
        entry(
            "footer_one_short",
            "the footer's length is one byte short: decoding starts inside the metadata",
            with_footer_len(&good, meta_len as u32 - 1),
        ),
        {
            let mut bytes = good.clone();
            // Every byte of the metadata's first field headers inverted.
            for b in &mut bytes[meta_start..meta_start + 4] {
                *b ^= 0xff;
            }
            entry(
                "footer_bitflips",
                "bits flipped in the metadata's first field headers",
                bytes,
            )
        },
        {
            let mut bytes = good.clone();
            let mut x = 0x9e37_79b9_7f4a_7c15u64;
            for b in &mut bytes[meta_start..n - 8] {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *b = x as u8;
            }
            entry(
                "footer_garbage",
                "the metadata overwritten with seeded garbage",
                bytes,
            )
        },
        entry(
            "chunk_offset_past_end",
            "a column chunk's data page offset points past the end of the file",
            with_first_chunk(&good, |c| {
                c.set_data_page_offset(n as i64 * 4)
                    .set_dictionary_page_offset(None)
            }),
        ),
        entry(
            "chunk_offset_bitflip",
            "bit 40 of a column chunk's data page offset flipped",
            with_first_chunk(&good, |c| {
                c.set_data_page_offset(first_offset ^ (1 << 40))
                    .set_dictionary_page_offset(None)
            }),
        ),
        entry(
            "chunk_offset_negative",
            "a column chunk's dictionary page offset is negative",
            with_first_chunk(&good, |c| c.set_dictionary_page_offset(Some(-4096))),
        ),
        entry(
            "chunk_size_past_end",
            "a column chunk's compressed size runs past the end of the file",
            with_first_chunk(&good, |c| c.set_total_compressed_size(n as i64 * 8)),
        ),
        entry(
            "row_count_mismatch",
            "a row group claims more rows than the file's total",
            {
                let metadata = footer(&good);
                let mut groups = metadata.row_groups().to_vec();
                let first = groups.remove(0);
                let rows = first.num_rows();
                groups.insert(
                    0,
                    first
                        .into_builder()
                        .set_num_rows(rows * 1000)
                        .build()
                        .expect("rg"),
                );
                with_metadata(&good, &metadata.into_builder().set_row_groups(groups).build())
            },
        ),
        {
            let mut bytes = good.clone();
            bytes[..4].copy_from_slice(b"PAR0");
            entry("wrong_magic_head", "the file starts with PAR0", bytes)
        },
        {
            let mut bytes = good.clone();
            bytes[n - 4..].copy_from_slice(b"PAR0");
            entry("wrong_magic_tail", "the file ends with PAR0", bytes)
        },
        entry("empty", "an empty file", Vec::new()),
        entry("magic_only", "just PAR1", b"PAR1".to_vec()),
        entry(
            "truncated",
            "the file cut in half (a copy that stopped)",
            good[..n / 2].to_vec(),
        ),
        entry(
            "deep_schema",
            "a schema nested 100,000 groups deep",
            deep_schema_file(DEEP_SCHEMA_LEVELS),
        ),
    ];
    // Page damage the footer cannot show: found by the scan of that file.
    let page = first_data_page(&good);
    let mut header = good.clone();
    for b in &mut header[page..page + 3] {
        *b ^= 0xff;
    }
    entries.push(Entry {
        name: "page_header_bitflips",
        defect: "bits flipped in the first data page's header",
        bytes: header,
        pages_only: true,
    });
    entries.push(Entry {
        name: "page_claims_past_its_chunk",
        defect: "the first data page's header claims more compressed bytes than its column chunk \
                 holds",
        // Without the chunk's offset index, whose page locations the reader would trust
        // over the header.
        bytes: with_first_chunk(&page_claiming_past_its_chunk(&good), |c| {
            c.set_offset_index_offset(None).set_offset_index_length(None)
        }),
        pages_only: true,
    });
    let mut body = good.clone();
    let dictionary = footer(&good).row_group(0).column(1).dictionary_page_offset();
    let text_page = dictionary.unwrap_or(footer(&good).row_group(0).column(1).data_page_offset()) as usize;
    for b in &mut body[text_page + 24..text_page + 40] {
        *b ^= 0x5a;
    }
    entries.push(Entry {
        name: "page_body_bitflips",
        defect: "bits flipped in a compressed page of the text column",
        bytes: body,
        pages_only: true,
    });
    entries
}

/// Writes the data root the corpus is served from: `healthy/` (two copies of the healthy
/// file) and, for each entry, `bad_<name>/` holding one healthy file and the entry.
pub fn write_corpus(root: &Path) -> Vec<Entry> {
    let good = healthy_file();
    let healthy = root.join("healthy");
    std::fs::create_dir_all(&healthy).expect("mkdir");
    std::fs::write(healthy.join("a.parquet"), &good).expect("write");
    std::fs::write(healthy.join("b.parquet"), &good).expect("write");
    let entries = corpus();
    for e in &entries {
        let dir = root.join(format!("bad_{}", e.name));
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(dir.join("a_good.parquet"), &good).expect("write");
        std::fs::write(dir.join(format!("{}.parquet", e.name)), &e.bytes).expect("write");
    }
    entries
}
