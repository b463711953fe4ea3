//! Flight SQL on the Flight port: SQL clients (ADBC, JDBC, pyarrow's Flight SQL users) run
//! queries over datasets and views unmodified.
//!
//! Every Flight SQL message is a protobuf `Any` whose type names the Flight SQL protocol.
//! [`PushdownService`](crate::PushdownService) asks [`FlightSql::command`] whether a
//! descriptor or ticket is one: the bytes are decoded once into arrow-flight's
//! [`Command`] and each RPC's handler here `match`es it (actions by their kind); everything
//! else keeps the `pushdown` protocol's meaning. This module depends on the shared
//! [`Context`], never on the service type. What this front end answers:
//!
//! * statement queries: planned exactly like a SQL command, so the answer has one endpoint
//!   per shard and its tickets are ordinary `pushdown` tickets (read by `DoGet` as any other);
//! * prepared statements with parameters (`$1`, `$2`, … or `?`). Handles are stateless: a
//!   handle is the statement's text and its bound parameters, checked again on every use
//!   like any ticket, so nothing is kept per client and closing is free. Binding substitutes
//!   each parameter as a typed SQL literal into the query's syntax tree, never into its text;
//! * `GetSqlInfo`, and the catalog commands: one catalog (`pushdown`) with one schema
//!   (`public`) whose tables are the datasets (`TABLE`) and views (`VIEW`) the caller may
//!   read, with their schemas.
//!
//! The server is read-only: updates, ingestion, Substrait plans and transactions are refused.

use std::sync::{Arc, LazyLock};

use arrow::array::RecordBatch;
use arrow::datatypes::{Schema, SchemaRef};
use arrow::ipc::writer::IpcWriteOptions;
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::error::FlightError;
use arrow_flight::sql::metadata::{SqlInfoData, SqlInfoDataBuilder};
use arrow_flight::sql::{
    ActionClosePreparedStatementRequest, ActionCreatePreparedStatementRequest,
    ActionCreatePreparedStatementResult, Any, Command, CommandPreparedStatementQuery,
    DoPutPreparedStatementResult, ProstMessageExt, SqlInfo, SqlSupportedTransaction,
};
use arrow_flight::{
    Action, FlightData, FlightDescriptor, FlightEndpoint, FlightInfo, IpcMessage, PutResult, SchemaAsIpc,
    Ticket,
};
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use prost::Message;
use pushdown_protocol::{Query, ScanRequest};
use tonic::{Request, Response, Status, Streaming};

use crate::context::Context;
use pushdown_engine::{CATALOG, Grant, ListedKind, PreparedStatement, Result, SCHEMA, ServerError};

mod params;

#[cfg(feature = "fuzzing")]
pub(crate) use params::decode_params;

/// The Flight SQL front end of a [`PushdownService`](crate::PushdownService).
#[derive(Debug, Clone)]
pub(crate) struct FlightSql {
    ctx: Context,
}

/// The prefix of every Flight SQL message's type.
const FLIGHT_SQL_TYPE: &str = "type.googleapis.com/arrow.flight.protocol.sql.";

pub(crate) const CREATE_PREPARED_STATEMENT: &str = "CreatePreparedStatement";
pub(crate) const CLOSE_PREPARED_STATEMENT: &str = "ClosePreparedStatement";

/// Flight SQL's actions (everything else is one of ours).
const ACTIONS: [&str; 8] = [
    CREATE_PREPARED_STATEMENT,
    CLOSE_PREPARED_STATEMENT,
    "CreatePreparedSubstraitPlan",
    "BeginTransaction",
    "EndTransaction",
    "BeginSavepoint",
    "EndSavepoint",
    "CancelQuery",
];

/// Whether an action is a Flight SQL one.
pub(crate) fn is_action(kind: &str) -> bool {
    ACTIONS.contains(&kind)
}

/// What `GetSqlInfo` answers (built once; an error if arrow-flight's builder refuses it).
static SQL_INFO: LazyLock<std::result::Result<SqlInfoData, String>> = LazyLock::new(|| {
    let mut b = SqlInfoDataBuilder::new();
    b.append(SqlInfo::FlightSqlServerName, "pushdown");
    b.append(SqlInfo::FlightSqlServerVersion, env!("CARGO_PKG_VERSION"));
    b.append(SqlInfo::FlightSqlServerArrowVersion, "1.5");
    b.append(SqlInfo::FlightSqlServerReadOnly, true);
    b.append(SqlInfo::FlightSqlServerSql, true);
    b.append(SqlInfo::FlightSqlServerSubstrait, false);
    b.append(
        SqlInfo::FlightSqlServerTransaction,
        SqlSupportedTransaction::None as i32,
    );
    b.append(SqlInfo::FlightSqlServerCancel, false);
    b.append(SqlInfo::FlightSqlServerStatementTimeout, 0i32);
    b.append(SqlInfo::SqlDdlCatalog, false);
    b.append(SqlInfo::SqlDdlSchema, false);
    b.append(SqlInfo::SqlDdlTable, false);
    b.append(SqlInfo::SqlIdentifierQuoteChar, "\"");
    b.append(SqlInfo::SqlAllTablesAreSelectable, true);
    b.append(SqlInfo::SqlTransactionsSupported, false);
    b.build().map_err(|e| format!("building SQL info: {e}"))
});

fn sql_info() -> Result<&'static SqlInfoData, Status> {
    SQL_INFO.as_ref().map_err(|e| Status::internal(e.clone()))
}

impl FlightSql {
    pub(crate) fn new(ctx: Context) -> Self {
        Self { ctx }
    }

    /// Runs a handler the way every method of the service runs: authenticated, with panics
    /// contained, and the outcome counted under `method`.
    async fn run<T, R, F>(
        &self,
        method: &'static str,
        request: &Request<R>,
        work: impl FnOnce(Arc<Grant>) -> F,
    ) -> Result<T, Status>
    where
        F: Future<Output = Result<T>>,
    {
        let caller = self.ctx.caller(request).map_err(|e| self.ctx.fail(method, e))?;
        let result = self.ctx.contained(work(caller.grant)).await;
        self.ctx.finish(method, result)
    }

    /// A statement's answer: planned as a SQL command from a client that cannot choose a
    /// codec, with `pushdown` tickets.
    async fn statement_info(
        &self,
        sql: String,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let peer = request.remote_addr();
        let info = self
            .run("flight_sql_statement", &request, |grant| {
                let descriptor = request.get_ref().clone();
                self.ctx
                    .plan_info(ScanRequest::new(Query::Sql(sql)), true, descriptor, peer, grant)
            })
            .await?;
        Ok(Response::new(info))
    }

    /// Authenticates a metadata command (catalogs, schemas, tables, SQL info); the answer is
    /// filtered by the caller's grant where it names tables.
    fn authenticated<R>(&self, request: &Request<R>) -> Result<(), Status> {
        self.ctx
            .finish("flight_sql_metadata", self.ctx.caller(request).map(|_| ()))
    }

    /// A metadata command's answer: its schema and one endpoint whose ticket is the command.
    fn command_info<M: ProstMessageExt>(
        &self,
        command: &M,
        schema: &Schema,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        self.authenticated(&request)?;
        let descriptor = request.into_inner();
        let ticket = Ticket::new(command.as_any().encode_to_vec());
        let info = FlightInfo::new()
            .try_with_schema(schema)
            .map_err(|e| Status::internal(format!("encoding schema: {e}")))?
            .with_endpoint(FlightEndpoint::new().with_ticket(ticket))
            .with_descriptor(descriptor);
        Ok(Response::new(info))
    }

    /// One batch as a `DoGet` stream.
    fn batch_stream(
        schema: SchemaRef,
        batch: std::result::Result<RecordBatch, FlightError>,
    ) -> Result<Response<Stream<FlightData>>, Status> {
        let batch = batch.map_err(Status::from)?;
        let stream = FlightDataEncoderBuilder::new()
            .with_schema(schema)
            .build(futures::stream::once(async { Ok(batch) }))
            .map_err(Status::from);
        Ok(Response::new(Box::pin(stream)))
    }

    /// The tables `grant` may read: datasets, then views, each with its schema.
    async fn tables(&self, grant: Arc<Grant>) -> Result<Vec<(String, &'static str, SchemaRef)>> {
        let listed = self.ctx.node().list(&grant).await?;
        Ok(listed
            .into_iter()
            .map(|l| {
                let kind = match l.kind {
                    ListedKind::Dataset => "TABLE",
                    ListedKind::View => "VIEW",
                };
                (l.name, kind, l.schema)
            })
            .collect())
    }

    fn read_only(what: &str) -> Status {
        crate::status::status(ServerError::NotReadOnly(format!(
            "{what}: this server only answers queries"
        )))
    }
}

fn schema_bytes(schema: &Schema) -> Result<Bytes> {
    let IpcMessage(bytes) = SchemaAsIpc::new(schema, &IpcWriteOptions::default())
        .try_into()
        .map_err(ServerError::encode("encoding a schema"))?;
    Ok(bytes)
}

/// The stream a Flight SQL answer sends.
pub(crate) type Stream<T> = BoxStream<'static, std::result::Result<T, Status>>;

/// One item as a stream.
fn once<T: Send + 'static>(item: T) -> Response<Stream<T>> {
    Response::new(futures::stream::iter([Ok(item)]).boxed())
}

/// `bytes` (a descriptor's command or a ticket) as a Flight SQL command: `None` when they
/// are not Flight SQL (they are then the `pushdown` protocol's).
pub(crate) fn decode_command(bytes: &[u8]) -> Option<Result<Command, ServerError>> {
    let any = Any::decode(bytes).ok()?;
    if !any.type_url.starts_with(FLIGHT_SQL_TYPE) {
        return None;
    }
    Some(Command::try_from(any).map_err(|source| ServerError::BadMessage {
        what: "Flight SQL command",
        cause: Box::new(source),
    }))
}

/// The dispatch: each RPC decodes its Flight SQL message once and `match`es the command.
impl FlightSql {
    /// `bytes` (a descriptor's command or a ticket) as a Flight SQL command, decoded once:
    /// `None` when they are not Flight SQL (they are then the `pushdown` protocol's).
    pub(crate) fn command(&self, bytes: &[u8]) -> Option<Result<Command, Status>> {
        decode_command(bytes).map(|decoded| decoded.map_err(|e| self.ctx.fail("flight_sql", e)))
    }

    /// A command's `FlightInfo` (GetFlightInfo, PollFlightInfo and GetSchema).
    pub(crate) async fn flight_info(
        &self,
        command: Command,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        match command {
            Command::CommandStatementQuery(query) => self.statement_info(query.query, request).await,
            Command::CommandPreparedStatementQuery(query) => {
                let sql = PreparedStatement::decode(&query.prepared_statement_handle)
                    .and_then(|p| p.bound_sql())
                    .map_err(|e| self.ctx.fail("flight_sql_statement", e))?;
                self.statement_info(sql, request).await
            }
            Command::CommandGetCatalogs(query) => {
                let schema = query.into_builder().schema();
                self.command_info(&query, &schema, request)
            }
            Command::CommandGetDbSchemas(query) => {
                let schema = query.clone().into_builder().schema();
                self.command_info(&query, &schema, request)
            }
            Command::CommandGetTables(query) => {
                let schema = query.clone().into_builder().schema();
                self.command_info(&query, &schema, request)
            }
            Command::CommandGetTableTypes(query) => {
                let schema = query.into_builder().schema();
                self.command_info(&query, &schema, request)
            }
            Command::CommandGetSqlInfo(query) => {
                let schema = query.clone().into_builder(sql_info()?).schema();
                self.command_info(&query, &schema, request)
            }
            other => Err(self.unsupported("flight_sql_info", &other)),
        }
    }

    /// A Flight SQL ticket's stream: the metadata commands' answers. Statement tickets are
    /// the endpoints' own `pushdown` tickets and never reach here.
    pub(crate) async fn do_get(
        &self,
        command: Command,
        request: Request<Ticket>,
    ) -> Result<Response<Stream<FlightData>>, Status> {
        let (schema, batch) = match command {
            Command::CommandGetCatalogs(query) => {
                self.authenticated(&request)?;
                let mut builder = query.into_builder();
                builder.append(CATALOG);
                (builder.schema(), builder.build())
            }
            Command::CommandGetDbSchemas(query) => {
                self.authenticated(&request)?;
                let mut builder = query.into_builder();
                builder.append(CATALOG, SCHEMA);
                (builder.schema(), builder.build())
            }
            Command::CommandGetTables(query) => {
                let tables = self
                    .run("flight_sql_metadata", &request, |grant| self.tables(grant))
                    .await?;
                let mut builder = query.into_builder();
                for (name, kind, schema) in tables {
                    builder
                        .append(CATALOG, SCHEMA, name, kind, &schema)
                        .map_err(Status::from)?;
                }
                (builder.schema(), builder.build())
            }
            Command::CommandGetTableTypes(query) => {
                self.authenticated(&request)?;
                let mut builder = query.into_builder();
                builder.append("TABLE");
                builder.append("VIEW");
                (builder.schema(), builder.build())
            }
            Command::CommandGetSqlInfo(query) => {
                self.authenticated(&request)?;
                let builder = query.into_builder(sql_info()?);
                (builder.schema(), builder.build())
            }
            Command::TicketStatementQuery(_) => {
                return Err(self.ctx.fail(
                    "flight_sql_metadata",
                    ServerError::BadRequest(
                        "this server's statement tickets are the endpoints' own: read those".into(),
                    ),
                ));
            }
            other => return Err(self.unsupported("flight_sql_metadata", &other)),
        };
        Self::batch_stream(schema, batch)
    }

    /// A `DoPut`: only binding a prepared statement's parameters; updates, ingestion and
    /// plans are refused (read-only). The first message's descriptor names the command.
    pub(crate) async fn do_put(
        &self,
        request: Request<Streaming<FlightData>>,
    ) -> Result<Response<Stream<PutResult>>, Status> {
        const METHOD: &str = "flight_sql_bind";
        // Authenticated first; the grant is checked when the bound statement is planned.
        self.ctx.caller(&request).map_err(|e| self.ctx.fail(METHOD, e))?;
        let mut incoming = request.into_inner();
        let first = match incoming.next().await {
            Some(Ok(first)) => first,
            Some(Err(e)) => return Err(e),
            None => {
                let missing = ServerError::BadRequest("DoPut: no messages".into());
                return Err(self.ctx.fail(METHOD, missing));
            }
        };
        let cmd = first
            .flight_descriptor
            .as_ref()
            .map(|d| d.cmd.clone())
            .unwrap_or_default();
        let Some(command) = self.command(&cmd) else {
            let ours = ServerError::NotReadOnly("DoPut: this server only answers queries".into());
            return Err(self.ctx.fail(METHOD, ours));
        };
        let bound = match command? {
            Command::CommandPreparedStatementQuery(query) => {
                let result = self.ctx.contained(self.bind(query, first, incoming)).await;
                self.ctx.finish(METHOD, result)?
            }
            Command::CommandStatementUpdate(_) | Command::CommandPreparedStatementUpdate(_) => {
                return Err(Self::read_only("updates"));
            }
            Command::CommandStatementIngest(_) => return Err(Self::read_only("ingestion")),
            Command::CommandStatementSubstraitPlan(_) => return Err(Self::read_only("Substrait plans")),
            other => return Err(self.unsupported(METHOD, &other)),
        };
        // Flight SQL sends this result bare, not as an `Any`.
        Ok(once(PutResult {
            app_metadata: bound.encode_to_vec().into(),
        }))
    }

    /// Binds parameters: the answer is a new handle carrying the statement and the values.
    async fn bind(
        &self,
        query: CommandPreparedStatementQuery,
        first: FlightData,
        mut rest: Streaming<FlightData>,
    ) -> Result<DoPutPreparedStatementResult> {
        let prepared = PreparedStatement::decode(&query.prepared_statement_handle)?;
        // At most a few messages (schema, one batch), then decoded one by one.
        let mut messages = vec![first];
        while let Some(data) = rest.next().await {
            let data = data.map_err(|e| ServerError::BadRequest(format!("parameters: {e}")))?;
            if messages.len() == params::MAX_PARAM_MESSAGES {
                return Err(ServerError::BadRequest("parameters: too many messages".into()));
            }
            messages.push(data);
        }
        let bound = match params::decode_params(&messages)? {
            Some(params) => PreparedStatement::bind(prepared.sql, &params)?,
            None => PreparedStatement {
                sql: prepared.sql,
                params: None,
            },
        };
        // Bad values fail now, not at execution.
        bound.bound_sql()?;
        Ok(DoPutPreparedStatementResult {
            prepared_statement_handle: Some(bound.encode()),
        })
    }

    /// A Flight SQL action: creating and closing prepared statements; transactions,
    /// savepoints, cancellation and Substrait plans are refused.
    pub(crate) async fn do_action(
        &self,
        request: Request<Action>,
    ) -> Result<Response<Stream<arrow_flight::Result>>, Status> {
        match request.get_ref().r#type.as_str() {
            CREATE_PREPARED_STATEMENT => {
                let query: ActionCreatePreparedStatementRequest = self.unpack(&request)?;
                let result = self.prepare(query, &request).await?;
                Ok(once(arrow_flight::Result::new(result.as_any().encode_to_vec())))
            }
            CLOSE_PREPARED_STATEMENT => {
                let _: ActionClosePreparedStatementRequest = self.unpack(&request)?;
                // Handles hold no server state: nothing to free.
                self.run("flight_sql_close", &request, |_| async { Ok(()) })
                    .await?;
                Ok(Response::new(futures::stream::empty().boxed()))
            }
            other => Err(self.ctx.fail(
                "flight_sql_action",
                ServerError::Unsupported(format!("the Flight SQL action {other}").into()),
            )),
        }
    }

    /// An action's body as the Flight SQL message its kind names.
    fn unpack<M: ProstMessageExt + Default>(&self, request: &Request<Action>) -> Result<M, Status> {
        let malformed = |source: Box<dyn std::error::Error + Send + Sync>| ServerError::BadMessage {
            what: "Flight SQL action",
            cause: source,
        };
        let message = Any::decode(&*request.get_ref().body)
            .map_err(|e| malformed(Box::new(e)))
            .and_then(|any| any.unpack::<M>().map_err(|e| malformed(Box::new(e))))
            .and_then(|m| {
                m.ok_or_else(|| {
                    ServerError::BadRequest(format!(
                        "the action {} takes a {}",
                        request.get_ref().r#type,
                        M::type_url().trim_start_matches(FLIGHT_SQL_TYPE)
                    ))
                })
            });
        message.map_err(|e| self.ctx.fail("flight_sql_action", e))
    }

    /// `CreatePreparedStatement`: the handle, the answer's schema and the parameters'.
    async fn prepare(
        &self,
        query: ActionCreatePreparedStatementRequest,
        request: &Request<Action>,
    ) -> Result<ActionCreatePreparedStatementResult, Status> {
        self.run("flight_sql_prepare", request, |grant| async move {
            let prepared = self.ctx.node().prepare(&query.query, &grant).await?;
            Ok(ActionCreatePreparedStatementResult {
                prepared_statement_handle: prepared.statement.encode(),
                dataset_schema: schema_bytes(&prepared.schema)?,
                parameter_schema: schema_bytes(&params::parameter_schema(&prepared.parameters))?,
            })
        })
        .await
    }

    /// A Flight SQL command this server does not answer (keys, type info, Substrait).
    fn unsupported(&self, method: &'static str, command: &Command) -> Status {
        let name = command.type_url().trim_start_matches(FLIGHT_SQL_TYPE);
        let what = format!("the Flight SQL command {name}");
        self.ctx.fail(method, ServerError::Unsupported(what.into()))
    }
}
