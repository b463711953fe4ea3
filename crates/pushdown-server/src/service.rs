//! The Arrow Flight service: catalog, planning and streaming over gRPC.

use std::net::SocketAddr;
use std::sync::Arc;

use arrow::ipc::writer::IpcWriteOptions;
use arrow_flight::flight_descriptor::DescriptorType;
use arrow_flight::flight_service_server::FlightService;
use arrow_flight::sql::Command;
use arrow_flight::{
    Action, ActionType, Criteria, Empty, FlightData, FlightDescriptor, FlightInfo, HandshakeRequest,
    HandshakeResponse, PollInfo, PutResult, SchemaAsIpc, SchemaResult, Ticket,
};
use futures::stream::{BoxStream, StreamExt};
use pushdown_protocol::{ActionKind, ClientReport, CountReply, Fragment, Query, ScanRequest, ShardTicket};
use tokio::sync::OwnedSemaphorePermit;
use tonic::{Request, Response, Status, Streaming};

use crate::context::Context;
use crate::doget::DoGet;
use crate::flight_sql::FlightSql;
use crate::state::State;
use pushdown_engine::auth::{Caller, Grant};
use pushdown_engine::error::{Result, ServerError};
use pushdown_engine::query::Shape;

type FlightStream<T> = BoxStream<'static, Result<T, Status>>;

/// The `pushdown` Flight service. Cheap to clone.
#[derive(Debug, Clone)]
pub struct PushdownService {
    state: Arc<State>,
    /// What every request handler shares with Flight SQL's.
    ctx: Context,
}

impl PushdownService {
    pub(crate) fn new(state: Arc<State>) -> Self {
        let ctx = Context::new(Arc::clone(&state));
        Self { state, ctx }
    }

    fn sql(&self) -> FlightSql {
        FlightSql::new(self.ctx.clone())
    }

    /// A descriptor's Flight SQL command, decoded once (`None`: not Flight SQL).
    fn sql_command(&self, descriptor: &FlightDescriptor) -> Option<Result<Command, Status>> {
        (descriptor.r#type == DescriptorType::Cmd as i32)
            .then(|| self.sql().command(&descriptor.cmd))
            .flatten()
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
        self.ctx.plan_info(request, plain, descriptor, peer, grant).await
    }

    async fn open_stream(
        &self,
        ticket: Ticket,
        caller: &Caller,
        (peer, reader): (Option<SocketAddr>, Option<u64>),
    ) -> Result<FlightStream<FlightData>> {
        let raw = ticket.ticket;
        let ticket = ShardTicket::decode(&raw).map_err(ServerError::BadTicket)?;
        let node = &self.state.node;
        // The query is parsed and checked once, here: a caller the ticket is not for is
        // refused before it takes a stream slot or drops a stream opened ahead for someone
        // else, and opening plans the checked statement.
        let checked = node.engine.authorize(&ticket, &caller.grant)?;
        let permit = self.acquire_stream_slot().await?;
        let (ticket, placement) = node.place(ticket);
        let running = node.config.max_concurrent_streams - self.state.streams.available_permits();
        let opened = node
            .open_ticket(
                &raw,
                (&ticket, &placement),
                checked,
                caller,
                node.stream_parallelism(running),
            )
            .await?;
        if node.config.read_ahead && running <= 1 {
            node.read_ahead(&raw, caller);
        }
        let span = tracing::info_span!(
            "stream",
            caller = &*caller.principal,
            dataset = ticket.shard.as_ref().map(|s| s.dataset.as_str()),
            file = ticket.shard.as_ref().map(|s| s.file.as_str()),
            row_groups = ?ticket.shard.as_ref().map(|s| s.row_groups.clone()),
        );
        let shard_name = ticket
            .shard
            .as_ref()
            .map(|s| format!(" over `{}/{}`", s.dataset, s.file))
            .unwrap_or_default();
        let stream = DoGet {
            state: Arc::clone(&self.state),
            ticket,
            opened,
            placement,
            grant: Arc::clone(&caller.grant),
            permit,
            peer,
            reader,
        };
        Ok(stream.spawn(span, shard_name))
    }

    async fn acquire_stream_slot(&self) -> Result<OwnedSemaphorePermit> {
        let wait = self.state.node.config.queue_timeout;
        match tokio::time::timeout(wait, Arc::clone(&self.state.streams).acquire_owned()).await {
            Ok(Ok(permit)) => Ok(permit),
            Ok(Err(_)) => Err(ServerError::Internal("stream limiter closed".into())),
            Err(_) => Err(ServerError::Overloaded(format!(
                "all {} stream slots busy for {wait:?}; retry later",
                self.state.node.config.max_concurrent_streams
            ))),
        }
    }

    async fn schema(&self, descriptor: FlightDescriptor, grant: Arc<Grant>) -> Result<SchemaResult> {
        let request = Self::request_of(&descriptor)?;
        let planned = self.ctx.plan_off_io(request, grant).await?;
        SchemaAsIpc::new(&planned.schema, &IpcWriteOptions::default())
            .try_into()
            .map_err(ServerError::encode("encoding a schema"))
    }

    /// The datasets and views `grant` may read; no other is even named.
    async fn list(&self, grant: Arc<Grant>) -> Result<Vec<FlightInfo>> {
        let datasets = self.state.node.engine.visible(&grant).await?;
        let mut infos: Vec<FlightInfo> = datasets
            .values()
            .map(|d| {
                let info = FlightInfo::new()
                    .try_with_schema(&d.schema)
                    .map_err(ServerError::encode("encoding a schema"))?
                    .with_descriptor(FlightDescriptor::new_path(vec![d.name.clone()]))
                    .with_total_records(d.num_rows() as i64)
                    .with_total_bytes(d.num_bytes() as i64)
                    .with_app_metadata(dataset_version(d).encode());
                Ok(info)
            })
            .collect::<Result<_>>()?;
        let all = self.state.node.engine.catalog().snapshot();
        for (view, schema) in self.ctx.view_schemas(grant).await? {
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
                    .map_err(ServerError::encode("encoding a schema"))?
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
            ActionKind::Health | ActionKind::Report | ActionKind::Scaling | ActionKind::HasTokenizer
        ) {
            return self.run_action(kind, action, grant).await;
        }
        // Every other action plans or reads: it takes a stream slot and runs under the
        // request deadline, like a stream (a `profile` or `count` scans data).
        let _slot = self.acquire_stream_slot().await?;
        let deadline = self.state.node.config.request_timeout;
        match tokio::time::timeout(deadline, self.run_action(kind, action, grant)).await {
            Ok(result) => result,
            Err(_) => Err(ServerError::Deadline(deadline)),
        }
    }

    /// Runs one decoded action: one method per [`ActionKind`].
    async fn run_action(
        &self,
        kind: ActionKind,
        action: Action,
        grant: Arc<Grant>,
    ) -> Result<Vec<arrow_flight::Result>> {
        match kind {
            ActionKind::Health => Ok(Self::health()),
            ActionKind::Report => self.report(&action.body),
            ActionKind::Scaling => Ok(self.scaling()),
            ActionKind::Explain => self.explain(&action.body, grant).await,
            ActionKind::Profile => self.profile(&action.body, grant).await,
            ActionKind::Count => self.count(&action.body, grant).await,
            ActionKind::Refresh => self.refresh(&grant).await,
            ActionKind::Tokenizer => self.tokenizer(&action.body, &grant).await,
            ActionKind::GiveTokenizer => self.give_tokenizer(&action.body).await,
            ActionKind::HasTokenizer => Ok(self.has_tokenizer(&action.body)),
        }
    }

    /// `give_tokenizer`: keeps a trainer's tokenizer (parsed off the async threads) and
    /// returns its id. Any caller may give one: it is kept by its content, so it names
    /// only itself, and it reads no data.
    async fn give_tokenizer(&self, body: &[u8]) -> Result<Vec<arrow_flight::Result>> {
        let tokenizers = Arc::clone(self.state.node.engine.tokenizers());
        let json = body.to_vec();
        let id = tokio::task::spawn_blocking(move || tokenizers.give(&json))
            .await
            .map_err(|e| ServerError::Internal(format!("parsing a given tokenizer: {e}")))?
            .map_err(|reason| ServerError::BadRequest(format!("give_tokenizer: {reason}")))?;
        Ok(vec![arrow_flight::Result::new(bytes::Bytes::from(id))])
    }

    /// `has_tokenizer`: whether this server keeps the given tokenizer the body names.
    fn has_tokenizer(&self, body: &[u8]) -> Vec<arrow_flight::Result> {
        let id = String::from_utf8_lossy(body);
        let kept = self.state.node.engine.tokenizers().given(id.trim()).is_some();
        let answer: &'static [u8] = if kept { b"yes" } else { b"no" };
        vec![arrow_flight::Result::new(bytes::Bytes::from_static(answer))]
    }

    /// `health`: the server answers.
    fn health() -> Vec<arrow_flight::Result> {
        vec![arrow_flight::Result::new("ok")]
    }

    /// `report`: a client's report, recorded for the scaling signal.
    fn report(&self, body: &[u8]) -> Result<Vec<arrow_flight::Result>> {
        let report = ClientReport::from_bytes(body).map_err(ServerError::BadCommand)?;
        self.state.node.scaling.record(report);
        Ok(vec![])
    }

    /// `scaling`: the node's scaling signal.
    fn scaling(&self) -> Vec<arrow_flight::Result> {
        vec![arrow_flight::Result::new(
            self.state.node.scaling.signal().to_bytes(),
        )]
    }

    /// `explain`: how a request is planned, as text.
    async fn explain(&self, body: &[u8], grant: Arc<Grant>) -> Result<Vec<arrow_flight::Result>> {
        let request = ScanRequest::decode_command(body).map_err(ServerError::BadCommand)?;
        let planned = self.ctx.plan_off_io(request, Arc::clone(&grant)).await?;
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
                self.state.node.engine.cache_mode(&planned.names),
                self.state.node.cache.describe(keys)
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

    /// `profile`: where a sample of a request's rows spends its time.
    async fn profile(&self, body: &[u8], grant: Arc<Grant>) -> Result<Vec<arrow_flight::Result>> {
        let request = ScanRequest::decode_command(body).map_err(ServerError::BadCommand)?;
        let state = Arc::clone(&self.state);
        let cores = self.state.node.config.cpu_threads as u32;
        let profile = self
            .ctx
            .on_cpu("profile", async move {
                pushdown_engine::profile::profile(&state.node.engine, &request, PROFILE_ROWS, cores, &grant)
                    .await
            })
            .await?;
        Ok(vec![arrow_flight::Result::new(profile.encode())])
    }

    /// `count`: the rows a ticket reads.
    async fn count(&self, body: &[u8], grant: Arc<Grant>) -> Result<Vec<arrow_flight::Result>> {
        let ticket = ShardTicket::decode(body).map_err(ServerError::BadTicket)?;
        let state = Arc::clone(&self.state);
        let n = self
            .ctx
            .on_control(
                "count",
                async move { state.node.engine.count(&ticket, &grant).await },
            )
            .await?;
        Ok(vec![arrow_flight::Result::new(CountReply { rows: n }.encode())])
    }

    /// `refresh`: rescans the catalog; the versions of the datasets `grant` may read.
    async fn refresh(&self, grant: &Grant) -> Result<Vec<arrow_flight::Result>> {
        self.state.node.engine.catalog().refresh().await?;
        let datasets = grant.visible(&self.state.node.engine.catalog().snapshot());
        Ok(datasets
            .values()
            .map(|d| arrow_flight::Result::new(dataset_version(d).encode()))
            .collect())
    }

    /// `tokenizer`: the tokenizer (JSON) of the dataset the body names.
    async fn tokenizer(&self, body: &[u8], grant: &Grant) -> Result<Vec<arrow_flight::Result>> {
        let name = std::str::from_utf8(body)
            .map_err(|_| ServerError::BadRequest("the tokenizer action's body is a dataset name".into()))?;
        let name = name.trim();
        // A tokenizer of the server's own (its folder's, or a given one) where no dataset or
        // view has the name.
        let views = self.state.node.engine.views();
        let bases = views.bases_of(name);
        let is_dataset = views.get(name).is_some()
            || self
                .state
                .node
                .engine
                .catalog()
                .snapshot()
                .keys()
                .any(|d| d.eq_ignore_ascii_case(name));
        if !is_dataset
            && let Some(t) = self
                .state
                .node
                .engine
                .tokenizers()
                .get(name)
                .map_err(|reason| ServerError::NoResource(format!("tokenizer `{name}`: {reason}")))?
        {
            let json = t
                .to_string(false)
                .map_err(|e| ServerError::failed("serializing the tokenizer", e))?;
            return Ok(vec![arrow_flight::Result::new(json)]);
        }
        grant.check_spelling(name)?;
        // A view's tokenizer is its dataset's.
        let dataset = match bases.iter().collect::<Vec<_>>().as_slice() {
            [only] => {
                let dataset = self.state.node.engine.catalog().dataset(only).await?;
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
                .map_err(|e| ServerError::failed("serializing the tokenizer", e))?,
        };
        Ok(vec![arrow_flight::Result::new(json)])
    }
}

/// How long a handshake waits for its credentials.
const HANDSHAKE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Rows the `profile` action samples.
const PROFILE_ROWS: usize = 256;

/// A dataset's version as `ListFlights` and the `refresh` action report it.
fn dataset_version(d: &pushdown_engine::catalog::Dataset) -> pushdown_protocol::DatasetVersion {
    pushdown_protocol::DatasetVersion {
        dataset: d.name.clone(),
        version: d.version(),
        files: d.files.len() as u64,
        broken_files: d.broken.len() as u64,
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
        let Some(tokens) = self.state.node.tokens.clone() else {
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
                    return Err(self.ctx.fail(
                        "handshake",
                        ServerError::Unauthenticated("no credentials arrived in time".into()),
                    ));
                }
            }
        };
        let found =
            crate::context::authorization(&metadata).and_then(|header| tokens.handshake(header, &payload));
        let (caller, token) = match found {
            Ok(found) => found,
            Err(e) => return Err(self.ctx.fail("handshake", e)),
        };
        tracing::debug!(caller = &*caller.principal, "handshake");
        self.state.node.metrics.record_request("handshake", "ok");
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
        let caller = self
            .ctx
            .caller(&request)
            .map_err(|e| self.ctx.fail("list_flights", e))?;
        let infos = self
            .ctx
            .finish("list_flights", self.ctx.contained(self.list(caller.grant)).await)?;
        Ok(Response::new(
            futures::stream::iter(infos.into_iter().map(Ok)).boxed(),
        ))
    }

    #[tracing::instrument(skip_all)]
    async fn get_flight_info(
        &self,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        if let Some(command) = self.sql_command(request.get_ref()) {
            return self.sql().flight_info(command?, request).await;
        }
        let caller = self
            .ctx
            .caller(&request)
            .map_err(|e| self.ctx.fail("get_flight_info", e))?;
        let peer = request.remote_addr();
        let result = self
            .ctx
            .contained(self.flight_info(request.into_inner(), peer, caller.grant))
            .await;
        Ok(Response::new(self.ctx.finish("get_flight_info", result)?))
    }

    async fn poll_flight_info(
        &self,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<PollInfo>, Status> {
        // Planning is quick: the answer is always complete.
        if let Some(command) = self.sql_command(request.get_ref()) {
            let descriptor = request.get_ref().clone();
            let info = self.sql().flight_info(command?, request).await?.into_inner();
            return Ok(Response::new(
                PollInfo::new().with_info(info).with_descriptor(descriptor),
            ));
        }
        let caller = self
            .ctx
            .caller(&request)
            .map_err(|e| self.ctx.fail("poll_flight_info", e))?;
        let peer = request.remote_addr();
        let descriptor = request.into_inner();
        let result = self
            .ctx
            .contained(self.flight_info(descriptor.clone(), peer, caller.grant))
            .await;
        let info = self.ctx.finish("poll_flight_info", result)?;
        Ok(Response::new(
            PollInfo::new().with_info(info).with_descriptor(descriptor),
        ))
    }

    #[tracing::instrument(skip_all)]
    async fn get_schema(&self, request: Request<FlightDescriptor>) -> Result<Response<SchemaResult>, Status> {
        if let Some(command) = self.sql_command(request.get_ref()) {
            let info = self.sql().flight_info(command?, request).await?.into_inner();
            return Ok(Response::new(SchemaResult { schema: info.schema }));
        }
        let caller = self
            .ctx
            .caller(&request)
            .map_err(|e| self.ctx.fail("get_schema", e))?;
        let result = self
            .ctx
            .contained(self.schema(request.into_inner(), caller.grant))
            .await;
        Ok(Response::new(self.ctx.finish("get_schema", result)?))
    }

    #[tracing::instrument(skip_all)]
    async fn do_get(&self, request: Request<Ticket>) -> Result<Response<Self::DoGetStream>, Status> {
        if let Some(command) = self.sql().command(&request.get_ref().ticket) {
            return self.sql().do_get(command?, request).await;
        }
        let caller = self
            .ctx
            .caller(&request)
            .map_err(|e| self.ctx.fail("do_get", e))?;
        let peer = request.remote_addr();
        let reader = request
            .metadata()
            .get(pushdown_protocol::READER_HEADER)
            .and_then(|v| v.to_str().ok()?.parse().ok());
        match self
            .ctx
            .contained(self.open_stream(request.into_inner(), &caller, (peer, reader)))
            .await
        {
            Ok(stream) => Ok(Response::new(stream)),
            // Streams that open record their outcome when they end.
            Err(e) => Err(self.ctx.fail("do_get", e)),
        }
    }

    /// Only Flight SQL's parameter binding; every other put is refused (read-only).
    async fn do_put(
        &self,
        request: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoPutStream>, Status> {
        self.sql().do_put(request).await
    }

    async fn do_exchange(
        &self,
        _request: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoExchangeStream>, Status> {
        Err(self
            .ctx
            .fail("do_exchange", ServerError::Unsupported("DoExchange".into())))
    }

    #[tracing::instrument(skip_all, fields(action = %request.get_ref().r#type))]
    async fn do_action(&self, request: Request<Action>) -> Result<Response<Self::DoActionStream>, Status> {
        if crate::flight_sql::is_action(&request.get_ref().r#type) {
            return self.sql().do_action(request).await;
        }
        let caller = self
            .ctx
            .caller(&request)
            .map_err(|e| self.ctx.fail("do_action", e))?;
        let results = self.ctx.finish(
            "do_action",
            self.ctx
                .contained(self.action(request.into_inner(), caller.grant))
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
        self.ctx
            .caller(&request)
            .map_err(|e| self.ctx.fail("list_actions", e))?;
        let ours = ActionKind::ALL.map(|a| {
            Ok(ActionType {
                r#type: a.name().into(),
                description: a.description().into(),
            })
        });
        let sql = [
            crate::flight_sql::CREATE_PREPARED_STATEMENT,
            crate::flight_sql::CLOSE_PREPARED_STATEMENT,
        ]
        .map(|name| {
            Ok(ActionType {
                r#type: name.into(),
                description: "Flight SQL prepared statements (stateless handles)".into(),
            })
        });
        let actions = ours.into_iter().chain(sql);
        Ok(Response::new(futures::stream::iter(actions).boxed()))
    }
}
