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

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use datafusion::catalog::TableProvider;
use datafusion::common::config::TableParquetOptions;
use datafusion::common::tree_node::TreeNode;
use datafusion::common::{DFSchema, TableReference};
use datafusion::datasource::physical_plan::parquet::{
    ParquetAccessPlan, ParquetFileMetrics, RowGroupAccessPlanFilter,
};
use datafusion::execution::FunctionRegistry;
use datafusion::execution::context::{SQLOptions, SessionConfig, SessionContext};
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::execution::runtime_env::RuntimeEnv;
use datafusion::logical_expr::utils::conjunction;
use datafusion::logical_expr::{Expr, LogicalPlan};
use datafusion::physical_optimizer::pruning::{PruningPredicate, PruningPredicateBuilder};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, MetricValue};
use datafusion::prelude::DataFrame;
use pushdown_protocol::{
    FilterPushdown, Fragment, OpCall, Query, ScanRequest, Shard, ShardTicket, StreamStats, Value,
};

use crate::ServerConfig;
use crate::allow::{CATALOG, CheckedQuery, SCHEMA, SQL_RECURSION_LIMIT};
use crate::auth::Grant;
use crate::catalog::{Catalog, DataFile, Dataset, METADATA_SIZE_HINT, lookup};
use crate::error::{Result, ServerError};
use crate::layout::PartitionFilter;
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

/// The shards a plan's scan is cut into, and what they add up to.
struct Cut {
    shards: Vec<Shard>,
    /// Rows before filtering, over the row groups the shards scan.
    rows_upper_bound: u64,
    /// Compressed bytes of the projected column chunks the shards read.
    bytes_to_scan: u64,
    /// Row groups no shard scans: their statistics rule the filter out.
    row_groups_pruned: u64,
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
    /// counted into the stream's statistics.
    pub prescan: StreamStats,
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
        Arc::new(ShardTable::new(
            Arc::clone(&dataset.file_schema),
            dataset.partitions.clone(),
            self.store_url.clone(),
            dataset.files.iter().map(|f| (f.clone(), None)).collect(),
            self.parquet_options(pushdown),
        ))
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

    /// `GetFlightInfo`: the result schema, the shape, and the shards, for a caller holding
    /// `grant`.
    pub async fn plan(&self, request: &ScanRequest, grant: &Grant) -> Result<Planned> {
        let checked = self.check(&request.query, grant)?;
        let datasets = self.catalog.datasets().await?;
        let ctx = self.session(self.config.cpu_threads);
        let limits = self.op_limits(&ctx, request.tokenizer.as_deref());
        let referenced = self
            .register_names(&ctx, &datasets, grant, checked.names(), &limits, |d| {
                self.full_table(d, false)
            })
            .await?;
        // Unreadable files fail the request before anything else is said about it.
        for dataset in &referenced {
            dataset.check_readable()?;
        }
        let df = checked_dataframe(&ctx, &request.query, &checked).await?;
        let schema: SchemaRef = Arc::new(df.schema().as_arrow().clone());
        let logical = df.logical_plan().clone();
        let optimized = ctx.state().optimize(&logical)?;
        let scan = scan_of(&optimized);

        let mut request = request.clone();
        // The dataset a row-wise query is sharded over.
        let row_wise = row_wise_table(&logical)
            .map(|table| lookup(&datasets, &table))
            .transpose()?;

        let (projection, filter_columns) = match &scan {
            Some(s) => (s.projection.clone(), s.filter_columns.clone()),
            None => (None, vec![]),
        };
        let has_filter = !filter_columns.is_empty()
            || matches!(&request.query, Query::Fragment(f) if f.predicate.is_some());
        let scanned: Vec<Arc<Dataset>> = match &row_wise {
            Some(dataset) => vec![Arc::clone(dataset)],
            None => referenced.clone(),
        };
        if request.filter_pushdown == FilterPushdown::Auto {
            request.filter_pushdown = decide_filter_pushdown(row_wise.as_ref(), scan.as_ref());
        }

        // Row groups whose statistics rule the filter out get no shard: a selective query
        // over sorted data costs one request per matching range, not one per file.
        let pruning = match (&row_wise, &scan) {
            (Some(dataset), Some(s)) => pruning_predicate(&ctx, dataset, s)?,
            _ => None,
        };
        // Files whose path columns (`split`, hive keys) rule the filter out get no shard.
        let files = match (&row_wise, &scan) {
            (Some(dataset), Some(s)) => PartitionFilter::new(
                &ctx.state(),
                &arrow::datatypes::Fields::from(dataset.partitions.clone()),
                &s.filters,
            ),
            _ => PartitionFilter::default(),
        };
        let Cut {
            shards,
            rows_upper_bound,
            bytes_to_scan,
            row_groups_pruned,
        } = self.cut_shards(&scanned, projection.as_deref(), pruning.as_deref(), &files);
        // A whole query's estimates cover every dataset it scans; its one stream has no shard.
        let shape = match row_wise {
            Some(dataset) => Shape::RowWise { dataset, shards },
            None => Shape::Whole,
        };
        Ok(Planned {
            schema,
            shape,
            request,
            rows_upper_bound,
            bytes_to_scan,
            row_groups_pruned,
            has_filter,
            optimized,
            names: checked.names().to_vec(),
        })
    }

    /// Cuts the row groups of `scanned` that `pruning` leaves into shards: runs of
    /// consecutive matching row groups of one file, each closed at the server's shard size
    /// (rows or bytes of the `projection`'s column chunks).
    fn cut_shards(
        &self,
        scanned: &[Arc<Dataset>],
        projection: Option<&[usize]>,
        pruning: Option<&PruningPredicate>,
        files: &PartitionFilter,
    ) -> Cut {
        let mut shards = Vec::new();
        let mut rows_upper_bound = 0;
        let mut bytes_to_scan = 0;
        let mut row_groups_pruned = 0;
        for dataset in scanned {
            let leaves = leaf_columns(dataset, projection);
            for file in &dataset.files {
                if !files.admits(&file.partition) {
                    row_groups_pruned += file.num_row_groups() as u64;
                    continue;
                }
                let matching = matching_row_groups(dataset, file, pruning);
                // The run of matching row groups being gathered: start, end, rows, bytes.
                let mut run: Option<(usize, usize, u64, u64)> = None;
                let mut close = |run: &mut Option<(usize, usize, u64, u64)>| {
                    if let Some((start, end, rows, bytes)) = run.take() {
                        rows_upper_bound += rows;
                        bytes_to_scan += bytes;
                        shards.push(Shard {
                            dataset: dataset.name.clone(),
                            file: file.path.clone(),
                            row_groups: start as u32..end as u32,
                            rows,
                            version: file.version.clone(),
                            bytes,
                        });
                    }
                };
                for (rg, matches) in matching.iter().enumerate() {
                    if !matches {
                        row_groups_pruned += 1;
                        close(&mut run);
                        continue;
                    }
                    let (_, end, rows, bytes) = run.get_or_insert((rg, rg, 0, 0));
                    *end = rg + 1;
                    *rows += file.row_group_rows(rg);
                    *bytes += file.row_group_bytes(rg, leaves.as_deref());
                    if *rows >= self.config.shard_max_rows || *bytes >= self.config.shard_target_bytes {
                        close(&mut run);
                    }
                }
                close(&mut run);
            }
        }
        Cut {
            shards,
            rows_upper_bound,
            bytes_to_scan,
            row_groups_pruned,
        }
    }

    /// `DoGet`: checks the ticket against the catalog and builds its physical plan. A shard
    /// is read as up to `parallelism` contiguous row-group ranges, decoded at once and
    /// emitted in order (see [`ordered_stream`]): one stream can use several cores.
    pub async fn open(&self, ticket: &ShardTicket, parallelism: usize, grant: &Grant) -> Result<Opened> {
        let checked = self.authorize(ticket, grant)?;
        self.open_checked(ticket, &checked, parallelism, grant).await
    }

    /// [`Self::open`] for a ticket whose query [`Self::authorize`] has checked (`checked`
    /// is its result for this very ticket): the query is not parsed again.
    pub async fn open_checked(
        &self,
        ticket: &ShardTicket,
        checked: &CheckedQuery,
        parallelism: usize,
        grant: &Grant,
    ) -> Result<Opened> {
        let framed = self.dataframe_for(ticket, checked, parallelism, grant).await?;
        let Framed {
            ctx,
            df,
            row_groups,
            limits,
            source,
            skipped,
            prescan,
        } = framed;
        // Batches small enough that one batch of the largest op output stays under the cap.
        let rows = limits.batch_rows(self.config.batch_size);
        let (mut state, logical) = df.into_parts();
        if rows < self.config.batch_size {
            let rows = datafusion::common::config::ConfigNonZeroUsize::try_new(rows)?;
            state.config_mut().options_mut().execution.batch_size = rows;
            ctx.state_ref()
                .write()
                .config_mut()
                .options_mut()
                .execution
                .batch_size = rows;
        }
        let optimized = state.optimize(&logical)?;
        // A whole query's partitions may depend on each other (a hash repartition feeds them
        // all): every one is drained at once, as DataFusion would.
        let parallelism = if source.is_some() { parallelism } else { usize::MAX };
        let cacheable = match source {
            Some(source) => {
                crate::cache::query_print(&optimized, &source.names)?.map(|print| crate::cache::Cacheable {
                    key: crate::cache::shard_key(print, &source.dataset, &source.file, &source.row_groups),
                    mode: self.cache_mode(&source.names),
                    names: source.names,
                })
            }
            None => None,
        };
        // After the cache key: the rewrite changes how, not what, the plan reads.
        let optimized = crate::table::strings_as_views_under_filters(optimized)?;
        let plan = state
            .query_planner()
            .create_physical_plan(&optimized, &state)
            .await?;
        Ok(Opened {
            plan,
            ctx,
            row_groups,
            parallelism,
            started: None,
            cacheable,
            skipped,
            prescan,
        })
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

    /// The ticket's query (`checked` by [`Self::authorize`]) as a DataFrame over its shard (or
    /// the whole catalog).
    async fn dataframe_for(
        &self,
        ticket: &ShardTicket,
        checked: &CheckedQuery,
        parallelism: usize,
        grant: &Grant,
    ) -> Result<Framed> {
        let datasets = self.catalog.datasets().await?;
        match &ticket.shard {
            Some(shard) => {
                self.shard_dataframe(ticket, checked, shard, parallelism, grant, &datasets)
                    .await
            }
            None => self.whole_dataframe(ticket, checked, grant, &datasets).await,
        }
    }

    /// [`Self::dataframe_for`] a ticket for `shard`: its query over a table of the shard's
    /// row groups, cut into partitions for `parallelism`. A ticket for a part of the shard's
    /// output (`skip_rows`, `take_rows`) whose query has no filter reads only that part: the
    /// query's row `i` is the shard's row `i`, so the part is a row selection of the scan
    /// (unless the fragment cache is `on` for the query's datasets).
    async fn shard_dataframe(
        &self,
        ticket: &ShardTicket,
        checked: &CheckedQuery,
        shard: &Shard,
        parallelism: usize,
        grant: &Grant,
        datasets: &BTreeMap<String, Arc<Dataset>>,
    ) -> Result<Framed> {
        let (dataset, file) = self.current_shard_file(datasets, shard).await?;
        let frame = |rows: Option<Range<u64>>| ShardFrame {
            ticket,
            checked,
            shard,
            dataset: &dataset,
            file: &file,
            rows,
            parallelism,
        };
        let whole = self.frame_shard(frame(None), grant, datasets).await?;
        let partial = ticket.skip_rows > 0 || ticket.take_rows.is_some();
        // A dataset cached `on` computes its shards whole, so that the next request for any
        // part of it is a hit (see `TicketStream`).
        if !partial || self.cache_mode(checked.names()) == crate::CacheMode::On {
            return Ok(whole);
        }
        let first: u64 = (0..shard.row_groups.start as usize)
            .map(|i| file.row_group_rows(i))
            .sum();
        let len: u64 = shard
            .row_groups
            .clone()
            .map(|i| file.row_group_rows(i as usize))
            .sum();
        let (rows, prescan) = if one_to_one(whole.df.logical_plan()) {
            let from = ticket.skip_rows.min(len);
            let to = ticket.take_rows.map_or(len, |t| from.saturating_add(t).min(len));
            (from..to, StreamStats::default())
        } else {
            match self.filtered_part(&whole, ticket, len, parallelism).await? {
                Some(found) => found,
                None => return Ok(whole),
            }
        };
        let mut part = self
            .frame_shard(frame(Some(first + rows.start..first + rows.end)), grant, datasets)
            .await?;
        part.skipped = Some(ticket.skip_rows);
        part.prescan = prescan;
        Ok(part)
    }

    /// The shard's rows (counted from its start) holding the part of a filtered query's
    /// output that `ticket` asks for, found by evaluating the filter alone (only its columns
    /// are read) and stopping at the part's last row; and what that read. `None` when the
    /// query is not a filter over a one-to-one plan (its part is then cut from the whole
    /// output) or the shard holds fewer matching rows than the part skips.
    async fn filtered_part(
        &self,
        whole: &Framed,
        ticket: &ShardTicket,
        len: u64,
        parallelism: usize,
    ) -> Result<Option<(Range<u64>, StreamStats)>> {
        let Some((predicate, input)) = part_filter(whole.df.logical_plan()) else {
            return Ok(None);
        };
        let keep = datafusion::logical_expr::LogicalPlanBuilder::from(input)
            .project(vec![predicate.alias("__pushdown_keep")])?
            .build()?;
        let state = whole.ctx.state();
        let plan = state.create_physical_plan(&keep).await?;
        let mut stream = ordered_stream(Arc::clone(&plan), whole.ctx.task_ctx(), parallelism)?;
        let (skip, take) = (ticket.skip_rows, ticket.take_rows.unwrap_or(u64::MAX));
        let (mut row, mut matched, mut start) = (0u64, 0u64, None);
        let mut end = None;
        'batches: while let Some(batch) = futures::StreamExt::next(&mut stream).await {
            let batch = batch.map_err(|e| ServerError::from_scan(e, ticket.shard.as_ref()))?;
            let keep = arrow::array::AsArray::as_boolean(batch.column(0));
            for i in 0..keep.len() {
                // A null predicate drops the row, as the filter does.
                if arrow::array::Array::is_valid(keep, i) && keep.value(i) {
                    if matched == skip {
                        start = Some(row + i as u64);
                    }
                    matched += 1;
                    if matched == skip.saturating_add(take) {
                        end = Some(row + i as u64 + 1);
                        break 'batches;
                    }
                }
            }
            row += keep.len() as u64;
        }
        drop(stream);
        let stats = scan_stats(&plan);
        Ok(start.map(|start| (start..end.unwrap_or(len), stats)))
    }

    /// The query of `frame` over its shard's table (only its rows, when it names some).
    async fn frame_shard(
        &self,
        frame: ShardFrame<'_>,
        grant: &Grant,
        datasets: &BTreeMap<String, Arc<Dataset>>,
    ) -> Result<Framed> {
        let ShardFrame {
            ticket,
            checked,
            shard,
            dataset,
            file,
            rows,
            parallelism,
        } = frame;
        let pushdown = ticket.request.filter_pushdown == FilterPushdown::On;
        // The row groups holding the rows read (all of the shard's, without a selection).
        let row_groups = match &rows {
            Some(rows) => groups_holding(file, shard.row_groups.clone(), rows),
            None => shard.row_groups.clone(),
        };
        let units = shard_partitions(file, &row_groups, parallelism);
        let parts = split_range(row_groups.clone(), units);
        let ctx = self.session(parts.len());
        let table = ShardTable::new(
            Arc::clone(&dataset.file_schema),
            dataset.partitions.clone(),
            self.store_url.clone(),
            parts.into_iter().map(|r| (file.clone(), Some(r))).collect(),
            self.parquet_options(pushdown),
        );
        let table = match rows {
            Some(rows) => table.with_rows(rows),
            None => table,
        };
        let table: Arc<ShardTable> = Arc::new(table);
        // Under every name the query gives the shard's dataset (`MyPets` and `mypets`).
        for name in checked.names().iter().flat_map(|n| self.views.bases_of(n)) {
            if lookup(datasets, &name).is_ok_and(|d| d.name == dataset.name) {
                let reference = TableReference::bare(name.as_str());
                if !ctx.table_exist(reference.clone())? {
                    ctx.register_table(reference, Arc::clone(&table) as Arc<dyn TableProvider>)?;
                }
            }
        }
        let limits = self.op_limits(&ctx, ticket.request.tokenizer.as_deref());
        // Views over the shard's dataset read the shard table just registered.
        self.register_names(&ctx, datasets, grant, checked.names(), &limits, |d| {
            self.full_table(d, pushdown)
        })
        .await?;
        let df = checked_dataframe(&ctx, &ticket.request.query, checked).await?;
        let scanned = row_wise_table(df.logical_plan()).map(|t| lookup(datasets, &t));
        if !matches!(scanned, Some(Ok(d)) if d.name == dataset.name) {
            return Err(ServerError::BadRequest(
                "the ticket's query is not row-wise over its shard's dataset".into(),
            ));
        }
        Ok(Framed {
            ctx,
            df,
            row_groups: u64::from(row_groups.end - row_groups.start),
            limits,
            source: Some(ShardSource {
                names: checked.names().to_vec(),
                dataset: dataset.name.clone(),
                file: file.clone(),
                row_groups: shard.row_groups.clone(),
            }),
            skipped: None,
            prescan: StreamStats::default(),
        })
    }

    /// The dataset and file `shard` reads, as they are now, checked against the shard: the
    /// file is still the version it names and holds its row groups.
    async fn current_shard_file(
        &self,
        datasets: &BTreeMap<String, Arc<Dataset>>,
        shard: &Shard,
    ) -> Result<(Arc<Dataset>, DataFile)> {
        let listed = lookup(datasets, &shard.dataset)?;
        let unknown = || ServerError::UnknownShard {
            dataset: shard.dataset.clone(),
            file: shard.file.clone(),
        };
        let file = listed.file(&shard.file).ok_or_else(unknown)?;
        // The file as it is now: never new bytes read with an old footer.
        let (dataset, file) = self
            .catalog
            .current(&shard.dataset, file)
            .await?
            .ok_or_else(unknown)?;
        if file.version != shard.version {
            return Err(ServerError::FileChanged {
                dataset: shard.dataset.clone(),
                file: shard.file.clone(),
                planned: shard.version.clone(),
                now: file.version.clone(),
            });
        }
        if shard.row_groups.end as usize > file.num_row_groups() {
            return Err(ServerError::BadRequest(format!(
                "ticket names row groups {:?} of `{}`, which has {}",
                shard.row_groups,
                shard.file,
                file.num_row_groups()
            )));
        }
        Ok((dataset, file))
    }

    /// [`Self::dataframe_for`] a ticket with no shard: its query over the whole datasets it
    /// reads, as one stream.
    async fn whole_dataframe(
        &self,
        ticket: &ShardTicket,
        checked: &CheckedQuery,
        grant: &Grant,
        datasets: &BTreeMap<String, Arc<Dataset>>,
    ) -> Result<Framed> {
        let pushdown = ticket.request.filter_pushdown == FilterPushdown::On;
        if ticket.skip_rows > 0 || ticket.take_rows.is_some() {
            return Err(ServerError::BadRequest(
                "a query that is not row-wise (an aggregate, join, sort or limit, or a \
                 volatile function) has no total order, so its stream cannot be resumed or \
                 cut: run it again from the start, whole"
                    .into(),
            ));
        }
        let ctx = self.session(self.config.cpu_threads);
        let limits = self.op_limits(&ctx, ticket.request.tokenizer.as_deref());
        let referenced = self
            .register_referenced(&ctx, datasets, grant, checked, &limits, |d| {
                self.full_table(d, pushdown)
            })
            .await?;
        let mut row_groups = 0;
        for dataset in &referenced {
            dataset.check_readable()?;
            row_groups += dataset
                .files
                .iter()
                .map(|f| f.num_row_groups() as u64)
                .sum::<u64>();
        }
        let df = checked_dataframe(&ctx, &ticket.request.query, checked).await?;
        Ok(Framed {
            ctx,
            df,
            row_groups,
            limits,
            source: None,
            skipped: None,
            prescan: StreamStats::default(),
        })
    }
}

/// A ticket's query framed over its shard (or the whole catalog), checked.
struct Framed {
    ctx: SessionContext,
    df: DataFrame,
    row_groups: u64,
    limits: OpLimits,
    source: Option<ShardSource>,
    /// A part of the shard's output read as a row selection: the rows of the output the
    /// scan skipped (the stream's first row is the output's row `skipped`). `None`: the
    /// whole output is computed.
    skipped: Option<u64>,
    /// What finding a filtered part's rows read (its filter's columns, before the part).
    prescan: StreamStats,
}

/// What [`Engine::frame_shard`] frames: a ticket's checked query over its shard of `file`,
/// only the rows `rows` of the file when set.
struct ShardFrame<'a> {
    ticket: &'a ShardTicket,
    checked: &'a CheckedQuery,
    shard: &'a Shard,
    dataset: &'a Dataset,
    file: &'a DataFile,
    rows: Option<Range<u64>>,
    parallelism: usize,
}

/// The row groups of `row_groups` in `file` that hold any of `rows` (counted from the file's
/// first row), as a range (empty, at the range's start, when none do).
fn groups_holding(file: &DataFile, row_groups: Range<u32>, rows: &Range<u64>) -> Range<u32> {
    let mut first = 0u64;
    let (mut start, mut end) = (None, row_groups.start);
    for i in 0..row_groups.end {
        let len = file.row_group_rows(i as usize);
        let group = first..first + len;
        first += len;
        if i >= row_groups.start && group.start < rows.end && rows.start < group.end {
            start.get_or_insert(i);
            end = i + 1;
        }
    }
    match start {
        Some(start) => start..end,
        None => row_groups.start..row_groups.start,
    }
}

/// What a shard's output is computed from, for its cache key.
struct ShardSource {
    /// The names the query gives, granted (datasets and views).
    names: Vec<String>,
    dataset: String,
    /// The file as it is now.
    file: crate::catalog::DataFile,
    row_groups: std::ops::Range<u32>,
}

/// How many partitions `shard` of `file` is read in with `parallelism` cores (see
/// [`split_range`]).
fn shard_partitions(file: &DataFile, row_groups: &Range<u32>, parallelism: usize) -> usize {
    // In parallel, partitions of about `UNIT_ROWS` rows (each has a fixed cost to
    // start), at least one per core: the stream's cores decode the next
    // partitions while one is sent (see `ordered_stream`).
    if parallelism > 1 {
        let rows: i64 = file.metadata.row_groups()[row_groups.start as usize..row_groups.end as usize]
            .iter()
            .map(|rg| rg.num_rows())
            .sum();
        // At least one per core, at most `MAX_PARTITIONS` (even past 64 cores).
        (rows.max(0) as u64 / UNIT_ROWS)
            .max(parallelism as u64)
            .min(MAX_PARTITIONS as u64) as usize
    } else {
        1
    }
}

/// The most partitions a shard is cut into: a shard's row groups past it share partitions.
const MAX_PARTITIONS: usize = 64;

/// About the rows of a partition when a shard is decoded in parallel: smaller partitions
/// made the clicks filter slower (each pays its own start-up), larger ones made the lineitem
/// projection faster (measured with `bench_plain_client.py`, 2 threads; the figures are in
/// `benches/RESULTS.md`, "Scan: the server against DuckDB").
const UNIT_ROWS: u64 = 65_536;

/// `range` cut into at most `parts` contiguous, non-empty ranges of near-equal length, in
/// order.
fn split_range(range: Range<u32>, parts: usize) -> Vec<Range<u32>> {
    let len = range.end.saturating_sub(range.start);
    let parts = (parts.max(1) as u32).min(len.max(1));
    (0..parts)
        .map(|i| {
            let start = range.start + len * i / parts;
            let end = range.start + len * (i + 1) / parts;
            start..end
        })
        .filter(|r| !r.is_empty() || len == 0)
        .collect()
}

/// What the partitions of one stream may hold in finished batches, in KiB, in equal shares
/// (at least 1 MiB each; each may also have one batch waiting for room, so the bound is
/// approximate). With 2 cores, 16 MiB each: a 131,072-row row group of a lineitem projection
/// (7 MB) fits, so a partition ahead finishes and frees its core.
const AHEAD_KIB: u32 = 32 * 1024;

/// The plan's partitions one after another, as if one partition had read them all. Up to
/// `window` partitions past the one being sent decode ahead, each on its own task and each
/// holding at most its share of `AHEAD_KIB` of finished batches: a shard cut into row groups uses
/// `window` cores while its rows leave in order. Nothing of partition `i + 1` is emitted
/// before partition `i` ends, so a stream's rows, and the offsets it resumes from, do not
/// depend on the parallelism.
pub fn ordered_stream(
    plan: Arc<dyn ExecutionPlan>,
    ctx: Arc<datafusion::execution::TaskContext>,
    window: usize,
) -> datafusion::error::Result<datafusion::physical_plan::SendableRecordBatchStream> {
    let n = datafusion::physical_plan::ExecutionPlanProperties::output_partitioning(&plan).partition_count();
    let window = window.clamp(1, n.max(1));
    let share = (AHEAD_KIB / u32::try_from(window).unwrap_or(u32::MAX)).max(1024);
    ordered_stream_within(plan, ctx, window, share)
}

/// [`ordered_stream`] with `ahead_kib` for what each partition ahead may hold.
fn ordered_stream_within(
    plan: Arc<dyn ExecutionPlan>,
    ctx: Arc<datafusion::execution::TaskContext>,
    window: usize,
    ahead_kib: u32,
) -> datafusion::error::Result<datafusion::physical_plan::SendableRecordBatchStream> {
    let n = datafusion::physical_plan::ExecutionPlanProperties::output_partitioning(&plan).partition_count();
    if n <= 1 {
        return datafusion::physical_plan::execute_stream(plan, ctx);
    }
    let schema = plan.schema();
    // Opened up front, so a partition that cannot start fails the open, not the stream.
    let partitions = (0..n)
        .map(|i| plan.execute(i, Arc::clone(&ctx)))
        .collect::<datafusion::error::Result<Vec<_>>>()?;
    Ok(ordered_partitions(schema, partitions, window, ahead_kib))
}

/// [`ordered_stream_within`] over partitions already opened.
fn ordered_partitions(
    schema: arrow::datatypes::SchemaRef,
    partitions: Vec<datafusion::physical_plan::SendableRecordBatchStream>,
    window: usize,
    ahead_kib: u32,
) -> datafusion::physical_plan::SendableRecordBatchStream {
    use futures::StreamExt;
    // The partitions started, in order; the bound keeps the one being sent plus `window`.
    let window = window.clamp(1, partitions.len().max(1));
    let (started_tx, started_rx) = tokio::sync::mpsc::channel::<Ahead>(window);
    let starter = pushdown_task::Task::spawn(async move {
        for mut partition in partitions {
            // A slot first: no partition starts before there is room for it.
            let Ok(slot) = started_tx.reserve().await else {
                return;
            };
            let budget = Arc::new(tokio::sync::Semaphore::new(ahead_kib as usize));
            let (tx, batches) = tokio::sync::mpsc::unbounded_channel();
            let task = pushdown_task::Task::spawn(async move {
                while let Some(item) = partition.next().await {
                    let kib = item
                        .as_ref()
                        .map_or(1, |b| b.get_array_memory_size() / 1024)
                        .clamp(1, ahead_kib as usize) as u32;
                    let Ok(held) = Arc::clone(&budget).acquire_many_owned(kib).await else {
                        return;
                    };
                    if tx.send((item, held)).is_err() {
                        return;
                    }
                }
            });
            slot.send(Ahead { batches, task });
        }
    });
    let stream = tokio_stream::wrappers::ReceiverStream::new(started_rx)
        .flat_map(|ahead| {
            futures::stream::unfold(Some(ahead), |ahead| async move {
                let mut ahead = ahead?;
                // The batch leaves the budget as it is taken.
                if let Some((item, _held)) = ahead.batches.recv().await {
                    return Some((item, Some(ahead)));
                }
                // The partition's task ended: a panic in it must end the stream with an
                // error, never look like the partition's last batch.
                match ahead.task.await {
                    Ok(()) => None,
                    Err(e) => Some((
                        Err(datafusion::error::DataFusionError::Execution(format!(
                            "a partition's task failed: {e}"
                        ))),
                        None,
                    )),
                }
            })
        })
        .map(move |item| {
            // The stream owns the starter: dropping it stops every partition.
            let _owner = &starter;
            item
        });
    Box::pin(datafusion::physical_plan::stream::RecordBatchStreamAdapter::new(
        schema, stream,
    ))
}

/// A partition decoding ahead: its batches in order, each holding its share of the budget
/// until taken, and its task. Dropping it stops the partition.
struct Ahead {
    batches: tokio::sync::mpsc::UnboundedReceiver<(
        datafusion::error::Result<arrow::record_batch::RecordBatch>,
        tokio::sync::OwnedSemaphorePermit,
    )>,
    task: pushdown_task::Task<()>,
}

/// Registers every op as a UDF (a random one to be refused by name) whose resources
/// (tokenizers) come from the datasets, `default` being the one a call that names none uses.
pub fn register_ops(
    ctx: &SessionContext,
    datasets: &BTreeMap<String, Arc<Dataset>>,
    default: Option<String>,
    limits: &OpLimits,
) {
    let default = limits.tokenizer.clone().or(default);
    let resources = Arc::new(crate::udf::DatasetResources::new(
        datasets.clone(),
        default,
        Arc::clone(&limits.tokenizers),
    ));
    for udf in crate::udf::udfs(resources, limits.clone()) {
        ctx.register_udf(udf);
    }
}

/// `query` (a fragment or SQL) as a DataFrame over the tables registered in `ctx`, parsed
/// here (for callers outside a request: the baselines, tests).
pub async fn dataframe(ctx: &SessionContext, query: &Query) -> Result<DataFrame> {
    let checked = crate::allow::check(&ctx.state(), query, usize::MAX)?;
    checked_dataframe(ctx, query, &checked).await
}

/// `query`, as `checked` (its check) found it, as a DataFrame over the tables registered in
/// `ctx`: SQL's statement planned as parsed, read-only (no DDL, DML or statements even past
/// the allow-list).
pub async fn checked_dataframe(
    ctx: &SessionContext,
    query: &Query,
    checked: &CheckedQuery,
) -> Result<DataFrame> {
    match (query, checked.statement()) {
        (Query::Fragment(f), _) => fragment_dataframe(ctx, f).await,
        (Query::Sql(_), Some(statement)) => {
            let options = SQLOptions::new()
                .with_allow_ddl(false)
                .with_allow_dml(false)
                .with_allow_statements(false);
            let plan = ctx.state().statement_to_plan(statement.clone()).await?;
            options.verify_plan(&plan)?;
            Ok(ctx.execute_logical_plan(plan).await?)
        }
        (Query::Sql(_), None) => Err(ServerError::Internal(
            "SQL planned without its checked statement".into(),
        )),
    }
}

async fn fragment_dataframe(ctx: &SessionContext, f: &Fragment) -> Result<DataFrame> {
    let mut df = ctx.table(TableReference::bare(f.dataset.as_str())).await?;
    if let Some(predicate) = &f.predicate {
        let expr = df
            .parse_sql_expr(predicate)
            .map_err(|e| ServerError::bad_part(format!("predicate `{predicate}`"), e))?;
        if !is_row_wise_expr(&expr) {
            return Err(ServerError::BadQuery(format!(
                "predicate `{predicate}` must be evaluable one row at a time (no subqueries or aggregates)"
            )));
        }
        df = df.filter(expr)?;
    }
    for call in &f.ops {
        let expr = op_expr(ctx, call, df.schema())?;
        df = df.with_column(&call.output, expr)?;
    }
    if !f.columns.is_empty() {
        let columns: Vec<&str> = f.columns.iter().map(String::as_str).collect();
        df = df.select_columns(&columns)?;
    }
    Ok(df)
}

/// A fragment's op call as an expression: `op(column, literal, …)`.
fn op_expr(ctx: &SessionContext, call: &OpCall, schema: &DFSchema) -> Result<Expr> {
    let op = pushdown_ops::lookup(&call.op)
        .filter(|op| op.is_deterministic())
        .ok_or_else(|| {
            let known: Vec<&str> = pushdown_ops::registry()
                .iter()
                .filter(|op| op.is_deterministic())
                .map(|op| op.name())
                .collect();
            ServerError::BadQuery(format!(
                "unknown server op `{}`; ops: {}",
                call.op,
                known.join(", ")
            ))
        })?;
    let udf = ctx
        .udf(op.name())
        .map_err(|e| ServerError::failed(format!("op `{}` is not registered", op.name()), e))?;
    // A column of that name, or a struct's field (`image.bytes`, `image['bytes']`).
    let input = if schema.has_column_with_unqualified_name(&call.input) {
        datafusion::prelude::ident(&call.input)
    } else {
        let path = pushdown_ops::input_path(&call.input);
        let (root, fields) = path.split_first().unwrap_or((&call.input, &[]));
        fields.iter().fold(datafusion::prelude::ident(root), |e, f| {
            datafusion::functions::core::expr_fn::get_field(e, f.as_str())
        })
    };
    let args = std::iter::once(input)
        .chain(call.params.iter().map(|p| match p {
            Value::Int(i) => datafusion::prelude::lit(*i),
            Value::Float(x) => datafusion::prelude::lit(*x),
            Value::Text(t) => datafusion::prelude::lit(t.as_str()),
            Value::List(_) => datafusion::prelude::lit(p.text()),
        }))
        .collect();
    Ok(udf.call(args))
}

/// Whether `expr` maps each row on its own, the same way on every run: no subqueries,
/// aggregates or windows, and no volatile function (`random()`, `now()`): a query that draws
/// different rows per run cannot be sharded, counted or resumed.
fn is_row_wise_expr(expr: &Expr) -> bool {
    !expr
        .exists(|e| {
            Ok(e.is_volatile_node()
                || matches!(
                    e,
                    Expr::ScalarSubquery(_)
                        | Expr::InSubquery(_)
                        | Expr::Exists(_)
                        | Expr::OuterReferenceColumn(..)
                        | Expr::AggregateFunction(_)
                        | Expr::WindowFunction(_)
                ))
        })
        .unwrap_or(true)
}

/// Whether the plan's row `i` is its table's row `i`: a row-wise plan with no filter (in
/// it, pushed into its scan, or in a view it reads) and no limit.
/// A row-wise plan's filter and the one-to-one plan it filters (consecutive filters joined
/// by `AND`), beneath projections: what [`Engine::filtered_part`] evaluates alone. `None`
/// for any other shape, and for a volatile filter (evaluated twice, it would differ).
fn part_filter(plan: &LogicalPlan) -> Option<(Expr, Arc<LogicalPlan>)> {
    match plan {
        LogicalPlan::Projection(p) if p.expr.iter().all(is_row_wise_expr) => part_filter(&p.input),
        LogicalPlan::SubqueryAlias(a) => part_filter(&a.input),
        LogicalPlan::Filter(f) if is_row_wise_expr(&f.predicate) && !f.predicate.is_volatile() => {
            if one_to_one(&f.input) {
                return Some((f.predicate.clone(), Arc::clone(&f.input)));
            }
            match f.input.as_ref() {
                LogicalPlan::Filter(_) => {
                    part_filter(&f.input).map(|(inner, input)| (f.predicate.clone().and(inner), input))
                }
                _ => None,
            }
        }
        _ => None,
    }
}

fn one_to_one(plan: &LogicalPlan) -> bool {
    match plan {
        LogicalPlan::Projection(p) => p.expr.iter().all(is_row_wise_expr) && one_to_one(&p.input),
        LogicalPlan::SubqueryAlias(a) => one_to_one(&a.input),
        LogicalPlan::TableScan(s) if s.fetch.is_none() && s.filters.is_empty() => {
            s.source.get_logical_plan().is_none_or(|view| one_to_one(&view))
        }
        _ => false,
    }
}

/// The one table a row-wise plan scans, or `None` when the plan is not row-wise.
fn row_wise_table(plan: &LogicalPlan) -> Option<String> {
    match plan {
        LogicalPlan::Projection(p) if p.expr.iter().all(is_row_wise_expr) => row_wise_table(&p.input),
        LogicalPlan::Filter(f) if is_row_wise_expr(&f.predicate) => row_wise_table(&f.input),
        LogicalPlan::SubqueryAlias(a) => row_wise_table(&a.input),
        LogicalPlan::TableScan(s) if s.fetch.is_none() => match s.source.get_logical_plan() {
            // A view: row-wise when its own query is, over the dataset beneath it.
            Some(view) if s.filters.is_empty() => row_wise_table(&view),
            Some(_) => None,
            None => Some(s.table_name.table().to_owned()),
        },
        _ => None,
    }
}

/// What the optimizer pushed into the (first) table scan.
struct ScanInfo {
    table: datafusion::common::TableReference,
    projection: Option<Vec<usize>>,
    filters: Vec<Expr>,
    filter_columns: Vec<usize>,
}

fn scan_of(plan: &LogicalPlan) -> Option<ScanInfo> {
    let mut found = None;
    let _ = plan.apply(|node| {
        if let LogicalPlan::TableScan(s) = node {
            let schema = s.source.schema();
            let mut filter_columns: Vec<usize> = s
                .filters
                .iter()
                .flat_map(|f| f.column_refs())
                .filter_map(|c| schema.index_of(&c.name).ok())
                .collect();
            filter_columns.sort_unstable();
            filter_columns.dedup();
            found = Some(ScanInfo {
                table: s.table_name.clone(),
                projection: s.projection.clone(),
                filters: s.filters.clone(),
                filter_columns,
            });
            return Ok(datafusion::common::tree_node::TreeNodeRecursion::Stop);
        }
        Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
    });
    found
}

/// The scan's filters as a predicate over row-group statistics (`None`: nothing to prune by).
fn pruning_predicate(
    ctx: &SessionContext,
    dataset: &Dataset,
    scan: &ScanInfo,
) -> Result<Option<Arc<PruningPredicate>>> {
    // Only what reads the files' own columns: a path column has no statistics.
    let file_schema = &dataset.file_schema;
    let on_files = scan
        .filters
        .iter()
        .flat_map(datafusion::logical_expr::utils::split_conjunction)
        .filter(|e| {
            e.column_refs()
                .iter()
                .all(|c| file_schema.index_of(&c.name).is_ok())
        })
        .cloned();
    let Some(filter) = conjunction(on_files) else {
        return Ok(None);
    };
    // NaN rows are invisible to float statistics (see `table`): no pruning by them.
    let names = scan
        .filter_columns
        .iter()
        .map(|&c| dataset.schema.field(c).name().as_str());
    if crate::table::reads_floats(&dataset.schema, names) {
        return Ok(None);
    }
    // Pruning only saves work: a filter that cannot be turned into one prunes nothing.
    let df_schema = DFSchema::try_from_qualified_schema(scan.table.clone(), file_schema)?;
    let physical = match ctx.create_physical_expr(filter, &df_schema) {
        Ok(p) => p,
        Err(e) => {
            tracing::debug!(error = %e, "no plan-time pruning for this filter");
            return Ok(None);
        }
    };
    // A filter the statistics cannot judge (e.g. over an op's output) prunes nothing.
    Ok(PruningPredicateBuilder::new()
        .with_file_schema(Arc::clone(file_schema))
        .build(physical))
}

/// Which of `file`'s row groups may hold rows passing `predicate`, judged by their min/max
/// and null-count statistics exactly as the scan itself judges them.
fn matching_row_groups(
    dataset: &Dataset,
    file: &DataFile,
    predicate: Option<&PruningPredicate>,
) -> Vec<bool> {
    let n = file.num_row_groups();
    // A drifted file's statistics are in its own types: the scan judges them, per file.
    let Some(predicate) = predicate.filter(|_| !file.drifted) else {
        return vec![true; n];
    };
    let mut filter = RowGroupAccessPlanFilter::new(ParquetAccessPlan::new_all(n));
    let metrics = ExecutionPlanMetricsSet::new();
    filter.prune_by_statistics(
        &dataset.file_schema,
        file.metadata.file_metadata().schema_descr(),
        file.metadata.row_groups(),
        predicate,
        &ParquetFileMetrics::new(0, &file.path, &metrics),
    );
    let access = filter.build();
    (0..n).map(|rg| access.should_scan(rg)).collect()
}

/// Parquet leaf columns under the projected top-level fields (`None`: all).
fn leaf_columns(dataset: &Dataset, projection: Option<&[usize]>) -> Option<Vec<usize>> {
    let projection = projection?;
    let descr = dataset.files.first()?.metadata.file_metadata().schema_descr_ptr();
    Some(
        (0..descr.num_columns())
            .filter(|&leaf| projection.contains(&descr.get_column_root_idx(leaf)))
            .collect(),
    )
}

/// The filter pushdown an `Auto` request gets: on where the scan of a row-wise query pays
/// off for late materialization (see [`auto_filter_pushdown`]), off otherwise.
fn decide_filter_pushdown(row_wise: Option<&Arc<Dataset>>, scan: Option<&ScanInfo>) -> FilterPushdown {
    let on = match (row_wise, scan) {
        (Some(dataset), Some(s)) => auto_filter_pushdown(dataset, s.projection.as_deref(), &s.filter_columns),
        _ => false,
    };
    if on {
        FilterPushdown::On
    } else {
        FilterPushdown::Off
    }
}

/// Late materialization pays off when the filter is cheap to read and the rest of the
/// projection is far more expensive: decode the filter columns, then only the surviving rows
/// of the others. Judged from the dataset's column chunk sizes, against
/// [`LATE_MATERIALIZATION_MIN_RATIO`].
fn auto_filter_pushdown(dataset: &Dataset, projection: Option<&[usize]>, filter_columns: &[usize]) -> bool {
    if filter_columns.is_empty() {
        return false;
    }
    let all: Vec<usize> = (0..dataset.schema.fields().len()).collect();
    let projected = projection.unwrap_or(&all);
    let rest: Vec<usize> = projected
        .iter()
        .copied()
        .filter(|c| !filter_columns.contains(c))
        .collect();
    let bytes = |cols: &[usize]| -> u64 {
        let leaves = leaf_columns(dataset, Some(cols));
        dataset
            .files
            .iter()
            .flat_map(|f| (0..f.num_row_groups()).map(move |rg| (f, rg)))
            .map(|(f, rg)| f.row_group_bytes(rg, leaves.as_deref()))
            .sum()
    };
    bytes(&rest) >= LATE_MATERIALIZATION_MIN_RATIO * bytes(filter_columns).max(1)
}

/// How many times the filter columns' bytes the rest of a projection must weigh before the
/// filter runs inside the Parquet decoder. The decoder still decompresses every page of the
/// rest (apache/arrow-rs#7363) and pays per selected range (apache/arrow-rs#10852), so only
/// a much heavier rest wins. Measured (`harness scan`, plain client, 2 threads): images and
/// text, whose rest weighs hundreds of times the filter columns, gain; the clicks and
/// lineitem filters and Q6, a few to a few tens of times, ran the same or slower with it
/// (`benches/RESULTS.md`, "Scan: the server against DuckDB").
const LATE_MATERIALIZATION_MIN_RATIO: u64 = 32;

/// The names DataFusion registers the Parquet scan's metrics under, read from its own typed
/// `ParquetFileMetrics` rather than written here: a field that is renamed or removed fails
/// to compile, and a metric registered under a new name is still found.
#[derive(Debug)]
struct ScanMetricNames {
    bytes_scanned: String,
    rows_pruned_by_filter: String,
    row_groups_pruned: Vec<String>,
}

/// Found by probing: each metric of a fresh `ParquetFileMetrics` gets a distinct value, and
/// the metrics set tells the name that value was registered under.
static SCAN_METRIC_NAMES: std::sync::LazyLock<ScanMetricNames> = std::sync::LazyLock::new(|| {
    let set = ExecutionPlanMetricsSet::new();
    let probe = ParquetFileMetrics::new(0, "probe", &set);
    probe.bytes_scanned.add(1);
    probe.pushdown_rows_pruned.add(2);
    probe.row_groups_pruned_statistics.add_pruned(3);
    probe.row_groups_pruned_bloom_filter.add_pruned(4);
    probe.limit_pruned_row_groups.add_pruned(5);
    let mut names = ScanMetricNames {
        bytes_scanned: String::new(),
        rows_pruned_by_filter: String::new(),
        row_groups_pruned: Vec::new(),
    };
    for metric in set.clone_inner().iter() {
        match metric.value() {
            MetricValue::Count { name, count } => match count.value() {
                1 => names.bytes_scanned = name.to_string(),
                2 => names.rows_pruned_by_filter = name.to_string(),
                _ => {}
            },
            MetricValue::PruningMetrics {
                name,
                pruning_metrics,
            } if (3..=5).contains(&pruning_metrics.pruned()) => {
                names.row_groups_pruned.push(name.to_string())
            }
            _ => {}
        }
    }
    names
});

/// What the plan's scans did, from DataFusion's execution metrics.
pub fn scan_stats(plan: &Arc<dyn ExecutionPlan>) -> StreamStats {
    let names = &*SCAN_METRIC_NAMES;
    let mut stats = StreamStats::default();
    let mut stack = vec![Arc::clone(plan)];
    while let Some(node) = stack.pop() {
        stack.extend(node.children().into_iter().cloned());
        if node
            .downcast_ref::<datafusion::datasource::source::DataSourceExec>()
            .is_none()
        {
            continue;
        }
        let Some(metrics) = node.metrics() else { continue };
        for metric in metrics.iter() {
            match metric.value() {
                MetricValue::Count { name, count } => {
                    if name.as_ref() == names.bytes_scanned {
                        stats.bytes_scanned += count.value() as u64;
                    } else if name.as_ref() == names.rows_pruned_by_filter {
                        // Rows the late-materialized filter dropped were decoded too.
                        stats.rows_scanned += count.value() as u64;
                    }
                }
                MetricValue::OutputRows(count) => stats.rows_scanned += count.value() as u64,
                MetricValue::PruningMetrics {
                    name,
                    pruning_metrics,
                } if names.row_groups_pruned.iter().any(|n| n == name.as_ref()) => {
                    stats.row_groups_pruned += pruning_metrics.pruned() as u64;
                }
                _ => {}
            }
        }
    }
    stats
}

#[cfg(test)]
mod metric_tests {
    /// An upgrade of DataFusion that renames or drops a scan metric must fail here, not zero
    /// the servers' accounting silently.
    #[test]
    fn the_scan_metrics_are_found_in_datafusions_own_metrics() {
        let names = &*super::SCAN_METRIC_NAMES;
        assert!(!names.bytes_scanned.is_empty(), "{names:?}");
        assert!(!names.rows_pruned_by_filter.is_empty(), "{names:?}");
        assert_eq!(names.row_groups_pruned.len(), 3, "{names:?}");
    }
}

#[cfg(test)]
mod split_tests {
    use super::split_range;

    #[test]
    fn ranges_split_into_contiguous_near_equal_parts() {
        assert_eq!(split_range(0..8, 4), vec![0..2, 2..4, 4..6, 6..8]);
        assert_eq!(split_range(3..10, 3), vec![3..5, 5..7, 7..10]);
        assert_eq!(split_range(2..4, 8), vec![2..3, 3..4]);
        assert_eq!(split_range(5..6, 1), vec![5..6]);
        assert_eq!(split_range(0..5, 0), vec![0..5]);
    }
}

#[cfg(test)]
mod ordered_tests {
    use std::sync::Arc;

    use arrow::array::{AsArray, Int64Array};
    use arrow::datatypes::{DataType, Field, Int64Type, Schema};
    use arrow::record_batch::RecordBatch;
    use datafusion::datasource::memory::MemorySourceConfig;
    use datafusion::execution::TaskContext;
    use futures::StreamExt;

    use super::{ordered_partitions, ordered_stream_within};

    /// `parts` partitions of `batches` batches of `rows` rows each, numbered in order.
    fn numbered(parts: i64, batches: i64, rows: i64) -> Arc<dyn datafusion::physical_plan::ExecutionPlan> {
        let schema = Arc::new(Schema::new(vec![Field::new("n", DataType::Int64, false)]));
        let partitions: Vec<Vec<RecordBatch>> = (0..parts)
            .map(|p| {
                (0..batches)
                    .map(|b| {
                        let first = (p * batches + b) * rows;
                        let column = Int64Array::from_iter_values(first..first + rows);
                        RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(column)]).expect("batch")
                    })
                    .collect()
            })
            .collect();
        MemorySourceConfig::try_new_exec(&partitions, schema, None).expect("plan")
    }

    async fn numbers(
        stream: datafusion::physical_plan::SendableRecordBatchStream,
        take: Option<usize>,
    ) -> Vec<i64> {
        let batches = stream.take(take.unwrap_or(usize::MAX));
        batches
            .map(|b| {
                b.expect("batch")
                    .column(0)
                    .as_primitive::<Int64Type>()
                    .values()
                    .to_vec()
            })
            .concat()
            .await
    }

    /// More partitions than the window, each holding more than its budget: every row, in
    /// partition order, whatever the window.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn partitions_ahead_keep_the_order_within_their_budget() {
        let plan = numbered(9, 5, 700);
        let all: Vec<i64> = (0..9 * 5 * 700).collect();
        for window in [1, 2, 3, 16] {
            // 1 KiB: each partition ahead holds one batch at a time.
            let stream =
                ordered_stream_within(Arc::clone(&plan), Arc::new(TaskContext::default()), window, 1)
                    .expect("stream");
            assert_eq!(numbers(stream, None).await, all, "window {window}");
        }
    }

    /// What decodes ahead is bounded: a reader that stops after one batch finds only the
    /// started partitions (the one being sent and `window` more) each holding its budget
    /// (plus the batch waiting for room), never the whole shard decoded; and every row still
    /// arrives, in order, once it reads on.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn partitions_ahead_hold_no_more_than_their_budget() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let (parts, batches, rows, window) = (6_i64, 8_i64, 1024_i64, 2_usize);
        let plan = numbered(parts, batches, rows);
        let schema = plan.schema();
        let ctx = Arc::new(TaskContext::default());
        let produced = Arc::new(AtomicUsize::new(0));
        let partitions = (0..parts as usize)
            .map(|i| {
                let produced = Arc::clone(&produced);
                let stream = plan
                    .execute(i, Arc::clone(&ctx))
                    .expect("partition")
                    .inspect(move |_| {
                        produced.fetch_add(1, Ordering::SeqCst);
                    });
                Box::pin(datafusion::physical_plan::stream::RecordBatchStreamAdapter::new(
                    Arc::clone(&schema),
                    stream,
                )) as datafusion::physical_plan::SendableRecordBatchStream
            })
            .collect();
        // 1,024 Int64 rows are 8 KiB: a 16 KiB budget holds two batches per partition.
        let mut stream = ordered_partitions(Arc::clone(&schema), partitions, window, 16);
        let first = stream.next().await.expect("a batch").expect("batch");
        assert_eq!(first.num_rows(), rows as usize);
        // The partitions ahead decode while the reader waits.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while produced.load(Ordering::SeqCst) < 1 + 2 * window {
            assert!(std::time::Instant::now() < deadline, "nothing decoded ahead");
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        let held = produced.load(Ordering::SeqCst);
        let bound = 1 + (window + 1) * (2 + 1);
        assert!(
            held <= bound,
            "{held} batches decoded for a reader that took 1 (at most {bound})"
        );
        let rest = numbers(stream, None).await;
        let all: Vec<i64> = (rows..parts * batches * rows).collect();
        assert_eq!(rest, all);
    }

    /// A partition whose task panics ends the stream with an error, never as if its rows
    /// had simply ended.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_panicking_partition_ends_the_stream_with_an_error() {
        use datafusion::physical_plan::test::exec::PanicExec;
        let schema = Arc::new(Schema::new(vec![Field::new("n", DataType::Int64, false)]));
        // Each partition panics after a few (empty) batches.
        let panics = Arc::new(
            PanicExec::new(schema, 2)
                .with_partition_panic(0, 2)
                .with_partition_panic(1, 1),
        );
        let stream =
            ordered_stream_within(panics, Arc::new(TaskContext::default()), 2, 1024).expect("stream");
        let items: Vec<_> = stream.collect().await;
        assert!(
            items.iter().any(|i| i.is_err()),
            "{} items, none an error",
            items.len()
        );
    }

    /// A reader that stops early drops the stream; the partitions decoding ahead, and those
    /// not started yet, stop with it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn dropping_the_stream_stops_every_partition() {
        use datafusion::physical_plan::test::exec::BlockingExec;
        let schema = Arc::new(Schema::new(vec![Field::new("n", DataType::Int64, false)]));
        let blocking = Arc::new(BlockingExec::new(schema, 5));
        let refs = blocking.refs();
        let mut stream =
            ordered_stream_within(blocking, Arc::new(TaskContext::default()), 2, 1).expect("stream");
        // Every partition opened: each holds a reference until it ends.
        assert!(refs.strong_count() >= 5, "{}", refs.strong_count());
        let waited = tokio::time::timeout(std::time::Duration::from_millis(50), stream.next()).await;
        assert!(waited.is_err(), "a blocking partition yields nothing");
        drop(stream);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while refs.strong_count() > 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "{} partitions left running",
                refs.strong_count()
            );
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }
}
