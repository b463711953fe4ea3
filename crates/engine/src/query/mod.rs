//! From a command to shards, and from a ticket to a stream of record batches.
//!
//! Planning (`GetFlightInfo`) parses the request against full-dataset tables and decides its
//! shape:
//!
//! * **row-wise** — projections and filters over exactly one dataset (no aggregates, sorts,
//!   limits, joins, subqueries, unnest, window functions). Its answer is the concatenation of
//!   its answers over any split of the rows, so it gets one endpoint per shard
//!   (file × row-group range);
//! * **whole** — anything else. It is answered as one stream over the whole dataset, so a
//!   client can never assemble per-shard partial answers.
//!
//! Execution (`DoGet`) re-plans the ticket's query against a table restricted to the
//! ticket's shard, with one partition (deterministic order), after checking the shard
//! against the catalog and the query's shape again: tickets are client-held bytes.
//!
//! SQL is allow-listed, not deny-listed: exactly one `SELECT`/`WITH`/`VALUES` query whose
//! tables all resolve to catalog datasets; anything else (DDL, DML, `COPY`, `SET`,
//! `CREATE EXTERNAL TABLE`, file-path tables) is refused before planning.
//!
//! One job per file: `plan` (a request's shape and the shards its scan is cut into),
//! `pruning` (the row groups a filter's statistics rule out, filter pushdown), `open` (a
//! ticket's query framed over its shard, checked again), `frame` (a fragment or SQL as a
//! `DataFrame`, ops as UDFs), `ordered` (the ordered-partition executor), `scan_stats` (a
//! stream's scan statistics from DataFusion's metrics). This file holds the [`Engine`]
//! (sessions, checking and registering the names a query reads) and the types they share.

mod frame;
mod open;
mod ordered;
mod plan;
mod pruning;
mod scan_stats;

pub use frame::{checked_dataframe, dataframe, register_ops};
pub use ordered::ordered_stream;
pub use scan_stats::scan_stats;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use datafusion::common::TableReference;
use datafusion::common::config::TableParquetOptions;
use datafusion::execution::context::{SessionConfig, SessionContext};
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::execution::runtime_env::RuntimeEnv;
use datafusion::logical_expr::LogicalPlan;
use datafusion::physical_plan::ExecutionPlan;
use pushdown_protocol::{Query, ScanRequest, Shard, ShardTicket, StreamStats};

use crate::ServerConfig;
use crate::allow::{CATALOG, CheckedQuery, SCHEMA, SQL_RECURSION_LIMIT};
use crate::auth::Grant;
use crate::catalog::{Catalog, Dataset, METADATA_SIZE_HINT, lookup};
use crate::durations::DurationIndex;
use crate::error::{Result, ServerError};
use crate::table::ShardTable;
use crate::tokenizers::TokenizerCatalog;
use crate::udf::OpLimits;
use crate::views::Views;

/// How a query is answered.
#[derive(Debug, Clone)]
pub enum Shape {
    /// One endpoint per shard of this dataset (none: every row group ruled out, or empty).
    RowWise {
        dataset: Arc<Dataset>,
        shards: Vec<Shard>,
    },
    /// One endpoint, the whole query.
    Whole,
}

/// The answer to `GetFlightInfo`.
#[derive(Debug)]
pub struct Planned {
    pub schema: SchemaRef,
    pub shape: Shape,
    /// The request as the tickets carry it (filter pushdown decided).
    pub request: ScanRequest,
    /// Rows before filtering, over the row groups the shards scan.
    pub rows_upper_bound: u64,
    /// Compressed bytes of the projected column chunks the scan will read at most.
    pub bytes_to_scan: u64,
    /// Row groups no shard scans: their statistics rule the filter out.
    pub row_groups_pruned: u64,
    pub has_filter: bool,
    pub optimized: LogicalPlan,
    /// The names the query gives, granted (datasets and views).
    pub names: Vec<String>,
}

impl Planned {
    /// The tickets of the plan's endpoints, in order: one per shard, or one for the whole
    /// query. The one place tickets are minted.
    pub fn tickets(&self) -> Vec<ShardTicket> {
        let ticket = |shard| ShardTicket {
            request: self.request.clone(),
            shard,
            skip_rows: 0,
            take_rows: None,
        };
        match &self.shape {
            Shape::RowWise { shards, .. } => shards.iter().cloned().map(|s| ticket(Some(s))).collect(),
            Shape::Whole => vec![ticket(None)],
        }
    }

    pub fn is_row_wise(&self) -> bool {
        matches!(self.shape, Shape::RowWise { .. })
    }

    /// The rows the answer has, where planning knows them: none when every row group is
    /// ruled out (or the dataset is empty), all of them when nothing filters a row-wise scan.
    pub fn known_rows(&self) -> Option<u64> {
        match &self.shape {
            Shape::RowWise { shards, .. } if shards.is_empty() => Some(0),
            Shape::RowWise { .. } if !self.has_filter => Some(self.rows_upper_bound),
            _ => None,
        }
    }

    /// The plan's estimates, as the client's planner reads them.
    pub fn estimate(&self) -> pushdown_protocol::PlanEstimate {
        pushdown_protocol::PlanEstimate {
            rows_upper_bound: self.rows_upper_bound,
            bytes_to_scan: self.bytes_to_scan,
            row_wise: self.is_row_wise(),
            row_groups_pruned: self.row_groups_pruned,
        }
    }

    /// The cache keys of the plan's shards as their files are listed now (none for a whole
    /// query or a volatile plan).
    pub fn cache_keys(&self) -> Result<Vec<crate::cache::Key>> {
        let Shape::RowWise { dataset, shards } = &self.shape else {
            return Ok(vec![]);
        };
        let Some(print) = crate::cache::query_print(&self.optimized, &self.names)? else {
            return Ok(vec![]);
        };
        Ok(shards
            .iter()
            .filter_map(|s| {
                let file = dataset.file(&s.file)?;
                Some(crate::cache::shard_key(print, &dataset.name, file, &s.row_groups))
            })
            .collect())
    }
}

/// A ticket ready to run.
pub struct Opened {
    pub plan: Arc<dyn ExecutionPlan>,
    pub ctx: SessionContext,
    pub row_groups: u64,
    /// The partitions that may decode at once (see [`ordered_stream`]); all of them for a
    /// query that is not row-wise.
    pub parallelism: usize,
    /// The plan's stream, when it was started ahead of its reader (see `prefetch`).
    pub started: Option<Started>,
    /// The shard's cache key and what it reads; `None` for whole queries and volatile plans.
    pub cacheable: Option<crate::cache::Cacheable>,
    /// A part of the shard's output read as a row selection: the output rows the scan
    /// skipped. `None`: the plan computes the whole output (and `skip_rows` is dropped from
    /// its stream).
    pub skipped: Option<u64>,
    /// What finding a filtered part's rows read before the plan runs (its filter's columns),
    /// counted into the stream's statistics; its `rows_scanned` stand for the part's.
    pub prescan: Option<StreamStats>,
}

/// A plan's stream started ahead of its reader, and since when.
pub struct Started {
    pub stream: datafusion::physical_plan::SendableRecordBatchStream,
    pub since: std::time::Instant,
}

impl std::fmt::Debug for Started {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Started")
            .field("since", &self.since)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Opened {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Opened")
            .field("row_groups", &self.row_groups)
            .finish_non_exhaustive()
    }
}

/// Plans and opens queries over a catalog with one shared runtime (memory pool, caches).
#[derive(Debug)]
pub struct Engine {
    catalog: Arc<Catalog>,
    views: Arc<Views>,
    runtime: Arc<RuntimeEnv>,
    store_url: ObjectStoreUrl,
    config: Arc<ServerConfig>,
    /// A session's state kept to parse queries and name what they read, the same for every
    /// query (built once: cloning a session's state copies its function registries).
    parser: std::sync::OnceLock<datafusion::execution::SessionState>,
    /// Tokenizers no dataset ships: given by trainers, or the server's folder of them.
    tokenizers: Arc<TokenizerCatalog>,
    /// Clips' durations read so far, shared by every scan ([`crate::durations`]).
    durations: Arc<DurationIndex>,
}

impl Engine {
    pub fn new(
        catalog: Arc<Catalog>,
        views: Arc<Views>,
        runtime: Arc<RuntimeEnv>,
        store_url: ObjectStoreUrl,
        config: Arc<ServerConfig>,
        tokenizers: Arc<TokenizerCatalog>,
    ) -> Self {
        Self {
            catalog,
            views,
            runtime,
            store_url,
            config,
            parser: std::sync::OnceLock::new(),
            tokenizers,
            durations: Arc::default(),
        }
    }

    pub fn catalog(&self) -> &Arc<Catalog> {
        &self.catalog
    }

    pub fn views(&self) -> &Arc<Views> {
        &self.views
    }

    /// The Parquet options of every scan, each one set deliberately.
    pub fn parquet_options(&self, pushdown_filters: bool) -> TableParquetOptions {
        let mut options = TableParquetOptions::default();
        let p = &mut options.global;
        p.pruning = true; // row groups by min/max statistics
        p.enable_page_index = true; // pages by the page index
        p.bloom_filter_on_read = true; // row groups by bloom filters (equality, IN)
        p.pushdown_filters = pushdown_filters; // late materialization in the decoder
        // Late materialization is chosen only where the rest of the projection is far heavier
        // than the filter's columns (`auto_filter_pushdown`): skip the rows the filter dropped
        // rather than decoding every row and masking (the reader's default for scattered
        // selections, which copies every JPEG of a row group to keep a tenth of them).
        p.force_filter_selections = pushdown_filters;
        p.reorder_filters = true; // cheapest, most selective filters first
        p.skip_metadata = true; // embedded Arrow schema metadata is not part of the data
        p.metadata_size_hint = Some(METADATA_SIZE_HINT);
        p.schema_force_view_types = false; // Utf8/Binary out, as stored: what clients expect
        p.binary_as_string = false;
        options
    }

    pub fn session(&self, partitions: usize) -> SessionContext {
        let mut config = SessionConfig::new()
            .with_target_partitions(partitions.max(1))
            .with_batch_size(self.config.batch_size)
            // No byte-range splitting of files: a shard's output order is deterministic.
            .with_repartition_file_scans(false)
            .with_information_schema(false)
            .with_default_catalog_and_schema(CATALOG, SCHEMA)
            .with_create_default_catalog_and_schema(true);
        let options = config.options_mut();
        options.execution.parquet = self.parquet_options(false).global;
        // Each partition reads its own file group, never a sibling's (DataFusion lets an idle
        // partition steal files by default): a shard's row-group ranges are emitted in order.
        options.execution.enable_file_stream_work_stealing = false;
        options.sql_parser.enable_ident_normalization = true;
        // Nesting deeper than this (parentheses, subqueries) is a parse error, not a deep
        // recursion; long flat chains (`1+1+…`) are bounded by the text's length cap.
        if let Ok(limit) = datafusion::common::config::ConfigNonZeroUsize::try_new(SQL_RECURSION_LIMIT) {
            options.sql_parser.recursion_limit = limit;
        }
        // The query's own pool over the server's: its limit, and the server's total.
        let pool = crate::pool::QueryPool::new(
            Arc::clone(&self.runtime.memory_pool),
            self.config.max_query_memory.min(self.config.memory_limit),
        );
        let runtime = RuntimeEnv {
            memory_pool: Arc::new(pool),
            ..(*self.runtime).clone()
        };
        let state = datafusion::execution::session_state::SessionStateBuilder::new()
            .with_config(config)
            .with_runtime_env(Arc::new(runtime))
            .with_default_features()
            .with_physical_optimizer_rule(Arc::new(crate::conjunction::FlatConjunctions))
            .build();
        SessionContext::new_with_state(state)
    }

    /// Tokenizers no dataset ships: given by trainers, or the server's folder of them.
    pub fn tokenizers(&self) -> &Arc<TokenizerCatalog> {
        &self.tokenizers
    }

    /// The caps of op calls in a query of `ctx`: the server's, accounted in `ctx`'s pool;
    /// `tokenizer`, the one calls that name none use (a request's; none: the dataset read's).
    pub fn op_limits(&self, ctx: &SessionContext, tokenizer: Option<&str>) -> OpLimits {
        OpLimits {
            tokenizer: tokenizer.map(str::to_owned),
            tokenizers: Arc::clone(&self.tokenizers),
            max_row_bytes: self.config.max_op_row_bytes,
            max_batch_bytes: self.config.max_op_batch_bytes,
            pool: Some(Arc::clone(&ctx.runtime_env().memory_pool)),
            ..OpLimits::unlimited()
        }
    }

    pub fn full_table(&self, dataset: &Dataset, pushdown: bool) -> Arc<ShardTable> {
        Arc::new(
            ShardTable::new(
                Arc::clone(&dataset.file_schema),
                dataset.partitions.clone(),
                self.store_url.clone(),
                dataset.files.iter().map(|f| (f.clone(), None)).collect(),
                self.parquet_options(pushdown),
            )
            .with_durations(Arc::clone(&self.durations)),
        )
    }

    /// The datasets `grant` may read, as the catalog lists them now: all a query over its
    /// caller's grant can see (an unknown-dataset error lists only these).
    pub async fn visible(&self, grant: &Grant) -> Result<BTreeMap<String, Arc<Dataset>>> {
        Ok(grant.visible(&*self.catalog.datasets().await?))
    }

    /// The views `grant` may read.
    pub fn visible_views(&self, grant: &Grant) -> Vec<Arc<crate::views::View>> {
        self.views
            .iter()
            .filter(|v| grant.allows(&v.name))
            .cloned()
            .collect()
    }

    /// `query` parsed and checked once (see [`crate::allow`]), every name it reads granted
    /// to the caller: what planning and opening take, never the text again.
    pub fn check(&self, query: &Query, grant: &Grant) -> Result<CheckedQuery> {
        let parser = self.parser.get_or_init(|| self.session(1).state());
        let checked = crate::allow::check(parser, query, self.config.max_sql_bytes)?;
        for name in checked.names() {
            grant.check_spelling(name)?;
        }
        Ok(checked)
    }

    /// Registers every dataset and view the query names (all must exist and be granted),
    /// the datasets beneath those views (as built by `table`) and the ops; returns those
    /// datasets. Only these are tables of the query: it cannot read anything else. A view
    /// is planned here, over the tables of this query, so what is asked of it reaches the
    /// scans beneath.
    pub async fn register_referenced(
        &self,
        ctx: &SessionContext,
        datasets: &BTreeMap<String, Arc<Dataset>>,
        grant: &Grant,
        checked: &CheckedQuery,
        limits: &OpLimits,
        table: impl Fn(&Dataset) -> Arc<ShardTable>,
    ) -> Result<Vec<Arc<Dataset>>> {
        self.register_names(ctx, datasets, grant, checked.names(), limits, table)
            .await
    }

    /// [`Self::register_referenced`] for names already parsed and checked.
    async fn register_names(
        &self,
        ctx: &SessionContext,
        datasets: &BTreeMap<String, Arc<Dataset>>,
        grant: &Grant,
        names: &[String],
        limits: &OpLimits,
        table: impl Fn(&Dataset) -> Arc<ShardTable>,
    ) -> Result<Vec<Arc<Dataset>>> {
        let base_names: BTreeSet<String> = names.iter().flat_map(|n| self.views.bases_of(n)).collect();
        let mut bases = Vec::with_capacity(base_names.len());
        for name in &base_names {
            let dataset = lookup(datasets, name).map_err(|e| match e {
                // An unknown-dataset error lists only what the caller may read.
                ServerError::UnknownDataset { name, known } => ServerError::UnknownDataset {
                    name,
                    known: known
                        .into_iter()
                        .filter(|k| grant.allows(k))
                        .chain(self.visible_views(grant).iter().map(|v| v.name.clone()))
                        .collect(),
                },
                other => other,
            })?;
            // A dataset the query names itself (not through a view) is granted by its
            // canonical name (`MyPets`, however the query spells it).
            if names.contains(name) {
                grant.check(&dataset.name)?;
            }
            // Registered as the query spells it, never parsed again (`cifar-10`, `MyPets`).
            let reference = TableReference::bare(name.as_str());
            if !ctx.table_exist(reference.clone())? {
                ctx.register_table(reference, table(&dataset))?;
            }
            bases.push(dataset);
        }
        let default = match bases.as_slice() {
            [only] => Some(only.name.clone()),
            _ => None,
        };
        // Ops find resources (tokenizers) in the datasets the caller may read or reads.
        let mut resources = grant.visible(datasets);
        resources.extend(bases.iter().map(|d| (d.name.clone(), Arc::clone(d))));
        register_ops(ctx, &resources, default, limits);
        for view in self.views.closure(names.iter().map(String::as_str)) {
            if ctx.table_exist(view.name.as_str())? {
                continue;
            }
            let statement = view.checked.statement().cloned().ok_or_else(|| {
                ServerError::Internal(format!("view `{}` without its parsed statement", view.name))
            })?;
            let plan = ctx
                .state()
                .statement_to_plan(statement)
                .await
                .map_err(|e| ServerError::bad_part(format!("view `{}`", view.name), e))?;
            let provider = datafusion::catalog::view::ViewTable::new(plan, Some(view.sql.clone()));
            ctx.register_table(view.name.as_str(), Arc::new(provider))?;
        }
        Ok(bases)
    }

    /// A query's result schema and logical plan (its parameters unbound), planned without
    /// shards or estimates: what listings and prepared statements need.
    pub async fn describe(&self, query: &Query, grant: &Grant) -> Result<(SchemaRef, LogicalPlan)> {
        let checked = self.check(query, grant)?;
        let datasets = self.catalog.datasets().await?;
        let ctx = self.session(1);
        let limits = self.op_limits(&ctx, None);
        self.register_referenced(&ctx, &datasets, grant, &checked, &limits, |d| {
            self.full_table(d, false)
        })
        .await?;
        let df = checked_dataframe(&ctx, query, &checked).await?;
        Ok((
            Arc::new(df.schema().as_arrow().clone()),
            df.logical_plan().clone(),
        ))
    }

    /// The fragment cache's mode for a query over `names` (datasets and views): set by
    /// them and by the datasets their views read.
    pub fn cache_mode(&self, names: &[String]) -> crate::CacheMode {
        let bases = names.iter().flat_map(|n| self.views.bases_of(n));
        let all: Vec<String> = names.iter().cloned().chain(bases).collect();
        self.config.cache.mode_of(all.iter().map(String::as_str))
    }

    /// Whether the file `ticket`'s shard reads is still the version the ticket names: a
    /// stream opened ahead is taken only then (its later pages are still to be read).
    pub async fn still_current(&self, ticket: &ShardTicket) -> Result<bool> {
        let Some(shard) = &ticket.shard else {
            return Ok(true);
        };
        let datasets = self.catalog.datasets().await?;
        let Some(file) = datasets.get(&shard.dataset).and_then(|d| d.file(&shard.file)) else {
            return Ok(false);
        };
        Ok(matches!(
            self.catalog.current(&shard.dataset, file).await?,
            Some((_, now)) if now.version == shard.version
        ))
    }

    /// The rows `ticket` would stream (after its `skip_rows`, up to its `take_rows`), counted
    /// by the engine: only the filter's columns are read, and none at all when statistics
    /// answer.
    pub async fn count(&self, ticket: &ShardTicket, grant: &Grant) -> Result<u64> {
        let checked = self.authorize(ticket, grant)?;
        let framed = self.dataframe_for(ticket, &checked, 1, grant).await?;
        let n = framed
            .df
            .count()
            .await
            .map_err(|e| ServerError::from_scan(e, ticket.shard.as_ref()))? as u64;
        if framed.skipped.is_some() {
            // Only the part was read.
            return Ok(n);
        }
        let n = n.saturating_sub(ticket.skip_rows);
        Ok(ticket.take_rows.map_or(n, |t| n.min(t)))
    }

    /// Whether `grant` may redeem `ticket`, checked before its shard is looked at: the names
    /// its query gives are granted, and one of them reads the shard's dataset (itself, or a
    /// view over it). A ticket is the caller's own text: this is never skipped. Returns the
    /// checked query.
    pub fn authorize(&self, ticket: &ShardTicket, grant: &Grant) -> Result<CheckedQuery> {
        let checked = self.check(&ticket.request.query, grant)?;
        if let Some(shard) = &ticket.shard
            && !checked
                .names()
                .iter()
                .any(|n| self.views.bases_of(n).contains(&shard.dataset))
        {
            grant.check(&shard.dataset)?;
        }
        Ok(checked)
    }
}
