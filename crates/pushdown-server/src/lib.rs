//! The pushdown server: Parquet datasets next to their storage, served over Arrow Flight.
//!
//! ```text
//!  --data DIR | s3://…        ┌────────────────────── Server ──────────────────────┐
//!  ┌──────────────┐  list,   │ Catalog: dataset → files → row groups (footers cached) │
//!  │ images/*.pq  │◀─footers─┤ Engine:  DataFusion; ShardTable per ticket             │
//!  │ clicks/*.pq  │◀─ranges──┤   (projection, statistics/page/bloom pruning, filters) │
//!  └──────────────┘          │ PushdownService: Flight (GetFlightInfo, DoGet, …)      │
//!   InstrumentedStore        │ CpuRuntime: decode + encode off the async threads      │
//!   (bytes, requests)        │ Metrics: Prometheus text on /metrics                   │
//!                            └────────────────────────────────────────────────────────┘
//! ```
//!
//! A client sends `GetFlightInfo` with a `ScanRequest` (or SQL); the reply has one endpoint
//! per shard (file × row-group range). Each `DoGet` streams that shard's reduced rows as
//! compressed Arrow IPC. Bad input of any kind is an error status for that request only: the
//! server never panics on input and stays up.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use pushdown_server::{Server, ServerConfig, open_store};
//! let store = open_store("./data")?;
//! let server = Server::builder(store).config(ServerConfig::default()).open().await?;
//! let running = server.spawn("127.0.0.1:0".parse()?).await?;
//! assert_ne!(running.addr().port(), 0);
//! running.shutdown().await?;
//! # Ok(()) }
//! ```

mod auth;
mod cache;
mod catalog;
mod codec;
mod conjunction;
mod error;
mod flight_sql;
mod metrics;
mod pool;
mod prefetch;
mod profile;
mod query;
mod runtime;
mod scaling;
mod service;
mod store;
mod table;
mod udf;
mod views;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arrow_flight::flight_service_server::FlightServiceServer;
use datafusion::execution::object_store::{ObjectStoreRegistry, ObjectStoreUrl};
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use object_store::ObjectStore;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

pub use auth::{Caller, Grant, MIN_TOKEN_LEN, Tokens};
pub use cache::{CacheConfig, CacheMode};
pub use catalog::{Catalog, DataFile, Dataset};
pub use error::ServerError;
pub use flight_sql::{FlightSql, Prepared};
pub use metrics::{Metrics, serve_metrics};
/// Stream codecs, as `ServerConfig::plain_client_codec` takes them.
pub use pushdown_protocol::Compression;
pub use query::{MAX_EXPR_DEPTH, Planned, Shape, dataframe};
pub use scaling::to_json as scaling_json;
pub use service::PushdownService;
pub use store::{InstrumentedStore, ReadRequest, open_store, reads_in_flight_for};
pub use udf::{DatasetResources, OpLimits, udfs};
pub use views::{View, ViewDecl, Views};

use crate::error::Result;
use crate::query::Engine;
use crate::runtime::CpuRuntime;

/// Limits and sizes of a server. Every field has a deliberate default.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Rows per record batch produced by scans.
    pub batch_size: usize,
    /// A shard grows by whole row groups until its projected bytes reach this.
    pub shard_target_bytes: u64,
    /// … or its rows reach this.
    pub shard_max_rows: u64,
    /// DoGet streams running at once; more wait up to `queue_timeout`, then get
    /// `ResourceExhausted`.
    pub max_concurrent_streams: usize,
    pub queue_timeout: Duration,
    /// Longest a DoGet stream may run.
    pub request_timeout: Duration,
    /// Memory pool of the query engine, shared by all requests.
    pub memory_limit: usize,
    /// Threads of the CPU runtime (decode, filter, ops, encode); also the partitions of
    /// queries that are not row-wise.
    pub cpu_threads: usize,
    /// Streams that run their fragment ops here at once before a stream whose client allows
    /// it (`Deferral::IfBusy`) is answered un-reduced, its ops left to the client. `None`:
    /// `cpu_threads` (each reducing stream has a core); `Some(0)`: every such stream is
    /// left to its client.
    pub reducing_streams: Option<usize>,
    /// Row-group ranges read at once by the streams running now, shared among them: a
    /// store with long round trips (S3: tens of ms per request) is read at its bandwidth
    /// only with several requests in flight, however few cores decode. A stream reads
    /// `max(cpu_threads, store_reads_in_flight) / running streams` ranges at once (at least
    /// one), emitted in order. See [`reads_in_flight_for`].
    pub store_reads_in_flight: usize,
    /// The catalog is listed again when older than this.
    pub catalog_refresh: Duration,
    /// Target size of one Flight message.
    pub max_flight_data_bytes: usize,
    /// gRPC message size limit, both directions.
    pub max_message_bytes: usize,
    /// Location put in endpoints (`grpc://host:port`); none means "this server".
    pub advertise: Option<String>,
    /// The codec of streams for clients that cannot choose one (SQL text or a path as the
    /// descriptor: pyarrow, ADBC, any Flight client). None: uncompressed for peers on this
    /// host, [`Compression::Adaptive`] for the rest. Set it where the peer address misleads
    /// (behind a local proxy every peer is on loopback).
    pub plain_client_codec: Option<pushdown_protocol::Compression>,
    /// Whether a stream that opens with no other running also opens, and starts decoding,
    /// the endpoint planned after it (a reader taking endpoints in order finds it ready).
    pub read_ahead: bool,
    /// An op call whose output may exceed this many bytes per row is refused at planning
    /// (`decode_resize(image, 8192, 8192)`: 192 MiB a row).
    pub max_op_row_bytes: u64,
    /// Batches are cut so that one batch of the largest op output stays under this.
    pub max_op_batch_bytes: u64,
    /// Longest SQL text (or fragment predicate) accepted, in bytes.
    pub max_sql_bytes: usize,
    /// The most memory one query may hold, out of `memory_limit` (every query has a pool
    /// of its own over the server's).
    pub max_query_memory: usize,
    /// The fragment cache: budgets, disk directory, modes by dataset.
    pub cache: CacheConfig,
    /// The scaling signal's window: clients' reports and the server's CPU use over this
    /// long answer "how many servers would remove the stall".
    pub scaling_window: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            batch_size: 8192,
            shard_target_bytes: 64 << 20,
            shard_max_rows: 1 << 20,
            max_concurrent_streams: 64,
            queue_timeout: Duration::from_secs(30),
            request_timeout: Duration::from_secs(3600),
            memory_limit: 1 << 30,
            cpu_threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
            reducing_streams: None,
            store_reads_in_flight: 1,
            catalog_refresh: Duration::from_secs(5),
            max_flight_data_bytes: 2 << 20,
            max_message_bytes: 64 << 20,
            advertise: None,
            plain_client_codec: None,
            read_ahead: true,
            max_op_row_bytes: 16 << 20,
            max_op_batch_bytes: 256 << 20,
            max_sql_bytes: 64 << 10,
            max_query_memory: 512 << 20,
            cache: CacheConfig::default(),
            scaling_window: Duration::from_secs(10),
        }
    }
}

/// TLS for the Flight port (rustls): the server's certificate chain and private key, PEM,
/// and optionally the CA whose client certificates every connection must present (mutual
/// TLS). Its `Debug` never shows the key.
#[derive(Clone)]
pub struct ServerTls {
    cert: Vec<u8>,
    key: Vec<u8>,
    client_ca: Option<Vec<u8>>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("mutual", &self.client_ca.is_some())
            .finish_non_exhaustive()
    }
}

impl ServerTls {
    /// From PEM text: the certificate chain and its private key.
    pub fn new(cert_pem: impl Into<Vec<u8>>, key_pem: impl Into<Vec<u8>>) -> Self {
        Self {
            cert: cert_pem.into(),
            key: key_pem.into(),
            client_ca: None,
        }
    }

    /// From PEM files (`--tls-cert`, `--tls-key`).
    pub fn from_files(cert: &std::path::Path, key: &std::path::Path) -> Result<Self> {
        Ok(Self::new(read_pem(cert)?, read_pem(key)?))
    }

    /// Requires every client to present a certificate signed by `ca_pem` (mutual TLS).
    pub fn require_client_certs(mut self, ca_pem: impl Into<Vec<u8>>) -> Self {
        self.client_ca = Some(ca_pem.into());
        self
    }

    fn config(&self) -> tonic::transport::ServerTlsConfig {
        use tonic::transport::{Certificate, Identity, ServerTlsConfig};
        let config = ServerTlsConfig::new().identity(Identity::from_pem(&self.cert, &self.key));
        match &self.client_ca {
            Some(ca) => config.client_ca_root(Certificate::from_pem(ca)),
            None => config,
        }
    }
}

/// A PEM file's bytes, or an error that names the file.
pub fn read_pem(path: &std::path::Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| ServerError::BadRequest(format!("reading {}: {e}", path.display())))
}

/// Shared by every request of a server.
#[derive(Debug)]
pub(crate) struct State {
    engine: Engine,
    metrics: Arc<Metrics>,
    cpu: CpuRuntime,
    cache: Arc<cache::FragmentCache>,
    scaling: Arc<scaling::Scaling>,
    streams: Arc<Semaphore>,
    /// Streams running fragment ops here now: a stream that may leave its ops to the client
    /// does so when there are as many as CPU threads.
    reducing: Arc<std::sync::atomic::AtomicUsize>,
    /// Streams computing now (any stream, not only reducing ones): not waiting for their
    /// clients. A stream opened shares the cores with these, not with streams their readers
    /// hold back.
    computing: Arc<std::sync::atomic::AtomicUsize>,
    /// What adaptive streams learnt of each peer's link, for the next stream to it.
    links: std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, codec::LinkMemory>>,
    config: Arc<ServerConfig>,
    /// The tokens requests must carry; none: every request reads everything.
    tokens: Option<Arc<Tokens>>,
    /// The endpoint opened ahead for a lone reader, and each plan's endpoint order.
    prefetch: prefetch::Prefetch,
}

/// Builds a [`Server`] over a store rooted at the data root.
#[derive(Debug)]
pub struct ServerBuilder {
    store: Arc<dyn ObjectStore>,
    config: ServerConfig,
    record_reads: bool,
    tokens: Option<Tokens>,
    tls: Option<ServerTls>,
    views: Views,
}

impl ServerBuilder {
    /// Serves `views` (a `--catalog` file) as datasets beside the storage root's.
    pub fn views(mut self, views: Views) -> Self {
        self.views = views;
        self
    }

    pub fn config(mut self, config: ServerConfig) -> Self {
        self.config = config;
        self
    }

    /// Requests must carry one of `tokens` and read only what it grants.
    pub fn tokens(mut self, tokens: Tokens) -> Self {
        self.tokens = Some(tokens);
        self
    }

    /// Serves Flight over TLS only.
    pub fn tls(mut self, tls: ServerTls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Keep every read request made to the store (see [`Server::store`]); for tests and
    /// I/O accounting.
    pub fn record_reads(mut self) -> Self {
        self.record_reads = true;
        self
    }

    /// Lists the catalog and prepares the query engine.
    pub async fn open(self) -> Result<Server> {
        if let Some(tls) = &self.tls {
            // A certificate or key that does not parse fails here, before anything listens.
            tonic::transport::Server::builder()
                .tls_config(tls.config())
                .map_err(|e| ServerError::BadRequest(format!("TLS certificate or key: {e}")))?;
        }
        let metrics = Arc::new(Metrics::new());
        let mut store = InstrumentedStore::new(self.store, Arc::clone(&metrics));
        if self.record_reads {
            store = store.with_recording();
        }
        let store = Arc::new(store);
        let config = Arc::new(self.config);
        let store_url = ObjectStoreUrl::parse("pushdown://catalog").map_err(ServerError::from)?;
        let registry = Arc::new(CatalogOnlyRegistry {
            url: store_url.clone(),
            store: Arc::clone(&store) as Arc<dyn ObjectStore>,
        });
        let runtime = RuntimeEnvBuilder::new()
            .with_memory_limit(config.memory_limit, 1.0)
            .with_object_store_registry(registry)
            .build_arc()?;
        // The catalog reads footers into the engine's metadata cache: scans never re-read them.
        let catalog = Arc::new(
            Catalog::open(
                Arc::clone(&store) as Arc<dyn ObjectStore>,
                config.catalog_refresh,
                runtime.cache_manager.get_file_metadata_cache(),
                Arc::clone(&metrics),
            )
            .await?,
        );
        let cpu = CpuRuntime::new(config.cpu_threads)
            .map_err(|e| ServerError::Internal(format!("starting the CPU runtime: {e}")))?;
        let cache = Arc::new(cache::FragmentCache::open(
            config.cache.clone(),
            Arc::clone(&metrics),
        )?);
        let scaling = Arc::new(scaling::Scaling::new(config.cpu_threads, config.scaling_window));
        metrics.watch_scaling(Arc::clone(&scaling));
        let state = Arc::new(State {
            cache,
            scaling,
            engine: Engine::new(
                catalog,
                Arc::new(self.views),
                runtime,
                store_url,
                Arc::clone(&config),
            ),
            metrics,
            cpu,
            streams: Arc::new(Semaphore::new(config.max_concurrent_streams.max(1))),
            reducing: Arc::default(),
            computing: Arc::default(),
            links: Default::default(),
            config,
            tokens: self.tokens.map(Arc::new),
            prefetch: prefetch::Prefetch::default(),
        });
        Ok(Server {
            state,
            store,
            tls: self.tls,
        })
    }
}

/// A pushdown server, ready to serve.
#[derive(Debug, Clone)]
pub struct Server {
    state: Arc<State>,
    store: Arc<InstrumentedStore>,
    tls: Option<ServerTls>,
}

impl Server {
    /// Plans `request` as `GetFlightInfo` does: result schema, shape, estimates, tickets.
    pub async fn plan(&self, request: &pushdown_protocol::ScanRequest) -> Result<Planned> {
        self.state.engine.plan(request, &Grant::All).await
    }

    /// Runs `ticket` in this process as its `DoGet` does (the same checks and physical plan),
    /// with no Flight, IPC or socket in between: its record batches.
    pub async fn run_ticket(
        &self,
        ticket: &pushdown_protocol::ShardTicket,
    ) -> Result<datafusion::physical_plan::SendableRecordBatchStream> {
        let opened = self
            .state
            .engine
            .open(
                ticket,
                self.state
                    .config
                    .cpu_threads
                    .max(self.state.config.store_reads_in_flight),
                &Grant::All,
            )
            .await?;
        Ok(crate::query::ordered_stream(
            opened.plan,
            opened.ctx.task_ctx(),
            opened.parallelism,
        )?)
    }

    pub fn builder(store: Arc<dyn ObjectStore>) -> ServerBuilder {
        ServerBuilder {
            store,
            config: ServerConfig::default(),
            record_reads: false,
            tokens: None,
            tls: None,
            views: Views::default(),
        }
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.state.metrics
    }

    /// Whether an endpoint is opened ahead now, waiting for its reader (see
    /// `ServerConfig::read_ahead`).
    pub fn holds_read_ahead(&self) -> bool {
        self.state.prefetch.holds()
    }

    /// The decorated store every read goes through.
    pub fn store(&self) -> &Arc<InstrumentedStore> {
        &self.store
    }

    pub fn catalog(&self) -> &Arc<Catalog> {
        self.state.engine.catalog()
    }

    /// The tonic service, with message limits and compression set.
    pub fn service(&self) -> FlightServiceServer<PushdownService> {
        FlightServiceServer::new(PushdownService::new(Arc::clone(&self.state)))
            .max_decoding_message_size(self.state.config.max_message_bytes)
            .max_encoding_message_size(self.state.config.max_message_bytes)
    }

    /// Serves Flight on `listener` until `shutdown` completes, then lets streams finish.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl std::future::Future<Output = ()> + Send,
    ) -> Result<()> {
        // No Nagle: a stream's last frames and trailers (and every small response) would wait
        // for the peer's delayed ACK, ~40 ms per request. The builder's `tcp_nodelay` covers
        // only listeners tonic binds itself, so it is set on the accepted sockets here.
        let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
        // grpc.health.v1 for probes and load balancers: SERVING for the whole server ("") and
        // for Flight once the catalog is open (it is, by the time a Server exists).
        let (health, health_service) = tonic_health::server::health_reporter();
        health.set_serving::<FlightServiceServer<PushdownService>>().await;
        let mut builder = tonic::transport::Server::builder();
        if let Some(tls) = &self.tls {
            builder = builder
                .tls_config(tls.config())
                .map_err(|e| ServerError::BadRequest(format!("TLS certificate or key: {e}")))?;
        }
        builder
            // Large windows: a stream of multi-MiB messages must not stall on 64 KiB acks.
            .initial_stream_window_size(Some(8 << 20))
            .initial_connection_window_size(Some(32 << 20))
            .http2_keepalive_interval(Some(Duration::from_secs(30)))
            .add_service(health_service)
            .add_service(self.service())
            .serve_with_incoming_shutdown(incoming, shutdown)
            .await
            .map_err(|e| ServerError::Internal(format!("transport: {e}")))
    }

    /// Binds `addr` and serves in the background (tests, the demo).
    pub async fn spawn(self, addr: SocketAddr) -> Result<RunningServer> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|e| ServerError::BadRequest(format!("binding {addr}: {e}")))?;
        let addr = listener
            .local_addr()
            .map_err(|e| ServerError::Internal(format!("local address: {e}")))?;
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let task = tokio::spawn(self.serve(listener, async {
            let _ = rx.await;
        }));
        Ok(RunningServer {
            addr,
            scheme,
            shutdown: Some(tx),
            task: Some(task),
        })
    }
}

/// A server serving in the background; stops when shut down or dropped.
#[derive(Debug)]
pub struct RunningServer {
    addr: SocketAddr,
    /// `https` when serving TLS.
    scheme: &'static str,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<Result<()>>>,
}

impl RunningServer {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://addr` (`https://` with TLS), for clients.
    pub fn url(&self) -> String {
        format!("{}://{}", self.scheme, self.addr)
    }

    /// Stops accepting, waits for the server to wind down.
    pub async fn shutdown(mut self) -> Result<()> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        match self.task.take() {
            Some(task) => task
                .await
                .map_err(|e| ServerError::Internal(format!("server task: {e}")))?,
            None => Ok(()),
        }
    }
}

impl Drop for RunningServer {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// The object-store registry of the query engine: only the catalog's store exists, so no
/// query can read a file outside the data root, whatever URL it names.
#[derive(Debug)]
struct CatalogOnlyRegistry {
    url: ObjectStoreUrl,
    store: Arc<dyn ObjectStore>,
}

impl ObjectStoreRegistry for CatalogOnlyRegistry {
    fn register_store(&self, url: &url::Url, _store: Arc<dyn ObjectStore>) -> Option<Arc<dyn ObjectStore>> {
        tracing::warn!(%url, "refusing to register an object store outside the catalog");
        None
    }

    fn get_store(&self, url: &url::Url) -> datafusion::error::Result<Arc<dyn ObjectStore>> {
        let ours: &url::Url = self.url.as_ref();
        if url.scheme() == ours.scheme() && url.host_str() == ours.host_str() {
            Ok(Arc::clone(&self.store))
        } else {
            Err(datafusion::error::DataFusionError::Plan(format!(
                "`{url}` is outside the catalog; only datasets can be read"
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::Int64Array;
    use arrow::datatypes::{DataType, Field, Schema};
    use arrow::record_batch::RecordBatch;
    use datafusion::datasource::physical_plan::{FileScanConfig, ParquetSource};
    use datafusion::datasource::source::DataSourceExec;
    use datafusion::physical_plan::ExecutionPlan;
    use pushdown_protocol::{FilterPushdown, Query, ScanRequest};

    use super::*;

    async fn server_with_one_file() -> (tempfile::TempDir, Server) {
        let dir = tempfile::tempdir().expect("dir");
        std::fs::create_dir_all(dir.path().join("t")).expect("mkdir");
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false)]));
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![Arc::new(Int64Array::from_iter_values(0..100))],
        )
        .expect("batch");
        let file = std::fs::File::create(dir.path().join("t/a.parquet")).expect("file");
        let mut writer = parquet::arrow::ArrowWriter::try_new(file, schema, None).expect("writer");
        writer.write(&batch).expect("write");
        writer.close().expect("close");
        let store = open_store(&dir.path().to_string_lossy()).expect("store");
        let server = Server::builder(store).open().await.expect("open");
        (dir, server)
    }

    fn parquet_source(plan: &Arc<dyn ExecutionPlan>) -> Option<ParquetSource> {
        if let Some(exec) = plan.downcast_ref::<DataSourceExec>() {
            let config = exec.data_source().downcast_ref::<FileScanConfig>()?;
            return config.file_source().downcast_ref::<ParquetSource>().cloned();
        }
        plan.children().into_iter().find_map(parquet_source)
    }

    /// Every Parquet read option is set deliberately, and each shard's scan carries them.
    #[tokio::test]
    async fn scans_use_the_explicit_parquet_settings() {
        let (_dir, server) = server_with_one_file().await;
        for (pushdown, expected) in [(FilterPushdown::On, true), (FilterPushdown::Off, false)] {
            let mut request = ScanRequest::new(Query::Sql("SELECT x FROM t WHERE x > 10".into()));
            request.filter_pushdown = pushdown;
            let planned = server
                .state
                .engine
                .plan(&request, &Grant::All)
                .await
                .expect("plan");
            let ticket = planned.tickets().remove(0);
            let opened = server
                .state
                .engine
                .open(&ticket, 1, &Grant::All)
                .await
                .expect("open");
            let source = parquet_source(&opened.plan).expect("a parquet scan");
            let o = &source.table_parquet_options().global;
            assert!(o.pruning, "row-group pruning by statistics");
            assert!(o.enable_page_index, "page index");
            assert!(o.bloom_filter_on_read, "bloom filters");
            assert!(o.reorder_filters);
            assert!(!o.schema_force_view_types, "plain Utf8/Binary out");
            assert_eq!(o.metadata_size_hint, Some(64 * 1024));
            assert_eq!(o.pushdown_filters, expected, "per-request filter pushdown");
            use datafusion::datasource::physical_plan::FileSource;
            assert!(
                FileSource::filter(&source).is_some(),
                "the filter reaches the scan for pruning"
            );
            // One partition per shard: deterministic order.
            assert_eq!(
                opened.plan.properties().output_partitioning().partition_count(),
                1
            );
        }
    }

    #[tokio::test]
    async fn auto_filter_pushdown_is_decided_at_planning() {
        let (_dir, server) = server_with_one_file().await;
        let planned = server
            .state
            .engine
            .plan(
                &ScanRequest::new(Query::Sql("SELECT x FROM t".into())),
                &Grant::All,
            )
            .await
            .expect("plan");
        assert_eq!(
            planned.request.filter_pushdown,
            FilterPushdown::Off,
            "nothing to push"
        );
        assert_eq!(planned.tickets().len(), 1);
        assert!(planned.is_row_wise());
    }
}
