//! What every request handler shares, the Flight service's and Flight SQL's alike: the
//! state, authentication, outcome accounting, contained panics, work on the CPU runtime,
//! and planning a request into its `FlightInfo`. Neither front end imports the other's type.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use arrow_flight::{FlightDescriptor, FlightEndpoint, FlightInfo, Ticket};
use futures::FutureExt;
use pushdown_engine::{Caller, Grant, Node, Result, ServerError};
use pushdown_protocol::{CodecInputs, Compression, LinkKnown, Profiled, ScanRequest, choose_codec};
use pushdown_task::panic_message;
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

    pub(crate) fn node(&self) -> &Arc<Node> {
        &self.state.node
    }

    pub(crate) fn finish<T>(&self, method: &'static str, result: Result<T>) -> Result<T, Status> {
        let outcome = match &result {
            Ok(_) => "ok",
            Err(e) => e.outcome(),
        };
        self.node().metrics().record_request(method, outcome);
        result.map_err(crate::status::status)
    }

    pub(crate) fn fail(&self, method: &'static str, error: ServerError) -> Status {
        self.node().metrics().record_request(method, error.outcome());
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
        self.node().authenticate(authorization(request.metadata())?)
    }

    /// Runs a request's handler with any panic in it (a decoder's, a kernel's) contained: the
    /// request fails with `Internal`, the server goes on.
    pub(crate) async fn contained<T>(&self, work: impl Future<Output = Result<T>>) -> Result<T> {
        match std::panic::AssertUnwindSafe(work).catch_unwind().await {
            Ok(result) => result,
            Err(panic) => {
                self.node().metrics().panics_contained.inc();
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
            request.compression = codec_for_plain_client(self.node().config().plain_client_codec, peer);
        }
        let planned = self.node().plan(&request, &grant).await?;
        let endpoints: Vec<FlightEndpoint> = planned
            .tickets()
            .iter()
            .map(|t| self.endpoint(t.encode()))
            .collect();
        let total_records = planned.known_rows().map_or(-1, |n| n as i64);
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
            .with_app_metadata(planned.estimate().encode());
        Ok(info)
    }

    pub(crate) fn endpoint(&self, ticket: bytes::Bytes) -> FlightEndpoint {
        let endpoint = FlightEndpoint::new().with_ticket(Ticket::new(ticket));
        match &self.node().config().advertise {
            Some(url) => endpoint.with_location(url.clone()),
            None => endpoint,
        }
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
