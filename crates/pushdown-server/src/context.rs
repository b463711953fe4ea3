//! What every request handler shares, the Flight service's and Flight SQL's alike: the
//! state, authentication, outcome accounting, contained panics, work on the CPU runtime,
//! and planning a request into its `FlightInfo`. Neither front end imports the other's type.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use arrow_flight::{FlightDescriptor, FlightEndpoint, FlightInfo, Ticket};
use futures::FutureExt;
use pushdown_engine::auth::{Caller, Grant};
use pushdown_engine::catalog::panic_message;
use pushdown_engine::error::{Result, ServerError, outcome};
use pushdown_engine::query::Shape;
use pushdown_protocol::{
    CodecInputs, Compression, Fragment, LinkKnown, Profiled, Query, ScanRequest, choose_codec,
};
use tonic::{Request, Status};

use crate::state::State;

/// A handle on the server's state with the handlers' shared steps. Cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct Context {
    state: Arc<State>,
}

impl Context {
    pub(crate) fn new(state: Arc<State>) -> Self {
        Self { state }
    }

    pub(crate) fn state(&self) -> Arc<State> {
        Arc::clone(&self.state)
    }

    pub(crate) fn engine(&self) -> &pushdown_engine::query::Engine {
        &self.state.node.engine
    }

    pub(crate) fn finish<T>(&self, method: &'static str, result: Result<T>) -> Result<T, Status> {
        self.state.node.metrics.record_request(method, outcome(&result));
        result.map_err(crate::status::status)
    }

    pub(crate) fn fail(&self, method: &'static str, error: ServerError) -> Status {
        self.state.node.metrics.record_request(method, error.outcome());
        crate::status::status(error)
    }

    /// Who sent `request`: anyone on a server without tokens, else the holder of the bearer
    /// token it carries (or `Unauthenticated`). A pushdown client of an incompatible version
    /// is refused first, naming both versions.
    pub(crate) fn caller<T>(&self, request: &Request<T>) -> Result<Caller> {
        if let Some(version) = request.metadata().get(pushdown_protocol::VERSION_HEADER) {
            let version = version.to_str().unwrap_or("(not text)");
            pushdown_protocol::compatible(version, pushdown_protocol::VERSION)
                .map_err(ServerError::BadRequest)?;
        }
        match &self.state.node.tokens {
            None => Ok(Caller::anonymous()),
            Some(tokens) => tokens.authenticate(authorization(request.metadata())?),
        }
    }

    /// Runs a request's handler with any panic in it (a decoder's, a kernel's) contained: the
    /// request fails with `Internal`, the server goes on.
    pub(crate) async fn contained<T>(&self, work: impl Future<Output = Result<T>>) -> Result<T> {
        match std::panic::AssertUnwindSafe(work).catch_unwind().await {
            Ok(result) => result,
            Err(panic) => {
                self.state.node.metrics.panics_contained.inc();
                Err(ServerError::Internal(format!(
                    "request panicked: {}",
                    panic_message(panic.as_ref())
                )))
            }
        }
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
            request.compression = codec_for_plain_client(self.state.node.config.plain_client_codec, peer);
        }
        let planned = self.plan_off_io(request, grant).await?;
        self.state
            .node
            .metrics
            .row_groups_pruned_at_planning
            .inc_by(planned.row_groups_pruned);
        let tickets: Vec<bytes::Bytes> = planned.tickets().iter().map(|t| t.encode()).collect();
        if self.state.node.config.read_ahead {
            self.state.node.prefetch.remember(&tickets);
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
            .map_err(ServerError::encode("encoding a schema"))?
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

    pub(crate) fn endpoint(&self, ticket: bytes::Bytes) -> FlightEndpoint {
        let endpoint = FlightEndpoint::new().with_ticket(Ticket::new(ticket));
        match &self.state.node.config.advertise {
            Some(url) => endpoint.with_location(url.clone()),
            None => endpoint,
        }
    }

    /// The views `grant` may read, each with its result schema. A view that cannot be
    /// planned now (a dataset beneath it is missing or broken) is left out, with a warning.
    pub(crate) async fn view_schemas(
        &self,
        grant: Arc<Grant>,
    ) -> Result<Vec<(Arc<pushdown_engine::views::View>, arrow::datatypes::SchemaRef)>> {
        let mut out = Vec::new();
        for view in self.state.node.engine.visible_views(&grant) {
            let query = Query::Fragment(Fragment {
                dataset: view.name.clone(),
                ..Fragment::default()
            });
            let state = Arc::clone(&self.state);
            let grant = Arc::clone(&grant);
            let schema = self
                .on_control("planning a view", async move {
                    Ok(state.node.engine.describe(&query, &grant).await?.0)
                })
                .await;
            match schema {
                Ok(schema) => out.push((view, schema)),
                Err(e) => tracing::warn!(view = %view.name, error = %e, "view cannot be planned; not listed"),
            }
        }
        Ok(out)
    }

    /// Plans off the I/O threads ([`Self::on_control`]): a CPU runtime's deep stacks hold
    /// DataFusion's recursion over large query trees, and a slow plan never holds up the I/O
    /// threads.
    pub(crate) async fn plan_off_io(
        &self,
        request: ScanRequest,
        grant: Arc<Grant>,
    ) -> Result<pushdown_engine::query::Planned> {
        let state = Arc::clone(&self.state);
        self.on_control("planning", async move {
            state.node.engine.plan(&request, &grant).await
        })
        .await
    }

    /// Runs `work` on the CPU runtime, off the I/O threads, and waits for it.
    pub(crate) async fn on_cpu<T: Send + 'static>(
        &self,
        what: &str,
        work: impl Future<Output = Result<T>> + Send + 'static,
    ) -> Result<T> {
        self.state.node.on_cpu(what, work).await
    }

    /// Runs short control work off the I/O threads and never behind a shard being reduced
    /// (see [`pushdown_engine::Node::on_control`]), and waits for it.
    pub(crate) async fn on_control<T: Send + 'static>(
        &self,
        what: &str,
        work: impl Future<Output = Result<T>> + Send + 'static,
    ) -> Result<T> {
        self.state.node.on_control(what, work).await
    }
}

/// The `authorization` header's value, if present and text.
pub(crate) fn authorization(metadata: &tonic::metadata::MetadataMap) -> Result<Option<&str>> {
    match metadata.get("authorization") {
        None => Ok(None),
        Some(value) => value
            .to_str()
            .map(Some)
            .map_err(|_| ServerError::Unauthenticated("the authorization header is not text".into())),
    }
}

/// The codec for a client that could not choose one, at `peer`: the server's
/// `--plain-client-codec`, else [`choose_codec`]'s for a peer on this host (loopback) or
/// across an unknown link.
fn codec_for_plain_client(configured: Option<Compression>, peer: Option<SocketAddr>) -> Compression {
    choose_codec(CodecInputs {
        forced: configured,
        link: match peer {
            Some(p) if p.ip().is_loopback() => LinkKnown::Local,
            _ => LinkKnown::Unknown,
        },
        profiled: Profiled::No,
    })
}
