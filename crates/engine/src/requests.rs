//! What a front end asks of a node: one method per kind of request, each returning the
//! engine's own types. A front end decodes a request, calls one of these, and encodes the
//! answer; none of them knows of gRPC, and each runs in-process (tests, baselines, fuzz)
//! exactly as a Flight request does.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::datatypes::{DataType, SchemaRef};
use pushdown_protocol::{
    ClientReport, DatasetVersion, Fragment, Profile, Query, ScalingSignal, ScanRequest, ShardTicket,
};
use tokio::sync::OwnedSemaphorePermit;

use crate::auth::{Caller, Grant};
use crate::catalog::Dataset;
use crate::error::{Result, ServerError};
use crate::node::Node;
use crate::prepared::{PreparedStatement, rewrite_placeholders};
use crate::query::{Planned, Shape};
use crate::views::View;

/// Rows the `profile` request samples.
const PROFILE_ROWS: usize = 256;

/// A dataset or view a caller may read, as a listing names it.
#[derive(Debug, Clone)]
pub struct Listed {
    pub name: String,
    pub kind: ListedKind,
    pub schema: SchemaRef,
    /// Rows and bytes, known for a dataset, not for a view (that would mean running it).
    pub rows: Option<u64>,
    pub bytes: Option<u64>,
    /// A view's is summed over the datasets beneath it.
    pub version: DatasetVersion,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListedKind {
    Dataset,
    View,
}

/// A statement prepared for later binding: its handle, its answer's schema, and the types of
/// its parameters (`$1`, `$2`, …; `None` where the plan does not say).
#[derive(Debug)]
pub struct Prepared {
    pub statement: PreparedStatement,
    pub schema: SchemaRef,
    pub parameters: HashMap<String, Option<DataType>>,
}

/// A place among the streams a node admits at once, held until dropped.
#[derive(Debug)]
pub struct Slot {
    _permit: OwnedSemaphorePermit,
}

impl Node {
    /// Who sends `authorization` (the header's value, if any): anyone on a node without
    /// tokens, else the holder of the bearer token (or `Unauthenticated`).
    pub fn authenticate(&self, authorization: Option<&str>) -> Result<Caller> {
        match &self.tokens {
            None => Ok(Caller::anonymous()),
            Some(tokens) => tokens.authenticate(authorization),
        }
    }

    /// Waits (up to `ServerConfig::queue_timeout`) for one of the places among the streams
    /// admitted at once; `Overloaded` when none frees in time. A stream holds it until it
    /// ends, an action that plans or reads until it answers.
    pub async fn admit(&self) -> Result<Slot> {
        let wait = self.config.queue_timeout;
        match tokio::time::timeout(wait, Arc::clone(&self.streams).acquire_owned()).await {
            Ok(Ok(permit)) => Ok(Slot { _permit: permit }),
            Ok(Err(_)) => Err(ServerError::Internal("stream limiter closed".into())),
            Err(_) => Err(ServerError::Overloaded(format!(
                "all {} stream slots busy for {wait:?}; retry later",
                self.config.max_concurrent_streams
            ))),
        }
    }

    /// The streams admitted now.
    pub(crate) fn admitted(&self) -> usize {
        self.config
            .max_concurrent_streams
            .max(1)
            .saturating_sub(self.streams.available_permits())
    }

    /// Plans `request` as `GetFlightInfo` does: result schema, shape, estimates, tickets.
    /// Counts the row groups pruned, and remembers the endpoints' order for the read-ahead.
    pub async fn plan(self: &Arc<Self>, request: &ScanRequest, grant: &Arc<Grant>) -> Result<Planned> {
        let planned = self.plan_quietly(request, grant).await?;
        self.metrics
            .row_groups_pruned_at_planning
            .inc_by(planned.row_groups_pruned);
        if self.config.read_ahead {
            let tickets: Vec<bytes::Bytes> = planned.tickets().iter().map(|t| t.encode()).collect();
            self.prefetch.remember(&tickets);
        }
        Ok(planned)
    }

    /// Plans off the I/O threads ([`Node::on_control`]): a CPU runtime's deep stacks hold
    /// DataFusion's recursion over large query trees, and a slow plan never holds up the
    /// I/O threads. Counts and remembers nothing.
    async fn plan_quietly(self: &Arc<Self>, request: &ScanRequest, grant: &Arc<Grant>) -> Result<Planned> {
        let (node, request, grant) = (Arc::clone(self), request.clone(), Arc::clone(grant));
        self.on_control(
            "planning",
            async move { node.engine.plan(&request, &grant).await },
        )
        .await
    }

    /// The schema of `request`'s answer.
    pub async fn schema(self: &Arc<Self>, request: &ScanRequest, grant: &Arc<Grant>) -> Result<SchemaRef> {
        Ok(self.plan_quietly(request, grant).await?.schema)
    }

    /// The datasets `grant` may read (by name), then its views (in the catalog file's
    /// order); no other is even named. A view that cannot be planned now (a dataset beneath
    /// it is missing or broken) is left out, with a warning.
    pub async fn list(self: &Arc<Self>, grant: &Arc<Grant>) -> Result<Vec<Listed>> {
        let datasets = self.engine.visible(grant).await?;
        let mut listed: Vec<Listed> = datasets
            .values()
            .map(|d| Listed {
                name: d.name.clone(),
                kind: ListedKind::Dataset,
                schema: Arc::clone(&d.schema),
                rows: Some(d.num_rows()),
                bytes: Some(d.num_bytes()),
                version: version_of(d),
            })
            .collect();
        let all = self.engine.catalog().snapshot();
        for view in self.engine.visible_views(grant) {
            let schema = match self.view_schema(&view, grant).await {
                Ok(schema) => schema,
                Err(e) => {
                    tracing::warn!(view = %view.name, error = %e, "view cannot be planned; not listed");
                    continue;
                }
            };
            let bases: Vec<_> = view.bases.iter().filter_map(|b| all.get(b)).collect();
            listed.push(Listed {
                name: view.name.clone(),
                kind: ListedKind::View,
                schema,
                rows: None,
                bytes: None,
                version: DatasetVersion {
                    dataset: view.name.clone(),
                    version: view.version(&all),
                    files: bases.iter().map(|d| d.files.len() as u64).sum(),
                    broken_files: bases.iter().map(|d| d.broken.len() as u64).sum(),
                },
            });
        }
        Ok(listed)
    }

    /// A view's result schema, planned off the I/O threads.
    async fn view_schema(self: &Arc<Self>, view: &View, grant: &Arc<Grant>) -> Result<SchemaRef> {
        let query = Query::Fragment(Fragment {
            dataset: view.name.clone(),
            ..Fragment::default()
        });
        let (node, grant) = (Arc::clone(self), Arc::clone(grant));
        self.on_control("planning a view", async move {
            Ok(node.engine.describe(&query, &grant).await?.0)
        })
        .await
    }

    /// Rescans the catalog; the versions of the datasets `grant` may read.
    pub async fn refresh(&self, grant: &Grant) -> Result<Vec<DatasetVersion>> {
        self.engine.catalog().refresh().await?;
        let datasets = grant.visible(&self.engine.catalog().snapshot());
        Ok(datasets.values().map(|d| version_of(d)).collect())
    }

    /// How `request` is planned, as text: its shape, estimates, schema, what the fragment
    /// cache holds of it, and the optimized logical plan.
    pub async fn explain(self: &Arc<Self>, request: &ScanRequest, grant: &Arc<Grant>) -> Result<String> {
        let planned = self.plan_quietly(request, grant).await?;
        let shape = match &planned.shape {
            Shape::RowWise { dataset, shards } => {
                format!("row-wise over `{}`: {} shards", dataset.name, shards.len())
            }
            Shape::Whole => "not row-wise: one stream over the whole query".to_string(),
        };
        let cache = match planned.cache_keys()?.as_slice() {
            [] => "not cached (not row-wise, or not deterministic)".to_string(),
            keys => format!(
                "mode {}; {}",
                self.engine.cache_mode(&planned.names),
                self.cache.describe(keys)
            ),
        };
        Ok(format!(
            "{shape}\nfilter pushdown: {:?}\nrows (upper bound): {}\nbytes to scan (upper bound): {}\nschema: {}\ncache: {cache}\n\n{}",
            planned.request.filter_pushdown,
            planned.rows_upper_bound,
            planned.bytes_to_scan,
            planned.schema,
            planned.optimized.display_indent()
        ))
    }

    /// Where a sample of `request`'s rows (a fragment's) spends its time, per op.
    pub async fn profile(self: &Arc<Self>, request: ScanRequest, grant: &Arc<Grant>) -> Result<Profile> {
        let (node, grant) = (Arc::clone(self), Arc::clone(grant));
        let cores = self.config.cpu_threads as u32;
        self.on_cpu("profile", async move {
            crate::profile::profile(&node.engine, &request, PROFILE_ROWS, cores, &grant).await
        })
        .await
    }

    /// The rows `ticket` reads.
    pub async fn count(self: &Arc<Self>, ticket: ShardTicket, grant: &Arc<Grant>) -> Result<u64> {
        let (node, grant) = (Arc::clone(self), Arc::clone(grant));
        self.on_control("count", async move { node.engine.count(&ticket, &grant).await })
            .await
    }

    /// Records a client's report for the scaling signal.
    pub fn report(&self, report: ClientReport) {
        self.scaling.record(report);
    }

    /// The node's scaling signal: whether its clients wait on it, and how many cores would do.
    pub fn scaling(&self) -> ScalingSignal {
        self.scaling.signal()
    }

    /// Keeps a trainer's tokenizer (`json`, parsed off the async threads) and returns its
    /// id. Kept by its content, it names only itself, and it reads no data: any caller may
    /// give one.
    pub async fn give_tokenizer(&self, json: Vec<u8>) -> Result<String> {
        let tokenizers = Arc::clone(self.engine.tokenizers());
        tokio::task::spawn_blocking(move || tokenizers.give(&json))
            .await
            .map_err(|e| ServerError::Internal(format!("parsing a given tokenizer: {e}")))?
            .map_err(|reason| ServerError::BadRequest(format!("give_tokenizer: {reason}")))
    }

    /// Whether this node keeps the given tokenizer `id` names.
    pub fn has_tokenizer(&self, id: &str) -> bool {
        self.engine.tokenizers().given(id.trim()).is_some()
    }

    /// The tokenizer (JSON) `name` gives: the node's own (its folder's, or a given one)
    /// where no dataset or view has the name, else the one its dataset ships (a view's is
    /// its dataset's).
    pub async fn tokenizer(&self, name: &str, grant: &Grant) -> Result<String> {
        let views = self.engine.views();
        let is_dataset = views.get(name).is_some()
            || self
                .engine
                .catalog()
                .snapshot()
                .keys()
                .any(|d| d.eq_ignore_ascii_case(name));
        if !is_dataset
            && let Some(t) = self
                .engine
                .tokenizers()
                .get(name)
                .map_err(|reason| ServerError::NoResource(format!("tokenizer `{name}`: {reason}")))?
        {
            return t
                .to_string(false)
                .map_err(|e| ServerError::failed("serializing the tokenizer", e));
        }
        grant.check_spelling(name)?;
        let dataset = match views.bases_of(name).iter().collect::<Vec<_>>().as_slice() {
            [only] => {
                let dataset = self.engine.catalog().dataset(only).await?;
                if views.get(name).is_none() {
                    grant.check(&dataset.name)?;
                }
                dataset
            }
            _ => {
                return Err(ServerError::BadRequest(format!(
                    "`{name}` reads several datasets: name one for its tokenizer"
                )));
            }
        };
        match &dataset.tokenizer {
            None => Err(ServerError::NoResource(format!(
                "dataset `{}` ships no {}",
                dataset.name,
                pushdown_ops::TOKENIZER_FILE
            ))),
            Some(Err(reason)) => Err(ServerError::CorruptFile {
                dataset: dataset.name.clone(),
                file: pushdown_ops::TOKENIZER_FILE.to_owned(),
                reason: reason.clone(),
            }),
            Some(Ok(t)) => t
                .to_string(false)
                .map_err(|e| ServerError::failed("serializing the tokenizer", e)),
        }
    }

    /// Prepares `sql` (`?` placeholders become `$1`, `$2`, …): checked and planned for its
    /// answer's schema and its parameters' types, off the I/O threads.
    pub async fn prepare(self: &Arc<Self>, sql: &str, grant: &Arc<Grant>) -> Result<Prepared> {
        let sql = rewrite_placeholders(sql, |_| Ok(None))?;
        let (node, grant, statement) = (Arc::clone(self), Arc::clone(grant), Query::Sql(sql.clone()));
        let (schema, plan) = self
            .on_control("preparing", async move {
                node.engine.describe(&statement, &grant).await
            })
            .await?;
        Ok(Prepared {
            parameters: plan.get_parameter_types()?,
            statement: PreparedStatement { sql, params: None },
            schema,
        })
    }
}

/// A dataset's version as listings and `refresh` report it.
fn version_of(d: &Dataset) -> DatasetVersion {
    DatasetVersion {
        dataset: d.name.clone(),
        version: d.version(),
        files: d.files.len() as u64,
        broken_files: d.broken.len() as u64,
    }
}
