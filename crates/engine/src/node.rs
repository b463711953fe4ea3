//! A node: everything a server's requests share below the wire — the catalog and the query
//! engine, the fragment cache, the CPU runtime, the metrics, the access tokens, the
//! endpoint read ahead — and the one way from a ticket to its batches.

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

use datafusion::execution::object_store::{ObjectStoreRegistry, ObjectStoreUrl};
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use object_store::ObjectStore;
use tokio::sync::Semaphore;

use crate::auth::Tokens;
use crate::cache::FragmentCache;
use crate::catalog::Catalog;
use crate::company::Company;
use crate::config::ServerConfig;
use crate::metrics::Metrics;
use crate::prefetch::Prefetch;
use crate::query::Engine;
use crate::runtime::CpuRuntime;
use crate::scaling::Scaling;
use crate::startup::StartupError;
use crate::store::InstrumentedStore;
use crate::tokenizers::TokenizerCatalog;
use crate::views::Views;

/// Shared by every request of a server.
#[derive(Debug)]
pub struct Node {
    pub(crate) engine: Engine,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) cpu: CpuRuntime,
    /// The streams whose fragment ops this server left to their clients: they read and send,
    /// reducing nothing, on threads of their own (as many as `cpu`'s, whose threads run
    /// `reducing_nice` steps below these). On `cpu` they waited behind every shard being
    /// reduced, each a batch decoded in one go, and a trainer completing its own shards
    /// waited with them (simulated with eight trainers on one core: far below the best static
    /// placement; `crates/client/src/control/tests.rs`, and `benches/RESULTS.md`,
    /// "One server core shared by 3 trainers"). Short control work runs here too
    /// (planning, counting: [`Node::on_control`]), never behind a shard being reduced.
    pub(crate) unreduced: CpuRuntime,
    pub(crate) cache: Arc<FragmentCache>,
    pub(crate) scaling: Arc<Scaling>,
    /// Streams running fragment ops here now: a stream that may leave its ops to the client
    /// does so when there are as many as CPU threads.
    pub(crate) reducing: Arc<AtomicUsize>,
    /// Streams computing now (any stream, not only reducing ones): not waiting for their
    /// clients. A stream opened shares the cores with these, not with streams their readers
    /// hold back.
    pub(crate) computing: Arc<AtomicUsize>,
    pub(crate) config: Arc<ServerConfig>,
    /// The tokens requests must carry; none: every request reads everything.
    pub(crate) tokens: Option<Arc<Tokens>>,
    /// The endpoint opened ahead for a lone reader, and each plan's endpoint order.
    pub(crate) prefetch: Prefetch,
    /// Streams (and actions that plan or read) admitted at once
    /// (`ServerConfig::max_concurrent_streams`).
    pub(crate) streams: Arc<Semaphore>,
    /// The streams on the reducing cores, by client: who reduced alone.
    pub(crate) company: Arc<Company>,
    /// The decorated store every read goes through.
    store: Arc<InstrumentedStore>,
}

/// Builds a [`Node`] over a store rooted at the data root.
#[derive(Debug)]
pub struct NodeBuilder {
    store: Arc<dyn ObjectStore>,
    config: ServerConfig,
    record_reads: bool,
    tokens: Option<Tokens>,
    views: Views,
}

impl NodeBuilder {
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

    /// Keep every read request made to the store (see [`Node::store`]); for tests and
    /// I/O accounting.
    pub fn record_reads(mut self) -> Self {
        self.record_reads = true;
        self
    }

    /// Lists the catalog and prepares the query engine.
    pub async fn open(self) -> std::result::Result<Node, StartupError> {
        let metrics = Arc::new(Metrics::new());
        let mut store = InstrumentedStore::new(self.store, Arc::clone(&metrics));
        if self.record_reads {
            store = store.with_recording();
        }
        let store = Arc::new(store);
        let config = Arc::new(self.config);
        let store_url = ObjectStoreUrl::parse("pushdown://catalog").map_err(StartupError::Engine)?;
        let registry = Arc::new(CatalogOnlyRegistry {
            url: store_url.clone(),
            store: Arc::clone(&store) as Arc<dyn ObjectStore>,
        });
        let runtime = RuntimeEnvBuilder::new()
            .with_memory_limit(config.memory_limit, 1.0)
            .with_object_store_registry(registry)
            .build_arc()
            .map_err(StartupError::Engine)?;
        // The catalog reads footers into the engine's metadata cache: scans never re-read them.
        let catalog = Arc::new(
            Catalog::open(
                Arc::clone(&store) as Arc<dyn ObjectStore>,
                config.catalog_refresh,
                runtime.cache_manager.get_file_metadata_cache(),
                Arc::clone(&metrics),
            )
            .await
            .map_err(|e| StartupError::Listing(Box::new(e)))?,
        );
        let cpu = CpuRuntime::yielding(config.cpu_threads, "pushdown-cpu", config.reducing_nice)
            .map_err(StartupError::CpuRuntime)?;
        let unreduced =
            CpuRuntime::named(config.cpu_threads, "pushdown-unreduced").map_err(StartupError::CpuRuntime)?;
        let cache = Arc::new(FragmentCache::open(config.cache.clone(), Arc::clone(&metrics))?);
        let scaling = Arc::new(Scaling::new(config.cpu_threads, config.scaling_window));
        let streams = Arc::new(Semaphore::new(config.max_concurrent_streams.max(1)));
        metrics.watch_scaling(Arc::clone(&scaling));
        Ok(Node {
            cache,
            scaling,
            engine: Engine::new(
                catalog,
                Arc::new(self.views),
                runtime,
                store_url,
                Arc::clone(&config),
                Arc::new(TokenizerCatalog::new(config.tokenizers.clone())),
            ),
            metrics,
            cpu,
            unreduced,
            reducing: Arc::default(),
            computing: Arc::default(),
            config,
            tokens: self.tokens.map(Arc::new),
            prefetch: Prefetch::default(),
            streams,
            company: Arc::default(),
            store,
        })
    }
}

impl Node {
    pub fn builder(store: Arc<dyn ObjectStore>) -> NodeBuilder {
        NodeBuilder {
            store,
            config: ServerConfig::default(),
            record_reads: false,
            tokens: None,
            views: Views::default(),
        }
    }

    /// The decorated store every read goes through.
    pub fn store(&self) -> &Arc<InstrumentedStore> {
        &self.store
    }

    pub fn catalog(&self) -> &Arc<Catalog> {
        self.engine.catalog()
    }

    /// The limits and settings the node was opened with.
    pub fn config(&self) -> &ServerConfig {
        &self.config
    }

    /// The node's counters, for a front end to add its own to and expose.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The tokens requests must carry, if any (replace them to reload: SIGHUP in `serve`).
    pub fn tokens(&self) -> Option<&Arc<Tokens>> {
        self.tokens.as_ref()
    }

    /// Runs `work` on the reducing cores, where a shard being reduced runs: for tests that
    /// take those cores from every stream. Dropping the returned task aborts it.
    #[doc(hidden)]
    pub fn spawn_reducing<F>(&self, work: F) -> pushdown_task::Task<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.cpu.spawn(work)
    }

    /// Whether an endpoint is opened ahead now, waiting for its reader (see
    /// `ServerConfig::read_ahead`).
    pub fn holds_read_ahead(&self) -> bool {
        self.prefetch.holds()
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
    use crate::auth::Grant;
    use crate::store::open_store;

    async fn node_with_one_file() -> (tempfile::TempDir, Node) {
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
        let node = Node::builder(store).open().await.expect("open");
        (dir, node)
    }

    /// Where both want the cores, un-reduced streams go first: the reducing threads run
    /// `reducing_nice` steps below them.
    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn the_reducing_threads_run_below_the_unreduced_ones() {
        let (_dir, node) = node_with_one_file().await;
        async fn nice_on(runtime: &CpuRuntime) -> i32 {
            let (tx, rx) = tokio::sync::oneshot::channel();
            runtime.spawn_detached(async move {
                let _ = tx.send(crate::runtime::priority::own());
            });
            rx.await.expect("the task ran")
        }
        let (reducing, unreduced) = (nice_on(&node.cpu).await, nice_on(&node.unreduced).await);
        assert_eq!(
            unreduced,
            crate::runtime::priority::own(),
            "the server's own priority"
        );
        let steps = i32::from(node.config.reducing_nice);
        assert!(steps > 0, "lowered by default");
        assert_eq!(reducing, (unreduced + steps).min(19));
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
        let (_dir, node) = node_with_one_file().await;
        for (pushdown, expected) in [(FilterPushdown::On, true), (FilterPushdown::Off, false)] {
            let mut request = ScanRequest::new(Query::Sql("SELECT x FROM t WHERE x > 10".into()));
            request.filter_pushdown = pushdown;
            let planned = node.engine.plan(&request, &Grant::All).await.expect("plan");
            let ticket = planned.tickets().remove(0);
            let opened = node.engine.open(&ticket, 1, &Grant::All).await.expect("open");
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
        let (_dir, node) = node_with_one_file().await;
        let planned = node
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
