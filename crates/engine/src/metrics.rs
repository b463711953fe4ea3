//! Prometheus metrics of a server; the front end exposes them as text at `/metrics`.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use pushdown_protocol::StreamStats;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub method: &'static str,
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpSideLabels {
    pub op: String,
    pub side: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CodecLabels {
    pub codec: &'static str,
}

impl CodecLabels {
    fn of(codec: pushdown_protocol::Compression) -> Self {
        Self { codec: codec.name() }
    }
}

/// A dataset at one version (an info metric: the value is the dataset's file count).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DatasetLabels {
    pub dataset: String,
    pub version: String,
}

/// Counters of everything a server does. Cheap to clone (`Arc`s inside).
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    pub bytes_scanned: Counter,
    pub bytes_sent: Counter,
    pub rows_scanned: Counter,
    pub rows_sent: Counter,
    pub row_groups_scanned: Counter,
    pub row_groups_pruned: Counter,
    pub row_groups_pruned_at_planning: Counter,
    pub store_bytes_read: Counter<u64, AtomicU64>,
    pub store_requests: Counter<u64, AtomicU64>,
    pub requests: Family<RequestLabels, Counter>,
    pub active_streams: Gauge,
    pub stream_seconds: Histogram,
    pub unreadable_files: Gauge,
    pub unreadable_files_found: Counter,
    pub dataset_files: Family<DatasetLabels, Gauge>,
    pub panics_contained: Counter,
    pub batches_sent: Family<CodecLabels, Counter>,
    pub streams_by_codec: Family<CodecLabels, Counter>,
    pub op_rows: Family<OpSideLabels, Counter>,
    pub deferred_streams: Counter,
    pub read_ahead: Family<OutcomeLabels, Counter>,
    pub cache_lookups: Family<OutcomeLabels, Counter>,
    pub cache_admitted: Counter,
    pub cache_declined: Counter,
    pub cache_evicted: Counter,
    pub cache_saved_seconds: Counter<f64, AtomicU64>,
    pub cache_memory_bytes: Gauge,
    pub cache_disk_bytes: Gauge,
    pub cache_entries: Gauge,
    pub busy_fraction: Gauge<f64, AtomicU64>,
    pub client_wait_fraction: Gauge<f64, AtomicU64>,
    pub scaling_clients: Gauge,
    pub scaling_servers: Gauge,
    pub scaling_servers_wanted: Gauge,
    pub scaling_load_ratio: Gauge<f64, AtomicU64>,
    /// Where the scaling gauges come from (set when the server opens; read on each scrape).
    scaling: std::sync::OnceLock<Arc<crate::scaling::Scaling>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("pushdown");
        let m = Self::unregistered();
        m.register_scaling(&mut registry);
        m.register_placement(&mut registry);
        m.register_cache(&mut registry);
        m.register_catalog(&mut registry);
        m.register_io(&mut registry);
        m.register_requests(&mut registry);
        Self { registry, ..m }
    }

    /// Every metric at zero, registered nowhere.
    fn unregistered() -> Self {
        Self {
            registry: Registry::default(),
            bytes_scanned: Counter::default(),
            bytes_sent: Counter::default(),
            rows_scanned: Counter::default(),
            rows_sent: Counter::default(),
            row_groups_scanned: Counter::default(),
            row_groups_pruned: Counter::default(),
            row_groups_pruned_at_planning: Counter::default(),
            store_bytes_read: Counter::default(),
            store_requests: Counter::default(),
            requests: Family::default(),
            active_streams: Gauge::default(),
            stream_seconds: Histogram::new(exponential_buckets(0.001, 4.0, 10)),
            unreadable_files: Gauge::default(),
            unreadable_files_found: Counter::default(),
            dataset_files: Family::default(),
            panics_contained: Counter::default(),
            batches_sent: Family::default(),
            streams_by_codec: Family::default(),
            op_rows: Family::default(),
            deferred_streams: Counter::default(),
            read_ahead: Family::default(),
            cache_lookups: Family::default(),
            cache_admitted: Counter::default(),
            cache_declined: Counter::default(),
            cache_evicted: Counter::default(),
            cache_saved_seconds: Counter::default(),
            cache_memory_bytes: Gauge::default(),
            cache_disk_bytes: Gauge::default(),
            cache_entries: Gauge::default(),
            busy_fraction: Gauge::default(),
            client_wait_fraction: Gauge::default(),
            scaling_clients: Gauge::default(),
            scaling_servers: Gauge::default(),
            scaling_servers_wanted: Gauge::default(),
            scaling_load_ratio: Gauge::default(),
            scaling: std::sync::OnceLock::new(),
        }
    }

    /// The scaling signal: this server's load and what its loaders report.
    fn register_scaling(&self, registry: &mut Registry) {
        registry.register(
            "busy_fraction",
            "This server's CPU use over the scaling window, as a fraction of its cores",
            self.busy_fraction.clone(),
        );
        registry.register(
            "client_wait_fraction",
            "The share of their time the reporting loaders waited for batches, over the scaling \
             window",
            self.client_wait_fraction.clone(),
        );
        registry.register(
            "scaling_clients",
            "Loaders that reported their wait in the scaling window",
            self.scaling_clients.clone(),
        );
        registry.register(
            "scaling_servers",
            "Servers the reporting loaders read from now (the largest fleet one reports)",
            self.scaling_servers.clone(),
        );
        registry.register(
            "scaling_servers_wanted",
            "Servers that would remove the loaders' stall, from this server's busy fraction and \
             their wait (never more than now when the stall is not this server's CPU)",
            self.scaling_servers_wanted.clone(),
        );
        registry.register(
            "scaling_load_ratio",
            "scaling_servers_wanted / scaling_servers: the per-server value a Kubernetes HPA \
             averages against a target of 1",
            self.scaling_load_ratio.clone(),
        );
    }

    /// Where fragment ops ran and which streams were opened ahead.
    fn register_placement(&self, registry: &mut Registry) {
        registry.register(
            "op_rows",
            "Rows each fragment op was asked for, by where it ran: server, or client (the \
             stream left it to the client: a split placement, or this server's cores were taken)",
            self.op_rows.clone(),
        );
        registry.register(
            "deferred_streams",
            "Shard streams answered un-reduced, their ops left to the client",
            self.deferred_streams.clone(),
        );
        registry.register(
            "read_ahead_streams",
            "Endpoints opened ahead for a lone reader, by outcome: taken (its reader came), \
             dropped (another stream opened first), stale (its reader came, but the ticket is \
             now placed differently, or its file changed or could not be checked), expired (nobody came)",
            self.read_ahead.clone(),
        );
    }

    /// The fragment cache.
    fn register_cache(&self, registry: &mut Registry) {
        registry.register(
            "cache_lookups",
            "Shard streams by what the fragment cache had: hit_memory, hit_disk, miss (computed \
             here), bypass (caching off for the dataset), beside (computed uncached beside a stream \
             held back by its client)",
            self.cache_lookups.clone(),
        );
        registry.register(
            "cache_admitted",
            "Computed shard outputs the cache kept (their saving beat the space they take)",
            self.cache_admitted.clone(),
        );
        registry.register(
            "cache_declined",
            "Computed shard outputs the cache did not keep (reading back saves too little, too \
             large, or no room worth making)",
            self.cache_declined.clone(),
        );
        registry.register(
            "cache_evicted",
            "Entries moved out of memory or dropped from disk to make room for more valuable ones",
            self.cache_evicted.clone(),
        );
        registry.register(
            "cache_saved_seconds",
            "Compute time the cache's hits saved (compute time of the entry minus its read time)",
            self.cache_saved_seconds.clone(),
        );
        registry.register(
            "cache_memory_bytes",
            "Bytes of cache entries in memory",
            self.cache_memory_bytes.clone(),
        );
        registry.register(
            "cache_disk_bytes",
            "Bytes of cache entries on disk",
            self.cache_disk_bytes.clone(),
        );
        registry.register(
            "cache_entries",
            "Cache entries, both tiers",
            self.cache_entries.clone(),
        );
    }

    /// The catalog's files and the requests' contained panics.
    fn register_catalog(&self, registry: &mut Registry) {
        registry.register(
            "unreadable_files",
            "Files the catalog holds as unusable now (unreadable footer, damaged layout, other \
             schema): requests touching them get DataLoss",
            self.unreadable_files.clone(),
        );
        registry.register(
            "dataset_files",
            "Readable files of each dataset, labelled with the dataset's current version (changes \
             when a file is added, removed or rewritten)",
            self.dataset_files.clone(),
        );
        registry.register(
            "unreadable_files_found",
            "File versions found unreadable when listing the catalog (each version counted once)",
            self.unreadable_files_found.clone(),
        );
        registry.register(
            "panics_contained",
            "Panics inside a request (a decoder or kernel) turned into that request's error",
            self.panics_contained.clone(),
        );
    }

    /// What was read from storage and sent to clients.
    fn register_io(&self, registry: &mut Registry) {
        registry.register(
            "bytes_scanned",
            "Bytes the Parquet reader fetched from storage for DoGet streams",
            self.bytes_scanned.clone(),
        );
        registry.register(
            "bytes_sent",
            "Bytes of Flight messages sent (IPC, after compression)",
            self.bytes_sent.clone(),
        );
        registry.register(
            "rows_scanned",
            "Rows the Parquet reader decoded or evaluated",
            self.rows_scanned.clone(),
        );
        registry.register("rows_sent", "Rows sent to clients", self.rows_sent.clone());
        registry.register(
            "batches_sent",
            "Record batches sent, by the codec of their IPC body (adaptive streams choose per batch)",
            self.batches_sent.clone(),
        );
        registry.register(
            "streams_by_codec",
            "DoGet streams begun, by the codec their ticket asks for (pushdown_protocol::choose_codec's choice for the client that planned it)",
            self.streams_by_codec.clone(),
        );
        registry.register(
            "row_groups_scanned",
            "Row groups of the requested shards",
            self.row_groups_scanned.clone(),
        );
        registry.register(
            "row_groups_pruned",
            "Row groups of the requested shards skipped by statistics or bloom filters",
            self.row_groups_pruned.clone(),
        );
        registry.register(
            "row_groups_pruned_at_planning",
            "Row groups ruled out by their statistics when planning: no endpoint scans them",
            self.row_groups_pruned_at_planning.clone(),
        );
        registry.register(
            "store_bytes_read",
            "Bytes requested from the object store (footers, indexes and data)",
            self.store_bytes_read.clone(),
        );
        registry.register(
            "store_requests",
            "Read requests made to the object store",
            self.store_requests.clone(),
        );
    }

    /// Flight requests and DoGet streams.
    fn register_requests(&self, registry: &mut Registry) {
        registry.register(
            "requests",
            "Flight requests by method and outcome",
            self.requests.clone(),
        );
        registry.register(
            "active_streams",
            "DoGet streams in progress",
            self.active_streams.clone(),
        );
        registry.register(
            "stream_duration_seconds",
            "Duration of DoGet streams",
            self.stream_seconds.clone(),
        );
    }

    pub fn record_request(&self, method: &'static str, outcome: &'static str) {
        self.requests
            .get_or_create(&RequestLabels { method, outcome })
            .inc();
    }

    /// The requests of `method` answered with `outcome` so far.
    pub fn requests_of(&self, method: &'static str, outcome: &'static str) -> u64 {
        self.requests
            .get_or_create(&RequestLabels { method, outcome })
            .get()
    }

    pub fn read_ahead(&self, outcome: &'static str) {
        self.read_ahead.get_or_create(&OutcomeLabels { outcome }).inc();
    }

    pub fn cache_lookups(&self, outcome: &'static str) {
        self.cache_lookups.get_or_create(&OutcomeLabels { outcome }).inc();
    }

    /// `rows` of a stream through `ops`, the first `on_server` of them run here.
    pub fn record_op_rows(&self, ops: &[String], on_server: usize, rows: u64) {
        for (i, op) in ops.iter().enumerate() {
            let side = if i < on_server { "server" } else { "client" };
            self.op_rows
                .get_or_create(&OpSideLabels { op: op.clone(), side })
                .inc_by(rows);
        }
    }

    pub fn record_batch(&self, codec: pushdown_protocol::Compression) {
        self.batches_sent.get_or_create(&CodecLabels::of(codec)).inc();
    }

    /// A stream begun whose ticket asks for `codec`.
    pub fn record_stream_codec(&self, codec: pushdown_protocol::Compression) {
        self.streams_by_codec.get_or_create(&CodecLabels::of(codec)).inc();
    }

    pub fn record_stream(&self, stats: &StreamStats) {
        self.bytes_scanned.inc_by(stats.bytes_scanned);
        self.bytes_sent.inc_by(stats.bytes_sent);
        self.rows_scanned.inc_by(stats.rows_scanned);
        self.rows_sent.inc_by(stats.rows_sent);
        self.row_groups_scanned.inc_by(stats.row_groups);
        self.row_groups_pruned.inc_by(stats.row_groups_pruned);
        self.stream_seconds.observe(stats.elapsed_ns as f64 / 1e9);
    }

    pub fn watch_scaling(&self, scaling: Arc<crate::scaling::Scaling>) {
        let _ = self.scaling.set(scaling);
    }

    /// The scaling signal now (and the gauges set from it); none before the server opens.
    pub fn scaling_signal(&self) -> Option<pushdown_protocol::ScalingSignal> {
        let signal = self.scaling.get()?.signal();
        self.busy_fraction.set(signal.busy_fraction);
        self.client_wait_fraction.set(signal.wait_fraction);
        self.scaling_clients.set(i64::from(signal.clients));
        self.scaling_servers.set(i64::from(signal.servers));
        self.scaling_servers_wanted.set(i64::from(signal.servers_wanted));
        self.scaling_load_ratio.set(crate::scaling::load_ratio(&signal));
        Some(signal)
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        self.scaling_signal();
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::error!(error = %e, "encoding metrics");
        }
        out
    }
}
