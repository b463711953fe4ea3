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
use tonic::{Request, Response, Status, Streaming};

use crate::context::Context;
use crate::doget::DoGet;
use crate::flight_sql::FlightSql;
use crate::state::{State, client_id};
use pushdown_engine::{Caller, Grant, Result, ServerError};

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
        let node = &self.state.node;
        let opened = node
            .open_stream(&ticket.ticket, caller, client_id(reader, peer))
            .await?;
        let placed = opened.ticket();
        let span = tracing::info_span!(
            "stream",
            caller = &*caller.principal,
            dataset = placed.shard.as_ref().map(|s| s.dataset.as_str()),
            file = placed.shard.as_ref().map(|s| s.file.as_str()),
            row_groups = ?placed.shard.as_ref().map(|s| s.row_groups.clone()),
        );
        let shard_name = placed
            .shard
            .as_ref()
            .map(|s| format!(" over `{}/{}`", s.dataset, s.file))
            .unwrap_or_default();
        let stream = DoGet {
            state: Arc::clone(&self.state),
            codec: placed.request.compression,
            stats: placed.request.stats,
            opened,
            peer,
        };
        Ok(stream.spawn(span, shard_name))
    }

    async fn schema(&self, descriptor: FlightDescriptor, grant: Arc<Grant>) -> Result<SchemaResult> {
        let request = Self::request_of(&descriptor)?;
        let schema = self.state.node.schema(&request, &grant).await?;
        SchemaAsIpc::new(&schema, &IpcWriteOptions::default())
            .try_into()
            .map_err(ServerError::encode("encoding a schema"))
    }

    /// The datasets and views `grant` may read, by name; no other is even named.
    async fn list(&self, grant: Arc<Grant>) -> Result<Vec<FlightInfo>> {
        let mut infos: Vec<FlightInfo> = self
            .state
            .node
            .list(&grant)
            .await?
            .into_iter()
            .map(|listed| {
                let info = FlightInfo::new()
                    .try_with_schema(&listed.schema)
                    .map_err(ServerError::encode("encoding a schema"))?
                    .with_descriptor(FlightDescriptor::new_path(vec![listed.name]))
                    .with_total_records(listed.rows.map_or(-1, |n| n as i64))
                    .with_total_bytes(listed.bytes.map_or(-1, |n| n as i64))
                    .with_app_metadata(listed.version.encode());
                Ok(info)
            })
            .collect::<Result<_>>()?;
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
            ActionKind::Health
                | ActionKind::Report
                | ActionKind::Scaling
                | ActionKind::HasTokenizer
                | ActionKind::Ops
        ) {
            return self.run_action(kind, action, grant).await;
        }
        // Every other action plans or reads: it takes a stream slot and runs under the
        // request deadline, like a stream (a `profile` or `count` scans data).
        let _slot = self.state.node.admit().await?;
        let deadline = self.state.node.config().request_timeout;
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
            ActionKind::Ops => Ok(Self::ops()),
            ActionKind::Explain => self.explain(&action.body, grant).await,
            ActionKind::Profile => self.profile(&action.body, grant).await,
            ActionKind::Count => self.count(&action.body, grant).await,
            ActionKind::Refresh => self.refresh(&grant).await,
            ActionKind::Tokenizer => self.tokenizer(&action.body, &grant).await,
            ActionKind::GiveTokenizer => self.give_tokenizer(&action.body).await,
            ActionKind::HasTokenizer => Ok(self.has_tokenizer(&action.body)),
        }
    }

    /// `give_tokenizer`: keeps a trainer's tokenizer and returns its id.
    async fn give_tokenizer(&self, body: &[u8]) -> Result<Vec<arrow_flight::Result>> {
        let id = self.state.node.give_tokenizer(body.to_vec()).await?;
        Ok(vec![arrow_flight::Result::new(bytes::Bytes::from(id))])
    }

    /// `has_tokenizer`: whether this server keeps the given tokenizer the body names.
    fn has_tokenizer(&self, body: &[u8]) -> Vec<arrow_flight::Result> {
        let kept = self.state.node.has_tokenizer(&String::from_utf8_lossy(body));
        let answer: &'static [u8] = if kept { b"yes" } else { b"no" };
        vec![arrow_flight::Result::new(bytes::Bytes::from_static(answer))]
    }

    /// `health`: the server answers.
    fn health() -> Vec<arrow_flight::Result> {
        vec![arrow_flight::Result::new("ok")]
    }

    /// `ops`: the ops this build runs, one name per line.
    fn ops() -> Vec<arrow_flight::Result> {
        let names: Vec<&str> = pushdown_ops::registry()
            .iter()
            .filter(|op| op.runs_here())
            .map(|op| op.name())
            .collect();
        vec![arrow_flight::Result::new(names.join("\n"))]
    }

    /// `report`: a client's report, recorded for the scaling signal.
    fn report(&self, body: &[u8]) -> Result<Vec<arrow_flight::Result>> {
        let report = ClientReport::from_bytes(body).map_err(ServerError::BadCommand)?;
        self.state.node.report(report);
        Ok(vec![])
    }

    /// `scaling`: the node's scaling signal.
    fn scaling(&self) -> Vec<arrow_flight::Result> {
        vec![arrow_flight::Result::new(self.state.node.scaling().to_bytes())]
    }

    /// `explain`: how a request is planned, as text.
    async fn explain(&self, body: &[u8], grant: Arc<Grant>) -> Result<Vec<arrow_flight::Result>> {
        let request = ScanRequest::decode_command(body).map_err(ServerError::BadCommand)?;
        let text = self.state.node.explain(&request, &grant).await?;
        Ok(vec![arrow_flight::Result::new(text)])
    }

    /// `profile`: where a sample of a request's rows spends its time.
    async fn profile(&self, body: &[u8], grant: Arc<Grant>) -> Result<Vec<arrow_flight::Result>> {
        let request = ScanRequest::decode_command(body).map_err(ServerError::BadCommand)?;
        let profile = self.state.node.profile(request, &grant).await?;
        Ok(vec![arrow_flight::Result::new(profile.encode())])
    }

    /// `count`: the rows a ticket reads.
    async fn count(&self, body: &[u8], grant: Arc<Grant>) -> Result<Vec<arrow_flight::Result>> {
        let ticket = ShardTicket::decode(body).map_err(ServerError::BadTicket)?;
        let rows = self.state.node.count(ticket, &grant).await?;
        Ok(vec![arrow_flight::Result::new(CountReply { rows }.encode())])
    }

    /// `refresh`: rescans the catalog; the versions of the datasets `grant` may read.
    async fn refresh(&self, grant: &Grant) -> Result<Vec<arrow_flight::Result>> {
        let versions = self.state.node.refresh(grant).await?;
        Ok(versions
            .iter()
            .map(|v| arrow_flight::Result::new(v.encode()))
            .collect())
    }

    /// `tokenizer`: the tokenizer (JSON) of the dataset the body names.
    async fn tokenizer(&self, body: &[u8], grant: &Grant) -> Result<Vec<arrow_flight::Result>> {
        let name = std::str::from_utf8(body)
            .map_err(|_| ServerError::BadRequest("the tokenizer action's body is a dataset name".into()))?;
        let json = self.state.node.tokenizer(name.trim(), grant).await?;
        Ok(vec![arrow_flight::Result::new(json)])
    }
}

/// How long a handshake waits for its credentials.
const HANDSHAKE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

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
        let Some(tokens) = self.state.node.tokens().cloned() else {
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
        self.state.node.metrics().record_request("handshake", "ok");
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
