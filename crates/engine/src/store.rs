//! Opening the storage root, and the decorating object store that accounts for every read.
//!
//! All file access of a server goes through one [`ObjectStore`] rooted at `--data`, so no
//! request can name a file outside it. [`InstrumentedStore`] wraps that store: it counts the
//! bytes and requests of every read into the server's metrics and, when asked, records each
//! request (path and byte range) so tests can prove what a query read, not only what it
//! returned.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::prefix::PrefixStore;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    ObjectStoreScheme, PutMultipartOptions, PutOptions, PutPayload, PutResult,
};
use parking_lot::Mutex;

use crate::metrics::Metrics;
use crate::startup::StartupError;

/// Opens `--data`: a local folder, or an object-store URL: `s3://bucket/prefix` (settings
/// from the `AWS_*` variables), `gs://bucket/prefix` (`GOOGLE_*`), `az://container/prefix`
/// or `abfss://container@account.dfs.core.windows.net/prefix` (`AZURE_*`), `file:///…`,
/// `memory://`. The returned store is rooted at the data root.
pub fn open_store(data: &str) -> std::result::Result<Arc<dyn ObjectStore>, StartupError> {
    let store_error = |source| StartupError::Store {
        data: data.to_owned(),
        cause: source,
    };
    let is_url = data.contains("://");
    if !is_url {
        let root = std::fs::canonicalize(data).map_err(|source| StartupError::DataRoot {
            data: data.to_owned(),
            cause: source,
        })?;
        let store = object_store::local::LocalFileSystem::new_with_prefix(root).map_err(store_error)?;
        return Ok(Arc::new(LocalFiles { inner: store }));
    }
    let url = url::Url::parse(data).map_err(|source| StartupError::DataUrl {
        data: data.to_owned(),
        cause: source,
    })?;
    let (scheme, prefix) = ObjectStoreScheme::parse(&url).map_err(|e| store_error(e.into()))?;
    let store: Box<dyn ObjectStore> = match scheme {
        ObjectStoreScheme::AmazonS3 => {
            plain_http_allowed(data, "AWS_ENDPOINT", "AWS_ALLOW_HTTP")?;
            let builder = object_store::aws::AmazonS3Builder::from_env().with_url(url.as_str());
            Box::new(builder.build().map_err(store_error)?)
        }
        ObjectStoreScheme::GoogleCloudStorage => Box::new(
            object_store::gcp::GoogleCloudStorageBuilder::from_env()
                .with_url(url.as_str())
                .build()
                .map_err(store_error)?,
        ),
        ObjectStoreScheme::MicrosoftAzure => Box::new(
            object_store::azure::MicrosoftAzureBuilder::from_env()
                .with_url(url.as_str())
                .build()
                .map_err(store_error)?,
        ),
        _ => object_store::parse_url(&url).map_err(store_error)?.0,
    };
    if prefix.as_ref().is_empty() {
        Ok(Arc::from(store))
    } else {
        Ok(Arc::new(PrefixStore::new(store, prefix)))
    }
}

/// An endpoint (`endpoint_var`, or its `_URL` form) that is plain `http://` needs
/// `allow_var=true`: without it the store refuses every request with no more than "builder
/// error", so the server refuses to start, naming the variable.
fn plain_http_allowed(
    data: &str,
    endpoint_var: &str,
    allow_var: &str,
) -> std::result::Result<(), StartupError> {
    let endpoint = std::env::var(endpoint_var)
        .or_else(|_| std::env::var(format!("{endpoint_var}_URL")))
        .unwrap_or_default();
    let allowed = std::env::var(allow_var).is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1");
    if endpoint.starts_with("http://") && !allowed {
        return Err(StartupError::StoreSetting {
            data: data.to_owned(),
            why: format!("{endpoint_var} {endpoint} is plain http: set {allow_var}=true to allow it"),
        });
    }
    Ok(())
}

/// [`crate::ServerConfig::store_reads_in_flight`] for a `--data` root: 1 for local files
/// (a read costs microseconds; the cores are the limit), 8 for an object store URL (a
/// request's round trip, not its bytes, would otherwise bound a stream).
pub fn reads_in_flight_for(data: &str) -> usize {
    if data.contains("://") && !data.starts_with("file://") {
        8
    } else {
        1
    }
}

/// A local folder: [`object_store::local::LocalFileSystem`] for everything but the ranged
/// reads a scan makes. Those read straight into uninitialised buffers: the stock store zeroes
/// each buffer before filling it, a second pass over every byte read (a sizeable share of the
/// server's CPU on the images scan, where column chunks are megabytes of JPEG: see
/// `benches/RESULTS.md`, "Scan: the server against DuckDB").
struct LocalFiles {
    inner: object_store::local::LocalFileSystem,
}

impl LocalFiles {
    /// Reads `ranges` of the file at `path`, in order. A range past the end of the file is an
    /// error, not a short buffer: the Parquet reader trusts the lengths it asked for.
    fn read_ranges(path: &std::path::Path, ranges: &[Range<u64>]) -> object_store::Result<Vec<Bytes>> {
        use std::io::{Read, Seek, SeekFrom};
        let error = |source: std::io::Error| -> object_store::Error {
            if source.kind() == std::io::ErrorKind::NotFound {
                object_store::Error::NotFound {
                    path: path.display().to_string(),
                    source: Box::new(source),
                }
            } else {
                object_store::Error::Generic {
                    store: "LocalFiles",
                    source: Box::new(source),
                }
            }
        };
        let mut file = std::fs::File::open(path).map_err(error)?;
        ranges
            .iter()
            .map(|range| {
                let len = range.end.saturating_sub(range.start);
                let mut buf =
                    Vec::with_capacity(usize::try_from(len).map_err(|e| error(std::io::Error::other(e)))?);
                file.seek(SeekFrom::Start(range.start)).map_err(error)?;
                // `File` reads into the spare capacity without initialising it first.
                (&mut file).take(len).read_to_end(&mut buf).map_err(error)?;
                if buf.len() as u64 != len {
                    return Err(error(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        format!(
                            "{}: bytes {}..{} asked for, the file ends at byte {}",
                            path.display(),
                            range.start,
                            range.end,
                            range.start + buf.len() as u64
                        ),
                    )));
                }
                Ok(Bytes::from(buf))
            })
            .collect()
    }
}

impl fmt::Display for LocalFiles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LocalFiles({})", self.inner)
    }
}

impl fmt::Debug for LocalFiles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalFiles").field("inner", &self.inner).finish()
    }
}

/// `#[async_trait] impl ObjectStore for $store` whose writes, deletes, listings and copies go
/// to its `inner` store unchanged, with the reads given. One macro for the whole impl:
/// `#[async_trait]` must see the methods themselves, not a macro call among them.
macro_rules! read_decorator {
    ($store:ty { $($read:item)* }) => {
        #[async_trait]
        impl ObjectStore for $store {
            $($read)*

            async fn put_opts(
                &self,
                location: &Path,
                payload: PutPayload,
                opts: PutOptions,
            ) -> object_store::Result<PutResult> {
                self.inner.put_opts(location, payload, opts).await
            }

            async fn put_multipart_opts(
                &self,
                location: &Path,
                opts: PutMultipartOptions,
            ) -> object_store::Result<Box<dyn MultipartUpload>> {
                self.inner.put_multipart_opts(location, opts).await
            }

            fn delete_stream(
                &self,
                locations: BoxStream<'static, object_store::Result<Path>>,
            ) -> BoxStream<'static, object_store::Result<Path>> {
                self.inner.delete_stream(locations)
            }

            fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
                self.inner.list(prefix)
            }

            fn list_with_offset(
                &self,
                prefix: Option<&Path>,
                offset: &Path,
            ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
                self.inner.list_with_offset(prefix, offset)
            }

            async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
                self.inner.list_with_delimiter(prefix).await
            }

            async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> object_store::Result<()> {
                self.inner.copy_opts(from, to, options).await
            }
        }
    };
}

read_decorator!(LocalFiles {
    async fn get_opts(&self, location: &Path, options: GetOptions) -> object_store::Result<GetResult> {
        self.inner.get_opts(location, options).await
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> object_store::Result<Vec<Bytes>> {
        let path = self.inner.path_to_filesystem(location)?;
        let ranges = ranges.to_vec();
        // Off the async workers, as the stock store does; inline where there is no runtime.
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => runtime
                .spawn_blocking(move || Self::read_ranges(&path, &ranges))
                .await
                .map_err(|e| object_store::Error::Generic {
                    store: "LocalFiles",
                    source: Box::new(e),
                })?,
            Err(_) => Self::read_ranges(&path, &ranges),
        }
    }
});

/// One read made to the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadRequest {
    pub path: String,
    pub range: Range<u64>,
}

/// Decorates a store with read accounting; writes pass through untouched.
pub struct InstrumentedStore {
    inner: Arc<dyn ObjectStore>,
    metrics: Arc<Metrics>,
    recording: Option<Mutex<Vec<ReadRequest>>>,
}

impl InstrumentedStore {
    pub fn new(inner: Arc<dyn ObjectStore>, metrics: Arc<Metrics>) -> Self {
        Self {
            inner,
            metrics,
            recording: None,
        }
    }

    /// Also keeps every read request, for [`Self::take_requests`].
    pub fn with_recording(mut self) -> Self {
        self.recording = Some(Mutex::new(Vec::new()));
        self
    }

    /// The read requests recorded since the last call.
    pub fn take_requests(&self) -> Vec<ReadRequest> {
        self.recording
            .as_ref()
            .map(|r| std::mem::take(&mut *r.lock()))
            .unwrap_or_default()
    }

    fn record(&self, path: &Path, range: Range<u64>) {
        self.metrics.store_requests.inc();
        self.metrics
            .store_bytes_read
            .inc_by(range.end.saturating_sub(range.start));
        if let Some(recording) = &self.recording {
            recording.lock().push(ReadRequest {
                path: path.to_string(),
                range,
            });
        }
    }
}

impl fmt::Display for InstrumentedStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Instrumented({})", self.inner)
    }
}

impl fmt::Debug for InstrumentedStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InstrumentedStore")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

read_decorator!(InstrumentedStore {
    async fn get_opts(&self, location: &Path, options: GetOptions) -> object_store::Result<GetResult> {
        let head = options.head;
        let result = self.inner.get_opts(location, options).await?;
        if !head {
            self.record(location, result.range.clone());
        }
        Ok(result)
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> object_store::Result<Vec<Bytes>> {
        let result = self.inner.get_ranges(location, ranges).await?;
        for range in ranges {
            self.record(location, range.clone());
        }
        Ok(result)
    }
});

#[cfg(test)]
mod tests {
    use object_store::ObjectStoreExt;

    use super::*;

    #[tokio::test]
    async fn local_ranges_read_exactly_what_was_asked_and_name_a_short_file() {
        let dir = tempfile::tempdir().unwrap();
        let bytes: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(dir.path().join("f.bin"), &bytes).unwrap();
        let store = open_store(dir.path().to_str().unwrap()).unwrap();
        let path = Path::from("f.bin");
        let ranges = [0..10, 9_000..10_000, 17..17, 4_096..8_192];
        let got = store.get_ranges(&path, &ranges).await.unwrap();
        for (range, got) in ranges.iter().zip(&got) {
            assert_eq!(
                &got[..],
                &bytes[range.start as usize..range.end as usize],
                "{range:?}"
            );
        }
        // The same through the stock path (`get_range` is not overridden).
        assert_eq!(&store.get_range(&path, 5..15).await.unwrap()[..], &bytes[5..15]);

        let past_end = store.get_ranges(&path, &[9_990..10_010, 0..1]).await.unwrap_err();
        assert!(
            past_end.to_string().contains("the file ends at byte 10000"),
            "{past_end}"
        );
        let missing = store
            .get_ranges(&Path::from("nope.bin"), &[0..1, 1..2])
            .await
            .unwrap_err();
        assert!(
            matches!(missing, object_store::Error::NotFound { .. }),
            "{missing}"
        );
    }
}
