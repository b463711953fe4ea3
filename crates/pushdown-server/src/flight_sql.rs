//! Flight SQL on the Flight port: SQL clients (ADBC, JDBC, pyarrow's Flight SQL users) run
//! queries over datasets and views unmodified.
//!
//! Every Flight SQL message is a protobuf `Any` whose type names the Flight SQL protocol;
//! [`PushdownService`](crate::PushdownService) hands those (and only those) to this front end, everything else keeps
//! its own meaning. What this front end answers:
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

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

use arrow::array::RecordBatch;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::ipc::writer::IpcWriteOptions;
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::error::FlightError;
use arrow_flight::flight_service_server::FlightService;
use arrow_flight::sql::metadata::{SqlInfoData, SqlInfoDataBuilder};
use arrow_flight::sql::server::{FlightSqlService, PeekableFlightDataStream};
use arrow_flight::sql::{
    ActionClosePreparedStatementRequest, ActionCreatePreparedStatementRequest,
    ActionCreatePreparedStatementResult, Any, CommandGetCatalogs, CommandGetDbSchemas, CommandGetSqlInfo,
    CommandGetTableTypes, CommandGetTables, CommandPreparedStatementQuery, CommandPreparedStatementUpdate,
    CommandStatementIngest, CommandStatementQuery, CommandStatementSubstraitPlan, CommandStatementUpdate,
    DoPutPreparedStatementResult, ProstMessageExt, SqlInfo, SqlSupportedTransaction, TicketStatementQuery,
};
use arrow_flight::{
    Action, FlightData, FlightDescriptor, FlightEndpoint, FlightInfo, IpcMessage, SchemaAsIpc, Ticket,
};
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use prost::Message;
use pushdown_protocol::{Query, ScanRequest};
use tonic::{Request, Response, Status};

use crate::context::Context;
use pushdown_engine::allow::{CATALOG, SCHEMA};
use pushdown_engine::error::{Result, ServerError};
use pushdown_engine::prepared::{PreparedStatement, rewrite_placeholders};

/// The Flight SQL front end of a [`PushdownService`](crate::PushdownService).
#[derive(Debug, Clone)]
pub struct FlightSql {
    ctx: Context,
}

/// The prefix of every Flight SQL message's type.
const FLIGHT_SQL_TYPE: &str = "type.googleapis.com/arrow.flight.protocol.sql.";

/// Flight SQL's actions (everything else is one of ours).
const ACTIONS: [&str; 8] = [
    "CreatePreparedStatement",
    "ClosePreparedStatement",
    "CreatePreparedSubstraitPlan",
    "BeginTransaction",
    "EndTransaction",
    "BeginSavepoint",
    "EndSavepoint",
    "CancelQuery",
];

/// Whether `bytes` (a command or a ticket) is a Flight SQL message.
pub fn is_flight_sql(bytes: &[u8]) -> bool {
    Any::decode(bytes).is_ok_and(|any| any.type_url.starts_with(FLIGHT_SQL_TYPE))
}

/// Whether an action is a Flight SQL one.
pub fn is_flight_sql_action(kind: &str) -> bool {
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
        work: impl FnOnce(Arc<pushdown_engine::auth::Grant>) -> F,
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
    ) -> Result<DoGetResponse, Status> {
        let batch = batch.map_err(Status::from)?;
        let stream = FlightDataEncoderBuilder::new()
            .with_schema(schema)
            .build(futures::stream::once(async { Ok(batch) }))
            .map_err(Status::from);
        Ok(Response::new(Box::pin(stream)))
    }

    /// The tables `grant` may read: datasets, then views, each with its schema.
    async fn tables(
        &self,
        grant: Arc<pushdown_engine::auth::Grant>,
    ) -> Result<Vec<(String, &'static str, SchemaRef)>> {
        let datasets = self.ctx.engine().visible(&grant).await?;
        let mut tables: Vec<_> = datasets
            .values()
            .map(|d| (d.name.clone(), "TABLE", Arc::clone(&d.schema)))
            .collect();
        for (view, schema) in self.ctx.view_schemas(grant).await? {
            tables.push((view.name.clone(), "VIEW", schema));
        }
        Ok(tables)
    }

    fn read_only(what: &str) -> Status {
        crate::status::status(ServerError::NotReadOnly(format!(
            "{what}: this server only answers queries"
        )))
    }
}

/// The one row of parameters that `messages` (a DoPut: schema, then record batches) bind.
///
/// Each message is checked, then decoded with any panic of Arrow's IPC decoder contained and
/// turned into the caller's error: arrow-rs builds arrays before validating them and panics
/// on some malformed headers (a field longer than its buffers; found by the mutation test in
/// tests/tests/security.rs), and these bytes come from the client.
fn decode_params(messages: &[FlightData]) -> Result<Option<RecordBatch>> {
    let malformed = |why: String| ServerError::BadRequest(format!("parameters: {why}"));
    let mut schema: Option<SchemaRef> = None;
    let mut params: Option<RecordBatch> = None;
    for data in messages.iter().filter(|d| !d.data_header.is_empty()) {
        check_param_message(data).map_err(|e| malformed(e.to_string()))?;
        let decoded = std::panic::catch_unwind(|| -> std::result::Result<_, String> {
            match &schema {
                None => Schema::try_from(data)
                    .map(|s| (Some(Arc::new(s)), None))
                    .map_err(|e| e.to_string()),
                Some(schema) => {
                    arrow_flight::utils::flight_data_to_arrow_batch(data, Arc::clone(schema), &HashMap::new())
                        .map(|b| (None, Some(b)))
                        .map_err(|e| e.to_string())
                }
            }
        })
        .unwrap_or_else(|_| Err("malformed Arrow IPC".into()))
        .map_err(malformed)?;
        match decoded {
            (Some(s), _) => schema = Some(s),
            (_, Some(batch)) if batch.num_rows() == 0 => {}
            (_, Some(batch)) => {
                if params.is_some() {
                    return Err(ServerError::BadQuery(
                        "a query binds one row of parameters; run it once per row".into(),
                    ));
                }
                params = Some(batch);
            }
            (None, None) => {}
        }
    }
    Ok(params)
}

/// The most messages a parameter binding may take (schema, one batch, a few empty ones).
const MAX_PARAM_MESSAGES: usize = 16;

/// A parameter message is checked before Arrow decodes it: a schema or an uncompressed
/// record batch whose body is exactly what its header says. Compressed bodies are refused:
/// decompression allocates whatever length a body claims.
fn check_param_message(data: &FlightData) -> std::result::Result<(), FlightError> {
    use arrow::ipc::MessageHeader;
    if data.data_header.is_empty() {
        return Ok(());
    }
    let message = arrow::ipc::root_as_message(&data.data_header)
        .map_err(|e| FlightError::protocol(format!("parameter message: {e}")))?;
    match message.header_type() {
        MessageHeader::Schema => Ok(()),
        MessageHeader::RecordBatch => {
            let batch = message
                .header_as_record_batch()
                .ok_or_else(|| FlightError::protocol("parameter message: no record batch"))?;
            if batch.compression().is_some() {
                return Err(FlightError::protocol("parameters must be sent uncompressed"));
            }
            let body = data.data_body.len();
            if usize::try_from(message.bodyLength()).ok() != Some(body) {
                return Err(FlightError::protocol(
                    "parameter message: body length differs from its header",
                ));
            }
            // arrow-rs slices each buffer as the header says and panics past the body's end.
            let inside = |offset: i64, length: i64| {
                let (Ok(offset), Ok(length)) = (usize::try_from(offset), usize::try_from(length)) else {
                    return false;
                };
                offset.checked_add(length).is_some_and(|end| end <= body)
            };
            if !batch
                .buffers()
                .is_some_and(|buffers| buffers.iter().all(|b| inside(b.offset(), b.length())))
            {
                return Err(FlightError::protocol(
                    "parameter message: a buffer lies outside the body",
                ));
            }
            Ok(())
        }
        other => Err(FlightError::protocol(format!(
            "parameters are a schema and a record batch, not {other:?}"
        ))),
    }
}

/// The parameters of a prepared query, `$1`… in order, typed where the query implies a type.
fn parameter_schema(types: &HashMap<String, Option<DataType>>) -> Schema {
    let mut params: Vec<(usize, DataType)> = types
        .iter()
        .filter_map(|(name, ty)| {
            let n = name.strip_prefix('$')?.parse().ok()?;
            Some((n, ty.clone().unwrap_or(DataType::Null)))
        })
        .collect();
    params.sort_by_key(|(n, _)| *n);
    Schema::new(
        params
            .into_iter()
            .map(|(n, ty)| Field::new(format!("${n}"), ty, true))
            .collect::<Vec<_>>(),
    )
}

fn schema_bytes(schema: &Schema) -> Result<Bytes> {
    let IpcMessage(bytes) = SchemaAsIpc::new(schema, &IpcWriteOptions::default())
        .try_into()
        .map_err(ServerError::encode("encoding a schema"))?;
    Ok(bytes)
}

type DoGetResponse = Response<<FlightSql as FlightService>::DoGetStream>;

#[tonic::async_trait]
impl FlightSqlService for FlightSql {
    type FlightService = FlightSql;

    async fn get_flight_info_statement(
        &self,
        query: CommandStatementQuery,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        self.statement_info(query.query, request).await
    }

    async fn get_flight_info_prepared_statement(
        &self,
        query: CommandPreparedStatementQuery,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let sql = PreparedStatement::decode(&query.prepared_statement_handle)
            .and_then(|p| p.bound_sql())
            .map_err(|e| self.ctx.fail("flight_sql_statement", e))?;
        self.statement_info(sql, request).await
    }

    async fn get_flight_info_substrait_plan(
        &self,
        _query: CommandStatementSubstraitPlan,
        _request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        Err(Status::unimplemented("Substrait plans: send SQL"))
    }

    async fn get_flight_info_catalogs(
        &self,
        query: CommandGetCatalogs,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = query.into_builder().schema();
        self.command_info(&query, &schema, request)
    }

    async fn get_flight_info_schemas(
        &self,
        query: CommandGetDbSchemas,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = query.clone().into_builder().schema();
        self.command_info(&query, &schema, request)
    }

    async fn get_flight_info_tables(
        &self,
        query: CommandGetTables,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = query.clone().into_builder().schema();
        self.command_info(&query, &schema, request)
    }

    async fn get_flight_info_table_types(
        &self,
        query: CommandGetTableTypes,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = query.into_builder().schema();
        self.command_info(&query, &schema, request)
    }

    async fn get_flight_info_sql_info(
        &self,
        query: CommandGetSqlInfo,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = query.clone().into_builder(sql_info()?).schema();
        self.command_info(&query, &schema, request)
    }

    async fn do_get_statement(
        &self,
        _ticket: TicketStatementQuery,
        _request: Request<Ticket>,
    ) -> Result<DoGetResponse, Status> {
        Err(crate::status::status(ServerError::BadRequest(
            "this server's statement tickets are the endpoints' own: read those".into(),
        )))
    }

    async fn do_get_catalogs(
        &self,
        query: CommandGetCatalogs,
        request: Request<Ticket>,
    ) -> Result<DoGetResponse, Status> {
        self.authenticated(&request)?;
        let mut builder = query.into_builder();
        builder.append(CATALOG);
        let schema = builder.schema();
        Self::batch_stream(schema, builder.build())
    }

    async fn do_get_schemas(
        &self,
        query: CommandGetDbSchemas,
        request: Request<Ticket>,
    ) -> Result<DoGetResponse, Status> {
        self.authenticated(&request)?;
        let mut builder = query.into_builder();
        builder.append(CATALOG, SCHEMA);
        let schema = builder.schema();
        Self::batch_stream(schema, builder.build())
    }

    async fn do_get_tables(
        &self,
        query: CommandGetTables,
        request: Request<Ticket>,
    ) -> Result<DoGetResponse, Status> {
        let tables = self
            .run("flight_sql_metadata", &request, |grant| self.tables(grant))
            .await?;
        let mut builder = query.into_builder();
        for (name, kind, schema) in tables {
            builder
                .append(CATALOG, SCHEMA, name, kind, &schema)
                .map_err(Status::from)?;
        }
        let schema = builder.schema();
        Self::batch_stream(schema, builder.build())
    }

    async fn do_get_table_types(
        &self,
        query: CommandGetTableTypes,
        request: Request<Ticket>,
    ) -> Result<DoGetResponse, Status> {
        self.authenticated(&request)?;
        let mut builder = query.into_builder();
        builder.append("TABLE");
        builder.append("VIEW");
        let schema = builder.schema();
        Self::batch_stream(schema, builder.build())
    }

    async fn do_get_sql_info(
        &self,
        query: CommandGetSqlInfo,
        request: Request<Ticket>,
    ) -> Result<DoGetResponse, Status> {
        self.authenticated(&request)?;
        let builder = query.into_builder(sql_info()?);
        let schema = builder.schema();
        Self::batch_stream(schema, builder.build())
    }

    async fn do_put_statement_update(
        &self,
        _query: CommandStatementUpdate,
        _request: Request<PeekableFlightDataStream>,
    ) -> Result<i64, Status> {
        Err(Self::read_only("updates"))
    }

    async fn do_put_statement_ingest(
        &self,
        _query: CommandStatementIngest,
        _request: Request<PeekableFlightDataStream>,
    ) -> Result<i64, Status> {
        Err(Self::read_only("ingestion"))
    }

    async fn do_put_prepared_statement_update(
        &self,
        _query: CommandPreparedStatementUpdate,
        _request: Request<PeekableFlightDataStream>,
    ) -> Result<i64, Status> {
        Err(Self::read_only("updates"))
    }

    async fn do_put_substrait_plan(
        &self,
        _query: CommandStatementSubstraitPlan,
        _request: Request<PeekableFlightDataStream>,
    ) -> Result<i64, Status> {
        Err(Self::read_only("Substrait plans"))
    }

    /// Binds parameters: the answer is a new handle carrying the statement and the values.
    async fn do_put_prepared_statement_query(
        &self,
        query: CommandPreparedStatementQuery,
        request: Request<PeekableFlightDataStream>,
    ) -> Result<DoPutPreparedStatementResult, Status> {
        // Authenticated here; the grant is checked when the bound statement is planned.
        self.ctx
            .caller(&request)
            .map_err(|e| self.ctx.fail("flight_sql_bind", e))?;
        let work = async {
            let prepared = PreparedStatement::decode(&query.prepared_statement_handle)?;
            // At most a few messages (schema, one batch), then decoded one by one.
            let mut incoming = request.into_inner();
            let mut messages = Vec::new();
            while let Some(data) = incoming.next().await {
                let data = data.map_err(|e| ServerError::BadRequest(format!("parameters: {e}")))?;
                if messages.len() == MAX_PARAM_MESSAGES {
                    return Err(ServerError::BadRequest("parameters: too many messages".into()));
                }
                messages.push(data);
            }
            let params = decode_params(&messages)?;
            let bound = match params {
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
        };
        let result = self.ctx.contained(work).await;
        self.ctx.finish("flight_sql_bind", result)
    }

    async fn do_action_create_prepared_statement(
        &self,
        query: ActionCreatePreparedStatementRequest,
        request: Request<Action>,
    ) -> Result<ActionCreatePreparedStatementResult, Status> {
        self.run("flight_sql_prepare", &request, |grant| async move {
            let sql = rewrite_placeholders(&query.query, |_| Ok(None))?;
            let state = self.ctx.state();
            let statement = Query::Sql(sql.clone());
            let (schema, plan) = self
                .ctx
                .on_cpu("preparing", async move {
                    state.node.engine.describe(&statement, &grant).await
                })
                .await?;
            let types = plan.get_parameter_types()?;
            Ok(ActionCreatePreparedStatementResult {
                prepared_statement_handle: PreparedStatement { sql, params: None }.encode(),
                dataset_schema: schema_bytes(&schema)?,
                parameter_schema: schema_bytes(&parameter_schema(&types))?,
            })
        })
        .await
    }

    async fn do_action_close_prepared_statement(
        &self,
        _query: ActionClosePreparedStatementRequest,
        request: Request<Action>,
    ) -> Result<(), Status> {
        // Handles hold no server state: nothing to free.
        self.run("flight_sql_close", &request, |_| async { Ok(()) }).await
    }

    async fn register_sql_info(&self, _id: i32, _result: &SqlInfo) {}
}
