//! Prometheus metrics of a server, exposed as text at `/metrics`.

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
pub struct CodecLabels {
    pub codec: &'static str,
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
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("pushdown");
        let m = Self {
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
        };
        registry.register(
            "unreadable_files",
            "Files the catalog holds as unusable now (unreadable footer, damaged layout, other \
             schema): requests touching them get DataLoss",
            m.unreadable_files.clone(),
        );
        registry.register(
            "dataset_files",
            "Readable files of each dataset, labelled with the dataset's current version (changes \
             when a file is added, removed or rewritten)",
            m.dataset_files.clone(),
        );
        registry.register(
            "unreadable_files_found",
            "File versions found unreadable when listing the catalog (each version counted once)",
            m.unreadable_files_found.clone(),
        );
        registry.register(
            "panics_contained",
            "Panics inside a request (a decoder or kernel) turned into that request's error",
            m.panics_contained.clone(),
        );
        registry.register(
            "bytes_scanned",
            "Bytes the Parquet reader fetched from storage for DoGet streams",
            m.bytes_scanned.clone(),
        );
        registry.register(
            "bytes_sent",
            "Bytes of Flight messages sent (IPC, after compression)",
            m.bytes_sent.clone(),
        );
        registry.register(
            "rows_scanned",
            "Rows the Parquet reader decoded or evaluated",
            m.rows_scanned.clone(),
        );
        registry.register("rows_sent", "Rows sent to clients", m.rows_sent.clone());
        registry.register(
            "batches_sent",
            "Record batches sent, by the codec of their IPC body (adaptive streams choose per batch)",
            m.batches_sent.clone(),
        );
        registry.register(
            "row_groups_scanned",
            "Row groups of the requested shards",
            m.row_groups_scanned.clone(),
        );
        registry.register(
            "row_groups_pruned",
            "Row groups of the requested shards skipped by statistics or bloom filters",
            m.row_groups_pruned.clone(),
        );
        registry.register(
            "row_groups_pruned_at_planning",
            "Row groups ruled out by their statistics when planning: no endpoint scans them",
            m.row_groups_pruned_at_planning.clone(),
        );
        registry.register(
            "store_bytes_read",
            "Bytes requested from the object store (footers, indexes and data)",
            m.store_bytes_read.clone(),
        );
        registry.register(
            "store_requests",
            "Read requests made to the object store",
            m.store_requests.clone(),
        );
        registry.register(
            "requests",
            "Flight requests by method and outcome",
            m.requests.clone(),
        );
        registry.register(
            "active_streams",
            "DoGet streams in progress",
            m.active_streams.clone(),
        );
        registry.register(
            "stream_duration_seconds",
            "Duration of DoGet streams",
            m.stream_seconds.clone(),
        );
        Self { registry, ..m }
    }

    pub(crate) fn record_request(&self, method: &'static str, outcome: &'static str) {
        self.requests
            .get_or_create(&RequestLabels { method, outcome })
            .inc();
    }

    pub(crate) fn record_batch(&self, codec: pushdown_protocol::Compression) {
        let codec = match codec {
            pushdown_protocol::Compression::None => "none",
            pushdown_protocol::Compression::Lz4 => "lz4",
            pushdown_protocol::Compression::Zstd => "zstd",
            pushdown_protocol::Compression::Adaptive => "adaptive",
        };
        self.batches_sent.get_or_create(&CodecLabels { codec }).inc();
    }

    pub(crate) fn record_stream(&self, stats: &StreamStats) {
        self.bytes_scanned.inc_by(stats.bytes_scanned);
        self.bytes_sent.inc_by(stats.bytes_sent);
        self.rows_scanned.inc_by(stats.rows_scanned);
        self.rows_sent.inc_by(stats.rows_sent);
        self.row_groups_scanned.inc_by(stats.row_groups);
        self.row_groups_pruned.inc_by(stats.row_groups_pruned);
        self.stream_seconds.observe(stats.elapsed_ns as f64 / 1e9);
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::error!(error = %e, "encoding metrics");
        }
        out
    }
}

/// Serves `GET /metrics` until `shutdown` completes.
pub async fn serve_metrics(
    listener: tokio::net::TcpListener,
    metrics: Arc<Metrics>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use axum::routing::get;
    let app = axum::Router::new().route(
        "/metrics",
        get(move || {
            let metrics = Arc::clone(&metrics);
            async move {
                (
                    [(
                        axum::http::header::CONTENT_TYPE,
                        "text/plain; version=0.0.4; charset=utf-8",
                    )],
                    metrics.encode(),
                )
            }
        }),
    );
    axum::serve(listener, app).with_graceful_shutdown(shutdown).await
}
