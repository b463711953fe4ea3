//! The Arrow Flight service: catalog, planning and streaming over gRPC.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use arrow::ipc::writer::IpcWriteOptions;
use arrow_flight::flight_descriptor::DescriptorType;
use arrow_flight::flight_service_server::FlightService;
use arrow_flight::{
    Action, ActionType, Criteria, Empty, FlightData, FlightDescriptor, FlightEndpoint, FlightInfo,
    HandshakeRequest, HandshakeResponse, PollInfo, PutResult, SchemaAsIpc, SchemaResult, Ticket,
};
use futures::FutureExt;
use futures::stream::{BoxStream, StreamExt};
use pushdown_protocol::{
    ActionKind, ClientReport, Compression, CountReply, DEFERRED_FROM_KEY, Deferral, Fragment, Query,
    ScanRequest, ShardTicket,
};
use tokio::sync::{OwnedSemaphorePermit, mpsc};
use tonic::{Request, Response, Status, Streaming};
use tracing::Instrument;

use crate::State;
use crate::auth::{Caller, Grant};
use crate::catalog::panic_message;
use crate::codec::{Encoder, Governor};
use crate::error::{Result, ServerError, outcome};
use crate::query::{Shape, scan_stats};

type FlightStream<T> = BoxStream<'static, Result<T, Status>>;

/// The `pushdown` Flight service. Cheap to clone.
#[derive(Debug, Clone)]
pub struct PushdownService {
    state: Arc<State>,
}

impl PushdownService {
    pub(crate) fn new(state: Arc<State>) -> Self {
        Self { state }
    }

    pub(crate) fn state(&self) -> Arc<State> {
        Arc::clone(&self.state)
    }

    pub(crate) fn engine(&self) -> &crate::query::Engine {
        &self.state.engine
    }

    fn sql(&self) -> crate::flight_sql::FlightSql {
        crate::flight_sql::FlightSql::new(self.clone())
    }

    pub(crate) fn finish<T>(&self, method: &'static str, result: Result<T>) -> Result<T, Status> {
        self.state.metrics.record_request(method, outcome(&result));
        result.map_err(Status::from)
    }

    pub(crate) fn fail(&self, method: &'static str, error: ServerError) -> Status {
        let result: Result<()> = Err(error);
        self.state.metrics.record_request(method, outcome(&result));
        match result {
            Err(e) => Status::from(e),
            Ok(()) => Status::internal("unreachable"),
        }
    }

    /// Who sent `request`: anyone on a server without tokens, else the holder of the bearer
    /// token it carries (or `Unauthenticated`).
    pub(crate) fn caller<T>(&self, request: &Request<T>) -> Result<Caller> {
        match &self.state.tokens {
            None => Ok(Caller::anonymous()),
            Some(tokens) => tokens.authenticate(request.metadata()),
        }
    }

    /// A descriptor as a request: a command (ScanRequest or SQL) or a path `[dataset]`.
    fn request_of(descriptor: &FlightDescriptor) -> Result<ScanRequest> {
        Self::request_and_origin(descriptor).map(|(request, _)| request)
    }

    /// [`Self::request_of`], and whether the client could not choose the stream's codec (SQL
    /// text or a path: what plain Flight clients such as pyarrow send).
    fn request_and_origin(descriptor: &FlightDescriptor) -> Result<(ScanRequest, bool)> {
        match DescriptorType::try_from(descriptor.r#type) {
            Ok(DescriptorType::Cmd) => {
                ScanRequest::decode_command_origin(&descriptor.cmd).map_err(ServerError::BadCommand)
            }
            Ok(DescriptorType::Path) => match descriptor.path.as_slice() {
                [dataset] => Ok((
                    ScanRequest::new(Query::Fragment(Fragment {
                        dataset: dataset.clone(),
                        ..Fragment::default()
                    })),
                    true,
                )),
                other => Err(ServerError::BadRequest(format!(
                    "a path descriptor names one dataset, got {} elements",
                    other.len()
                ))),
            },
            _ => Err(ServerError::BadRequest(
                "descriptor type must be CMD or PATH".into(),
            )),
        }
    }

    /// Runs a request's handler with any panic in it (a decoder's, a kernel's) contained: the
    /// request fails with `Internal`, the server goes on.
    pub(crate) async fn contained<T>(&self, work: impl Future<Output = Result<T>>) -> Result<T> {
        match std::panic::AssertUnwindSafe(work).catch_unwind().await {
            Ok(result) => result,
            Err(panic) => {
                self.state.metrics.panics_contained.inc();
                Err(ServerError::Internal(format!(
                    "request panicked: {}",
                    panic_message(panic.as_ref())
                )))
            }
        }
    }

    /// Plans a descriptor for the client at `peer`. A client that could not choose a codec
    /// gets uncompressed streams when it is on this host (loopback: compressing only costs
    /// both sides CPU), else adaptive ones: compressed while the network holds the stream
    /// back, not while the server's CPU does.
    async fn flight_info(
        &self,
        descriptor: FlightDescriptor,
        peer: Option<SocketAddr>,
        grant: Arc<Grant>,
    ) -> Result<FlightInfo> {
        let (request, plain) = Self::request_and_origin(&descriptor)?;
        self.plan_info(request, plain, descriptor, peer, grant).await
    }

    /// Plans `request` into the `FlightInfo` that answers `descriptor`; `plain`: the client
    /// could not choose the stream's codec.
    pub(crate) async fn plan_info(
        &self,
        mut request: ScanRequest,
        plain: bool,
        descriptor: FlightDescriptor,
        peer: Option<SocketAddr>,
        grant: Arc<Grant>,
    ) -> Result<FlightInfo> {
        if plain {
            request.compression = self
                .state
                .config
                .plain_client_codec
                .unwrap_or_else(|| codec_for_plain_client(peer));
        }
        let planned = self.plan_on_cpu(request, grant).await?;
        self.state
            .metrics
            .row_groups_pruned_at_planning
            .inc_by(planned.row_groups_pruned);
        let tickets: Vec<bytes::Bytes> = planned.tickets().iter().map(|t| t.encode()).collect();
        if self.state.config.read_ahead {
            self.state.prefetch.remember(&tickets);
        }
        let endpoints: Vec<FlightEndpoint> = tickets.into_iter().map(|t| self.endpoint(t)).collect();
        let total_records = match &planned.shape {
            // Every row group ruled out (or an empty dataset): known to be empty.
            Shape::RowWise { shards, .. } if shards.is_empty() => 0,
            Shape::RowWise { .. } if !planned.has_filter => planned.rows_upper_bound as i64,
            _ => -1,
        };
        tracing::debug!(
            endpoints = endpoints.len(),
            rows_upper_bound = planned.rows_upper_bound,
            bytes_to_scan = planned.bytes_to_scan,
            row_groups_pruned = planned.row_groups_pruned,
            "planned"
        );
        let info = FlightInfo::new()
            .try_with_schema(&planned.schema)
            .map_err(|e| ServerError::Internal(format!("encoding schema: {e}")))?
            .with_descriptor(descriptor)
            .with_endpoints(endpoints)
            .with_total_records(total_records)
            .with_total_bytes(-1)
            .with_ordered(true)
            .with_app_metadata(
                pushdown_protocol::PlanEstimate {
                    rows_upper_bound: planned.rows_upper_bound,
                    bytes_to_scan: planned.bytes_to_scan,
                    row_wise: planned.is_row_wise(),
                    row_groups_pruned: planned.row_groups_pruned,
                }
                .encode(),
            );
        Ok(info)
    }

    fn endpoint(&self, ticket: bytes::Bytes) -> FlightEndpoint {
        let endpoint = FlightEndpoint::new().with_ticket(Ticket::new(ticket));
        match &self.state.config.advertise {
            Some(url) => endpoint.with_location(url.clone()),
            None => endpoint,
        }
    }

    async fn open_stream(
        &self,
        ticket: Ticket,
        caller: &Caller,
        peer: Option<std::net::IpAddr>,
    ) -> Result<FlightStream<FlightData>> {
        let raw = ticket.ticket;
        let ticket = ShardTicket::decode(&raw).map_err(ServerError::BadTicket)?;
        // A caller the ticket is not for is refused before it can drop a stream opened ahead
        // for someone else (opening checks the grant too; this only costs a second parse
        // while something is held).
        if self.state.prefetch.holds() {
            self.state.engine.authorize(&ticket, &caller.grant)?;
        }
        let shard = ticket.shard.clone();
        let permit = self.acquire_stream_slot().await?;
        let (ticket, placement) = self.place(ticket);
        // The CPU threads (and reads in flight, for a remote store) shared among the streams
        // computing now: a lone reader (pyarrow taking endpoints one by one) decodes its shard
        // on every core; many readers one core each. Streams their readers hold back (a
        // loader prefetching shards it will read in order) leave their cores to this one:
        // counting them starved the shard being read while the cores idled.
        let running = self.state.config.max_concurrent_streams - self.state.streams.available_permits();
        let computing = self.state.computing.load(std::sync::atomic::Ordering::Relaxed);
        let config = &self.state.config;
        let cores = config.cpu_threads.max(config.store_reads_in_flight);
        let parallelism = (cores / (computing + 1).min(running.max(1))).max(1);
        // Opened ahead for this caller and unchanged by placement: taken as it is.
        let ahead = match self.state.prefetch.claim(&caller.principal, &raw) {
            crate::prefetch::Claim::None => None,
            crate::prefetch::Claim::Dropped => {
                self.state.metrics.read_ahead("dropped");
                None
            }
            crate::prefetch::Claim::Taken(opened) => {
                // Unchanged by placement, and its file unchanged since it was opened.
                let unchanged = *ticket.encode() == *raw
                    && self.state.engine.still_current(&ticket).await.unwrap_or(false);
                self.state
                    .metrics
                    .read_ahead(if unchanged { "taken" } else { "stale" });
                unchanged.then_some(opened)
            }
        };
        let opened = match ahead {
            Some(opened) => opened,
            None => {
                let (state, ticket, grant) =
                    (Arc::clone(&self.state), ticket.clone(), Arc::clone(&caller.grant));
                self.on_cpu("opening a stream", async move {
                    state.engine.open(&ticket, parallelism, &grant).await
                })
                .await?
            }
        };
        if config.read_ahead && running <= 1 {
            self.read_ahead(&raw, caller, cores);
        }
        let span = tracing::info_span!(
            "stream",
            caller = &*caller.principal,
            dataset = ticket.shard.as_ref().map(|s| s.dataset.as_str()),
            file = ticket.shard.as_ref().map(|s| s.file.as_str()),
            row_groups = ?ticket.shard.as_ref().map(|s| s.row_groups.clone()),
        );
        let (tx, rx) = mpsc::channel(2);
        let state = Arc::clone(&self.state);
        let producer = produce(
            state,
            ticket,
            opened,
            Arc::clone(&caller.grant),
            (permit, placement, peer),
            tx.clone(),
        );
        let metrics = Arc::clone(&self.state.metrics);
        let shard_name = shard
            .as_ref()
            .map(|s| format!(" over `{}/{}`", s.dataset, s.file))
            .unwrap_or_default();
        let guard = self.state.cpu.spawn(
            async move {
                let mut outcome = StreamOutcome::start(Arc::clone(&metrics));
                // A panic in a kernel or decoder must end this stream with an error, never
                // silently: a stream that just stopped would look complete to the client.
                let result = std::panic::AssertUnwindSafe(producer).catch_unwind().await;
                let status = match result {
                    Ok(Ok(completed)) => {
                        outcome.outcome = if completed { "ok" } else { "cancelled" };
                        return;
                    }
                    Ok(Err(status)) => status,
                    Err(panic) => {
                        metrics.panics_contained.inc();
                        let what = panic_message(panic.as_ref());
                        Status::from(ServerError::Internal(format!(
                            "stream{shard_name} panicked: {what}"
                        )))
                    }
                };
                outcome.outcome = match status.code() {
                    tonic::Code::DeadlineExceeded => "deadline",
                    _ => "error",
                };
                // The receiver may be gone (client disconnected): nothing to tell then.
                let _ = tx.send(Err(status)).await;
            }
            .instrument(span),
        );
        let stream = tokio_stream::wrappers::ReceiverStream::new(rx).map(move |item| {
            // The stream owns the producer: dropping it (client gone) aborts the query.
            let _owner = &guard;
            item
        });
        Ok(stream.boxed())
    }

    /// Opens the endpoint planned after `ticket` for `caller` and starts its partitions
    /// decoding, to be taken by the caller's next `DoGet` (see `prefetch`). Failures are
    /// the next `DoGet`'s to report: here they only mean nothing is held.
    fn read_ahead(&self, ticket: &[u8], caller: &Caller, cores: usize) {
        let Some(next) = self.state.prefetch.successor(ticket) else {
            return;
        };
        let Ok(decoded) = ShardTicket::decode(&next) else {
            return;
        };
        let generation = self.state.prefetch.begin();
        let (state, grant, principal) = (
            Arc::clone(&self.state),
            Arc::clone(&caller.grant),
            Arc::clone(&caller.principal),
        );
        let work = async move {
            let mut opened = state.engine.open(&decoded, cores, &grant).await?;
            // A shard the cache holds is served from it: nothing to read ahead.
            if let Some(c) = &opened.cacheable
                && c.mode != crate::CacheMode::Off
                && state.cache.holds(c.key)
            {
                return Ok(());
            }
            let since = Instant::now();
            let stream =
                crate::query::ordered_stream(Arc::clone(&opened.plan), opened.ctx.task_ctx(), cores)?;
            opened.started = Some(crate::query::Started { stream, since });
            if state.prefetch.hold(generation, principal, next, opened) {
                // Waiting must not keep a stopped server alive.
                let weak = Arc::downgrade(&state);
                drop(state);
                tokio::time::sleep(crate::prefetch::HELD_FOR).await;
                if let Some(state) = weak.upgrade()
                    && state.prefetch.expire(generation)
                {
                    state.metrics.read_ahead("expired");
                }
            }
            Ok::<_, ServerError>(())
        };
        // It ends by itself: stale, taken, or expired.
        self.state.cpu.spawn_detached(async move {
            if let Err(e) = work.await {
                tracing::debug!(error = %e, "reading ahead");
            }
        });
    }

    /// Where this stream's fragment ops run. A ticket that lets the server leave ops `from..`
    /// to the client gets them left when it says `Always` (a split placement), or `IfBusy`
    /// and as many streams as CPU threads run ops here now; the ticket's fragment is then
    /// [`Fragment::deferred`]. A stream that runs ops here counts as reducing while it
    /// computes: one waiting for its client leaves the cores to others.
    fn place(&self, mut ticket: ShardTicket) -> (ShardTicket, Placement) {
        use std::sync::atomic::Ordering;
        let Query::Fragment(fragment) = &ticket.request.query else {
            return (ticket, Placement::default());
        };
        let ops: Vec<String> = fragment.ops.iter().map(|c| c.op.clone()).collect();
        let reducing = &self.state.reducing;
        let from = match ticket.request.deferral {
            Deferral::Never => None,
            Deferral::Always { from } => Some(from as usize),
            Deferral::IfBusy { from } => {
                let config = &self.state.config;
                let room = config.reducing_streams.unwrap_or(config.cpu_threads.max(1));
                (reducing.load(Ordering::Relaxed) >= room).then_some(from as usize)
            }
        }
        .filter(|&from| from < ops.len());
        let on_server = from.unwrap_or(ops.len());
        if let Some(from) = from {
            let deferred = fragment.deferred(from);
            ticket.request.query = Query::Fragment(deferred);
            self.state.metrics.deferred_streams.inc();
        }
        let guard = (on_server > 0).then(|| Counted::new(Arc::clone(reducing)));
        (
            ticket,
            Placement {
                ops,
                on_server,
                deferred_from: from,
                reducing: guard,
            },
        )
    }

    async fn acquire_stream_slot(&self) -> Result<OwnedSemaphorePermit> {
        let wait = self.state.config.queue_timeout;
        match tokio::time::timeout(wait, Arc::clone(&self.state.streams).acquire_owned()).await {
            Ok(Ok(permit)) => Ok(permit),
            Ok(Err(_)) => Err(ServerError::Internal("stream limiter closed".into())),
            Err(_) => Err(ServerError::Overloaded(format!(
                "all {} stream slots busy for {wait:?}; retry later",
                self.state.config.max_concurrent_streams
            ))),
        }
    }

    async fn schema(&self, descriptor: FlightDescriptor, grant: Arc<Grant>) -> Result<SchemaResult> {
        let request = Self::request_of(&descriptor)?;
        let planned = self.plan_on_cpu(request, grant).await?;
        SchemaAsIpc::new(&planned.schema, &IpcWriteOptions::default())
            .try_into()
            .map_err(|e: arrow::error::ArrowError| ServerError::Internal(format!("encoding schema: {e}")))
    }

    /// The datasets and views `grant` may read; no other is even named.
    async fn list(&self, grant: Arc<Grant>) -> Result<Vec<FlightInfo>> {
        let datasets = self.state.engine.visible(&grant).await?;
        let mut infos: Vec<FlightInfo> = datasets
            .values()
            .map(|d| {
                let info = FlightInfo::new()
                    .try_with_schema(&d.schema)
                    .map_err(|e| ServerError::Internal(format!("encoding schema: {e}")))?
                    .with_descriptor(FlightDescriptor::new_path(vec![d.name.clone()]))
                    .with_total_records(d.num_rows() as i64)
                    .with_total_bytes(d.num_bytes() as i64)
                    .with_app_metadata(dataset_version(d).encode());
                Ok(info)
            })
            .collect::<Result<_>>()?;
        let all = self.state.engine.catalog().snapshot();
        for (view, schema) in self.view_schemas(grant).await? {
            let bases: Vec<_> = view.bases.iter().filter_map(|b| all.get(b)).collect();
            let version = pushdown_protocol::DatasetVersion {
                dataset: view.name.clone(),
                version: view.version(&all),
                files: bases.iter().map(|d| d.files.len() as u64).sum(),
                broken_files: bases.iter().map(|d| d.broken.len() as u64).sum(),
            };
            infos.push(
                FlightInfo::new()
                    .try_with_schema(&schema)
                    .map_err(|e| ServerError::Internal(format!("encoding schema: {e}")))?
                    .with_descriptor(FlightDescriptor::new_path(vec![view.name.clone()]))
                    .with_total_records(-1)
                    .with_total_bytes(-1)
                    .with_app_metadata(version.encode()),
            );
        }
        infos.sort_by(|a, b| {
            let name = |i: &FlightInfo| i.flight_descriptor.as_ref().map(|d| d.path.clone());
            name(a).cmp(&name(b))
        });
        Ok(infos)
    }

    /// The views `grant` may read, each with its result schema. A view that cannot be
    /// planned now (a dataset beneath it is missing or broken) is left out, with a warning.
    pub(crate) async fn view_schemas(
        &self,
        grant: Arc<Grant>,
    ) -> Result<Vec<(Arc<crate::views::View>, arrow::datatypes::SchemaRef)>> {
        let mut out = Vec::new();
        for view in self.state.engine.visible_views(&grant) {
            let query = Query::Fragment(Fragment {
                dataset: view.name.clone(),
                ..Fragment::default()
            });
            let state = Arc::clone(&self.state);
            let grant = Arc::clone(&grant);
            let schema = self
                .on_cpu("planning a view", async move {
                    Ok(state.engine.describe(&query, &grant).await?.0)
                })
                .await;
            match schema {
                Ok(schema) => out.push((view, schema)),
                Err(e) => tracing::warn!(view = %view.name, error = %e, "view cannot be planned; not listed"),
            }
        }
        Ok(out)
    }

    /// Plans on the CPU runtime: its threads' deep stacks hold DataFusion's recursion over
    /// large query trees, and a slow plan never holds up the I/O threads.
    async fn plan_on_cpu(&self, request: ScanRequest, grant: Arc<Grant>) -> Result<crate::query::Planned> {
        let state = Arc::clone(&self.state);
        self.on_cpu(
            "planning",
            async move { state.engine.plan(&request, &grant).await },
        )
        .await
    }

    /// Runs `work` on the CPU runtime, off the I/O threads, and waits for it.
    pub(crate) async fn on_cpu<T: Send + 'static>(
        &self,
        what: &str,
        work: impl Future<Output = Result<T>> + Send + 'static,
    ) -> Result<T> {
        self.state
            .cpu
            .spawn(work)
            .join()
            .await
            .map_err(|e| ServerError::Internal(format!("{what} task: {e}")))?
    }

    async fn action(&self, action: Action, grant: Arc<Grant>) -> Result<Vec<arrow_flight::Result>> {
        let Some(kind) = ActionKind::parse(&action.r#type) else {
            return Err(ServerError::BadRequest(format!(
                "unknown action `{}`; actions: {}",
                action.r#type,
                ActionKind::ALL.map(ActionKind::name).join(", ")
            )));
        };
        // Cheap answers from memory take no stream slot: a saturated server must still
        // answer its probes and hear its clients' reports.
        if matches!(
            kind,
            ActionKind::Health | ActionKind::Report | ActionKind::Scaling
        ) {
            return self.run_action(kind, action, grant).await;
        }
        // Every other action plans or reads: it takes a stream slot and runs under the
        // request deadline, like a stream (a `profile` or `count` scans data).
        let _slot = self.acquire_stream_slot().await?;
        let deadline = self.state.config.request_timeout;
        match tokio::time::timeout(deadline, self.run_action(kind, action, grant)).await {
            Ok(result) => result,
            Err(_) => Err(ServerError::Deadline(deadline)),
        }
    }

    async fn run_action(
        &self,
        kind: ActionKind,
        action: Action,
        grant: Arc<Grant>,
    ) -> Result<Vec<arrow_flight::Result>> {
        match kind {
            ActionKind::Health => Ok(vec![arrow_flight::Result::new("ok")]),
            ActionKind::Report => {
                let report = ClientReport::from_bytes(&action.body).map_err(ServerError::BadCommand)?;
                self.state.scaling.record(report);
                Ok(vec![])
            }
            ActionKind::Scaling => Ok(vec![arrow_flight::Result::new(
                self.state.scaling.signal().to_bytes(),
            )]),
            ActionKind::Explain => {
                let request = ScanRequest::decode_command(&action.body).map_err(ServerError::BadCommand)?;
                let planned = self.plan_on_cpu(request, Arc::clone(&grant)).await?;
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
                        self.state.engine.cache_mode(&planned.names),
                        self.state.cache.describe(keys)
                    ),
                };
                let text = format!(
                    "{shape}\nfilter pushdown: {:?}\nrows (upper bound): {}\nbytes to scan (upper bound): {}\nschema: {}\ncache: {cache}\n\n{}",
                    planned.request.filter_pushdown,
                    planned.rows_upper_bound,
                    planned.bytes_to_scan,
                    planned.schema,
                    planned.optimized.display_indent()
                );
                Ok(vec![arrow_flight::Result::new(text)])
            }
            ActionKind::Profile => {
                let request = ScanRequest::decode_command(&action.body).map_err(ServerError::BadCommand)?;
                let state = Arc::clone(&self.state);
                let cores = self.state.config.cpu_threads as u32;
                let profile = self
                    .on_cpu("profile", async move {
                        crate::profile::profile(&state.engine, &request, PROFILE_ROWS, cores, &grant).await
                    })
                    .await?;
                Ok(vec![arrow_flight::Result::new(profile.encode())])
            }
            ActionKind::Count => {
                let ticket = ShardTicket::decode(&action.body).map_err(ServerError::BadTicket)?;
                let state = Arc::clone(&self.state);
                let n = self
                    .on_cpu("count", async move { state.engine.count(&ticket, &grant).await })
                    .await?;
                Ok(vec![arrow_flight::Result::new(CountReply { rows: n }.encode())])
            }
            ActionKind::Refresh => {
                self.state.engine.catalog().refresh().await?;
                let datasets = grant.visible(&self.state.engine.catalog().snapshot());
                Ok(datasets
                    .values()
                    .map(|d| arrow_flight::Result::new(dataset_version(d).encode()))
                    .collect())
            }
            ActionKind::Tokenizer => {
                let name = std::str::from_utf8(&action.body).map_err(|_| {
                    ServerError::BadRequest("the tokenizer action's body is a dataset name".into())
                })?;
                let name = name.trim();
                grant.check(name)?;
                // A view's tokenizer is its dataset's.
                let bases = self.state.engine.views().bases_of(name);
                let dataset = match bases.iter().collect::<Vec<_>>().as_slice() {
                    [only] => self.state.engine.catalog().dataset(only).await?,
                    _ => {
                        return Err(ServerError::BadRequest(format!(
                            "`{name}` reads several datasets: name one for its tokenizer"
                        )));
                    }
                };
                let json = match &dataset.tokenizer {
                    None => {
                        return Err(ServerError::NoResource(format!(
                            "dataset `{}` ships no {}",
                            dataset.name,
                            pushdown_ops::TOKENIZER_FILE
                        )));
                    }
                    Some(Err(reason)) => {
                        return Err(ServerError::CorruptFile {
                            dataset: dataset.name.clone(),
                            file: pushdown_ops::TOKENIZER_FILE.to_owned(),
                            reason: reason.clone(),
                        });
                    }
                    Some(Ok(t)) => t
                        .to_string(false)
                        .map_err(|e| ServerError::Internal(format!("serializing the tokenizer: {e}")))?,
                };
                Ok(vec![arrow_flight::Result::new(json)])
            }
        }
    }
}

/// Whether a descriptor carries a Flight SQL command.
fn is_flight_sql_descriptor(descriptor: &FlightDescriptor) -> bool {
    descriptor.r#type == DescriptorType::Cmd as i32 && crate::flight_sql::is_flight_sql(&descriptor.cmd)
}

/// How long a handshake waits for its credentials.
const HANDSHAKE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Rows the `profile` action samples.
const PROFILE_ROWS: usize = 256;

/// Runs an opened query on the CPU runtime and sends its encoded batches to `tx`. A
/// cacheable shard is served from the fragment cache when stored there (after waiting for a
/// stream computing it now), else computed and offered to the cache once whole.
async fn produce(
    state: Arc<State>,
    ticket: ShardTicket,
    mut opened: crate::query::Opened,
    grant: Arc<Grant>,
    (_permit, mut placement, peer): (OwnedSemaphorePermit, Placement, Option<std::net::IpAddr>),
    tx: mpsc::Sender<Result<FlightData, Status>>,
) -> Result<bool, Status> {
    use crate::cache::Lookup;
    let start = Instant::now();
    let deadline = state.config.request_timeout;
    let plan = Arc::clone(&opened.plan);
    let schema = plan.schema();
    // A stream whose ops were left to the client says so in its schema.
    let sent_schema = match placement.deferred_from {
        Some(from) => {
            let mut metadata = schema.metadata().clone();
            metadata.insert(DEFERRED_FROM_KEY.to_owned(), from.to_string());
            Arc::new(schema.as_ref().clone().with_metadata(metadata))
        }
        None => Arc::clone(&schema),
    };

    let shard = ticket.shard.clone();
    let mut skip = ticket.skip_rows;
    // Rows sent, and output rows of the query so far (skipped ones included): where a failing
    // value is, and the shard's whole output once the stream ends.
    let mut rows_sent = 0u64;
    let mut output = 0u64;
    let mut bytes_sent = 0u64;
    // Time spent producing batches (scan, ops, codec), not waiting for the client: what the
    // cache weighs a computed shard by, and a hit's read cost.
    let mut producing_total = std::time::Duration::ZERO;
    let mut copying_total = std::time::Duration::ZERO;
    let mut claim = None;
    let mut hit_bytes = None;
    // An adaptive stream starts from what the last one to this peer learnt of the link.
    let learnt = peer.and_then(|p| crate::catalog::lock(&state.links).get(&p).copied());
    let mut governor = Governor::resume(ticket.request.compression, learnt);
    // Counted as computing but while it waits for its client.
    let mut computing = Counted::new(Arc::clone(&state.computing));
    let mut encoder = Encoder::new(state.config.max_flight_data_bytes)
        .map_err(|e| ServerError::Internal(format!("IPC options: {e}")))?;
    let stream_all = async {
        let lookup = match &opened.cacheable {
            Some(cacheable) => state.cache.lookup(cacheable, &schema, &grant).await?,
            None => Lookup::Bypass,
        };
        let started = opened.started.take();
        let computed = |started: Option<crate::query::Started>| match started {
            Some(started) => Ok(started.stream),
            None => {
                crate::query::ordered_stream(Arc::clone(&plan), opened.ctx.task_ctx(), opened.parallelism)
                    .map_err(ServerError::from)
            }
        };
        // A stream decoded ahead had its head start to compute in: counted as producing (an
        // upper bound: it may have waited for its budget), so the cache weighs it fully.
        let head_start = started.as_ref().map(|s| s.since.elapsed());
        let batches = match lookup {
            Lookup::Hit(hit) => {
                // What was decoded ahead is not needed: dropping it stops its partitions.
                drop(started);
                hit_bytes = Some(hit.bytes());
                futures::stream::iter(hit.batches().into_iter().map(Ok)).boxed()
            }
            Lookup::Compute(c, tee) => {
                claim = Some((c, tee));
                producing_total += head_start.unwrap_or_default();
                computed(started)?
            }
            Lookup::Bypass => computed(started)?,
        };
        let mut batches = std::pin::pin!(batches);
        let schema_message = encoder.schema(&sent_schema);
        bytes_sent += schema_message.data_header.len() as u64;
        if tx.send(Ok(schema_message)).await.is_err() {
            return Ok(false);
        }
        let mut ready_since = Instant::now();
        while let Some(item) = batches.next().await {
            let batch =
                item.map_err(|e| Status::from(ServerError::from_scan(e, shard.as_ref()).after_rows(output)))?;
            if let Some((_, tee)) = &mut claim {
                // Copying into the cache is not computing: its time is left out of `compute`.
                let copying = Instant::now();
                tee.push(
                    &batch,
                    (producing_total + ready_since.elapsed()).saturating_sub(copying_total),
                );
                copying_total += copying.elapsed();
            }
            let n = batch.num_rows() as u64;
            output += n;
            let batch = if skip >= n {
                skip -= n;
                continue;
            } else if skip > 0 {
                let rest = batch.slice(skip as usize, (n - skip) as usize);
                skip = 0;
                rest
            } else {
                batch
            };
            rows_sent += batch.num_rows() as u64;
            let codec = governor.codec();
            let messages = encoder
                .batch(&batch, codec)
                .map_err(|e| ServerError::Internal(format!("encoding a batch: {e}")))?;
            let producing = ready_since.elapsed();
            producing_total += producing;
            let wire: u64 = messages
                .iter()
                .map(|m| (m.data_header.len() + m.data_body.len()) as u64)
                .sum();
            // What the batch would have been uncompressed (its buffers: what IPC copies).
            let raw = if codec == Compression::None {
                wire
            } else {
                batch
                    .columns()
                    .iter()
                    .map(|c| c.get_buffer_memory_size() as u64)
                    .sum()
            };
            let sending_since = Instant::now();
            // Waiting for the client is not computing: a stream held back by its reader does
            // not count against the streams its server reduces at once.
            placement.waiting(true);
            computing.set(false);
            for data in messages {
                bytes_sent += (data.data_header.len() + data.data_body.len()) as u64;
                if tx.send(Ok(data)).await.is_err() {
                    tracing::debug!("client went away; stopping the stream");
                    return Ok(false);
                }
            }
            placement.waiting(false);
            computing.set(true);
            state.metrics.record_batch(codec);
            ready_since = Instant::now();
            governor.observe(producing, ready_since - sending_since, raw, wire);
        }
        producing_total += ready_since.elapsed();
        Ok::<bool, Status>(true)
    };
    let ended = tokio::time::timeout(deadline, stream_all).await;
    if let (Some(peer), Some(memory)) = (peer, governor.memory()) {
        let mut links = crate::catalog::lock(&state.links);
        // Bounded: a server with this many peers forgets them all and learns again.
        if links.len() >= MAX_PEERS_REMEMBERED && !links.contains_key(&peer) {
            links.clear();
        }
        links.insert(peer, memory);
    }
    let completed = match ended {
        Ok(result) => result?,
        Err(_) => return Err(ServerError::Deadline(deadline).into()),
    };
    if completed {
        // Only a whole output is offered to the cache; a claim dropped unfinished lets the
        // next request compute it.
        if let Some((claim, tee)) = claim.take() {
            let decision = claim.finish(*tee, producing_total.saturating_sub(copying_total));
            tracing::debug!(%decision, "fragment cache");
        }
        if let Some(bytes) = hit_bytes {
            state.cache.observe_read(bytes, producing_total);
        }
    }

    let mut stats = scan_stats(&plan);
    stats.rows_sent = rows_sent;
    stats.rows_output = output;
    stats.bytes_sent = bytes_sent;
    stats.row_groups = opened.row_groups;
    stats.elapsed_ns = start.elapsed().as_nanos() as u64;
    state.metrics.record_stream(&stats);
    state
        .metrics
        .record_op_rows(&placement.ops, placement.on_server, output);
    tracing::debug!(?stats, link_bytes_per_s = ?governor.link(), "stream finished");
    if completed && ticket.request.stats {
        let _ = tx
            .send(Ok(FlightData::new().with_app_metadata(stats.encode())))
            .await;
    }
    Ok(completed)
}

/// Peers whose links adaptive streams remember (see [`crate::codec::LinkMemory`]).
const MAX_PEERS_REMEMBERED: usize = 4096;

/// Where a stream's fragment ops run: the first `on_server` here, the rest (from
/// `deferred_from`) on the client.
#[derive(Debug, Default)]
struct Placement {
    ops: Vec<String>,
    on_server: usize,
    deferred_from: Option<usize>,
    reducing: Option<Counted>,
}

impl Placement {
    /// The stream waits for its client (`true`) or computes again.
    fn waiting(&mut self, waiting: bool) {
        if let Some(r) = &mut self.reducing {
            r.set(!waiting);
        }
    }
}

/// One stream in a count of streams (those computing, those running fragment ops here):
/// counted while it computes (not while its client holds it back), until it ends.
#[derive(Debug)]
struct Counted {
    count: Arc<std::sync::atomic::AtomicUsize>,
    counted: bool,
}

impl Counted {
    fn new(count: Arc<std::sync::atomic::AtomicUsize>) -> Self {
        let mut r = Self {
            count,
            counted: false,
        };
        r.set(true);
        r
    }

    fn set(&mut self, counted: bool) {
        use std::sync::atomic::Ordering;
        if counted != self.counted {
            if counted {
                self.count.fetch_add(1, Ordering::Relaxed);
            } else {
                self.count.fetch_sub(1, Ordering::Relaxed);
            }
            self.counted = counted;
        }
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.set(false);
    }
}

/// The codec for a client that could not choose one, at `peer`: none on this host (on
/// loopback compressing only costs both sides CPU), else adaptive.
fn codec_for_plain_client(peer: Option<SocketAddr>) -> Compression {
    match peer {
        Some(p) if p.ip().is_loopback() => Compression::None,
        _ => Compression::Adaptive,
    }
}

/// A dataset's version as `ListFlights` and the `refresh` action report it.
fn dataset_version(d: &crate::catalog::Dataset) -> pushdown_protocol::DatasetVersion {
    pushdown_protocol::DatasetVersion {
        dataset: d.name.clone(),
        version: d.version(),
        files: d.files.len() as u64,
        broken_files: d.broken.len() as u64,
    }
}

/// Accounts for one DoGet stream however it ends: finished, failed, or dropped mid-way
/// (a client that went away aborts the producer, so only a drop guard sees that).
struct StreamOutcome {
    metrics: Arc<crate::metrics::Metrics>,
    outcome: &'static str,
}

impl StreamOutcome {
    fn start(metrics: Arc<crate::metrics::Metrics>) -> Self {
        metrics.active_streams.inc();
        Self {
            metrics,
            outcome: "cancelled",
        }
    }
}

impl Drop for StreamOutcome {
    fn drop(&mut self) {
        // The outcome first: whoever sees the gauge drop also sees how the stream ended.
        self.metrics.record_request("do_get", self.outcome);
        self.metrics.active_streams.dec();
    }
}

#[tonic::async_trait]
impl FlightService for PushdownService {
    type HandshakeStream = FlightStream<HandshakeResponse>;
    type ListFlightsStream = FlightStream<FlightInfo>;
    type DoGetStream = FlightStream<FlightData>;
    type DoPutStream = FlightStream<PutResult>;
    type DoActionStream = FlightStream<arrow_flight::Result>;
    type ListActionsStream = FlightStream<ActionType>;
    type DoExchangeStream = FlightStream<FlightData>;

    async fn handshake(
        &self,
        request: Request<Streaming<HandshakeRequest>>,
    ) -> Result<Response<Self::HandshakeStream>, Status> {
        let Some(tokens) = self.state.tokens.clone() else {
            // No authentication: an empty handshake succeeds, as for an open server.
            return Ok(Response::new(futures::stream::empty().boxed()));
        };
        let (metadata, _, mut incoming) = request.into_parts();
        // Credentials in a header (pyarrow's `authenticate_basic_token`) need no message;
        // otherwise the first message's payload is the token.
        let payload = if metadata.contains_key("authorization") {
            Vec::new()
        } else {
            match tokio::time::timeout(HANDSHAKE_WAIT, incoming.message()).await {
                Ok(Ok(Some(m))) => m.payload.to_vec(),
                Ok(Ok(None)) => Vec::new(),
                Ok(Err(status)) => return Err(status),
                Err(_) => {
                    return Err(self.fail(
                        "handshake",
                        ServerError::Unauthenticated("no credentials arrived in time".into()),
                    ));
                }
            }
        };
        let (caller, token) = match tokens.handshake(&metadata, &payload) {
            Ok(found) => found,
            Err(e) => return Err(self.fail("handshake", e)),
        };
        tracing::debug!(caller = &*caller.principal, "handshake");
        self.state.metrics.record_request("handshake", "ok");
        let reply = HandshakeResponse {
            protocol_version: 0,
            payload: token.clone().into(),
        };
        let mut response = Response::new(futures::stream::iter([Ok(reply)]).boxed());
        let header = format!("Bearer {token}")
            .parse()
            .map_err(|_| Status::unauthenticated("the token is not a valid header value"))?;
        response.metadata_mut().insert("authorization", header);
        Ok(response)
    }

    #[tracing::instrument(skip_all)]
    async fn list_flights(
        &self,
        request: Request<Criteria>,
    ) -> Result<Response<Self::ListFlightsStream>, Status> {
        let caller = self.caller(&request).map_err(|e| self.fail("list_flights", e))?;
        let infos = self.finish("list_flights", self.contained(self.list(caller.grant)).await)?;
        Ok(Response::new(
            futures::stream::iter(infos.into_iter().map(Ok)).boxed(),
        ))
    }

    #[tracing::instrument(skip_all)]
    async fn get_flight_info(
        &self,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        if is_flight_sql_descriptor(request.get_ref()) {
            return FlightService::get_flight_info(&self.sql(), request).await;
        }
        let caller = self
            .caller(&request)
            .map_err(|e| self.fail("get_flight_info", e))?;
        let peer = request.remote_addr();
        let result = self
            .contained(self.flight_info(request.into_inner(), peer, caller.grant))
            .await;
        Ok(Response::new(self.finish("get_flight_info", result)?))
    }

    async fn poll_flight_info(
        &self,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<PollInfo>, Status> {
        // Planning is quick: the answer is always complete.
        if is_flight_sql_descriptor(request.get_ref()) {
            let descriptor = request.get_ref().clone();
            let info = FlightService::get_flight_info(&self.sql(), request)
                .await?
                .into_inner();
            return Ok(Response::new(
                PollInfo::new().with_info(info).with_descriptor(descriptor),
            ));
        }
        let caller = self
            .caller(&request)
            .map_err(|e| self.fail("poll_flight_info", e))?;
        let peer = request.remote_addr();
        let descriptor = request.into_inner();
        let result = self
            .contained(self.flight_info(descriptor.clone(), peer, caller.grant))
            .await;
        let info = self.finish("poll_flight_info", result)?;
        Ok(Response::new(
            PollInfo::new().with_info(info).with_descriptor(descriptor),
        ))
    }

    #[tracing::instrument(skip_all)]
    async fn get_schema(&self, request: Request<FlightDescriptor>) -> Result<Response<SchemaResult>, Status> {
        if is_flight_sql_descriptor(request.get_ref()) {
            let info = FlightService::get_flight_info(&self.sql(), request)
                .await?
                .into_inner();
            return Ok(Response::new(SchemaResult { schema: info.schema }));
        }
        let caller = self.caller(&request).map_err(|e| self.fail("get_schema", e))?;
        let result = self
            .contained(self.schema(request.into_inner(), caller.grant))
            .await;
        Ok(Response::new(self.finish("get_schema", result)?))
    }

    #[tracing::instrument(skip_all)]
    async fn do_get(&self, request: Request<Ticket>) -> Result<Response<Self::DoGetStream>, Status> {
        if crate::flight_sql::is_flight_sql(&request.get_ref().ticket) {
            return FlightService::do_get(&self.sql(), request).await;
        }
        let caller = self.caller(&request).map_err(|e| self.fail("do_get", e))?;
        let peer = request.remote_addr().map(|a| a.ip());
        match self
            .contained(self.open_stream(request.into_inner(), &caller, peer))
            .await
        {
            Ok(stream) => Ok(Response::new(stream)),
            // Streams that open record their outcome when they end.
            Err(e) => Err(self.fail("do_get", e)),
        }
    }

    /// Only Flight SQL's parameter binding; every other put is refused (read-only).
    async fn do_put(
        &self,
        request: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoPutStream>, Status> {
        FlightService::do_put(&self.sql(), request).await
    }

    async fn do_exchange(
        &self,
        _request: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoExchangeStream>, Status> {
        Err(self.fail("do_exchange", ServerError::Unsupported("DoExchange")))
    }

    #[tracing::instrument(skip_all, fields(action = %request.get_ref().r#type))]
    async fn do_action(&self, request: Request<Action>) -> Result<Response<Self::DoActionStream>, Status> {
        if crate::flight_sql::is_flight_sql_action(&request.get_ref().r#type) {
            return FlightService::do_action(&self.sql(), request).await;
        }
        let caller = self.caller(&request).map_err(|e| self.fail("do_action", e))?;
        let results = self.finish(
            "do_action",
            self.contained(self.action(request.into_inner(), caller.grant))
                .await,
        )?;
        Ok(Response::new(
            futures::stream::iter(results.into_iter().map(Ok)).boxed(),
        ))
    }

    async fn list_actions(
        &self,
        request: Request<Empty>,
    ) -> Result<Response<Self::ListActionsStream>, Status> {
        self.caller(&request).map_err(|e| self.fail("list_actions", e))?;
        let ours = ActionKind::ALL.map(|a| {
            Ok(ActionType {
                r#type: a.name().into(),
                description: a.description().into(),
            })
        });
        let sql = ["CreatePreparedStatement", "ClosePreparedStatement"].map(|name| {
            Ok(ActionType {
                r#type: name.into(),
                description: "Flight SQL prepared statements (stateless handles)".into(),
            })
        });
        let actions = ours.into_iter().chain(sql);
        Ok(Response::new(futures::stream::iter(actions).boxed()))
    }
}
