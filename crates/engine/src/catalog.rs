//! The catalog: which datasets a server offers, their schemas, files and row groups.
//!
//! Every sub-folder of the storage root that holds Parquet files is a dataset named after
//! the folder, as the folder spells it: `cifar-10` and `MyPets` are datasets (see
//! [`is_dataset_name`]; SQL quotes such names, `"cifar-10"`, pipelines give them as they are).
//! SQL folds unquoted names to lower case, so a name that matches no dataset exactly finds
//! the one dataset equal to it ignoring case ([`lookup`]). Folders whose names cannot be
//! dataset names are skipped with a warning at every listing. Files are every `*.parquet` object under the folder (recursively,
//! sorted by path, hidden `.`/`_` names skipped). Footers (with page indexes) go through the
//! query engine's file-metadata cache, validated by size and modification time: refreshing
//! the catalog lists the store but reads only footers of new or changed files, and scans
//! reuse what the catalog read.
//!
//! The files' schemas are merged into the dataset's, and their paths give columns (hive
//! folders, the Hub's splits): see [`crate::layout`]. A file whose footer cannot be read, or
//! whose schema cannot join the others', is kept in [`Dataset::broken`]: requests over that
//! dataset fail with an error naming the file rather than silently skipping its rows, and
//! other datasets are unaffected.
//!
//! Any file may be damaged, so a footer is checked before it reaches the Parquet decoder and
//! after: the envelope (size, `PAR1` at both ends, a metadata length that fits in the file)
//! before decoding, the layout (every column chunk, index and bloom filter inside the file,
//! row counts that add up, a bounded schema depth) after. A panic of the decoder is contained
//! and becomes the file's reason. Each unreadable file version is read, logged and counted
//! once; it is read again only when its size, modification time or ETag change.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::datatypes::SchemaRef;
use datafusion::datasource::physical_plan::parquet::metadata::DFParquetMetadata;
use datafusion::execution::cache::cache_manager::FileMetadataCache;
use futures::{FutureExt, StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{ObjectMeta, ObjectStore, ObjectStoreExt};
use parking_lot::Mutex;
use parquet::file::metadata::ParquetMetaData;
use pushdown_protocol::FileVersion;
use xxhash_rust::xxh3::Xxh3;

use crate::error::{Result, ServerError};
use crate::metrics::Metrics;

/// The Parquet magic, at the start and the end of every file.
const MAGIC: &[u8; 4] = b"PAR1";
/// The magic of a file whose footer is encrypted.
const ENCRYPTED_MAGIC: &[u8; 4] = b"PARE";
/// Bytes read from the end of a file to get its footer and page index in one request,
/// small enough not to drag in pages of wide columns (the catalog's reads and every scan's).
pub const METADATA_SIZE_HINT: usize = 64 * 1024;
/// Metadata length and magic at the end of a file.
const FOOTER_LEN: u64 = 8;
/// Deepest schema nesting accepted (levels under the root). The depth is read from the
/// footer's bytes before the Parquet decoder builds the schema tree, which it does by
/// recursion: a deeper footer is its file's `DataLoss`, never a worker's stack overflow.
pub const MAX_SCHEMA_DEPTH: usize = 64;

/// One Parquet file of a dataset.
#[derive(Debug, Clone)]
pub struct DataFile {
    /// Path relative to the dataset folder: what tickets carry.
    pub path: String,
    /// The object as listed (location relative to the storage root).
    pub meta: ObjectMeta,
    pub metadata: Arc<ParquetMetaData>,
    /// What tickets name: size and footer hash (the same for copies on other servers).
    pub version: FileVersion,
    /// The file's values of the dataset's path columns ([`Dataset::partitions`]).
    pub partition: Vec<Option<String>>,
    /// The file's own schema differs from the dataset's (it lacks a column, or holds one in a
    /// narrower type): its statistics are not judged against the dataset's schema at planning.
    pub drifted: bool,
}

impl DataFile {
    pub fn num_row_groups(&self) -> usize {
        self.metadata.num_row_groups()
    }

    pub fn row_group_rows(&self, i: usize) -> u64 {
        self.metadata.row_group(i).num_rows().max(0) as u64
    }

    /// Compressed bytes of the row group's chunks of `columns` (all columns when `None`).
    pub fn row_group_bytes(&self, i: usize, columns: Option<&[usize]>) -> u64 {
        let rg = self.metadata.row_group(i);
        let size = |c: usize| {
            rg.columns()
                .get(c)
                .map_or(0, |c| c.compressed_size().max(0) as u64)
        };
        match columns {
            Some(cols) => cols.iter().map(|&c| size(c)).sum(),
            None => (0..rg.num_columns()).map(size).sum(),
        }
    }
}

/// A file that could not be used, and why.
#[derive(Debug, Clone)]
pub struct BrokenFile {
    pub path: String,
    pub reason: String,
    /// Readable, but its schema cannot join the other files' (see [`crate::layout`]): the
    /// dataset's configuration, not damage.
    pub incompatible: bool,
}

/// A named set of Parquet files read as one table.
#[derive(Debug)]
pub struct Dataset {
    pub name: String,
    /// The table's schema: the files' columns merged ([`Self::file_schema`]), then the
    /// columns their paths give ([`Self::partitions`]).
    pub schema: SchemaRef,
    /// The files' columns, merged (see `layout`): what each file is read as.
    pub file_schema: SchemaRef,
    /// The columns the files' paths give (hive `key=value/` folders, the Hub's splits).
    pub partitions: Vec<arrow::datatypes::FieldRef>,
    pub files: Vec<DataFile>,
    pub broken: Vec<BrokenFile>,
    /// The dataset's `tokenizer.json`, if it ships one (an error if it cannot be parsed).
    pub tokenizer: Option<std::result::Result<Arc<tokenizers::Tokenizer>, String>>,
}

impl Dataset {
    pub fn num_rows(&self) -> u64 {
        self.files
            .iter()
            .map(|f| f.metadata.file_metadata().num_rows().max(0) as u64)
            .sum()
    }

    pub fn num_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.meta.size).sum()
    }

    pub fn file(&self, path: &str) -> Option<&DataFile> {
        self.files.iter().find(|f| f.path == path)
    }

    /// The dataset's version: a hash of every file's path and version (and of the unreadable
    /// files' paths), so adding, removing or rewriting a file changes it.
    pub fn version(&self) -> String {
        let mut h = Xxh3::new();
        for f in &self.files {
            for part in [
                f.path.as_bytes(),
                &f.version.size.to_le_bytes(),
                f.version.hash.as_bytes(),
            ] {
                h.update(&(part.len() as u64).to_le_bytes());
                h.update(part);
            }
        }
        for b in &self.broken {
            h.update(b"broken");
            h.update(b.path.as_bytes());
        }
        format!("{:016x}", h.digest())
    }

    /// Fails when the dataset has unreadable files (answering without them would lose rows):
    /// a damaged file is the file's `CorruptFile`, an incompatible schema is `Misconfigured`.
    pub fn check_readable(&self) -> Result<()> {
        match self.broken.first() {
            None => Ok(()),
            Some(b) if b.incompatible => Err(ServerError::Misconfigured(format!(
                "dataset `{}`: file `{}` cannot be read with the dataset's other files: {} \
                 (rewrite it, or move it to a dataset of its own)",
                self.name, b.path, b.reason
            ))),
            Some(b) => Err(ServerError::CorruptFile {
                dataset: self.name.clone(),
                file: b.path.clone(),
                reason: b.reason.clone(),
            }),
        }
    }
}

type Datasets = Arc<BTreeMap<String, Arc<Dataset>>>;

/// Whether two listings of an object show the same version: a file that changes its size,
/// modification time or ETag is read again.
fn same_version(a: &ObjectMeta, b: &ObjectMeta) -> bool {
    a.size == b.size && a.last_modified == b.last_modified && a.e_tag == b.e_tag
}

/// The datasets under one storage root.
#[derive(Debug)]
pub struct Catalog {
    store: Arc<dyn ObjectStore>,
    refresh_interval: Duration,
    state: tokio::sync::Mutex<Option<Instant>>,
    datasets: Mutex<Datasets>,
    footers: Arc<FileMetadataCache>,
    metrics: Arc<Metrics>,
    /// Files found unreadable, by location, with the version that was read: not read,
    /// logged or counted again until the file changes.
    unreadable: Mutex<HashMap<Path, (ObjectMeta, String)>>,
    /// What the operator has been warned about (skipped folders, loose files): once each.
    warned: Mutex<HashSet<String>>,
}

impl Catalog {
    /// Lists the store and reads every footer into `footers`.
    pub async fn open(
        store: Arc<dyn ObjectStore>,
        refresh_interval: Duration,
        footers: Arc<FileMetadataCache>,
        metrics: Arc<Metrics>,
    ) -> Result<Self> {
        let catalog = Self {
            store,
            refresh_interval,
            state: tokio::sync::Mutex::new(None),
            datasets: Mutex::new(Arc::default()),
            footers,
            metrics,
            unreadable: Mutex::default(),
            warned: Mutex::default(),
        };
        catalog.refresh().await?;
        Ok(catalog)
    }

    /// The current datasets, refreshed first when the last listing is older than the
    /// refresh interval.
    pub async fn datasets(&self) -> Result<Datasets> {
        {
            let last = self.state.lock().await;
            if last.is_some_and(|t| t.elapsed() < self.refresh_interval) {
                return Ok(self.snapshot());
            }
        }
        self.refresh().await?;
        Ok(self.snapshot())
    }

    /// The datasets as last listed, without touching storage.
    pub fn snapshot(&self) -> Datasets {
        Arc::clone(&self.datasets.lock())
    }

    pub async fn dataset(&self, name: &str) -> Result<Arc<Dataset>> {
        let datasets = self.datasets().await?;
        lookup(&datasets, name)
    }

    /// `file` of `dataset` as it is in storage now. A file changed since the last listing
    /// (its size, modification time or ETag differ) makes the catalog list the store again,
    /// so a scan never pairs new bytes with an old footer. `Ok(None)`: the file is gone.
    pub async fn current(&self, dataset: &str, file: &DataFile) -> Result<Option<(Arc<Dataset>, DataFile)>> {
        let unchanged = match self.store.head(&file.meta.location).await {
            Ok(now) => same_version(&now, &file.meta),
            Err(object_store::Error::NotFound { .. }) => false,
            Err(e) => return Err(ServerError::storage(e)),
        };
        if !unchanged {
            tracing::info!(dataset, file = %file.path, "file changed since it was listed; listing again");
            self.refresh().await?;
        }
        let datasets = self.snapshot();
        let Some(dataset) = datasets.get(dataset) else {
            return Ok(None);
        };
        let found = dataset.file(&file.path).cloned();
        Ok(found.map(|f| (Arc::clone(dataset), f)))
    }

    /// Lists the storage root again and reads footers of new or changed files.
    pub async fn refresh(&self) -> Result<()> {
        let mut last = self.state.lock().await;
        let listing = self
            .store
            .list_with_delimiter(None)
            .await
            .map_err(ServerError::storage)?;
        let mut datasets = BTreeMap::new();
        let mut listed = HashSet::new();
        for folder in listing.common_prefixes {
            let Some(name) = folder.filename().map(str::to_owned) else {
                continue;
            };
            if !is_dataset_name(&name) {
                if !name.starts_with(['.', '_']) && self.warned.lock().insert(name.clone()) {
                    tracing::warn!(
                        folder = %folder,
                        "skipping folder: a dataset name has 1 to 128 characters, no control \
                         characters and no commas"
                    );
                }
                continue;
            }
            if let Some(dataset) = self.load_dataset(&name, &folder, &mut listed).await? {
                datasets.insert(name, Arc::new(dataset));
            }
        }
        let loose = listing
            .objects
            .iter()
            .filter(|m| m.location.extension() == Some("parquet"))
            .count();
        if loose > 0 && self.warned.lock().insert(format!("/{loose}")) {
            tracing::warn!(
                files = loose,
                "Parquet files directly under the storage root belong to no dataset: a dataset \
                 is a folder of them (move them into one)"
            );
        }
        // Forget deleted files; the gauge is what the datasets hold now.
        self.unreadable
            .lock()
            .retain(|location, _| listed.contains(location));
        let broken: usize = datasets.values().map(|d: &Arc<Dataset>| d.broken.len()).sum();
        self.metrics.unreadable_files.set(broken as i64);
        self.metrics.dataset_files.clear();
        for d in datasets.values() {
            let labels = crate::metrics::DatasetLabels {
                dataset: d.name.clone(),
                version: d.version(),
            };
            self.metrics
                .dataset_files
                .get_or_create(&labels)
                .set(d.files.len() as i64);
        }
        *self.datasets.lock() = Arc::new(datasets);
        *last = Some(Instant::now());
        Ok(())
    }

    async fn load_dataset(
        &self,
        name: &str,
        folder: &Path,
        listed: &mut HashSet<Path>,
    ) -> Result<Option<Dataset>> {
        let tokenizer_path = folder.clone().join(pushdown_ops::TOKENIZER_FILE);
        let mut has_tokenizer = false;
        let mut objects: Vec<ObjectMeta> = self
            .store
            .list(Some(folder))
            .try_filter(|m| {
                has_tokenizer |= m.location == tokenizer_path;
                let keep = m.location.extension() == Some("parquet")
                    && m.location.parts().all(|p| !p.as_ref().starts_with(['.', '_']));
                futures::future::ready(keep)
            })
            .try_collect()
            .await
            .map_err(ServerError::storage)?;
        if objects.is_empty() {
            return Ok(None);
        }
        let tokenizer = if has_tokenizer {
            Some(self.tokenizer(name, &tokenizer_path).await)
        } else {
            None
        };
        objects.sort_by(|a, b| a.location.cmp(&b.location));
        listed.extend(objects.iter().map(|m| m.location.clone()));
        let footers: Vec<_> = futures::stream::iter(objects)
            .map(|meta| async move {
                let footer = self.footer(&meta).await;
                (meta, footer)
            })
            .buffered(16)
            .collect()
            .await;

        Ok(Some(assemble(name, folder, footers, tokenizer)))
    }

    async fn tokenizer(
        &self,
        dataset: &str,
        path: &Path,
    ) -> std::result::Result<Arc<tokenizers::Tokenizer>, String> {
        let loaded = match self.store.get(path).await {
            Ok(got) => match got.bytes().await {
                Ok(bytes) => pushdown_ops::load_tokenizer(&bytes).map(Arc::new),
                Err(e) => Err(e.to_string()),
            },
            Err(e) => Err(e.to_string()),
        };
        if let Err(reason) = &loaded {
            tracing::warn!(dataset, %reason, "unusable tokenizer.json");
        }
        loaded
    }

    /// The file's Arrow schema and Parquet metadata, from the cache when unchanged; the
    /// reason it is unusable otherwise. An unreadable version is read and reported once.
    async fn footer(&self, meta: &ObjectMeta) -> Result<(SchemaRef, Arc<ParquetMetaData>), String> {
        if let Some((known, reason)) = self.unreadable.lock().get(&meta.location)
            && same_version(known, meta)
        {
            return Err(reason.clone());
        }
        let read = AssertUnwindSafe(self.read_footer(meta)).catch_unwind().await;
        let result = read.unwrap_or_else(|panic| {
            Err(FooterError::Damaged(format!(
                "the Parquet decoder panicked reading the footer: {}",
                pushdown_task::panic_message(panic.as_ref())
            )))
        });
        match result {
            Ok(footer) => {
                self.unreadable.lock().remove(&meta.location);
                Ok(footer)
            }
            // The store failed, not the file: tried again at the next refresh.
            Err(FooterError::Storage(reason)) => {
                tracing::warn!(file = %meta.location, %reason, "could not read a footer");
                Err(reason)
            }
            Err(FooterError::Damaged(reason)) => {
                // Whatever the decoder cached of it is not to be used by a scan.
                self.footers.remove(&meta.location);
                tracing::warn!(file = %meta.location, size = meta.size, %reason, "unreadable Parquet file");
                self.metrics.unreadable_files_found.inc();
                self.unreadable
                    .lock()
                    .insert(meta.location.clone(), (meta.clone(), reason.clone()));
                Err(reason)
            }
        }
    }

    async fn read_footer(&self, meta: &ObjectMeta) -> Result<(SchemaRef, Arc<ParquetMetaData>), FooterError> {
        let cached = self
            .footers
            .get(&meta.location)
            .is_some_and(|entry| entry.is_valid_for(meta));
        if !cached {
            let ends = envelope_ranges(meta.size)?;
            let got = self
                .store
                .get_ranges(&meta.location, &ends)
                .await
                .map_err(|e| FooterError::Storage(format!("reading the file's ends: {e}")))?;
            let length = check_envelope(meta.size, &got)?;
            let metadata = match metadata_in_tail(&got[1], length) {
                Some(metadata) => metadata,
                None => {
                    let end = meta.size - FOOTER_LEN;
                    self.store
                        .get_range(&meta.location, end - length..end)
                        .await
                        .map_err(|e| FooterError::Storage(format!("reading the footer: {e}")))?
                }
            };
            check_schema_depth(&metadata)?;
        }
        let metadata = DFParquetMetadata::new(self.store.as_ref(), meta)
            .with_metadata_size_hint(Some(METADATA_SIZE_HINT))
            .with_file_metadata_cache(Some(Arc::clone(&self.footers)))
            .fetch_metadata()
            .await
            .map_err(|e| match e.find_root() {
                datafusion::error::DataFusionError::ObjectStore(store) => {
                    FooterError::Storage(store.to_string())
                }
                root => FooterError::Damaged(root.to_string()),
            })?;
        check_layout(&metadata, meta.size)?;
        let schema = parquet::arrow::parquet_to_arrow_schema(
            metadata.file_metadata().schema_descr(),
            metadata.file_metadata().key_value_metadata(),
        )
        .map_err(|e| e.to_string())?;
        // Field-level metadata (e.g. the Parquet field ids) is not part of a dataset's identity.
        Ok((Arc::new(strip_metadata(&schema)), metadata))
    }
}

/// A file's Arrow schema and Parquet metadata, or why it cannot be read.
type Footer = std::result::Result<(SchemaRef, Arc<ParquetMetaData>), String>;

/// A dataset's files as one table, in path order: schemas merged (a file that cannot join
/// is broken, incompatible), path columns found, each file's values of them.
fn assemble(
    name: &str,
    folder: &Path,
    footers: Vec<(ObjectMeta, Footer)>,
    tokenizer: Option<std::result::Result<Arc<tokenizers::Tokenizer>, String>>,
) -> Dataset {
    let mut merge = crate::layout::SchemaMerge::default();
    let mut readable = Vec::new();
    let mut broken = Vec::new();
    for (meta, footer) in footers {
        let path = meta
            .location
            .prefix_match(folder)
            .map(|parts| parts.map(|p| p.as_ref().to_owned()).collect::<Vec<_>>().join("/"))
            .unwrap_or_else(|| meta.location.to_string());
        match footer {
            Err(reason) => broken.push(BrokenFile {
                path,
                reason,
                incompatible: false,
            }),
            Ok((file_schema, metadata)) => match merge.add(&path, &file_schema) {
                Err(reason) => {
                    tracing::warn!(dataset = name, file = %path, %reason, "incompatible schema");
                    broken.push(BrokenFile {
                        path,
                        reason,
                        incompatible: true,
                    });
                }
                Ok(()) => readable.push((path, meta, metadata, file_schema)),
            },
        }
    }
    let file_schema = merge.schema();
    let partitions = crate::layout::partition_fields(readable.iter().map(|(p, ..)| p.as_str()), &file_schema);
    let files = readable
        .into_iter()
        .map(|(path, meta, metadata, own)| DataFile {
            version: file_version(meta.size, &metadata),
            partition: crate::layout::partition_values(&path, &partitions),
            drifted: own.fields() != file_schema.fields(),
            path,
            meta,
            metadata,
        })
        .collect();
    let mut fields: Vec<arrow::datatypes::FieldRef> = file_schema.fields().iter().cloned().collect();
    fields.extend(partitions.iter().cloned());
    let schema = Arc::new(arrow::datatypes::Schema::new_with_metadata(
        fields,
        file_schema.metadata().clone(),
    ));
    Dataset {
        name: name.to_owned(),
        schema,
        file_schema,
        partitions,
        files,
        broken,
        tokenizer,
    }
}

/// A file's version from its size and footer: row counts, and every column chunk's offsets,
/// sizes, encodings' statistics and page-index locations. Stable across processes and
/// copies of the file; any rewrite that moves a page or changes a statistic changes it.
pub fn file_version(size: u64, metadata: &ParquetMetaData) -> FileVersion {
    fn word(h: &mut Xxh3, v: i64) {
        h.update(&v.to_le_bytes());
    }
    let mut h = Xxh3::new();
    let file = metadata.file_metadata();
    word(&mut h, size as i64);
    word(&mut h, file.num_rows());
    word(&mut h, i64::from(file.version()));
    for rg in metadata.row_groups() {
        word(&mut h, rg.num_rows());
        word(&mut h, rg.total_byte_size());
        for c in rg.columns() {
            word(&mut h, c.data_page_offset());
            word(&mut h, c.dictionary_page_offset().unwrap_or(-1));
            word(&mut h, c.compressed_size());
            word(&mut h, c.uncompressed_size());
            word(&mut h, c.num_values());
            word(&mut h, c.column_index_offset().unwrap_or(-1));
            word(&mut h, c.offset_index_offset().unwrap_or(-1));
            if let Some(stats) = c.statistics() {
                word(&mut h, stats.null_count_opt().map_or(-1, |n| n as i64));
                for bytes in [stats.min_bytes_opt(), stats.max_bytes_opt()] {
                    match bytes {
                        Some(b) => {
                            word(&mut h, b.len() as i64);
                            h.update(b);
                        }
                        None => word(&mut h, -1),
                    }
                }
            }
        }
    }
    if let Some(kv) = file.key_value_metadata() {
        for entry in kv {
            h.update(entry.key.as_bytes());
            h.update(entry.value.as_deref().unwrap_or("").as_bytes());
        }
    }
    FileVersion {
        size,
        hash: format!("{:016x}", h.digest()),
    }
}

/// Why a footer could not be used.
#[derive(Debug)]
enum FooterError {
    /// The file itself: remembered until the file changes.
    Damaged(String),
    /// The store failed (a transient error may succeed on retry): not remembered.
    Storage(String),
}

impl From<String> for FooterError {
    fn from(reason: String) -> Self {
        FooterError::Damaged(reason)
    }
}

/// The ranges the envelope check reads, when the file is long enough to hold a frame
/// (leading magic, metadata length, trailing magic): the leading magic, and the file's last
/// [`METADATA_SIZE_HINT`] bytes with its footer, which hold most files' whole metadata.
fn envelope_ranges(size: u64) -> Result<[std::ops::Range<u64>; 2], String> {
    let min = MAGIC.len() as u64 + FOOTER_LEN;
    if size < min {
        return Err(format!(
            "{size} bytes is too short for a Parquet file (at least {min}: magic, footer length, magic)"
        ));
    }
    let tail = (size - MAGIC.len() as u64).min(FOOTER_LEN + METADATA_SIZE_HINT as u64);
    Ok([0..MAGIC.len() as u64, size - tail..size])
}

/// The file's frame, checked before any decoder sees it: `PAR1` at both ends and a metadata
/// length that fits between them, which it returns. `ends` are the bytes of
/// [`envelope_ranges`].
fn check_envelope(size: u64, ends: &[bytes::Bytes]) -> Result<u64, String> {
    let [head, tail] = ends else {
        return Err("reading the file's ends: the store returned the wrong number of ranges".into());
    };
    if tail.len() < FOOTER_LEN as usize {
        return Err("reading the file's ends: the store returned a short range".into());
    }
    if head.as_ref() != MAGIC {
        return Err(format!(
            "the file does not start with PAR1 (found {:?})",
            head.as_ref()
        ));
    }
    let (length, magic) = tail[tail.len() - FOOTER_LEN as usize..].split_at(4);
    if magic == ENCRYPTED_MAGIC {
        return Err("the footer is encrypted (PARE); encrypted files are not supported".into());
    }
    if magic != MAGIC {
        return Err(format!("the file does not end with PAR1 (found {magic:?})"));
    }
    let length = u32::from_le_bytes([length[0], length[1], length[2], length[3]]) as u64;
    let room = size - FOOTER_LEN - MAGIC.len() as u64;
    if length == 0 {
        return Err("the footer claims 0 bytes of metadata".into());
    }
    if length > room {
        return Err(format!(
            "the footer claims {length} bytes of metadata (as i32: {}), but the file has only {room} bytes before its footer",
            length as u32 as i32
        ));
    }
    Ok(length)
}

/// The metadata's `length` bytes, when the envelope's `tail` read holds them.
fn metadata_in_tail(tail: &bytes::Bytes, length: u64) -> Option<bytes::Bytes> {
    let end = tail.len().checked_sub(FOOTER_LEN as usize)?;
    let start = end.checked_sub(usize::try_from(length).ok()?)?;
    Some(tail.slice(start..end))
}

/// The footer's schema nests no deeper than [`MAX_SCHEMA_DEPTH`], read from its bytes
/// before the decoder builds the tree by recursion.
fn check_schema_depth(metadata: &[u8]) -> Result<(), String> {
    match crate::footer_schema::schema_depth(metadata, MAX_SCHEMA_DEPTH) {
        Ok(depth) if depth > MAX_SCHEMA_DEPTH => Err(format!(
            "the schema nests more than {MAX_SCHEMA_DEPTH} levels deep (the most accepted)"
        )),
        Ok(_) => Ok(()),
        Err(reason) => Err(format!("the footer's schema cannot be read: {reason}")),
    }
}

/// The decoded metadata describes this file: every byte range it names lies between the
/// leading magic and the footer, and row counts are non-negative and add up. The Parquet
/// reader trusts these values (some of its code asserts them), so a damaged footer is
/// refused here, not discovered by a scan.
fn check_layout(metadata: &ParquetMetaData, size: u64) -> Result<(), String> {
    let file = metadata.file_metadata();
    // Data lies between the leading magic and the metadata (a lower bound of its start).
    let end = size.saturating_sub(FOOTER_LEN);
    let within = |what: &dyn Fn() -> String, start: i64, len: i64| -> Result<(), String> {
        let ok = start >= MAGIC.len() as i64
            && len >= 0
            && (start as u64).checked_add(len as u64).is_some_and(|e| e <= end);
        if ok {
            Ok(())
        } else {
            Err(format!(
                "{} spans bytes {start}..{} (length {len}), outside the file's {size} bytes",
                what(),
                start.saturating_add(len)
            ))
        }
    };
    let mut rows = 0i64;
    for (r, rg) in metadata.row_groups().iter().enumerate() {
        if rg.num_rows() < 0 {
            return Err(format!("row group {r} claims {} rows", rg.num_rows()));
        }
        rows = rows.saturating_add(rg.num_rows());
        for (c, chunk) in rg.columns().iter().enumerate() {
            let name = || format!("column chunk {c} ({}) of row group {r}", chunk.column_path());
            let start = chunk.dictionary_page_offset().unwrap_or(chunk.data_page_offset());
            if chunk
                .dictionary_page_offset()
                .is_some_and(|d| d > chunk.data_page_offset())
            {
                return Err(format!("{}: dictionary page after the data pages", name()));
            }
            within(&name, start, chunk.compressed_size())?;
            // Every row has at least one level; an unrepeated column exactly one.
            let repeated = chunk.column_descr().max_rep_level() > 0;
            let values = chunk.num_values();
            if (repeated && values < rg.num_rows()) || (!repeated && values != rg.num_rows()) {
                return Err(format!(
                    "{} holds {values} values for the row group's {} rows",
                    name(),
                    rg.num_rows()
                ));
            }
            if let (Some(o), Some(l)) = (chunk.column_index_offset(), chunk.column_index_length()) {
                within(&|| format!("the column index of {}", name()), o, l.into())?;
            }
            if let (Some(o), Some(l)) = (chunk.offset_index_offset(), chunk.offset_index_length()) {
                within(&|| format!("the offset index of {}", name()), o, l.into())?;
            }
            if let Some(o) = chunk.bloom_filter_offset() {
                within(
                    &|| format!("the bloom filter of {}", name()),
                    o,
                    chunk.bloom_filter_length().unwrap_or(0).into(),
                )?;
            }
        }
    }
    if rows != file.num_rows() {
        return Err(format!(
            "the row groups hold {rows} rows but the footer claims {}",
            file.num_rows()
        ));
    }
    Ok(())
}

fn strip_metadata(schema: &arrow::datatypes::Schema) -> arrow::datatypes::Schema {
    arrow::datatypes::Schema::new(
        schema
            .fields()
            .iter()
            .map(|f| f.as_ref().clone().with_metadata(HashMap::new()))
            .collect::<Vec<_>>(),
    )
}

/// Finds a dataset by its name, or else by the one name equal to it ignoring case (SQL folds
/// unquoted `MyPets` to `mypets`); says which datasets exist when none matches, and which
/// spellings to choose from when several do.
pub fn lookup(datasets: &BTreeMap<String, Arc<Dataset>>, name: &str) -> Result<Arc<Dataset>> {
    if let Some(found) = datasets.get(name) {
        return Ok(Arc::clone(found));
    }
    let mut folded = datasets.iter().filter(|(k, _)| k.eq_ignore_ascii_case(name));
    match (folded.next(), folded.next()) {
        (Some((_, only)), None) => Ok(Arc::clone(only)),
        (Some(_), Some(_)) => Err(ServerError::BadQuery(format!(
            "`{name}` matches several datasets that differ only in case ({}): quote the name \
             in SQL (\"MyPets\") to choose one",
            datasets
                .keys()
                .filter(|k| k.eq_ignore_ascii_case(name))
                .cloned()
                .collect::<Vec<_>>()
                .join(", ")
        ))),
        (None, _) => Err(ServerError::UnknownDataset {
            name: name.to_owned(),
            known: datasets.keys().cloned().collect(),
        }),
    }
}

/// Whether a folder name can name a dataset: 1 to 128 characters, no control characters, `/`
/// or `,` (lists of names are comma-separated), not starting with `.` or `_` (hidden and bookkeeping folders, as for files).
/// Hyphens, dots, spaces and capitals are allowed: `cifar-10`, `tiny-imagenet`, `MyPets`.
pub fn is_dataset_name(name: &str) -> bool {
    !name.is_empty()
        && name.chars().count() <= 128
        && !name.starts_with(['.', '_'])
        && !name.chars().any(|c| c.is_control() || c == '/' || c == ',')
}

/// `[A-Za-z_][A-Za-z0-9_]*`, at most 128 characters.
pub fn is_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    name.len() <= 128
        && chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An upstream bug, reproduced: `ParquetMetaDataPushDecoder::try_decode` (parquet 59.3)
    /// computes `file_len - 8 - metadata_len` unchecked, so a footer whose length claims more
    /// than the file holds panics ("attempt to subtract with overflow" with overflow checks,
    /// "range start must not be greater than end" without) instead of returning an error.
    /// DataFusion's `DFParquetMetadata::fetch_metadata` reaches it for every file, which took
    /// the whole server down at start-up. [`check_envelope`] refuses such files before the
    /// decoder sees them and [`Catalog::footer`] contains any panic that remains. To report
    /// upstream (apache/arrow-rs, `parquet/src/file/metadata/push_decoder.rs`, state
    /// `ReadingMetadata`); when this test fails, the fix has landed and the envelope check is
    /// defence in depth only.
    #[test]
    fn upstream_push_decoder_panics_on_a_footer_longer_than_the_file() {
        let mut file = MAGIC.to_vec();
        file.extend_from_slice(&[0; 8]);
        file.extend_from_slice(&0x7fff_fff0u32.to_le_bytes());
        file.extend_from_slice(MAGIC);
        let len = file.len() as u64;
        let decoded = std::panic::catch_unwind(|| {
            let mut decoder = parquet::file::metadata::ParquetMetaDataPushDecoder::try_new(len)?;
            decoder.push_range(0..len, bytes::Bytes::from(file.clone()))?;
            decoder.try_decode().map(|_| ())
        });
        assert!(
            decoded.is_err(),
            "the push decoder no longer panics ({decoded:?}): update the note in check_envelope"
        );
    }

    #[test]
    fn dataset_names_are_folder_names() {
        for name in ["images", "cifar-10", "MyPets", "tiny-imagenet", "v1.2", "a b"] {
            assert!(is_dataset_name(name), "{name}");
        }
        for name in ["", ".hidden", "_tmp", "a\nb", "a/b", "a,b", &"x".repeat(129)] {
            assert!(!is_dataset_name(name), "{name:?}");
        }
    }

    #[test]
    fn lookup_folds_case_only_when_no_name_matches_exactly() {
        let dataset = |name: &str| {
            Arc::new(Dataset {
                name: name.to_owned(),
                schema: Arc::new(arrow::datatypes::Schema::empty()),
                file_schema: Arc::new(arrow::datatypes::Schema::empty()),
                partitions: vec![],
                files: vec![],
                broken: vec![],
                tokenizer: None,
            })
        };
        let mut all: BTreeMap<String, Arc<Dataset>> =
            ["MyPets", "cifar-10"].map(|n| (n.to_owned(), dataset(n))).into();
        assert_eq!(lookup(&all, "mypets").expect("folded").name, "MyPets");
        assert_eq!(lookup(&all, "CIFAR-10").expect("folded").name, "cifar-10");
        assert!(matches!(
            lookup(&all, "pets"),
            Err(ServerError::UnknownDataset { .. })
        ));
        all.insert("mypets".into(), dataset("mypets"));
        assert_eq!(lookup(&all, "mypets").expect("exact").name, "mypets");
        let err = lookup(&all, "MYPETS").expect_err("ambiguous");
        assert!(err.to_string().contains("MyPets, mypets"), "{err}");
    }

    #[test]
    fn identifiers() {
        assert!(is_identifier("images"));
        assert!(is_identifier("_t2"));
        assert!(!is_identifier("2t"));
        assert!(!is_identifier("a-b"));
        assert!(!is_identifier(".."));
        assert!(!is_identifier(""));
    }
}
