//! Where an import reads and writes: local paths, or object-store URLs (`s3://bucket/prefix`,
//! `gs://…`, `az://…`), opened and configured as `pushdown serve --data` opens them (the
//! `AWS_*`, `GOOGLE_*`, `AZURE_*` variables).
//!
//! A store is reached through its async client on a small runtime of the import's own; what
//! the kinds see is blocking: a listing, whole objects read [`CONCURRENT_GETS`] at a time,
//! and `ObjectReader`, `Read + Seek` over ranged GETs, so a tar's first pass, which seeks
//! over its members' bodies, fetches no more than it reads. The import must not run on a
//! thread that is inside a tokio runtime ([`crate::import`] sees to it).

use std::future::Future;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use anyhow::{Context, Result};
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path as Key;
use object_store::{ObjectStore, ObjectStoreExt};

/// Object reads in flight at once for whole-object reads (a folder of images).
pub const CONCURRENT_GETS: usize = 16;
/// Bytes an [`ObjectReader`] fetches per GET.
const RANGE_BYTES: u64 = 8 << 20;

/// The runtime every store's requests run on (its client needs tokio's I/O driver).
fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("pushdown-import-io")
            .enable_all()
            .build()
            .expect("a tokio runtime for object-store requests")
    })
}

fn block_on<F: Future>(future: F) -> F::Output {
    runtime().block_on(future)
}

/// `path` is an object-store URL (`scheme://…`), not a local path.
pub fn is_url(path: &Path) -> bool {
    path.to_str().is_some_and(|s| s.contains("://"))
}

/// One object store, rooted at a bucket (or container).
pub struct Store {
    store: Arc<dyn ObjectStore>,
    /// `scheme://authority`, for names in the summary.
    root: String,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("root", &self.root).finish()
    }
}

impl Store {
    /// The store `url` is in, and the key it names (empty for the bucket itself).
    pub fn open(url: &str) -> Result<(Arc<Store>, Key)> {
        let parsed = url::Url::parse(url).with_context(|| format!("{url}: not a URL"))?;
        let root = format!("{}://{}", parsed.scheme(), parsed.authority());
        let key = Key::from_url_path(parsed.path()).with_context(|| format!("{url}: not an object path"))?;
        let store = pushdown_engine::open_store(&root).with_context(|| format!("opening {root}"))?;
        Ok((Arc::new(Store { store, root }), key))
    }

    /// A store of tests' making (`memory://` and the like), named `root`.
    pub fn from_store(store: Arc<dyn ObjectStore>, root: &str) -> Arc<Store> {
        Arc::new(Store {
            store,
            root: root.to_owned(),
        })
    }

    /// The URL of `key`.
    pub fn url(&self, key: &Key) -> String {
        format!("{}/{}", self.root, key)
    }

    /// Every object under the folder `prefix` (not `prefix` itself), as keys relative to it,
    /// sorted.
    pub fn list(&self, prefix: &Key) -> Result<Vec<String>> {
        let listed: Vec<_> = block_on(self.store.list(Some(prefix)).try_collect())
            .with_context(|| format!("listing {}", self.url(prefix)))?;
        let mut keys: Vec<String> = listed
            .iter()
            .filter_map(|meta| relative(prefix, &meta.location))
            .collect();
        keys.sort();
        Ok(keys)
    }

    /// The object's size, or `None` where there is no object at `key`.
    pub fn size(&self, key: &Key) -> Result<Option<u64>> {
        if key.as_ref().is_empty() {
            return Ok(None);
        }
        match block_on(self.store.head(key)) {
            Ok(meta) => Ok(Some(meta.size)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e).with_context(|| format!("reading {}", self.url(key))),
        }
    }

    /// The objects at `keys`, [`CONCURRENT_GETS`] at a time, in order.
    pub fn read_many(&self, keys: &[Key]) -> Vec<io::Result<Vec<u8>>> {
        block_on(
            futures::stream::iter(keys)
                .map(|key| async move {
                    let got = self.store.get(key).await.map_err(io::Error::other)?;
                    got.bytes().await.map(|b| b.to_vec()).map_err(io::Error::other)
                })
                .buffered(CONCURRENT_GETS)
                .collect(),
        )
    }

    /// Uploads the local file `from` to `to` (one PUT, or a multipart upload for a large
    /// file: the object appears whole or not at all).
    pub fn upload(&self, from: &Path, to: &Key) -> Result<()> {
        let what = || format!("uploading {} to {}", from.display(), self.url(to));
        block_on(async {
            use tokio::io::AsyncWriteExt;
            let mut file = tokio::fs::File::open(from).await?;
            let mut writer = object_store::buffered::BufWriter::new(Arc::clone(&self.store), to.clone());
            tokio::io::copy(&mut file, &mut writer).await?;
            writer.shutdown().await
        })
        .with_context(what)
    }

    /// Writes `bytes` to `key` (one PUT).
    pub fn put(&self, key: &Key, bytes: &[u8]) -> Result<()> {
        let payload = object_store::PutPayload::from(bytes.to_vec());
        block_on(self.store.put(key, payload))
            .map(|_| ())
            .with_context(|| format!("writing {}", self.url(key)))
    }

    /// Copies `from` to `to` within the store.
    pub fn copy(&self, from: &Key, to: &Key) -> Result<()> {
        block_on(self.store.copy(from, to))
            .with_context(|| format!("copying {} to {}", self.url(from), self.url(to)))
    }

    /// Deletes `key` (already gone is not an error).
    pub fn delete(&self, key: &Key) -> Result<()> {
        match block_on(self.store.delete(key)) {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e).with_context(|| format!("deleting {}", self.url(key))),
        }
    }

    fn get_range(&self, key: &Key, range: std::ops::Range<u64>) -> io::Result<Bytes> {
        block_on(self.store.get_range(key, range)).map_err(io::Error::other)
    }
}

/// `location` relative to the folder `prefix`, if it is inside it.
fn relative(prefix: &Key, location: &Key) -> Option<String> {
    let (prefix, location) = (prefix.as_ref(), location.as_ref());
    if prefix.is_empty() {
        return Some(location.to_owned());
    }
    location
        .strip_prefix(prefix)?
        .strip_prefix('/')
        .filter(|rest| !rest.is_empty())
        .map(str::to_owned)
}

/// An input file: a local path or an object.
#[derive(Debug, Clone)]
pub struct Input {
    /// The path or URL, as the summary and `__url__` name it.
    pub name: String,
    source: Source,
}

#[derive(Debug, Clone)]
enum Source {
    Local(PathBuf),
    Object(Arc<Store>, Key, u64),
}

/// What an [`Input`] opens to.
pub trait ReadSeek: Read + Seek + Send {}
impl<T: Read + Seek + Send> ReadSeek for T {}

impl Input {
    /// The local file at `path`.
    pub fn local(path: PathBuf) -> Input {
        Input {
            name: path.display().to_string(),
            source: Source::Local(path),
        }
    }

    /// The object at `key` of `store`, `size` bytes long.
    pub fn object(store: &Arc<Store>, key: Key, size: u64) -> Input {
        Input {
            name: store.url(&key),
            source: Source::Object(Arc::clone(store), key, size),
        }
    }

    /// Opens the input for reading, from its start.
    pub fn open(&self) -> io::Result<Box<dyn ReadSeek>> {
        match &self.source {
            Source::Local(path) => Ok(Box::new(std::fs::File::open(path)?)),
            Source::Object(store, key, size) => Ok(Box::new(ObjectReader {
                store: Arc::clone(store),
                key: key.clone(),
                size: *size,
                position: 0,
                buffer: Bytes::new(),
                buffer_start: 0,
            })),
        }
    }
}

/// The input files `paths` name: a file or an object as itself; a local folder, a bucket or
/// a prefix as every file under it whose name `keep` accepts, sorted by path. Stores are
/// opened once per bucket.
pub fn inputs(paths: &[PathBuf], keep: &dyn Fn(&str) -> bool) -> Result<Vec<Input>> {
    let mut stores: Vec<(String, Arc<Store>)> = Vec::new();
    let mut out = Vec::new();
    for path in paths {
        if !is_url(path) {
            local_inputs(path, keep, &mut out)?;
            continue;
        }
        let url = path.to_string_lossy();
        let (opened, key) = Store::open(&url)?;
        let store = match stores.iter().find(|(root, _)| *root == opened.root) {
            Some((_, s)) => Arc::clone(s),
            None => {
                stores.push((opened.root.clone(), Arc::clone(&opened)));
                opened
            }
        };
        out.extend(objects(&store, key, keep, url.ends_with('/'))?);
    }
    Ok(out)
}

/// The object at `key`, or else every object under it whose relative name `keep` accepts,
/// sorted; only the latter for a `prefix` (a URL ending in `/`).
fn objects(store: &Arc<Store>, key: Key, keep: &dyn Fn(&str) -> bool, prefix: bool) -> Result<Vec<Input>> {
    // A HEAD of a prefix is a 404 on S3, and an error on stores that keep objects as files
    // (a folder is no object): the listing decides, the HEAD's error said only where it finds
    // nothing.
    let head = if prefix { Ok(None) } else { store.size(&key) };
    if let Ok(Some(size)) = head {
        return Ok(vec![Input::object(store, key, size)]);
    }
    let listed = block_on(store.store.list(Some(&key)).try_collect::<Vec<_>>())
        .with_context(|| format!("listing {}", store.url(&key)))?;
    let mut found: Vec<_> = listed
        .into_iter()
        .filter(|meta| relative(&key, &meta.location).is_some_and(|r| keep(&r)))
        .collect();
    if found.is_empty() {
        head?;
        anyhow::bail!("{}: no such object, and no inputs under it", store.url(&key));
    }
    found.sort_by(|a, b| a.location.as_ref().cmp(b.location.as_ref()));
    Ok(found
        .into_iter()
        .map(|meta| Input::object(store, meta.location, meta.size))
        .collect())
}

fn local_inputs(path: &Path, keep: &dyn Fn(&str) -> bool, out: &mut Vec<Input>) -> Result<()> {
    if !path.is_dir() {
        // A file named is read as given (a missing one is counted unreadable when read).
        out.push(Input::local(path.to_owned()));
        return Ok(());
    }
    let mut found = Vec::new();
    let mut folders = vec![path.to_owned()];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).with_context(|| format!("listing {}", folder.display()))? {
            let entry = entry?;
            let child = entry.path();
            if child.is_dir() {
                folders.push(child);
            } else if child
                .strip_prefix(path)
                .ok()
                .and_then(Path::to_str)
                .is_some_and(keep)
            {
                found.push(child);
            }
        }
    }
    anyhow::ensure!(!found.is_empty(), "{}: no inputs in the folder", path.display());
    found.sort();
    out.extend(found.into_iter().map(Input::local));
    Ok(())
}

/// `Read + Seek` over an object, [`RANGE_BYTES`] per GET: a seek costs nothing, a read
/// outside the bytes held fetches the range from there.
struct ObjectReader {
    store: Arc<Store>,
    key: Key,
    size: u64,
    position: u64,
    buffer: Bytes,
    buffer_start: u64,
}

impl Read for ObjectReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if self.position >= self.size || out.is_empty() {
            return Ok(0);
        }
        let held = self.buffer_start..self.buffer_start + self.buffer.len() as u64;
        if !held.contains(&self.position) {
            let end = (self.position + RANGE_BYTES).min(self.size);
            self.buffer = self.store.get_range(&self.key, self.position..end)?;
            self.buffer_start = self.position;
            if self.buffer.is_empty() {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!(
                        "{}: the store returned no bytes at {}",
                        self.store.url(&self.key),
                        self.position
                    ),
                ));
            }
        }
        let at = (self.position - self.buffer_start) as usize;
        let n = out.len().min(self.buffer.len() - at);
        out[..n].copy_from_slice(&self.buffer[at..at + n]);
        self.position += n as u64;
        Ok(n)
    }
}

impl Seek for ObjectReader {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let position = match to {
            SeekFrom::Start(p) => Some(p),
            SeekFrom::End(d) => self.size.checked_add_signed(d),
            SeekFrom::Current(d) => self.position.checked_add_signed(d),
        };
        self.position = position
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "a seek before the object's start"))?;
        Ok(self.position)
    }
}

/// A folder of files: a local one, or every object under a prefix.
#[derive(Debug, Clone)]
pub enum Folder {
    /// A local folder.
    Local(PathBuf),
    /// The objects under `prefix` in `store`.
    Objects(Arc<Store>, Key),
}

impl Folder {
    /// The folder `path` names; it must exist (a prefix must hold at least one object).
    pub fn open(path: &Path) -> Result<Folder> {
        if is_url(path) {
            let (store, key) = Store::open(&path.to_string_lossy())?;
            return Ok(Folder::Objects(store, key));
        }
        anyhow::ensure!(path.is_dir(), "{}: not a folder", path.display());
        Ok(Folder::Local(path.to_owned()))
    }

    /// The folder as the summary names it.
    pub fn name(&self) -> String {
        match self {
            Folder::Local(path) => path.display().to_string(),
            Folder::Objects(store, key) => store.url(key),
        }
    }

    /// The files at `relative` paths, in order: concurrently from a store, on rayon's threads
    /// from disk.
    pub fn read_many(&self, relative: &[&str]) -> Vec<io::Result<Vec<u8>>> {
        match self {
            Folder::Local(dir) => {
                use rayon::prelude::*;
                relative.par_iter().map(|r| std::fs::read(dir.join(r))).collect()
            }
            Folder::Objects(store, prefix) => {
                let keys: Vec<Key> = relative.iter().map(|r| child(prefix, r)).collect();
                store.read_many(&keys)
            }
        }
    }

    /// The file at `relative`, or `None` where there is none.
    pub fn read_optional(&self, relative: &str) -> Result<Option<Vec<u8>>> {
        match self {
            Folder::Local(dir) => {
                let path = dir.join(relative);
                if !path.is_file() {
                    return Ok(None);
                }
                std::fs::read(&path)
                    .map(Some)
                    .with_context(|| format!("reading {}", path.display()))
            }
            Folder::Objects(store, prefix) => {
                let key = child(prefix, relative);
                if store.size(&key)?.is_none() {
                    return Ok(None);
                }
                let read = store.read_many(std::slice::from_ref(&key)).pop();
                read.transpose()
                    .with_context(|| format!("reading {}", store.url(&key)))
            }
        }
    }
}

/// The key of `relative` (a `/`-separated path, as a listing gives it: already a valid key)
/// under `prefix`.
pub fn child(prefix: &Key, relative: &str) -> Key {
    let joined = if prefix.as_ref().is_empty() {
        relative.to_owned()
    } else {
        format!("{}/{relative}", prefix.as_ref())
    };
    Key::parse(&joined).unwrap_or_else(|_| Key::from(joined.as_str()))
}

/// Where the dataset goes: a local folder, or a prefix in a store.
#[derive(Debug, Clone)]
pub enum Output {
    /// A local folder.
    Local(PathBuf),
    /// The prefix `key` in `store`.
    Objects(Arc<Store>, Key),
}

impl Output {
    /// The dataset folder `path` names (a local folder is created when written).
    pub fn open(path: &Path) -> Result<Output> {
        if is_url(path) {
            let (store, key) = Store::open(&path.to_string_lossy())?;
            anyhow::ensure!(
                !key.as_ref().is_empty(),
                "{}: name the dataset's folder in the bucket (its name is the dataset's)",
                path.display()
            );
            return Ok(Output::Objects(store, key));
        }
        Ok(Output::Local(path.to_owned()))
    }

    /// The dataset folder as the summary names it.
    pub fn name(&self) -> String {
        match self {
            Output::Local(path) => path.display().to_string(),
            Output::Objects(store, key) => store.url(key),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::memory::InMemory;

    fn store() -> Arc<Store> {
        Store::from_store(Arc::new(InMemory::new()), "mem://bucket")
    }

    #[test]
    fn a_prefix_is_its_objects_a_key_is_itself() {
        let s = store();
        for key in [
            "shards/b.tar",
            "shards/a.tar",
            "shards/notes.txt",
            "shards/deep/c.tar",
            "shards2/x.tar",
        ] {
            s.put(&Key::from(key), key.as_bytes()).unwrap();
        }
        let tars = |name: &str| name.ends_with(".tar");
        let names = |inputs: Vec<Input>| inputs.into_iter().map(|i| i.name).collect::<Vec<_>>();
        assert_eq!(
            names(objects(&s, Key::from("shards"), &tars, false).unwrap()),
            [
                "mem://bucket/shards/a.tar",
                "mem://bucket/shards/b.tar",
                "mem://bucket/shards/deep/c.tar"
            ]
        );
        // A key named is itself, whatever `keep` says.
        assert_eq!(
            names(objects(&s, Key::from("shards/notes.txt"), &tars, false).unwrap()),
            ["mem://bucket/shards/notes.txt"]
        );
        let none = objects(&s, Key::from("nothing"), &tars, true).unwrap_err();
        assert!(format!("{none:#}").contains("no inputs under it"), "{none:#}");
    }

    #[test]
    fn an_object_reads_and_seeks_as_a_file_does() {
        let s = store();
        let len = 2 * RANGE_BYTES as usize + 12_345;
        let bytes: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
        s.put(&Key::from("big.bin"), &bytes).unwrap();
        let input = objects(&s, Key::from("big.bin"), &|_| true, false)
            .unwrap()
            .remove(0);
        let mut all = Vec::new();
        input.open().unwrap().read_to_end(&mut all).unwrap();
        assert!(all == bytes, "a whole read across three ranges");
        let mut reader = input.open().unwrap();
        for at in [len as u64 - 10, 5, RANGE_BYTES - 3, 0] {
            reader.seek(SeekFrom::Start(at)).unwrap();
            let mut six = [0u8; 6];
            let n = reader.read(&mut six).unwrap();
            assert_eq!(&six[..n], &bytes[at as usize..at as usize + n], "at {at}");
            assert!(n > 0);
        }
        reader.seek(SeekFrom::End(0)).unwrap();
        assert_eq!(reader.read(&mut [0u8; 4]).unwrap(), 0, "end of the object");
        assert!(reader.seek(SeekFrom::Current(-(len as i64) - 1)).is_err());
    }
}
