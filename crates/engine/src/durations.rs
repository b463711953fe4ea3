//! Durations of audio and video clips read from their ends, so a scan filtered on
//! `audio_seconds(column)`, `video_seconds(column)` or `video_info(column)['seconds']`
//! fetches only the clips it keeps.
//!
//! A clip's duration is in its container's first bytes (WAV's data size, FLAC's STREAMINFO,
//! MP3's Xing/Info frame, Matroska's segment info, a `+faststart` MP4's `moov`) or last
//! (Ogg's final granule position, the `moov` FFmpeg writes after an MP4's media). Where a
//! column chunk holds one clip per page, uncompressed and without a dictionary (the layout
//! `pushdown gen speech` writes, and the one that lets a reader skip a clip's page), the
//! index reads the first [`HEAD`] and last [`TAIL`] bytes of each page (a page no longer
//! than both: whole), finds the clip in the page (the parquet crate's page reader parses the
//! header) and asks [`pushdown_ops::audio_seconds_from_ends`] or
//! [`pushdown_ops::video_seconds_from_ends`]; a clip whose container needs more is read
//! whole. Durations are kept per (kind, file version, column, row group): a row group's
//! clips are read for their durations at most once per server, and a later scan (the next
//! epoch, another bound) reads nothing of a clip it drops.
//!
//! The index only ever narrows what a scan reads: rows are skipped when their duration is
//! outside the filter's bounds by more than [`MARGIN`], and the filter itself still runs on
//! every row read. A clip the index cannot read (another layout, a damaged or unknown
//! container, a failed read) is kept, so the filter judges it and a damaged clip is still
//! the row's error. Other layouts (compressed clips, several per page, no offset index) are
//! not indexed: their scans read every clip, as before.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use arrow::datatypes::DataType;
use bytes::Bytes;
use datafusion::common::ScalarValue;
use datafusion::logical_expr::utils::split_conjunction;
use datafusion::logical_expr::{Between, BinaryExpr, Expr, Operator};
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt, TryStreamExt};
use object_store::{ObjectStore, ObjectStoreExt};
use parking_lot::Mutex;
use parquet::arrow::async_reader::MetadataFetch;
use parquet::basic::{Compression, Encoding, Type as PhysicalType};
use parquet::column::page::{Page, PageReader};
use parquet::file::metadata::{PageIndexPolicy, ParquetMetaData, ParquetMetaDataReader};
use parquet::file::page_index::offset_index::PageLocation;
use parquet::file::reader::{ChunkReader, Length};
use parquet::file::serialized_reader::SerializedPageReader;
use pushdown_protocol::FileVersion;
use tokio::sync::OnceCell;

use crate::catalog::DataFile;

/// Bytes read from the start of each clip's page: the page header, the value's length, and
/// the container's header (ffmpeg's FLAC puts 8 KiB of padding before the first frame).
pub const HEAD: u64 = 16 << 10;
/// Bytes read from the end of each clip's page: Ogg's last page, with its granule position.
pub const TAIL: u64 = 16 << 10;
/// Seconds by which a duration must fall outside a filter's bounds for its row to be skipped.
pub const MARGIN: f64 = 1e-6;
/// Row groups' durations kept; past it the index starts over (a few bytes per row each).
const MAX_GROUPS: usize = 1 << 16;
/// Ranges fetched at once.
const FETCHES: usize = 16;

/// The kind of clips a duration is read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Clip {
    Audio,
    Video,
}

impl Clip {
    /// The clip's duration from its ends, as the kind's op reads it from the whole clip.
    fn seconds_from_ends(self, head: &[u8], tail: &[u8], len: u64) -> Option<f64> {
        match self {
            Clip::Audio => pushdown_ops::audio_seconds_from_ends(head, tail, len),
            Clip::Video => pushdown_ops::video_seconds_from_ends(head, tail, len),
        }
    }
}

/// What a scan's filters say of a column's clips' durations (`audio_seconds(column)`, …):
/// within `low..=high`.
#[derive(Debug, Clone, PartialEq)]
pub struct Bounds {
    pub clip: Clip,
    pub column: String,
    pub low: f64,
    pub high: f64,
}

impl Bounds {
    /// Whether a clip of `seconds` may pass the filter (certainly outside: false).
    pub fn admits(&self, seconds: f64) -> bool {
        seconds >= self.low - MARGIN && seconds <= self.high + MARGIN
    }
}

/// The bounds the conjuncts of `filters` put on the durations of a column's clips, one per
/// column and kind (comparisons with number literals, `BETWEEN`; several on one column
/// intersect).
pub fn duration_bounds(filters: &[Expr]) -> Vec<Bounds> {
    let mut out: Vec<Bounds> = Vec::new();
    for conjunct in filters.iter().flat_map(split_conjunction) {
        let Some(((clip, column), low, high)) = bound_of(conjunct) else {
            continue;
        };
        match out.iter_mut().find(|b| b.column == column && b.clip == clip) {
            Some(b) => {
                b.low = b.low.max(low);
                b.high = b.high.min(high);
            }
            None => out.push(Bounds {
                clip,
                column,
                low,
                high,
            }),
        }
    }
    out
}

fn bound_of(e: &Expr) -> Option<((Clip, String), f64, f64)> {
    match e {
        Expr::Between(Between {
            expr,
            negated: false,
            low,
            high,
        }) => Some((seconds_of(expr)?, number(low)?, number(high)?)),
        Expr::BinaryExpr(BinaryExpr { left, op, right }) => {
            let (column, op, v) = match (seconds_of(left), number(right)) {
                (Some(c), Some(v)) => (c, *op, v),
                _ => (seconds_of(right)?, op.swap()?, number(left)?),
            };
            match op {
                Operator::Gt | Operator::GtEq => Some((column, v, f64::INFINITY)),
                Operator::Lt | Operator::LtEq => Some((column, f64::NEG_INFINITY, v)),
                Operator::Eq => Some((column, v, v)),
                _ => None,
            }
        }
        _ => None,
    }
}

/// The clips' column `e` reads the duration of, when `e` is `audio_seconds(column)`,
/// `video_seconds(column)` or `video_info(column)['seconds']`.
fn seconds_of(e: &Expr) -> Option<(Clip, String)> {
    let Expr::ScalarFunction(f) = e else {
        return None;
    };
    let clip = match (f.func.name(), f.args.as_slice()) {
        ("audio_seconds", [_]) => Clip::Audio,
        ("video_seconds", [_]) => Clip::Video,
        ("get_field", [info, Expr::Literal(ScalarValue::Utf8(Some(field)), _)]) if field == "seconds" => {
            return match info {
                Expr::ScalarFunction(g) if g.func.name() == "video_info" => match g.args.as_slice() {
                    [Expr::Column(c)] => Some((Clip::Video, c.name.clone())),
                    _ => None,
                },
                _ => None,
            };
        }
        _ => return None,
    };
    match f.args.as_slice() {
        [Expr::Column(c)] => Some((clip, c.name.clone())),
        _ => None,
    }
}

fn number(e: &Expr) -> Option<f64> {
    match e {
        Expr::Literal(v, _) => match v.cast_to(&DataType::Float64).ok()? {
            ScalarValue::Float64(Some(x)) if !x.is_nan() => Some(x),
            _ => None,
        },
        Expr::Cast(c) => number(&c.expr),
        _ => None,
    }
}

type Durations = Option<Arc<[Option<f64>]>>;
/// A footer with its offset index.
type Indexed = Arc<ParquetMetaData>;
/// Values computed once per key, by whichever scan asks first.
type Cells<K, V> = Mutex<HashMap<K, Arc<OnceCell<V>>>>;

/// A row group's column, in a version of a file.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct GroupKey {
    clip: Clip,
    location: String,
    version: FileVersion,
    leaf: usize,
    row_group: usize,
}

/// The durations of clips read so far, shared by a server's scans.
#[derive(Debug, Default)]
pub struct DurationIndex {
    groups: Cells<GroupKey, Durations>,
    /// Files' footers with their offset indexes (where each page is).
    pages: Cells<(String, FileVersion), Indexed>,
}

impl DurationIndex {
    /// Which rows of the row groups `row_groups` of `file` may pass `bounds`: per row group
    /// cut, a mask over its rows (a row group absent keeps every row).
    pub async fn keep(
        &self,
        store: &Arc<dyn ObjectStore>,
        file: &DataFile,
        bounds: &[Bounds],
        row_groups: Range<u32>,
    ) -> HashMap<usize, Vec<bool>> {
        let mut masks = HashMap::new();
        for b in bounds {
            let Some(leaf) = clip_leaf(&file.metadata, &b.column) else {
                continue;
            };
            for rg in row_groups.clone() {
                let rg = rg as usize;
                let Some(durations) = self.durations(store, file, (b.clip, leaf), rg).await else {
                    continue;
                };
                let mask = masks.entry(rg).or_insert_with(|| vec![true; durations.len()]);
                for (keep, d) in mask.iter_mut().zip(durations.iter()) {
                    *keep &= d.is_none_or(|d| b.admits(d));
                }
            }
        }
        masks.retain(|_, m: &mut Vec<bool>| m.iter().any(|k| !k));
        masks
    }

    /// The durations of the clips of `leaf` in row group `rg` of `file`, read once.
    async fn durations(
        &self,
        store: &Arc<dyn ObjectStore>,
        file: &DataFile,
        (clip, leaf): (Clip, usize),
        rg: usize,
    ) -> Durations {
        let key = GroupKey {
            clip,
            location: file.meta.location.to_string(),
            version: file.version.clone(),
            leaf,
            row_group: rg,
        };
        let cell = {
            let mut groups = self.groups.lock();
            if groups.len() >= MAX_GROUPS {
                groups.clear();
            }
            Arc::clone(groups.entry(key.clone()).or_default())
        };
        let found = cell
            .get_or_try_init(|| async {
                match self.read_group(store, file, (clip, leaf), rg).await {
                    Ok(d) => Ok(d.map(Arc::from)),
                    Err(e) => Err(e),
                }
            })
            .await;
        match found {
            Ok(d) => d.clone(),
            Err(e) => {
                // Not kept: a read that failed may succeed on the next scan.
                tracing::debug!(file = %key.location, row_group = rg, "clip durations not read: {e}");
                self.groups.lock().remove(&key);
                None
            }
        }
    }

    /// The clips' durations from their pages' ends (`None`: not this layout).
    async fn read_group(
        &self,
        store: &Arc<dyn ObjectStore>,
        file: &DataFile,
        (clip_kind, leaf): (Clip, usize),
        rg: usize,
    ) -> Result<Option<Vec<Option<f64>>>, String> {
        let chunk = file.metadata.row_group(rg).column(leaf);
        let descr = chunk.column_descr();
        if chunk.compression() != Compression::UNCOMPRESSED
            || chunk.dictionary_page_offset().is_some()
            || descr.max_rep_level() > 0
            || chunk.offset_index_offset().is_none()
        {
            return Ok(None);
        }
        let indexed = self.offset_index(store, file).await?;
        let Some(pages) = indexed
            .offset_index()
            .and_then(|o| o.get(rg))
            .and_then(|o| o.get(leaf))
            .map(|o| o.page_locations().clone())
        else {
            return Ok(None);
        };
        let rows = file.row_group_rows(rg) as usize;
        if !one_clip_per_page(&pages, rows, file.meta.size) {
            return Ok(None);
        }
        let path = &file.meta.location;
        let fetched = fetch(store, path, pages.iter().flat_map(ends)).await?;
        let ends = Arc::new(Sparse {
            pieces: fetched,
            len: file.meta.size,
        });
        let mut reader = SerializedPageReader::new(Arc::clone(&ends), chunk, rows, Some(pages.clone()))
            .map_err(|e| e.to_string())?;
        let max_def = descr.max_def_level();
        let mut out = Vec::with_capacity(rows);
        let mut whole = Vec::new();
        for (row, location) in pages.iter().enumerate() {
            let page = reader
                .get_next_page()
                .map_err(|e| e.to_string())?
                .ok_or("fewer pages than the offset index lists")?;
            let page_end = location.offset as u64 + location.compressed_page_size as u64;
            let Some(clip) = clip_in(&page, max_def) else {
                return Ok(None);
            };
            let Some(clip) = clip else {
                out.push(None); // a null clip: the filter drops it anyway
                continue;
            };
            // The value runs to the page's end.
            let start = page_end - clip.len() as u64;
            let head = ends.read(start..page_end.min(location.offset as u64 + HEAD));
            let tail = ends.read(start.max(page_end.saturating_sub(TAIL))..page_end);
            let seconds = clip_kind.seconds_from_ends(head, tail, clip.len() as u64);
            if seconds.is_none() && head.len() < clip.len() {
                whole.push((row, start..page_end));
            }
            out.push(seconds);
        }
        let rows_whole: Vec<usize> = whole.iter().map(|(row, _)| *row).collect();
        let clips = fetch(store, path, whole.into_iter().map(|(_, r)| r)).await?;
        for (row, (_, clip)) in rows_whole.into_iter().zip(clips) {
            out[row] = clip_kind.seconds_from_ends(&clip, &[], clip.len() as u64);
        }
        Ok(Some(out))
    }

    /// `file`'s footer with its offset index, read once per file version.
    async fn offset_index(
        &self,
        store: &Arc<dyn ObjectStore>,
        file: &DataFile,
    ) -> Result<Arc<ParquetMetaData>, String> {
        let key = (file.meta.location.to_string(), file.version.clone());
        let cell = Arc::clone(self.pages.lock().entry(key).or_default());
        cell.get_or_try_init(|| async {
            let reader = Fetch {
                store,
                path: &file.meta.location,
            };
            let mut footer = ParquetMetaDataReader::new_with_metadata(file.metadata.as_ref().clone())
                .with_column_index_policy(PageIndexPolicy::Skip)
                .with_offset_index_policy(PageIndexPolicy::Required);
            footer.load_page_index(reader).await.map_err(|e| e.to_string())?;
            footer.finish().map(Arc::new).map_err(|e| e.to_string())
        })
        .await
        .cloned()
    }
}

/// Ranges of one object, as the footer reader asks for them.
struct Fetch<'a> {
    store: &'a Arc<dyn ObjectStore>,
    path: &'a object_store::path::Path,
}

impl MetadataFetch for Fetch<'_> {
    fn fetch(&mut self, range: Range<u64>) -> BoxFuture<'_, parquet::errors::Result<Bytes>> {
        let (store, path) = (self.store, self.path);
        async move {
            store
                .get_range(path, range)
                .await
                .map_err(|e| parquet::errors::ParquetError::External(Box::new(e)))
        }
        .boxed()
    }
}

/// The leaf holding `column`'s clips: the column itself (binary) or its `bytes` field (the
/// Hub's `struct<bytes, path>`).
fn clip_leaf(metadata: &ParquetMetaData, column: &str) -> Option<usize> {
    let schema = metadata.file_metadata().schema_descr();
    (0..schema.num_columns()).find(|&i| {
        let c = schema.column(i);
        let parts = c.path().parts();
        c.physical_type() == PhysicalType::BYTE_ARRAY
            && (parts == [column] || (parts.len() == 2 && parts[0] == column && parts[1] == "bytes"))
    })
}

/// Whether `pages` hold one row each, `rows` in all, every page inside a file of `size`
/// bytes (the offset index is outside input).
fn one_clip_per_page(pages: &[PageLocation], rows: usize, size: u64) -> bool {
    let within = |p: &PageLocation| {
        u64::try_from(p.offset)
            .ok()
            .and_then(|o| o.checked_add(u64::try_from(p.compressed_page_size).ok()?))
            .is_some_and(|end| end <= size)
    };
    pages.len() == rows
        && pages
            .iter()
            .enumerate()
            .all(|(i, p)| p.first_row_index == i as i64 && p.compressed_page_size > 0 && within(p))
}

/// The ranges of a page to read: its head and tail, or all of it when they would overlap.
fn ends(page: &PageLocation) -> Vec<Range<u64>> {
    let (start, len) = (page.offset as u64, page.compressed_page_size as u64);
    if len <= HEAD + TAIL {
        std::iter::once(start..start + len).collect()
    } else {
        vec![start..start + HEAD, start + len - TAIL..start + len]
    }
}

async fn fetch(
    store: &Arc<dyn ObjectStore>,
    path: &object_store::path::Path,
    ranges: impl IntoIterator<Item = Range<u64>>,
) -> Result<Vec<(u64, Bytes)>, String> {
    // One request per range: the store's `get_ranges` would merge ranges up to 1 MiB apart,
    // reading the clips in between.
    futures::stream::iter(ranges)
        .map(|r| async move { store.get_range(path, r.clone()).await.map(|b| (r.start, b)) })
        .buffered(FETCHES)
        .try_collect()
        .await
        .map_err(|e| e.to_string())
}

/// The clip of a one-value page: `Some(None)` for a null, `None` when the page is not one
/// PLAIN value (the index then leaves the row group alone).
fn clip_in(page: &Page, max_def: i16) -> Option<Option<Bytes>> {
    let (buf, levels) = match page {
        Page::DataPage {
            buf,
            num_values: 1,
            encoding: Encoding::PLAIN,
            def_level_encoding,
            ..
        } => {
            let levels = if max_def > 0 {
                if *def_level_encoding != Encoding::RLE {
                    return None;
                }
                4 + u32::from_le_bytes(buf.get(..4)?.try_into().ok()?) as usize
            } else {
                0
            };
            (buf, levels)
        }
        Page::DataPageV2 {
            buf,
            num_values: 1,
            encoding: Encoding::PLAIN,
            def_levels_byte_len,
            rep_levels_byte_len,
            is_compressed: false,
            ..
        } => (buf, (*def_levels_byte_len + *rep_levels_byte_len) as usize),
        _ => return None,
    };
    let values = buf.get(levels..)?;
    if values.is_empty() {
        return Some(None);
    }
    let len = u32::from_le_bytes(values.get(..4)?.try_into().ok()?) as usize;
    (values.len() == 4 + len).then(|| Some(buf.slice(buf.len() - len..)))
}

/// Pieces of a file read by range, as the page reader reads files: bytes not read are zeros
/// (they are never handed to a container reader: only the pieces are).
#[derive(Debug)]
struct Sparse {
    pieces: Vec<(u64, Bytes)>,
    len: u64,
}

impl Sparse {
    /// The bytes at `range`, which lies within one piece (else: none).
    fn read(&self, range: Range<u64>) -> &[u8] {
        self.pieces
            .iter()
            .find(|(start, b)| *start <= range.start && range.end <= start + b.len() as u64)
            .map_or(&[], |(start, b)| {
                &b[(range.start - start) as usize..(range.end - start) as usize]
            })
    }
}

impl Length for Sparse {
    fn len(&self) -> u64 {
        self.len
    }
}

impl ChunkReader for Sparse {
    type T = std::io::Cursor<Bytes>;

    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        let rest = self.len.saturating_sub(start);
        Ok(std::io::Cursor::new(self.get_bytes(start, rest as usize)?))
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        let mut out = vec![0u8; length];
        let end = start + length as u64;
        for (at, piece) in &self.pieces {
            let piece_end = at + piece.len() as u64;
            let (from, to) = ((*at).max(start), piece_end.min(end));
            if from < to {
                out[(from - start) as usize..(to - start) as usize]
                    .copy_from_slice(&piece[(from - at) as usize..(to - at) as usize]);
            }
        }
        Ok(Bytes::from(out))
    }
}

#[cfg(test)]
mod tests {
    use datafusion::prelude::{col, lit};

    use super::*;

    /// A stand-in for the op `name` on `column`: the bounds are read from names, not kernels.
    fn op(name: &str, column: &str) -> Expr {
        let udf = datafusion::logical_expr::create_udf(
            name,
            vec![DataType::Binary],
            DataType::Float64,
            datafusion::logical_expr::Volatility::Immutable,
            Arc::new(|_| unreachable!("never evaluated")),
        );
        udf.call(vec![col(column)])
    }

    fn seconds(column: &str) -> Expr {
        op("audio_seconds", column)
    }

    #[test]
    fn video_durations_are_bounded_by_either_op() {
        use datafusion::functions::core::expr_fn::get_field;
        let filters = [
            op("video_seconds", "video").gt(lit(2)),
            get_field(op("video_info", "video"), "seconds").lt_eq(lit(8.5)),
            get_field(op("video_info", "video"), "fps").gt(lit(100)),
            get_field(op("video_info", "other"), "seconds").gt(lit(1)),
            op("video_seconds", "video").lt(op("video_seconds", "other")),
        ];
        let bounds = duration_bounds(&filters);
        let video = |column: &str, low, high| Bounds {
            clip: Clip::Video,
            column: column.into(),
            low,
            high,
        };
        assert_eq!(
            bounds,
            [video("video", 2.0, 8.5), video("other", 1.0, f64::INFINITY)]
        );
        // One column's audio and video durations are bounded apart.
        let both = duration_bounds(&[seconds("clip").gt(lit(1)), op("video_seconds", "clip").lt(lit(3))]);
        assert_eq!(both.len(), 2, "{both:?}");
    }

    #[test]
    fn bounds_come_from_comparisons_and_between() {
        let filters = [
            seconds("audio").between(lit(1.0), lit(20)),
            seconds("audio").gt(lit(2)).and(lit(3.5).gt_eq(seconds("audio"))),
            seconds("other").eq(lit(4.0)),
            col("label").lt(lit(3)),
            seconds("audio").not_between(lit(0), lit(1)),
        ];
        let bounds = duration_bounds(&filters);
        assert_eq!(
            bounds,
            [
                Bounds {
                    clip: Clip::Audio,
                    column: "audio".into(),
                    low: 2.0,
                    high: 3.5
                },
                Bounds {
                    clip: Clip::Audio,
                    column: "other".into(),
                    low: 4.0,
                    high: 4.0
                }
            ]
        );
        assert!(bounds[0].admits(2.0) && bounds[0].admits(3.5) && !bounds[0].admits(3.6));
        assert!(duration_bounds(&[seconds("audio").not_eq(lit(3))]).is_empty());
    }
}
