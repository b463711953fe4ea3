//! The catalog: which datasets a server offers, their schemas, files and row groups.
//!
//! Every sub-folder of the storage root that holds Parquet files is a dataset named after
//! the folder. Names must be identifiers (`[A-Za-z_][A-Za-z0-9_]*`); other folders are
//! ignored with a warning. Files are every `*.parquet` object under the folder (recursively,
//! sorted by path, hidden `.`/`_` names skipped). Footers (with page indexes) go through the
//! query engine's file-metadata cache, validated by size and modification time: refreshing
//! the catalog lists the store but reads only footers of new or changed files, and scans
//! reuse what the catalog read.
//!
//! A file whose footer cannot be read, or whose schema differs from the dataset's, is kept in
//! [`Dataset::broken`]: requests over that dataset fail with an error naming the file rather
//! than silently skipping its rows, and other datasets are unaffected.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arrow::datatypes::SchemaRef;
use datafusion::datasource::physical_plan::parquet::metadata::DFParquetMetadata;
use datafusion::execution::cache::cache_manager::FileMetadataCache;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{ObjectMeta, ObjectStore, ObjectStoreExt};
use parquet::file::metadata::ParquetMetaData;

use crate::error::{Result, ServerError};

/// One Parquet file of a dataset.
#[derive(Debug, Clone)]
pub struct DataFile {
    /// Path relative to the dataset folder: what tickets carry.
    pub path: String,
    /// The object as listed (location relative to the storage root).
    pub meta: ObjectMeta,
    pub metadata: Arc<ParquetMetaData>,
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
}

/// A named set of Parquet files with one schema.
#[derive(Debug)]
pub struct Dataset {
    pub name: String,
    pub schema: SchemaRef,
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

    /// Fails when the dataset has unreadable files: answering without them would lose rows.
    pub fn check_readable(&self) -> Result<()> {
        match self.broken.first() {
            None => Ok(()),
            Some(b) => Err(ServerError::CorruptFile {
                dataset: self.name.clone(),
                file: b.path.clone(),
                reason: b.reason.clone(),
            }),
        }
    }
}

type Datasets = Arc<BTreeMap<String, Arc<Dataset>>>;

/// The datasets under one storage root.
#[derive(Debug)]
pub struct Catalog {
    store: Arc<dyn ObjectStore>,
    refresh_interval: Duration,
    state: tokio::sync::Mutex<Option<Instant>>,
    datasets: Mutex<Datasets>,
    footers: Arc<FileMetadataCache>,
}

impl Catalog {
    /// Lists the store and reads every footer into `footers`.
    pub async fn open(
        store: Arc<dyn ObjectStore>,
        refresh_interval: Duration,
        footers: Arc<FileMetadataCache>,
    ) -> Result<Self> {
        let catalog = Self {
            store,
            refresh_interval,
            state: tokio::sync::Mutex::new(None),
            datasets: Mutex::new(Arc::default()),
            footers,
        };
        catalog.refresh().await?;
        Ok(catalog)
    }

    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
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
        Arc::clone(&self.datasets.lock().unwrap_or_else(|p| p.into_inner()))
    }

    pub async fn dataset(&self, name: &str) -> Result<Arc<Dataset>> {
        let datasets = self.datasets().await?;
        lookup(&datasets, name)
    }

    /// Lists the storage root again and reads footers of new or changed files.
    pub async fn refresh(&self) -> Result<()> {
        let mut last = self.state.lock().await;
        let listing = self
            .store
            .list_with_delimiter(None)
            .await
            .map_err(ServerError::Storage)?;
        let mut datasets = BTreeMap::new();
        for folder in listing.common_prefixes {
            let Some(name) = folder.filename().map(str::to_owned) else {
                continue;
            };
            if !is_identifier(&name) {
                tracing::warn!(folder = %folder, "ignoring folder: dataset names must be identifiers");
                continue;
            }
            if let Some(dataset) = self.load_dataset(&name, &folder).await? {
                datasets.insert(name, Arc::new(dataset));
            }
        }
        *self.datasets.lock().unwrap_or_else(|p| p.into_inner()) = Arc::new(datasets);
        *last = Some(Instant::now());
        Ok(())
    }

    async fn load_dataset(&self, name: &str, folder: &Path) -> Result<Option<Dataset>> {
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
            .map_err(ServerError::Storage)?;
        if objects.is_empty() {
            return Ok(None);
        }
        let tokenizer = if has_tokenizer {
            Some(self.tokenizer(name, &tokenizer_path).await)
        } else {
            None
        };
        objects.sort_by(|a, b| a.location.cmp(&b.location));
        let footers: Vec<_> = futures::stream::iter(objects)
            .map(|meta| async move {
                let footer = self.footer(&meta).await;
                (meta, footer)
            })
            .buffered(16)
            .collect()
            .await;

        let mut schema: Option<SchemaRef> = None;
        let mut files = Vec::new();
        let mut broken = Vec::new();
        for (meta, footer) in footers {
            let path = meta
                .location
                .prefix_match(folder)
                .map(|parts| parts.map(|p| p.as_ref().to_owned()).collect::<Vec<_>>().join("/"))
                .unwrap_or_else(|| meta.location.to_string());
            match footer {
                Err(reason) => {
                    tracing::warn!(dataset = name, file = %path, %reason, "unreadable Parquet file");
                    broken.push(BrokenFile { path, reason });
                }
                Ok((file_schema, metadata)) => match &schema {
                    Some(s) if s.fields() != file_schema.fields() => {
                        let reason = format!("schema {file_schema:?} differs from the dataset's {s:?}");
                        tracing::warn!(dataset = name, file = %path, "schema mismatch");
                        broken.push(BrokenFile { path, reason });
                    }
                    _ => {
                        schema.get_or_insert(file_schema);
                        files.push(DataFile { path, meta, metadata });
                    }
                },
            }
        }
        let schema = schema.unwrap_or_else(|| Arc::new(arrow::datatypes::Schema::empty()));
        Ok(Some(Dataset {
            name: name.to_owned(),
            schema,
            files,
            broken,
            tokenizer,
        }))
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

    /// The file's Arrow schema and Parquet metadata, from the cache when unchanged.
    async fn footer(&self, meta: &ObjectMeta) -> Result<(SchemaRef, Arc<ParquetMetaData>), String> {
        let metadata = DFParquetMetadata::new(self.store.as_ref(), meta)
            .with_metadata_size_hint(Some(crate::query::METADATA_SIZE_HINT))
            .with_file_metadata_cache(Some(Arc::clone(&self.footers)))
            .fetch_metadata()
            .await
            .map_err(|e| e.find_root().to_string())?;
        let schema = parquet::arrow::parquet_to_arrow_schema(
            metadata.file_metadata().schema_descr(),
            metadata.file_metadata().key_value_metadata(),
        )
        .map_err(|e| e.to_string())?;
        // Field-level metadata (e.g. the Parquet field ids) is not part of a dataset's identity.
        Ok((Arc::new(strip_metadata(&schema)), metadata))
    }
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

/// Finds a dataset, or says which ones exist.
pub fn lookup(datasets: &BTreeMap<String, Arc<Dataset>>, name: &str) -> Result<Arc<Dataset>> {
    datasets
        .get(name)
        .cloned()
        .ok_or_else(|| ServerError::UnknownDataset {
            name: name.to_owned(),
            known: datasets.keys().cloned().collect(),
        })
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
    use super::is_identifier;

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
