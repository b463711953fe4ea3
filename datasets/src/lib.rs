//! Seeded, deterministic generators of realistic training datasets, written as Parquet:
//! what `pushdown gen` writes, and what the tests and benchmarks serve (each dataset is
//! described in `datasets/README.md`).
//!
//! | dataset | columns | row group | file |
//! |---|---|---|---|
//! | `images` | `id` i64, `image` binary (JPEG, 192–320 px sides), `label` i32 0..999, `caption` utf8, `width` i32, `height` i32, `split` utf8 | 128 rows | 1024 rows |
//! | `clicks` | `label` i32, `i1..i13` i32 (nullable), `c1..c26` utf8 (8 hex chars, skewed), `day` i32 | 16 Ki rows | 128 Ki rows |
//! | `text` | `id` i64, `lang` utf8, `quality` f32 0..1, `body` utf8 (100–3000 Zipfian pseudo-words; `tokenizer.json` beside the files) | 4 Ki rows | 32 Ki rows |
//! | `speech` | `id` i64, `audio` struct<bytes: binary (WAV, 0.5–10 s, 8–48 kHz, mono or stereo), path: utf8> (the Hub's `Audio`), `speaker` i32 0..99, `text` utf8 | 64 rows | 512 rows |
//! | `lineitem` | TPC-H `lineitem` (16 columns: keys, decimal(15,2) quantities and prices, dates, flags, comments) from `tpchgen`, at the scale factor that gives about `rows` rows | 128 Ki rows | 1 Mi rows |
//!
//! Every row is a function of (seed, row id) alone, so files are generated in parallel and
//! the output is identical whatever the thread count (`lineitem`: of the scale factor and
//! the file's part number, as `dbgen` defines it; the seed does not apply). Files are zstd-compressed, with page
//! statistics (page index) and bloom filters on the low-cardinality string columns, as a
//! data-platform team would write them. Images are the exception a team tuning for selective
//! reads would make: each JPEG is a page of its own, stored uncompressed and without a
//! dictionary, so a reader that filters on `label` reads only the images it keeps; the speech
//! clips are laid out the same way.

use std::collections::HashMap;
use std::fs::File;
use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use arrow::array::{
    ArrayRef, BinaryBuilder, Float32Builder, Int32Builder, Int64Builder, StringBuilder, StructArray,
};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::record_batch::RecordBatch;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::schema::types::ColumnPath;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The kinds of dataset `pushdown gen` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Kind {
    Images,
    Clicks,
    Text,
    Lineitem,
    Speech,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Images => "images",
            Kind::Clicks => "clicks",
            Kind::Text => "text",
            Kind::Lineitem => "lineitem",
            Kind::Speech => "speech",
        }
    }

    fn layout(self) -> (usize, usize) {
        // (rows per row group, rows per file)
        match self {
            Kind::Images => (128, 1024),
            Kind::Clicks => (16 * 1024, 128 * 1024),
            Kind::Text => (4 * 1024, 32 * 1024),
            Kind::Lineitem => (128 * 1024, 1024 * 1024),
            Kind::Speech => (64, 512),
        }
    }

    pub fn schema(self) -> SchemaRef {
        let fields = match self {
            Kind::Images => vec![
                Field::new("id", DataType::Int64, false),
                Field::new("image", DataType::Binary, false),
                Field::new("label", DataType::Int32, false),
                Field::new("caption", DataType::Utf8, false),
                Field::new("width", DataType::Int32, false),
                Field::new("height", DataType::Int32, false),
                Field::new("split", DataType::Utf8, false),
            ],
            Kind::Clicks => {
                let mut f = vec![Field::new("label", DataType::Int32, false)];
                f.extend((1..=13).map(|i| Field::new(format!("i{i}"), DataType::Int32, true)));
                f.extend((1..=26).map(|i| Field::new(format!("c{i}"), DataType::Utf8, true)));
                f.push(Field::new("day", DataType::Int32, false));
                f
            }
            Kind::Text => vec![
                Field::new("id", DataType::Int64, false),
                Field::new("lang", DataType::Utf8, false),
                Field::new("quality", DataType::Float32, false),
                Field::new("body", DataType::Utf8, false),
            ],
            Kind::Speech => vec![
                Field::new("id", DataType::Int64, false),
                Field::new("audio", audio_type(), true),
                Field::new("speaker", DataType::Int32, false),
                Field::new("text", DataType::Utf8, false),
            ],
            // tpchgen-arrow's schema with plain Utf8 strings (as most writers store them).
            Kind::Lineitem => {
                let money = || DataType::Decimal128(15, 2);
                vec![
                    Field::new("l_orderkey", DataType::Int64, false),
                    Field::new("l_partkey", DataType::Int64, false),
                    Field::new("l_suppkey", DataType::Int64, false),
                    Field::new("l_linenumber", DataType::Int32, false),
                    Field::new("l_quantity", money(), false),
                    Field::new("l_extendedprice", money(), false),
                    Field::new("l_discount", money(), false),
                    Field::new("l_tax", money(), false),
                    Field::new("l_returnflag", DataType::Utf8, false),
                    Field::new("l_linestatus", DataType::Utf8, false),
                    Field::new("l_shipdate", DataType::Date32, false),
                    Field::new("l_commitdate", DataType::Date32, false),
                    Field::new("l_receiptdate", DataType::Date32, false),
                    Field::new("l_shipinstruct", DataType::Utf8, false),
                    Field::new("l_shipmode", DataType::Utf8, false),
                    Field::new("l_comment", DataType::Utf8, false),
                ]
            }
        };
        let schema = Schema::new(fields);
        match self {
            // The Hub's feature description, so `datasets` reads `audio` back as `Audio`.
            Kind::Speech => Arc::new(schema.with_metadata(HashMap::from([(
                "huggingface".to_owned(),
                SPEECH_FEATURES.to_owned(),
            )]))),
            _ => Arc::new(schema),
        }
    }
}

/// The Hub's `Audio` column: the encoded file and its name.
fn audio_type() -> DataType {
    DataType::Struct(
        vec![
            Field::new("bytes", DataType::Binary, true),
            Field::new("path", DataType::Utf8, true),
        ]
        .into(),
    )
}

/// The `huggingface` schema metadata `datasets` writes for the speech columns.
const SPEECH_FEATURES: &str = r#"{"info": {"features": {"id": {"dtype": "int64", "_type": "Value"}, "audio": {"_type": "Audio"}, "speaker": {"dtype": "int32", "_type": "Value"}, "text": {"dtype": "string", "_type": "Value"}}}}"#;

/// A terminal progress bar wired into `options`: generation advances it.
#[cfg(feature = "progress")]
pub fn progress_bar(options: &mut GenOptions) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(options.rows as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} rows ({per_sec}, {eta} left)")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_message(format!("generating {}", options.kind.name()));
    let advance = bar.clone();
    options.progress = Some(Arc::new(move |rows| advance.inc(rows)));
    bar
}

/// Told the rows written as generation goes (a progress bar, a log line).
pub type Progress = Arc<dyn Fn(u64) + Send + Sync>;

/// What to generate.
#[derive(Clone)]
pub struct GenOptions {
    pub kind: Kind,
    pub rows: usize,
    pub seed: u64,
    /// Overrides of the kind's layout, for tests.
    pub row_group_rows: Option<usize>,
    pub rows_per_file: Option<usize>,
    pub progress: Option<Progress>,
}

impl std::fmt::Debug for GenOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GenOptions")
            .field("kind", &self.kind)
            .field("rows", &self.rows)
            .field("seed", &self.seed)
            .field("row_group_rows", &self.row_group_rows)
            .field("rows_per_file", &self.rows_per_file)
            .field("progress", &self.progress.is_some())
            .finish()
    }
}

impl GenOptions {
    pub fn new(kind: Kind, rows: usize) -> Self {
        Self {
            kind,
            rows,
            seed: 42,
            row_group_rows: None,
            rows_per_file: None,
            progress: None,
        }
    }
}

/// The version of the files' layout (encodings, compression, page and row-group sizes): a
/// change to it changes every file of some dataset. 2: images with one uncompressed,
/// dictionary-free JPEG per page.
pub const LAYOUT_VERSION: u32 = 2;

/// What was written.
#[derive(Debug, Clone)]
pub struct Generated {
    pub dir: PathBuf,
    pub files: Vec<PathBuf>,
    pub rows: usize,
    pub bytes: u64,
}

/// Writes the dataset into `dir` (created; existing `part-*.parquet` files are replaced).
pub fn generate(options: &GenOptions, dir: &Path) -> Result<Generated> {
    let (rg_default, file_default) = options.kind.layout();
    let rg_rows = options.row_group_rows.unwrap_or(rg_default).max(1);
    let file_rows = options.rows_per_file.unwrap_or(file_default).max(rg_rows);
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if name.starts_with("part-") && name.ends_with(".parquet") {
            std::fs::remove_file(&path)?;
        }
    }
    let n_files = options.rows.div_ceil(file_rows).max(1);
    let progress: Progress = options.progress.clone().unwrap_or_else(|| Arc::new(|_| {}));
    let bar = progress.as_ref();
    let threads = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .min(n_files);
    let files: Vec<PathBuf> = (0..n_files)
        .map(|f| dir.join(format!("part-{f:05}.parquet")))
        .collect();
    let rows = std::thread::scope(|scope| -> Result<usize> {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let files = &files;
                scope.spawn(move || -> Result<usize> {
                    let mut written = 0;
                    for f in (t..n_files).step_by(threads) {
                        written += if options.kind == Kind::Lineitem {
                            write_lineitem(options, &files[f], f, n_files, rg_rows, bar)?
                        } else {
                            let start = f * file_rows;
                            let end = ((f + 1) * file_rows).min(options.rows);
                            write_file(options, &files[f], start..end, rg_rows, bar)?;
                            end - start
                        };
                    }
                    Ok(written)
                })
            })
            .collect();
        let mut rows = 0;
        for h in handles {
            rows += h
                .join()
                .map_err(|_| anyhow::anyhow!("generator thread panicked"))??;
        }
        Ok(rows)
    })?;
    if options.kind == Kind::Text {
        write_tokenizer(options.seed, options.rows, dir)?;
    }
    let bytes = files
        .iter()
        .map(|f| std::fs::metadata(f).map(|m| m.len()).unwrap_or(0))
        .sum();
    Ok(Generated {
        dir: dir.to_path_buf(),
        files,
        rows,
        bytes,
    })
}

fn writer_properties(kind: Kind, rg_rows: usize) -> Result<WriterProperties> {
    let mut props = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(3)?))
        .set_statistics_enabled(EnabledStatistics::Page)
        .set_max_row_group_row_count(Some(rg_rows))
        .set_created_by("pushdown gen".into());
    let bloom: Vec<String> = match kind {
        Kind::Images => vec!["split".into()],
        Kind::Clicks => (1..=26).map(|i| format!("c{i}")).collect(),
        Kind::Text => vec!["lang".into()],
        Kind::Lineitem => vec!["l_shipmode".into()],
        Kind::Speech => vec![],
    };
    for column in bloom {
        props = props
            .set_column_bloom_filter_enabled(column.as_str().into(), true)
            .set_column_bloom_filter_fpp(column.as_str().into(), 0.01);
    }
    if kind == Kind::Images {
        // The JPEG column, laid out for selective reads. One image per page: with the page
        // index, a reader that filters rows first (on `label`, say) fetches only the pages of
        // the images it keeps, where megabyte pages would hold a kept row each (the writer
        // closes a page between write batches only). Uncompressed: zstd stores JPEG bytes as
        // raw blocks, a copy on each read for no saving. No dictionary for values unique per
        // row (`image`, `id`): the writer would fill one and fall back to plain pages, and
        // every reader would decode it for nothing. No min/max: JPEG bytes prune nothing (the
        // offset index, the pages' locations, stays). Text bodies keep their dictionary:
        // measured, their scan was slower without (`benches/RESULTS.md`, "Scan: the server
        // against DuckDB").
        props = props
            .set_write_batch_size(1)
            .set_column_data_page_size_limit("image".into(), 1)
            .set_column_compression("image".into(), Compression::UNCOMPRESSED)
            .set_column_dictionary_enabled("image".into(), false)
            .set_column_dictionary_enabled("id".into(), false)
            .set_column_statistics_enabled("image".into(), EnabledStatistics::None);
    }
    if kind == Kind::Speech {
        // The clips as the images: one per page, uncompressed (WAV barely shrinks), no
        // dictionary, no statistics, so a filtered read fetches only the clips it keeps.
        let clips = ColumnPath::new(vec!["audio".into(), "bytes".into()]);
        props = props
            .set_write_batch_size(1)
            .set_column_data_page_size_limit(clips.clone(), 1)
            .set_column_compression(clips.clone(), Compression::UNCOMPRESSED)
            .set_column_dictionary_enabled(clips.clone(), false)
            .set_column_dictionary_enabled("id".into(), false)
            .set_column_statistics_enabled(clips, EnabledStatistics::None);
    }
    Ok(props.build())
}

/// Rows of `lineitem` at scale factor 1.
const LINEITEM_ROWS_SF1: f64 = 6_001_215.0;

/// Part `part` (of `parts`) of TPC-H `lineitem` at the scale factor giving about
/// `options.rows` rows. Returns the rows written.
fn write_lineitem(
    options: &GenOptions,
    path: &Path,
    part: usize,
    parts: usize,
    rg_rows: usize,
    bar: &(dyn Fn(u64) + Send + Sync),
) -> Result<usize> {
    let scale_factor = options.rows as f64 / LINEITEM_ROWS_SF1;
    let generator = tpchgen::generators::LineItemGenerator::new(
        scale_factor,
        i32::try_from(part + 1)?,
        i32::try_from(parts)?,
    );
    let schema = Kind::Lineitem.schema();
    let file = File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let props = writer_properties(Kind::Lineitem, rg_rows)?;
    let mut writer = ArrowWriter::try_new(file, Arc::clone(&schema), Some(props))?;
    let mut rows = 0;
    for batch in tpchgen_arrow::LineItemArrow::new(generator).with_batch_size(8192) {
        let columns = batch
            .columns()
            .iter()
            .zip(schema.fields())
            .map(|(c, f)| arrow::compute::cast(c, f.data_type()))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        writer.write(&RecordBatch::try_new(Arc::clone(&schema), columns)?)?;
        rows += batch.num_rows();
        bar(batch.num_rows() as u64);
    }
    writer.close()?;
    Ok(rows)
}

fn write_file(
    options: &GenOptions,
    path: &Path,
    rows: std::ops::Range<usize>,
    rg_rows: usize,
    bar: &(dyn Fn(u64) + Send + Sync),
) -> Result<()> {
    let schema = options.kind.schema();
    let props = writer_properties(options.kind, rg_rows)?;
    let file = File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut writer = ArrowWriter::try_new(file, Arc::clone(&schema), Some(props))?;
    let mut start = rows.start;
    while start < rows.end {
        let end = (start + rg_rows).min(rows.end);
        let batch = batch(options.kind, &schema, options.seed, start..end, options.rows)?;
        writer.write(&batch)?;
        writer.flush()?;
        bar((end - start) as u64);
        start = end;
    }
    writer.close()?;
    Ok(())
}

/// The rows `ids` of a dataset of `total_rows` rows, as one batch.
pub fn batch(
    kind: Kind,
    schema: &SchemaRef,
    seed: u64,
    ids: std::ops::Range<usize>,
    total_rows: usize,
) -> Result<RecordBatch> {
    let columns = match kind {
        Kind::Images => images(seed, ids)?,
        Kind::Clicks => clicks(seed, ids, total_rows),
        Kind::Text => text(seed, ids),
        Kind::Speech => speech(seed, ids)?,
        Kind::Lineitem => anyhow::bail!("lineitem is generated by TPC-H parts, not by row ids"),
    };
    Ok(RecordBatch::try_new(Arc::clone(schema), columns)?)
}

/// The generator of one row: depends only on (seed, row).
fn row_rng(seed: u64, row: usize) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(row as u64);
    rng
}

const ADJECTIVES: [&str; 16] = [
    "red", "small", "fluffy", "old", "shiny", "wild", "sleepy", "striped", "tiny", "bright", "dark",
    "wooden", "smiling", "rusty", "golden", "blue",
];
const NOUNS: [&str; 16] = [
    "cat", "dog", "car", "tree", "house", "bird", "boat", "flower", "mountain", "bicycle", "lamp", "horse",
    "bridge", "cup", "robot", "kite",
];
const PLACES: [&str; 8] = [
    "on a beach",
    "in a field",
    "at night",
    "in the snow",
    "on a table",
    "in a city",
    "under a tree",
    "by a lake",
];

fn images(seed: u64, ids: std::ops::Range<usize>) -> Result<Vec<ArrayRef>> {
    let n = ids.len();
    let mut id = Int64Builder::with_capacity(n);
    let mut image = BinaryBuilder::with_capacity(n, n * 16 * 1024);
    let mut label = Int32Builder::with_capacity(n);
    let mut caption = StringBuilder::new();
    let mut width = Int32Builder::with_capacity(n);
    let mut height = Int32Builder::with_capacity(n);
    let mut split = StringBuilder::new();
    for row in ids {
        let mut rng = row_rng(seed, row);
        // Mostly 192–320 px sides; a few outliers, as real photo sets have.
        let (w, h) = if rng.random_bool(0.05) {
            (rng.random_range(64..640), rng.random_range(64..640))
        } else {
            (rng.random_range(192..=320), rng.random_range(192..=320))
        };
        id.append_value(row as i64);
        image.append_value(jpeg(&mut rng, w, h)?);
        label.append_value(rng.random_range(0..1000));
        caption.append_value(format!(
            "a photo of a {} {} {}",
            ADJECTIVES[rng.random_range(0..ADJECTIVES.len())],
            NOUNS[rng.random_range(0..NOUNS.len())],
            PLACES[rng.random_range(0..PLACES.len())]
        ));
        width.append_value(w as i32);
        height.append_value(h as i32);
        split.append_value(if rng.random_bool(0.9) { "train" } else { "val" });
    }
    Ok(vec![
        Arc::new(id.finish()),
        Arc::new(image.finish()),
        Arc::new(label.finish()),
        Arc::new(caption.finish()),
        Arc::new(width.finish()),
        Arc::new(height.finish()),
        Arc::new(split.finish()),
    ])
}

/// A photo-like picture: a two-colour gradient, a few soft shapes, sensor-like noise.
fn jpeg(rng: &mut ChaCha8Rng, w: u32, h: u32) -> Result<Vec<u8>> {
    let c0: [f32; 3] = [rng.random(), rng.random(), rng.random()];
    let c1: [f32; 3] = [rng.random(), rng.random(), rng.random()];
    let shapes: Vec<(f32, f32, f32, [f32; 3])> = (0..rng.random_range(2..6))
        .map(|_| {
            (
                rng.random_range(0.0..w as f32),
                rng.random_range(0.0..h as f32),
                rng.random_range(10.0..(w.min(h) as f32 / 2.0)),
                [rng.random(), rng.random(), rng.random()],
            )
        })
        .collect();
    let mut pixels = image::RgbImage::new(w, h);
    for (x, y, px) in pixels.enumerate_pixels_mut() {
        let t = (x as f32 / w as f32 + y as f32 / h as f32) / 2.0;
        let mut c = [0f32; 3];
        for k in 0..3 {
            c[k] = c0[k] * (1.0 - t) + c1[k] * t;
        }
        for (sx, sy, r, sc) in &shapes {
            let d = ((x as f32 - sx).powi(2) + (y as f32 - sy).powi(2)).sqrt();
            if d < *r {
                let a = 1.0 - (d / r).powi(4);
                for k in 0..3 {
                    c[k] = c[k] * (1.0 - a) + sc[k] * a;
                }
            }
        }
        let noise: f32 = rng.random_range(-0.04..0.04);
        *px = image::Rgb(c.map(|v| ((v + noise).clamp(0.0, 1.0) * 255.0) as u8));
    }
    let mut out = Cursor::new(Vec::with_capacity((w * h) as usize / 4));
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, 85).encode_image(&pixels)?;
    Ok(out.into_inner())
}

fn clicks(seed: u64, ids: std::ops::Range<usize>, total: usize) -> Vec<ArrayRef> {
    let n = ids.len();
    let mut label = Int32Builder::with_capacity(n);
    let mut ints: Vec<Int32Builder> = (0..13).map(|_| Int32Builder::with_capacity(n)).collect();
    let mut cats: Vec<StringBuilder> = (0..26).map(|_| StringBuilder::new()).collect();
    let mut day = Int32Builder::with_capacity(n);
    for row in ids {
        let mut rng = row_rng(seed, row);
        label.append_value(i32::from(rng.random_bool(0.25)));
        for (i, b) in ints.iter_mut().enumerate() {
            if rng.random_bool(0.1) {
                b.append_null();
            } else {
                // Counts: heavy-tailed, as Criteo's integer features.
                let scale = 1 << (i % 10);
                b.append_value((rng.random::<f32>().powi(3) * scale as f32 * 100.0) as i32);
            }
        }
        for (i, b) in cats.iter_mut().enumerate() {
            if rng.random_bool(0.05) {
                b.append_null();
            } else {
                // Skewed vocabularies of 10..100k values per column.
                let vocab = [10u32, 100, 1000, 10_000, 100_000][i % 5];
                let v = (rng.random::<f32>().powi(4) * vocab as f32) as u32;
                b.append_value(format!(
                    "{:08x}",
                    v.wrapping_mul(2_654_435_761) ^ (i as u32) << 24
                ));
            }
        }
        // Rows are in time order (24 days): row groups cover few days, so `day = d` prunes.
        day.append_value((row as u64 * 24 / total.max(1) as u64).min(23) as i32);
    }
    let mut columns: Vec<ArrayRef> = vec![Arc::new(label.finish())];
    columns.extend(ints.iter_mut().map(|b| Arc::new(b.finish()) as ArrayRef));
    columns.extend(cats.iter_mut().map(|b| Arc::new(b.finish()) as ArrayRef));
    columns.push(Arc::new(day.finish()));
    columns
}

const LANGS: [(&str, f64); 6] = [
    ("en", 0.55),
    ("de", 0.12),
    ("fr", 0.1),
    ("es", 0.1),
    ("zh", 0.08),
    ("ja", 0.05),
];
/// Syllables of the text dataset's pseudo-words: enough that a BPE tokenizer has sub-words
/// to learn, like natural language.
const SYLLABLES: [&str; 40] = [
    "ka", "to", "ri", "men", "sa", "lo", "ver", "in", "da", "ne", "qu", "ar", "tion", "el", "po", "mi", "st",
    "or", "ge", "la", "ch", "un", "be", "ro", "se", "al", "th", "is", "an", "re", "de", "es", "on", "ti",
    "ma", "ou", "wa", "ke", "ly", "ing",
];

/// Words in the text dataset's vocabulary; word `k` is drawn with probability ∝ 1/(k+1).
const VOCABULARY: usize = 20_000;

/// Word `k`: one to four syllables, a pure function of `k`.
fn word(k: usize, out: &mut String) {
    let mut x = (k as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x5851_F42D_4C95_7F2D;
    let n = 1 + ((k + 1).ilog2().min(9) as usize + (x % 3) as usize) / 3;
    for _ in 0..n {
        out.push_str(SYLLABLES[(x % SYLLABLES.len() as u64) as usize]);
        x = x.rotate_left(17).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    }
}

/// A Zipf(1) draw over `VOCABULARY` words by inverting the harmonic CDF's approximation.
fn zipf_word(u: f64) -> usize {
    let h = (VOCABULARY as f64).ln() + 0.577_215_664_9;
    (((u * h - 0.577_215_664_9).exp()) as usize).min(VOCABULARY - 1)
}

/// Documents per tokenizer training run: enough for every frequent word, quick to train.
const TOKENIZER_SAMPLE_ROWS: usize = 400;

/// Trains the text dataset's tokenizer on its first rows and writes `tokenizer.json` beside
/// the files: the tokenizer ships with the data, so nothing is downloaded at run time.
fn write_tokenizer(seed: u64, rows: usize, dir: &Path) -> Result<()> {
    let sample = text(seed, 0..rows.clamp(1, TOKENIZER_SAMPLE_ROWS));
    let bodies = sample[3]
        .as_any()
        .downcast_ref::<arrow::array::StringArray>()
        .context("text bodies")?;
    let json = pushdown_ops::train_tokenizer(bodies.iter().flatten(), 4096).map_err(anyhow::Error::msg)?;
    std::fs::write(dir.join(pushdown_ops::TOKENIZER_FILE), json)?;
    Ok(())
}

fn text(seed: u64, ids: std::ops::Range<usize>) -> Vec<ArrayRef> {
    let n = ids.len();
    let mut id = Int64Builder::with_capacity(n);
    let mut lang = StringBuilder::new();
    let mut quality = Float32Builder::with_capacity(n);
    let mut body = StringBuilder::new();
    for row in ids {
        let mut rng = row_rng(seed, row);
        id.append_value(row as i64);
        let mut p: f64 = rng.random();
        let mut chosen = LANGS[0].0;
        for (l, w) in LANGS {
            if p < w {
                chosen = l;
                break;
            }
            p -= w;
        }
        lang.append_value(chosen);
        quality.append_value(rng.random::<f32>().sqrt());
        // Document lengths are long-tailed, like web text: most are a few hundred words.
        let words = (100.0 / (1.0 - rng.random::<f64>() * 0.97)).min(3000.0) as usize;
        let mut s = String::with_capacity(words * 8);
        for w in 0..words {
            if w > 0 {
                s.push_str(if rng.random_bool(0.07) { ". " } else { " " });
            }
            word(zipf_word(rng.random()), &mut s);
        }
        s.push('.');
        body.append_value(s);
    }
    vec![
        Arc::new(id.finish()),
        Arc::new(lang.finish()),
        Arc::new(quality.finish()),
        Arc::new(body.finish()),
    ]
}

/// Sample rates of the speech clips, as speech corpora mix them (most at 16 kHz).
const RATES: [u32; 8] = [16_000, 16_000, 16_000, 8_000, 22_050, 44_100, 48_000, 24_000];

fn speech(seed: u64, ids: std::ops::Range<usize>) -> Result<Vec<ArrayRef>> {
    let n = ids.len();
    let mut id = Int64Builder::with_capacity(n);
    let mut bytes = BinaryBuilder::new();
    let mut path = StringBuilder::new();
    let mut speaker = Int32Builder::with_capacity(n);
    let mut text = StringBuilder::new();
    for row in ids {
        let mut rng = row_rng(seed, row);
        id.append_value(row as i64);
        bytes.append_value(voice_wav(&mut rng)?);
        path.append_value(format!("clip-{row:06}.wav"));
        speaker.append_value(rng.random_range(0..100));
        let mut s = String::new();
        for w in 0..rng.random_range(3..30) {
            if w > 0 {
                s.push(' ');
            }
            word(zipf_word(rng.random()), &mut s);
        }
        text.append_value(s);
    }
    let DataType::Struct(fields) = audio_type() else {
        unreachable!("the audio column is a struct")
    };
    let audio = StructArray::try_new(
        fields,
        vec![Arc::new(bytes.finish()), Arc::new(path.finish())],
        None,
    )?;
    Ok(vec![
        Arc::new(id.finish()),
        Arc::new(audio),
        Arc::new(speaker.finish()),
        Arc::new(text.finish()),
    ])
}

/// A voice-like clip as a WAV file (`hound`): a gliding fundamental with up to 12 harmonics below
/// 4 kHz, syllable-rate loudness, breath noise and pauses; 0.5–10 s (most short), at one of
/// [`RATES`], mono or (one in five) stereo, 16-bit PCM or (one in eight) 32-bit float.
fn voice_wav(rng: &mut ChaCha8Rng) -> Result<Vec<u8>> {
    let rate = RATES[rng.random_range(0..RATES.len())];
    let channels: u16 = if rng.random_bool(0.2) { 2 } else { 1 };
    let float = rng.random_bool(0.125);
    let seconds = 0.5 + 9.5 * rng.random::<f64>().powi(2);
    let frames = (seconds * f64::from(rate)) as usize;
    let f0 = rng.random_range(90.0..250.0);
    let glide = rng.random_range(-0.3..0.3);
    let syllables = rng.random_range(2.5..6.0);
    let harmonics = (((4000.0f64.min(f64::from(rate) / 2.0 - 200.0)) / f0) as usize).min(12);
    let spec = hound::WavSpec {
        channels,
        sample_rate: rate,
        bits_per_sample: if float { 32 } else { 16 },
        sample_format: if float {
            hound::SampleFormat::Float
        } else {
            hound::SampleFormat::Int
        },
    };
    let mut out = Cursor::new(Vec::with_capacity(frames * usize::from(channels) * 4 + 64));
    let mut writer = hound::WavWriter::new(&mut out, spec)?;
    let mut phase = 0.0f64;
    for i in 0..frames {
        let t = i as f64 / f64::from(rate);
        let f = f0 * (1.0 + glide * t / seconds);
        phase += std::f64::consts::TAU * f / f64::from(rate);
        let envelope = (std::f64::consts::PI * syllables * t).sin().abs().powf(0.7);
        let mut voice = 0.0;
        for h in 1..=harmonics.max(1) {
            voice += (phase * h as f64).sin() / h as f64;
        }
        let breath: f64 = rng.random_range(-0.02..0.02);
        let sample = (0.3 * envelope * voice + breath).clamp(-1.0, 1.0);
        for c in 0..channels {
            let s = if c == 0 { sample } else { 0.8 * sample };
            if float {
                writer.write_sample(s as f32)?;
            } else {
                writer.write_sample((s * 32767.0) as i16)?;
            }
        }
    }
    writer.finalize()?;
    Ok(out.into_inner())
}
