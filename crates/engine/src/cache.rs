//! Reduced shard outputs kept for reuse: every epoch, hyperparameter trial and restart that
//! asks for the same fragment of the same file version reads the stored result instead of
//! decoding and reducing again.
//!
//! * **Key.** A fingerprint of the shard's *optimized* logical plan made canonical — the
//!   simplifier has already put literals on the right of comparisons; conjuncts are sorted
//!   and deduplicated and the output columns taken as a set — with the names it reads
//!   (datasets and views, as granted), the op kernels' version, and the file as it is now
//!   (path, size, modification time, ETag, footer hash) with the shard's row groups.
//!   Equivalent fragments written differently share an entry; a rewritten or touched file
//!   gives a new key, and the old entry ages out.
//! * **Tiers.** Arrow IPC in memory, spilled to a disk directory when memory is short; both
//!   under byte budgets. Uncompressed: a hit is read back on every epoch, and its buffers
//!   are taken from the entry's bytes in place (no copy, no codec). zstd's decoding of
//!   reduced 128 px pixels cost a server a third of decoding the JPEGs again (0.52 against
//!   1.53 s per 1,000, `harness ceiling`), LZ4's frame decoder 0.19 s; reduced tensors
//!   compress little, and the wire has its own codec. Disk entries outlive the process: a
//!   file's name carries its key and a checksum of its bytes, checked before it is read.
//! * **Policy.** Measured, per fragment: the time computing it took, its output bytes, how
//!   often it was asked for, and the measured rate of reading entries back. An entry is
//!   kept when reading it saves at least half of computing it, and it stays while its
//!   saving per byte beats that of what would replace it (requests × (compute − read) /
//!   bytes, the least valuable evicted first). A dataset can force it on or off.
//! * **Once.** Concurrent requests for a missing entry wait for the first to compute it,
//!   but not for its client: once the first has waited [`HELD_BACK`] on a client that does
//!   not read, the others compute beside it (uncached) rather than stall with it.
//! * **Access.** An entry records the names it was computed from; it is served only to a
//!   caller granted every one of them.
//!
//! Only deterministic fragments have keys: a plan with a volatile function is never cached,
//! and randomized ops run on the client, after the cache.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arrow::array::RecordBatch;
use arrow::buffer::Buffer;
use arrow::datatypes::{Schema, SchemaRef};
use arrow::ipc::reader::StreamDecoder;
use arrow::ipc::writer::{IpcWriteOptions, StreamWriter};
use bytes::Bytes;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::logical_expr::utils::{conjunction, split_conjunction_owned};
use datafusion::logical_expr::{Expr, Filter, LogicalPlan, Projection};
use parking_lot::Mutex;
use xxhash_rust::xxh3::Xxh3;

use crate::auth::Grant;
use crate::catalog::DataFile;
use crate::error::{Result, ServerError};
use crate::metrics::Metrics;
use crate::startup::StartupError;

/// Schema metadata of an entry: the names it was computed from, comma-separated.
const NAMES_KEY: &str = "pushdown.cache.names";
/// Bumped when the key material or the entry format changes: old entries are never read.
const FORMAT: &str = "pushdown-cache-v1";
/// Suffix of entry files in the disk directory.
const SUFFIX: &str = "arrows";
/// Reading an entry back must cost at most this share of computing it for it to be kept.
const MAX_READ_SHARE: f64 = 0.5;
/// The rate entries are read back at (decoded and re-encoded) before one has been
/// measured, bytes/s.
const INITIAL_READ_RATE: f64 = 200e6;
/// The end of an Arrow IPC stream as its writer finishes it: a continuation marker and a
/// zero length.
const END_OF_STREAM: [u8; 8] = [0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0, 0];
/// Fragments whose statistics are kept (requests, costs, the last decision).
const MAX_SEEN: usize = 1 << 16;

/// Whether a dataset's fragments are cached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CacheMode {
    /// When measurement says it pays.
    #[default]
    Auto,
    /// Whenever the output fits.
    On,
    /// Never.
    Off,
}

impl std::str::FromStr for CacheMode {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "on" => Ok(Self::On),
            "off" => Ok(Self::Off),
            other => Err(format!("unknown cache mode `{other}` (auto, on or off)")),
        }
    }
}

impl std::fmt::Display for CacheMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::On => "on",
            Self::Off => "off",
        })
    }
}

/// Budgets and modes of a server's fragment cache.
#[derive(Debug, Clone)]
pub struct CacheConfig {
    /// Bytes of entries held in memory (0: none).
    pub memory_bytes: u64,
    /// Directory entries spill to, and are found in again after a restart.
    pub disk: Option<PathBuf>,
    /// Bytes of entries on disk.
    pub disk_bytes: u64,
    /// The mode of datasets not named in `modes`.
    pub default_mode: CacheMode,
    /// Modes by dataset (or view) name; `off` wins over `on`, `on` over `auto`.
    pub modes: BTreeMap<String, CacheMode>,
}

impl Default for CacheConfig {
    fn default() -> Self {
        Self {
            memory_bytes: 256 << 20,
            disk: None,
            disk_bytes: 8 << 30,
            default_mode: CacheMode::Auto,
            modes: BTreeMap::new(),
        }
    }
}

impl CacheConfig {
    /// The largest entry kept: a quarter of the larger tier, so one entry never flushes it.
    pub fn max_entry_bytes(&self) -> u64 {
        let disk = if self.disk.is_some() { self.disk_bytes } else { 0 };
        self.memory_bytes.max(disk) / 4
    }

    /// The mode of a fragment reading `names` (views and the datasets beneath them).
    pub fn mode_of<'a>(&self, names: impl IntoIterator<Item = &'a str>) -> CacheMode {
        let modes: Vec<CacheMode> = names
            .into_iter()
            .map(|n| self.modes.get(n).copied().unwrap_or(self.default_mode))
            .collect();
        if modes.is_empty() || modes.contains(&CacheMode::Off) {
            CacheMode::Off
        } else if modes.contains(&CacheMode::On) {
            CacheMode::On
        } else {
            CacheMode::Auto
        }
    }
}

/// The fingerprint of a query, the same for every shard of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct QueryPrint(u128);

/// The key of one shard's output: its query's print and the file as it is now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Key(u128);

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

impl std::str::FromStr for Key {
    type Err = std::num::ParseIntError;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        u128::from_str_radix(s, 16).map(Key)
    }
}

/// The print of an optimized plan reading `names`, or `None` when the plan is not
/// deterministic (a volatile function) and must not be cached.
pub fn query_print(optimized: &LogicalPlan, names: &[String]) -> Result<Option<QueryPrint>> {
    let volatile = optimized.exists(|node| Ok(node.expressions().iter().any(Expr::is_volatile)))?;
    if volatile {
        return Ok(None);
    }
    let canonical = canonical_text(optimized)?;
    let mut names = names.to_vec();
    names.sort();
    names.dedup();
    let mut h = Xxh3::new();
    for part in [FORMAT, env!("CARGO_PKG_VERSION"), &canonical] {
        h.update(part.as_bytes());
        h.update(&[0]);
    }
    for name in &names {
        h.update(name.as_bytes());
        h.update(&[0]);
    }
    Ok(Some(QueryPrint(h.digest128())))
}

/// The key of `query`'s output over `row_groups` of `file` (of `dataset`) as it is now.
pub fn shard_key(query: QueryPrint, dataset: &str, file: &DataFile, row_groups: &Range<u32>) -> Key {
    let mut h = Xxh3::new();
    h.update(&query.0.to_le_bytes());
    for part in [dataset, file.path.as_str(), &file.version.hash] {
        h.update(part.as_bytes());
        h.update(&[0]);
    }
    h.update(&file.meta.size.to_le_bytes());
    h.update(
        &file
            .meta
            .last_modified
            .timestamp_nanos_opt()
            .unwrap_or_default()
            .to_le_bytes(),
    );
    h.update(file.meta.e_tag.as_deref().unwrap_or_default().as_bytes());
    h.update(&[0]);
    h.update(&row_groups.start.to_le_bytes());
    h.update(&row_groups.end.to_le_bytes());
    Key(h.digest128())
}

/// The plan as text, with what does not change its answer made canonical: conjuncts of
/// filters (and of the filters handed to scans) sorted and deduplicated, and the final
/// projection's columns sorted (the output is the same set of columns; an entry is
/// reordered by name when served).
fn canonical_text(plan: &LogicalPlan) -> Result<String> {
    fn sorted(exprs: Vec<Expr>) -> Vec<Expr> {
        let mut keyed: Vec<(String, Expr)> = exprs.into_iter().map(|e| (e.to_string(), e)).collect();
        keyed.sort_by(|a, b| a.0.cmp(&b.0));
        keyed.dedup_by(|a, b| a.0 == b.0);
        keyed.into_iter().map(|(_, e)| e).collect()
    }
    let plan = plan
        .clone()
        .transform_up(|node| match node {
            LogicalPlan::Filter(f) => {
                let parts = sorted(split_conjunction_owned(f.predicate));
                let predicate = conjunction(parts).unwrap_or(datafusion::prelude::lit(true));
                Ok(Transformed::yes(LogicalPlan::Filter(Filter::try_new(
                    predicate, f.input,
                )?)))
            }
            LogicalPlan::TableScan(mut scan) => {
                scan.filters = sorted(std::mem::take(&mut scan.filters));
                Ok(Transformed::yes(LogicalPlan::TableScan(scan)))
            }
            other => Ok(Transformed::no(other)),
        })?
        .data;
    let plan = match plan {
        LogicalPlan::Projection(p) => {
            let mut exprs = p.expr;
            exprs.sort_by_key(|e| e.schema_name().to_string());
            LogicalPlan::Projection(Projection::try_new(exprs, p.input)?)
        }
        other => other,
    };
    Ok(plan.display_indent_schema().to_string())
}

/// What a DoGet stream of a cacheable shard carries to the cache.
#[derive(Debug, Clone)]
pub struct Cacheable {
    pub key: Key,
    /// The names the query reads, granted (datasets and views).
    pub names: Vec<String>,
    pub mode: CacheMode,
}

/// Where an entry's bytes are.
#[derive(Debug, Clone)]
enum Tier {
    Memory(Bytes),
    Disk(PathBuf),
}

#[derive(Debug)]
struct Entry {
    tier: Tier,
    bytes: u64,
    compute: Duration,
    hits: u64,
}

/// What is known of one fragment, cached or not.
#[derive(Debug, Clone, Default)]
struct Seen {
    requests: u64,
    hits: u64,
    compute: Option<Duration>,
    bytes: u64,
    decision: String,
    clock: u64,
}

#[derive(Debug, Default)]
struct Inner {
    entries: HashMap<Key, Entry>,
    seen: HashMap<Key, Seen>,
    memory_used: u64,
    disk_used: u64,
    /// Measured rate of reading entries back (bytes of entry per second of stream).
    read_rate: f64,
    clock: u64,
}

impl Inner {
    fn read_time(&self, bytes: u64) -> Duration {
        Duration::from_secs_f64(bytes as f64 / self.read_rate)
    }

    /// Seconds saved per byte of space, over the requests expected.
    fn value(&self, requests: u64, compute: Duration, bytes: u64) -> f64 {
        let saving = compute.saturating_sub(self.read_time(bytes)).as_secs_f64();
        requests.max(1) as f64 * saving / bytes.max(1) as f64
    }

    fn entry_value(&self, entry: &Entry) -> f64 {
        self.value(entry.hits + 1, entry.compute, entry.bytes)
    }

    fn seen(&mut self, key: Key) -> &mut Seen {
        self.clock += 1;
        if self.seen.len() >= MAX_SEEN && !self.seen.contains_key(&key) {
            // Forget the half least recently asked for.
            let mut clocks: Vec<u64> = self.seen.values().map(|s| s.clock).collect();
            clocks.sort_unstable();
            let cut = clocks[clocks.len() / 2];
            self.seen.retain(|_, s| s.clock > cut);
        }
        let clock = self.clock;
        let seen = self.seen.entry(key).or_default();
        seen.clock = clock;
        seen
    }
}

/// A served entry: its decoded batches, reordered to the stream's schema.
#[derive(Debug)]
pub struct Hit {
    bytes: u64,
    batches: Vec<RecordBatch>,
}

impl Hit {
    pub fn batches(self) -> Vec<RecordBatch> {
        self.batches
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

/// How long a request computing an entry may wait, without a break, for its client to take
/// what it sent before the requests waiting for the entry stop waiting and compute it
/// beside it. Longer than a training step's pause between batches; far shorter than a
/// stalled or stopped trainer's.
pub const HELD_BACK: Duration = Duration::from_secs(1);
/// How often a waiting request looks at whether the computing one is held back.
const HELD_BACK_POLL: Duration = Duration::from_millis(100);

/// One entry being computed: its claim's lock, and since when the stream computing it has
/// been waiting for its client (`None` while it computes).
#[derive(Debug, Default)]
struct Flight {
    lock: Arc<tokio::sync::Mutex<()>>,
    held_back_since: Mutex<Option<std::time::Instant>>,
}

impl Flight {
    fn held_back_over(&self, limit: Duration) -> bool {
        self.held_back_since
            .lock()
            .is_some_and(|since| since.elapsed() > limit)
    }
}

/// The right to compute a missing entry; others asking for it wait until this is dropped, or
/// until its stream is held back by its client ([`Claim::held_back`]) for [`HELD_BACK`].
pub struct Claim {
    cache: Arc<FragmentCache>,
    cacheable: Cacheable,
    flight: Arc<Flight>,
    _guard: tokio::sync::OwnedMutexGuard<()>,
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut flights = self.cache.flights.lock();
        // The map's Arc and this claim's: nobody else waits for this key.
        if flights
            .get(&self.cacheable.key)
            .is_some_and(|flight| Arc::strong_count(flight) <= 2)
        {
            flights.remove(&self.cacheable.key);
        }
    }
}

impl std::fmt::Debug for Claim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Claim")
            .field("key", &self.cacheable.key)
            .finish_non_exhaustive()
    }
}

/// What the cache says to a stream about to run.
#[derive(Debug)]
pub enum Lookup {
    /// Stored: send these batches.
    Hit(Hit),
    /// Missing: compute it, feed a [`Tee`], and [`Claim::finish`].
    Compute(Claim, Box<Tee>),
    /// Not cached (mode off).
    Bypass,
}

/// Copies a computed stream's batches into an entry, up to the entry cap. In `auto` mode it
/// stops copying as soon as the output so far reads back too fast to be worth keeping (a
/// plain projection, usually at its first batch), so a stream the cache will decline pays
/// for no encoding at all, or a few batches'.
pub struct Tee {
    writer: Option<StreamWriter<Vec<u8>>>,
    cap: u64,
    over: bool,
    error: Option<String>,
    /// `auto` mode: the cache's measured read rate (bytes/s), to decline early.
    auto_read_rate: Option<f64>,
    /// Why copying stopped early (`auto`'s rule, met part way).
    declined: Option<String>,
    /// Arrow bytes of the batches written so far.
    raw: u64,
}

impl std::fmt::Debug for Tee {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tee")
            .field("raw", &self.raw)
            .field("over", &self.over)
            .finish_non_exhaustive()
    }
}

impl Tee {
    fn new(schema: &Schema, names: &[String], cap: u64, auto_read_rate: Option<f64>) -> Self {
        let mut metadata = schema.metadata().clone();
        metadata.insert(NAMES_KEY.to_owned(), names.join(","));
        let schema = schema.clone().with_metadata(metadata);
        let (writer, error) =
            match StreamWriter::try_new_with_options(Vec::new(), &schema, IpcWriteOptions::default()) {
                Ok(w) => (Some(w), None),
                Err(e) => (None, Some(e.to_string())),
            };
        Self {
            writer,
            cap,
            over: false,
            error,
            auto_read_rate,
            declined: None,
            raw: 0,
        }
    }

    /// Adds one batch of the shard's output (before any rows are skipped); `compute` is the
    /// time producing the output took so far, this batch included.
    pub fn push(&mut self, batch: &RecordBatch, compute: Duration) {
        let Some(writer) = &mut self.writer else { return };
        let raw = batch.get_array_memory_size() as u64;
        if let Some(rate) = self.auto_read_rate {
            // The admission rule on the output so far, checked before encoding: this batch's
            // entry bytes estimated at the compression seen so far (none for the first).
            let written = writer.get_ref().len() as f64;
            let ratio = if self.raw > 0 {
                written / self.raw as f64
            } else {
                1.0
            };
            let read = (written + raw as f64 * ratio) / rate;
            if read > MAX_READ_SHARE * compute.as_secs_f64() {
                self.declined = Some(format!(
                    "reading back would save under half of computing (stopped after {} bytes \
                     of output: computing {:.1} ms, reading back ≈ {:.1} ms)",
                    self.raw + raw,
                    ms(compute),
                    read * 1e3
                ));
                self.writer = None;
                return;
            }
        }
        if let Err(e) = writer.write(batch) {
            self.error = Some(e.to_string());
            self.writer = None;
        } else if writer.get_ref().len() as u64 > self.cap {
            self.over = true;
            self.writer = None;
        }
        self.raw += raw;
    }

    fn finish(self) -> std::result::Result<Vec<u8>, String> {
        if let Some(reason) = self.declined {
            return Err(reason);
        }
        if self.over {
            return Err(format!("its output is over the entry cap ({} bytes)", self.cap));
        }
        let Some(mut writer) = self.writer else {
            return Err(format!(
                "it could not be encoded: {}",
                self.error.unwrap_or_default()
            ));
        };
        writer.finish().map_err(|e| e.to_string())?;
        writer.into_inner().map_err(|e| e.to_string())
    }
}

impl Claim {
    /// Whether the stream computing the entry is waiting for its client to take what it
    /// sent (`true`) or computing again (`false`).
    pub fn held_back(&self, waiting: bool) {
        let mut since = self.flight.held_back_since.lock();
        match (waiting, *since) {
            (true, None) => *since = Some(std::time::Instant::now()),
            (false, _) => *since = None,
            (true, Some(_)) => {}
        }
    }

    /// The computed stream ended whole after `compute` of producing: keep its output if it
    /// pays. Returns the decision, as the metrics and `explain` say it.
    pub fn finish(self, tee: Tee, compute: Duration) -> String {
        let cache = Arc::clone(&self.cache);
        let decision = match tee.finish() {
            Ok(bytes) => cache.admit(&self.cacheable, bytes, compute),
            Err(reason) => {
                cache.metrics.cache_declined.inc();
                format!("not cached: {reason}")
            }
        };
        let mut inner = cache.lock();
        let seen = inner.seen(self.cacheable.key);
        seen.decision = decision.clone();
        seen.compute = Some(compute);
        decision
    }
}

/// The fragment cache of one server.
#[derive(Debug)]
pub struct FragmentCache {
    config: CacheConfig,
    metrics: Arc<Metrics>,
    inner: Mutex<Inner>,
    flights: Mutex<HashMap<Key, Arc<Flight>>>,
}

impl FragmentCache {
    /// A cache with `config`'s budgets; entries already in its disk directory (from an
    /// earlier run) are found again.
    pub fn open(config: CacheConfig, metrics: Arc<Metrics>) -> std::result::Result<Self, StartupError> {
        let mut inner = Inner {
            read_rate: INITIAL_READ_RATE,
            ..Inner::default()
        };
        if let Some(dir) = &config.disk {
            let unusable = |source| StartupError::CacheDir {
                dir: dir.clone(),
                cause: source,
            };
            std::fs::create_dir_all(dir).map_err(unusable)?;
            let listing = std::fs::read_dir(dir).map_err(unusable)?;
            for file in listing.flatten() {
                let path = file.path();
                let Some((key, compute)) = parse_entry_name(&path) else {
                    continue;
                };
                let Ok(meta) = file.metadata() else { continue };
                if inner.disk_used + meta.len() > config.disk_bytes {
                    let _ = std::fs::remove_file(&path);
                    continue;
                }
                inner.disk_used += meta.len();
                inner.entries.insert(
                    key,
                    Entry {
                        tier: Tier::Disk(path),
                        bytes: meta.len(),
                        compute,
                        hits: 0,
                    },
                );
            }
        }
        let cache = Self {
            config,
            metrics,
            inner: Mutex::new(inner),
            flights: Mutex::new(HashMap::new()),
        };
        cache.publish(&cache.lock());
        Ok(cache)
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, Inner> {
        self.inner.lock()
    }

    fn publish(&self, inner: &Inner) {
        self.metrics.cache_memory_bytes.set(inner.memory_used as i64);
        self.metrics.cache_disk_bytes.set(inner.disk_used as i64);
        self.metrics.cache_entries.set(inner.entries.len() as i64);
    }

    /// Before a stream of `cacheable` runs with output `schema`: its stored output if there
    /// is one the caller may read, else the claim to compute it (after waiting for anyone
    /// computing it now).
    pub async fn lookup(
        self: &Arc<Self>,
        cacheable: &Cacheable,
        schema: &SchemaRef,
        grant: &Grant,
    ) -> Result<Lookup> {
        if cacheable.mode == CacheMode::Off {
            let mut inner = self.lock();
            let seen = inner.seen(cacheable.key);
            seen.requests += 1;
            seen.decision = "not cached: caching is off for this dataset".into();
            self.metrics.cache_lookups("bypass");
            return Ok(Lookup::Bypass);
        }
        self.lock().seen(cacheable.key).requests += 1;
        if let Some(hit) = self.hit(cacheable.key, schema, grant)? {
            return Ok(Lookup::Hit(hit));
        }
        let flight = {
            let mut flights = self.flights.lock();
            Arc::clone(flights.entry(cacheable.key).or_default())
        };
        let Some(guard) = Self::wait_for_claim(&flight).await else {
            self.metrics.cache_lookups("beside");
            self.lock().seen(cacheable.key).decision =
                "computed beside a request held back by its client".into();
            return Ok(Lookup::Bypass);
        };
        // Computed while this request waited.
        if let Some(hit) = self.hit(cacheable.key, schema, grant)? {
            return Ok(Lookup::Hit(hit));
        }
        self.metrics.cache_lookups("miss");
        let cap = self.config.max_entry_bytes();
        let auto_read_rate = (cacheable.mode == CacheMode::Auto).then(|| self.lock().read_rate);
        Ok(Lookup::Compute(
            Claim {
                cache: Arc::clone(self),
                cacheable: cacheable.clone(),
                flight,
                _guard: guard,
            },
            Box::new(Tee::new(schema, &cacheable.names, cap, auto_read_rate)),
        ))
    }

    /// The claim of `flight` once its holder drops it; `None` once the holder has been held
    /// back by its client for [`HELD_BACK`] (its output will come at its client's pace).
    async fn wait_for_claim(flight: &Flight) -> Option<tokio::sync::OwnedMutexGuard<()>> {
        let acquire = Arc::clone(&flight.lock).lock_owned();
        tokio::pin!(acquire);
        loop {
            tokio::select! {
                guard = &mut acquire => return Some(guard),
                () = tokio::time::sleep(HELD_BACK_POLL) => {
                    if flight.held_back_over(HELD_BACK) {
                        return None;
                    }
                }
            }
        }
    }

    /// The stored entry of `cacheable`, if any: what a part of a shard (a ticket's
    /// `skip_rows` and `take_rows`) is served from. A part is never computed into an entry,
    /// so a miss claims nothing and waits for no stream computing the whole.
    pub fn peek(&self, cacheable: &Cacheable, schema: &SchemaRef, grant: &Grant) -> Result<Option<Hit>> {
        if cacheable.mode == CacheMode::Off {
            return Ok(None);
        }
        self.hit(cacheable.key, schema, grant)
    }

    /// Whether an entry of `key` is stored (not checked, not counted as a lookup).
    pub fn holds(&self, key: Key) -> bool {
        self.lock().entries.contains_key(&key)
    }

    /// The entry of `key`, decoded, if it is stored, intact, and readable by `grant`.
    fn hit(&self, key: Key, schema: &SchemaRef, grant: &Grant) -> Result<Option<Hit>> {
        let tier = {
            let inner = self.lock();
            match inner.entries.get(&key) {
                Some(e) => e.tier.clone(),
                None => return Ok(None),
            }
        };
        let (bytes, from_disk) = match tier {
            Tier::Memory(b) => (b, false),
            Tier::Disk(path) => match read_checked(&path) {
                Ok(b) => (b, true),
                Err(reason) => {
                    tracing::warn!(entry = %key, %reason, "dropping a damaged cache entry");
                    self.remove(key);
                    return Ok(None);
                }
            },
        };
        let size = bytes.len() as u64;
        let batches = match decode(bytes, schema, grant) {
            Ok(b) => b,
            Err(Refused::Grant(e)) => return Err(e),
            Err(Refused::Damaged(reason)) => {
                tracing::warn!(entry = %key, %reason, "dropping an unreadable cache entry");
                self.remove(key);
                return Ok(None);
            }
        };
        let mut inner = self.lock();
        let compute = match inner.entries.get_mut(&key) {
            Some(e) => {
                e.hits += 1;
                e.compute
            }
            None => Duration::ZERO,
        };
        let read = inner.read_time(size);
        let seen = inner.seen(key);
        seen.hits += 1;
        self.metrics
            .cache_lookups(if from_disk { "hit_disk" } else { "hit_memory" });
        self.metrics
            .cache_saved_seconds
            .inc_by(compute.saturating_sub(read).as_secs_f64());
        Ok(Some(Hit { bytes: size, batches }))
    }

    /// A hit's stream finished: `elapsed` of producing for `bytes` of entry.
    pub fn observe_read(&self, bytes: u64, elapsed: Duration) {
        if elapsed.is_zero() || bytes == 0 {
            return;
        }
        let rate = bytes as f64 / elapsed.as_secs_f64();
        let mut inner = self.lock();
        inner.read_rate = 0.8 * inner.read_rate + 0.2 * rate;
    }

    fn remove(&self, key: Key) {
        let mut inner = self.lock();
        if let Some(entry) = inner.entries.remove(&key) {
            match entry.tier {
                Tier::Memory(_) => inner.memory_used -= entry.bytes,
                Tier::Disk(path) => {
                    inner.disk_used -= entry.bytes;
                    let _ = std::fs::remove_file(path);
                }
            }
        }
        self.publish(&inner);
    }

    /// Keeps `bytes` (the encoded output of `cacheable`, computed in `compute`) if it pays.
    fn admit(&self, cacheable: &Cacheable, bytes: Vec<u8>, compute: Duration) -> String {
        let size = bytes.len() as u64;
        let key = cacheable.key;
        let mut inner = self.lock();
        let read = inner.read_time(size);
        let requests = inner.seen.get(&key).map_or(1, |s| s.requests);
        inner.seen(key).bytes = size;
        let costs = format!(
            "computing took {:.1} ms, reading back ≈ {:.1} ms, {} bytes, asked {requests}×",
            ms(compute),
            ms(read),
            size
        );
        if cacheable.mode == CacheMode::Auto && read.as_secs_f64() > MAX_READ_SHARE * compute.as_secs_f64() {
            self.metrics.cache_declined.inc();
            return format!("not cached: reading back would save under half of computing ({costs})");
        }
        let value = inner.value(requests, compute, size);
        let bytes = Bytes::from(bytes);
        // Memory first, making room by moving less valuable entries to disk.
        let mut spill = Vec::new();
        if size <= self.config.memory_bytes {
            let victims = victims(
                &inner,
                size,
                self.config.memory_bytes - inner.memory_used,
                value,
                true,
                cacheable.mode,
            );
            if let Some(victims) = victims {
                for victim in victims {
                    if let Some(e) = inner.entries.remove(&victim) {
                        inner.memory_used -= e.bytes;
                        if let Tier::Memory(b) = e.tier {
                            spill.push((victim, b, e.compute, e.hits));
                        }
                    }
                }
                inner.memory_used += size;
                inner.entries.insert(
                    key,
                    Entry {
                        tier: Tier::Memory(bytes),
                        bytes: size,
                        compute,
                        hits: 0,
                    },
                );
                self.metrics.cache_admitted.inc();
                self.publish(&inner);
                drop(inner);
                for (victim, b, compute, hits) in spill {
                    self.metrics.cache_evicted.inc();
                    self.to_disk(victim, b, compute, hits, true);
                }
                return format!("cached in memory ({costs})");
            }
        }
        drop(inner);
        if self.to_disk(key, bytes, compute, 0, cacheable.mode == CacheMode::On) {
            self.metrics.cache_admitted.inc();
            return format!("cached on disk ({costs})");
        }
        self.metrics.cache_declined.inc();
        format!("not cached: no room, every entry kept saves more per byte ({costs})")
    }

    /// Writes an entry to the disk tier, evicting less valuable ones; false when there is no
    /// disk tier or no room worth making.
    fn to_disk(&self, key: Key, bytes: Bytes, compute: Duration, hits: u64, forced: bool) -> bool {
        let Some(dir) = &self.config.disk else {
            return false;
        };
        let size = bytes.len() as u64;
        if size > self.config.disk_bytes {
            return false;
        }
        let removed = {
            let mut inner = self.lock();
            let value = inner.value(hits + 1, compute, size);
            let mode = if forced { CacheMode::On } else { CacheMode::Auto };
            let free = self.config.disk_bytes.saturating_sub(inner.disk_used);
            let Some(victims) = victims(&inner, size, free, value, false, mode) else {
                return false;
            };
            let mut removed = Vec::new();
            for victim in victims {
                if let Some(e) = inner.entries.remove(&victim) {
                    inner.disk_used -= e.bytes;
                    if let Tier::Disk(p) = e.tier {
                        removed.push(p);
                    }
                }
            }
            // Reserved now, so concurrent spills do not overshoot the budget.
            inner.disk_used += size;
            removed
        };
        for path in removed {
            self.metrics.cache_evicted.inc();
            let _ = std::fs::remove_file(path);
        }
        let path = dir.join(entry_name(key, compute, &bytes));
        let tmp = path.with_extension("tmp");
        let written = std::fs::write(&tmp, &bytes).and_then(|()| std::fs::rename(&tmp, &path));
        let ok = written.is_ok();
        let mut inner = self.lock();
        match written {
            Ok(()) => {
                inner.entries.insert(
                    key,
                    Entry {
                        tier: Tier::Disk(path),
                        bytes: size,
                        compute,
                        hits,
                    },
                );
            }
            Err(e) => {
                tracing::warn!(entry = %key, error = %e, "writing a cache entry to disk");
                let _ = std::fs::remove_file(&tmp);
                inner.disk_used -= size;
            }
        }
        self.publish(&inner);
        ok
    }

    /// What the cache knows of a query's shards, for `explain`.
    pub fn describe(&self, keys: &[Key]) -> String {
        let inner = self.lock();
        let mut cached = (0, 0u64, 0u64);
        let mut asked = 0;
        let mut decisions: BTreeMap<String, usize> = BTreeMap::new();
        for key in keys {
            if let Some(e) = inner.entries.get(key) {
                cached.0 += 1;
                cached.1 += e.bytes;
                cached.2 += e.hits;
            }
            if let Some(s) = inner.seen.get(key) {
                asked += s.requests;
                if !s.decision.is_empty() {
                    let kind = s.decision.split(" (").next().unwrap_or_default().to_owned();
                    *decisions.entry(kind).or_default() += 1;
                }
            }
        }
        let mut text = format!(
            "{} of {} shards cached ({} bytes, {} hits); shards asked for {asked}×; reading entries back at {:.0} MB/s",
            cached.0,
            keys.len(),
            cached.1,
            cached.2,
            inner.read_rate / 1e6
        );
        for (decision, n) in decisions {
            text.push_str(&format!("\n  {n} shards: {decision}"));
        }
        if let Some(example) = keys
            .iter()
            .find_map(|k| inner.seen.get(k))
            .filter(|s| !s.decision.is_empty())
        {
            text.push_str(&format!("\n  e.g. {}", example.decision));
        }
        text
    }
}

/// Entries to evict from a tier (memory or disk) so that `size` more bytes fit, least
/// valuable first; `None` when that would evict something worth more per byte than the
/// newcomer (`value`), unless `mode` forces it.
fn victims(
    inner: &Inner,
    size: u64,
    free: u64,
    value: f64,
    memory: bool,
    mode: CacheMode,
) -> Option<Vec<Key>> {
    if size <= free {
        return Some(Vec::new());
    }
    let mut candidates: Vec<(f64, Key, u64)> = inner
        .entries
        .iter()
        .filter(|(_, e)| matches!(e.tier, Tier::Memory(_)) == memory)
        .map(|(k, e)| (inner.entry_value(e), *k, e.bytes))
        .collect();
    candidates.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut freed = free;
    let mut out = Vec::new();
    for (v, key, bytes) in candidates {
        if freed >= size {
            break;
        }
        if v >= value && mode != CacheMode::On {
            return None;
        }
        freed += bytes;
        out.push(key);
    }
    (freed >= size).then_some(out)
}

#[derive(Debug)]
enum Refused {
    Grant(ServerError),
    Damaged(String),
}

/// An entry's batches, checked against the caller's grant and reordered to `schema`. Their
/// buffers are slices of `bytes` (the IPC stream is decoded in place).
fn decode(bytes: Bytes, schema: &SchemaRef, grant: &Grant) -> std::result::Result<Vec<RecordBatch>, Refused> {
    let damaged = |e: arrow::error::ArrowError| Refused::Damaged(e.to_string());
    // Every entry ends with the stream's end marker: one cut at a message boundary would
    // otherwise decode as fewer rows.
    if !bytes.ends_with(&END_OF_STREAM) {
        return Err(Refused::Damaged("no end-of-stream marker".into()));
    }
    let mut buffer = Buffer::from(bytes);
    let mut decoder = StreamDecoder::new();
    let mut stored = Vec::new();
    while !buffer.is_empty() {
        let before = buffer.len();
        if let Some(batch) = decoder.decode(&mut buffer).map_err(damaged)? {
            stored.push(batch);
        } else if buffer.len() == before {
            break;
        }
    }
    decoder.finish().map_err(damaged)?;
    let stored_schema = decoder
        .schema()
        .ok_or_else(|| Refused::Damaged("no schema".into()))?;
    let names = stored_schema
        .metadata()
        .get(NAMES_KEY)
        .ok_or_else(|| Refused::Damaged("no names recorded".into()))?;
    for name in names.split(',').filter(|n| !n.is_empty()) {
        grant.check_spelling(name).map_err(Refused::Grant)?;
    }
    let indices = schema
        .fields()
        .iter()
        .map(|f| {
            stored_schema
                .index_of(f.name())
                .ok()
                .filter(|&i| stored_schema.field(i).data_type() == f.data_type())
                .ok_or_else(|| Refused::Damaged(format!("column `{}` missing or of another type", f.name())))
        })
        .collect::<std::result::Result<Vec<usize>, Refused>>()?;
    stored
        .into_iter()
        .map(|batch| {
            let columns = indices.iter().map(|&i| Arc::clone(batch.column(i))).collect();
            RecordBatch::try_new(Arc::clone(schema), columns).map_err(|e| Refused::Damaged(e.to_string()))
        })
        .collect()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// `<key>-<compute µs>-<checksum>.arrows`.
fn entry_name(key: Key, compute: Duration, bytes: &[u8]) -> String {
    format!(
        "{key}-{}-{:016x}.{SUFFIX}",
        compute.as_micros(),
        xxhash_rust::xxh3::xxh3_64(bytes)
    )
}

fn parse_entry_name(path: &Path) -> Option<(Key, Duration)> {
    if path.extension()? != SUFFIX {
        return None;
    }
    let stem = path.file_stem()?.to_str()?;
    let mut parts = stem.split('-');
    let key = parts.next()?.parse().ok()?;
    let micros: u64 = parts.next()?.parse().ok()?;
    let _checksum = parts.next()?;
    Some((key, Duration::from_micros(micros)))
}

/// A disk entry's bytes, if they match the checksum in its name.
fn read_checked(path: &Path) -> std::result::Result<Bytes, String> {
    let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
    let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or_default();
    let expected = stem.rsplit('-').next().unwrap_or_default();
    let actual = format!("{:016x}", xxhash_rust::xxh3::xxh3_64(&bytes));
    if expected != actual {
        return Err(format!("checksum {actual}, its name says {expected}"));
    }
    Ok(Bytes::from(bytes))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use arrow::array::{ArrayRef, Int64Array, StringArray};
    use arrow::datatypes::{DataType, Field};

    use super::*;

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("text", DataType::Utf8, false),
        ]))
    }

    /// A batch of `rows` rows whose text makes its entry about `rows * 56` bytes.
    fn batch(rows: i64) -> RecordBatch {
        let ids: ArrayRef = Arc::new(Int64Array::from_iter_values(0..rows));
        let text: ArrayRef = Arc::new(StringArray::from_iter_values((0..rows).map(|i| {
            format!(
                "{:040x}",
                (i as u128).wrapping_mul(0x9e3779b97f4a7c15_9e3779b97f4a7c15)
            )
        })));
        RecordBatch::try_new(schema(), vec![ids, text]).expect("batch")
    }

    fn cacheable(key: u128, mode: CacheMode) -> Cacheable {
        Cacheable {
            key: Key(key),
            names: vec!["images".into()],
            mode,
        }
    }

    /// Computes `key` (if missing) as `rows` rows taking `compute`; the decision.
    async fn compute(
        cache: &Arc<FragmentCache>,
        c: &Cacheable,
        rows: i64,
        compute: Duration,
    ) -> Option<String> {
        match cache.lookup(c, &schema(), &Grant::All).await.expect("lookup") {
            Lookup::Compute(claim, mut tee) => {
                tee.push(&batch(rows), compute);
                Some(claim.finish(*tee, compute))
            }
            Lookup::Hit(_) | Lookup::Bypass => None,
        }
    }

    fn open(config: CacheConfig) -> Arc<FragmentCache> {
        Arc::new(FragmentCache::open(config, Arc::new(Metrics::new())).expect("cache"))
    }

    /// A hit's buffers are the entry's own bytes, not copies, in every batch; a truncated
    /// entry is damaged, never a short answer.
    #[test]
    fn a_hit_reads_its_buffers_in_place() {
        let mut tee = Tee::new(&schema(), &["images".to_owned()], u64::MAX, None);
        tee.push(&batch(300), Duration::from_millis(5));
        tee.push(&batch(200), Duration::from_millis(9));
        let bytes = Bytes::from(tee.finish().expect("entry"));
        let range = bytes.as_ptr() as usize..bytes.as_ptr() as usize + bytes.len();
        let batches = decode(bytes.clone(), &schema(), &Grant::All).expect("decode");
        assert_eq!(
            batches.iter().map(RecordBatch::num_rows).collect::<Vec<_>>(),
            [300, 200]
        );
        assert_eq!(batches[1], batch(200));
        for batch in &batches {
            for column in batch.columns() {
                let data = column.to_data();
                for buffer in data.buffers() {
                    assert!(range.contains(&(buffer.as_ptr() as usize)), "a copied buffer");
                }
            }
        }
        // Cut inside a message, and cut where the last batch begins (its marker gone too).
        let mut one = Tee::new(&schema(), &["images".to_owned()], u64::MAX, None);
        one.push(&batch(300), Duration::from_millis(5));
        let one = one.finish().expect("entry");
        let at_boundary = bytes.slice(..one.len() - END_OF_STREAM.len());
        for cut in [bytes.slice(..bytes.len() - 100), at_boundary] {
            assert!(matches!(
                decode(cut, &schema(), &Grant::All),
                Err(Refused::Damaged(_))
            ));
        }
    }

    #[tokio::test]
    async fn auto_keeps_what_saves_compute_and_serves_it_reordered() {
        let cache = open(CacheConfig::default());
        // Tens of KB read back at 200 MB/s take ~0.1 ms: computing in 0.05 ms saves nothing…
        let cheap = compute(
            &cache,
            &cacheable(1, CacheMode::Auto),
            1000,
            Duration::from_micros(50),
        )
        .await;
        assert!(cheap.expect("computed").starts_with("not cached: reading back"));
        assert!(
            compute(
                &cache,
                &cacheable(1, CacheMode::Auto),
                1000,
                Duration::from_micros(50)
            )
            .await
            .is_some()
        );
        // … computing in 50 ms is worth keeping, and forced on keeps even the cheap one.
        let dear = compute(
            &cache,
            &cacheable(2, CacheMode::Auto),
            1000,
            Duration::from_millis(50),
        )
        .await;
        assert!(dear.expect("computed").starts_with("cached in memory"), "kept");
        let forced = compute(
            &cache,
            &cacheable(3, CacheMode::On),
            1000,
            Duration::from_micros(250),
        )
        .await;
        assert!(forced.expect("computed").starts_with("cached in memory"));

        // Served in the asker's column order, under its schema.
        let reordered = Arc::new(Schema::new(vec![
            Field::new("text", DataType::Utf8, false),
            Field::new("id", DataType::Int64, false),
        ]));
        let Lookup::Hit(hit) = cache
            .lookup(&cacheable(2, CacheMode::Auto), &reordered, &Grant::All)
            .await
            .expect("lookup")
        else {
            panic!("a hit");
        };
        let batches = hit.batches();
        assert_eq!(batches[0].schema(), reordered, "no cache metadata leaks");
        assert_eq!(batches[0].column(1), batch(1000).column(0));
    }

    #[tokio::test]
    async fn an_entry_is_served_only_to_callers_granted_what_it_was_computed_from() {
        let cache = open(CacheConfig::default());
        let c = cacheable(7, CacheMode::On);
        compute(&cache, &c, 10, Duration::from_millis(5))
            .await
            .expect("computed");
        let others = Grant::Datasets(BTreeSet::from(["clicks".to_owned()]));
        let refused = cache.lookup(&c, &schema(), &others).await.expect_err("refused");
        assert!(matches!(refused, ServerError::PermissionDenied(_)), "{refused:?}");
        let images = Grant::Datasets(BTreeSet::from(["images".to_owned()]));
        assert!(matches!(
            cache.lookup(&c, &schema(), &images).await.expect("lookup"),
            Lookup::Hit(_)
        ));
    }

    #[tokio::test]
    async fn memory_spills_the_least_valuable_to_disk_which_survives_a_restart() {
        let dir = tempfile::tempdir().expect("dir");
        let mut tee = Tee::new(&schema(), &["images".into()], u64::MAX, None);
        tee.push(&batch(1000), Duration::ZERO);
        let size = tee.finish().expect("encoded").len() as u64;
        let config = CacheConfig {
            // One entry fits in memory, not two.
            memory_bytes: size * 3 / 2,
            disk: Some(dir.path().to_owned()),
            disk_bytes: 1 << 20,
            ..CacheConfig::default()
        };
        let cache = open(config.clone());
        // The cheaper to recompute of two goes to disk.
        compute(
            &cache,
            &cacheable(1, CacheMode::Auto),
            1000,
            Duration::from_millis(20),
        )
        .await;
        compute(
            &cache,
            &cacheable(2, CacheMode::Auto),
            1000,
            Duration::from_millis(80),
        )
        .await;
        {
            let inner = cache.lock();
            assert!(matches!(inner.entries[&Key(1)].tier, Tier::Disk(_)));
            assert!(matches!(inner.entries[&Key(2)].tier, Tier::Memory(_)));
        }
        // A third, less valuable than the one in memory, goes to disk directly.
        let third = compute(
            &cache,
            &cacheable(3, CacheMode::Auto),
            1000,
            Duration::from_millis(10),
        )
        .await;
        assert!(third.expect("computed").starts_with("cached on disk"));
        drop(cache);

        // A new process finds the disk entries; a damaged one is dropped, not served.
        let files: Vec<PathBuf> = std::fs::read_dir(dir.path())
            .expect("dir")
            .map(|e| e.expect("entry").path())
            .collect();
        assert_eq!(files.len(), 2);
        let damaged = files
            .iter()
            .find(|p| p.to_string_lossy().contains(&Key(3).to_string()))
            .expect("entry 3");
        let mut bytes = std::fs::read(damaged).expect("read");
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0xff;
        std::fs::write(damaged, bytes).expect("write");
        let cache = open(config);
        let hit = cache
            .lookup(&cacheable(1, CacheMode::Auto), &schema(), &Grant::All)
            .await
            .expect("lookup");
        assert!(matches!(hit, Lookup::Hit(_)), "entry 1 outlived the restart");
        let miss = cache
            .lookup(&cacheable(3, CacheMode::Auto), &schema(), &Grant::All)
            .await
            .expect("lookup");
        assert!(
            matches!(miss, Lookup::Compute(..)),
            "damaged entry 3 is computed again"
        );
        assert!(!damaged.exists());
    }

    /// Entry `key` claimed by a first request, and a second request for it under way: what
    /// the second's lookup gives, `Compute` or `Bypass` (`None`: an error or a hit).
    async fn claimed_and_waiting(key: u128) -> (Claim, pushdown_task::Task<Option<&'static str>>) {
        let cache = open(CacheConfig::default());
        let c = cacheable(key, CacheMode::On);
        let Lookup::Compute(claim, _tee) = cache.lookup(&c, &schema(), &Grant::All).await.expect("lookup")
        else {
            panic!("a miss");
        };
        let waiter = pushdown_task::Task::spawn(async move {
            match cache.lookup(&c, &schema(), &Grant::All).await {
                Ok(Lookup::Compute(..)) => Some("compute"),
                Ok(Lookup::Bypass) => Some("bypass"),
                _ => None,
            }
        });
        (claim, waiter)
    }

    #[tokio::test]
    async fn an_abandoned_computation_lets_the_next_request_compute() {
        let (claim, waiter) = claimed_and_waiting(9).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "the second request waits for the first");
        drop(claim); // the first stream's client went away
        assert_eq!(
            waiter.await.expect("joins"),
            Some("compute"),
            "the waiter computes it"
        );
    }

    #[tokio::test]
    async fn a_computation_held_back_by_its_client_is_not_waited_for() {
        let (claim, waiter) = claimed_and_waiting(10).await;
        // Brief waits for the client (a training step between batches) keep the others waiting.
        for _ in 0..3 {
            claim.held_back(true);
            tokio::time::sleep(HELD_BACK / 2).await;
            claim.held_back(false);
        }
        assert!(
            !waiter.is_finished(),
            "still waiting for a computation that goes on"
        );
        // A client that stops reading: the waiter computes beside it, uncached, without the
        // claim, which stays with the first stream.
        claim.held_back(true);
        assert_eq!(
            waiter.await.expect("joins"),
            Some("bypass"),
            "the waiter computes beside it, uncached"
        );
        claim.held_back(false);
        drop(claim);
    }

    #[test]
    fn modes_off_wins_then_on() {
        let mut config = CacheConfig::default();
        config.modes.insert("a".into(), CacheMode::On);
        config.modes.insert("b".into(), CacheMode::Off);
        assert_eq!(config.mode_of(["a", "c"]), CacheMode::On);
        assert_eq!(config.mode_of(["a", "b"]), CacheMode::Off);
        assert_eq!(config.mode_of(["c"]), CacheMode::Auto);
        assert_eq!("OFF".parse::<CacheMode>(), Ok(CacheMode::Off));
        assert!("sometimes".parse::<CacheMode>().is_err());
    }

    #[test]
    fn auto_stops_copying_an_output_cheaper_to_compute_than_to_read() {
        // Read back at 1 MB/s. The first batch took 3× its reading time: kept.
        let mut tee = Tee::new(&schema(), &["images".into()], u64::MAX, Some(1e6));
        let size = batch(1000).get_array_memory_size() as f64;
        tee.push(&batch(1000), Duration::from_secs_f64(3.0 * size / 1e6));
        let written = tee
            .writer
            .as_ref()
            .map(|w| w.get_ref().len())
            .expect("still copying") as f64;
        // Twice the entry bytes, now read in more than half the (given) compute: stopped,
        // before encoding the second batch.
        tee.push(&batch(1000), Duration::from_secs_f64(written / 1e6));
        assert!(tee.writer.is_none(), "copying stops once the rule is met");
        assert_eq!(tee.raw as f64, size, "the declined batch was not encoded");
        let reason = tee.finish().expect_err("declined");
        assert!(reason.contains("under half of computing"), "{reason}");

        let mut kept = Tee::new(&schema(), &["images".into()], u64::MAX, Some(1e12));
        for ms in 1..=3 {
            kept.push(&batch(1000), Duration::from_millis(ms));
        }
        assert!(kept.finish().is_ok(), "expensive output is copied whole");
    }
}
