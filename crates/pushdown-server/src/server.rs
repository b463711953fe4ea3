//! A server: a [`Node`] behind the Flight service, on a socket, with TLS when asked.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arrow_flight::flight_service_server::FlightServiceServer;
use object_store::ObjectStore;
use pushdown_engine::{
    CacheUse, Catalog, Grant, InstrumentedStore, Metrics, Node, NodeBuilder, Planned, Result, ServerConfig,
    StartupError, TicketStream, Tokens, Views,
};
use pushdown_task::Task;
use tokio::net::TcpListener;

use crate::linger::Lingering;
use crate::service::PushdownService;
use crate::state::State;

/// TLS for the Flight port (rustls): the server's certificate chain and private key, PEM,
/// and optionally the CA whose client certificates every connection must present (mutual
/// TLS). Its `Debug` never shows the key.
#[derive(Clone)]
pub struct ServerTls {
    cert: Vec<u8>,
    key: Vec<u8>,
    client_ca: Option<Vec<u8>>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("mutual", &self.client_ca.is_some())
            .finish_non_exhaustive()
    }
}

impl ServerTls {
    /// From PEM text: the certificate chain and its private key.
    pub fn new(cert_pem: impl Into<Vec<u8>>, key_pem: impl Into<Vec<u8>>) -> Self {
        Self {
            cert: cert_pem.into(),
            key: key_pem.into(),
            client_ca: None,
        }
    }

    /// From PEM files (`--tls-cert`, `--tls-key`).
    pub fn from_files(cert: &std::path::Path, key: &std::path::Path) -> Result<Self, StartupError> {
        Ok(Self::new(read_pem(cert)?, read_pem(key)?))
    }

    /// Requires every client to present a certificate signed by `ca_pem` (mutual TLS).
    pub fn require_client_certs(mut self, ca_pem: impl Into<Vec<u8>>) -> Self {
        self.client_ca = Some(ca_pem.into());
        self
    }

    fn config(&self) -> tonic::transport::ServerTlsConfig {
        use tonic::transport::{Certificate, Identity, ServerTlsConfig};
        let config = ServerTlsConfig::new().identity(Identity::from_pem(&self.cert, &self.key));
        match &self.client_ca {
            Some(ca) => config.client_ca_root(Certificate::from_pem(ca)),
            None => config,
        }
    }
}

/// A PEM file's bytes, or an error that names the file.
pub fn read_pem(path: &std::path::Path) -> Result<Vec<u8>, StartupError> {
    std::fs::read(path).map_err(|source| StartupError::Read {
        path: path.to_owned(),
        cause: source,
    })
}

/// How long a server asked to stop lets the streams in flight finish before it ends them
/// (see [`ServerBuilder::drain`]). With [`ENDED_STREAMS_GRACE`] after it, a stop fits
/// Kubernetes' default grace period (30 s) before its SIGKILL.
pub const DEFAULT_DRAIN: Duration = Duration::from_secs(25);

/// How long streams ended at the drain deadline have to deliver their error to their
/// clients before the server stops without them.
pub const ENDED_STREAMS_GRACE: Duration = Duration::from_secs(5);

/// Builds a [`Server`] over a store rooted at the data root: a [`NodeBuilder`] and TLS.
#[derive(Debug)]
pub struct ServerBuilder {
    node: NodeBuilder,
    tls: Option<ServerTls>,
    drain: Duration,
}

impl ServerBuilder {
    /// Serves `views` (a `--catalog` file) as datasets beside the storage root's.
    pub fn views(mut self, views: Views) -> Self {
        self.node = self.node.views(views);
        self
    }

    pub fn config(mut self, config: ServerConfig) -> Self {
        self.node = self.node.config(config);
        self
    }

    /// Requests must carry one of `tokens` and read only what it grants.
    pub fn tokens(mut self, tokens: Tokens) -> Self {
        self.node = self.node.tokens(tokens);
        self
    }

    /// Serves Flight over TLS only.
    pub fn tls(mut self, tls: ServerTls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Once asked to stop ([`Server::serve`]'s `shutdown`), the server takes no new requests
    /// and lets the streams in flight finish for up to `drain`; then it ends those still open,
    /// each with `UNAVAILABLE` (its client reads on from another server), and stops. Without
    /// it, one stalled trainer would hold a stopping server for `request_timeout`.
    pub fn drain(mut self, drain: Duration) -> Self {
        self.drain = drain;
        self
    }

    /// Keep every read request made to the store (see [`Server::store`]); for tests and
    /// I/O accounting.
    pub fn record_reads(mut self) -> Self {
        self.node = self.node.record_reads();
        self
    }

    /// Lists the catalog and prepares the query engine.
    pub async fn open(self) -> Result<Server, StartupError> {
        if let Some(tls) = &self.tls {
            // A certificate or key that does not parse fails here, before anything listens.
            tonic::transport::Server::builder()
                .tls_config(tls.config())
                .map_err(|e| StartupError::Tls(Box::new(e)))?;
        }
        let node = Arc::new(self.node.open().await?);
        Ok(Server {
            state: Arc::new(State::new(node)),
            tls: self.tls,
            drain: self.drain,
        })
    }
}

/// A pushdown server, ready to serve.
#[derive(Debug, Clone)]
pub struct Server {
    state: Arc<State>,
    tls: Option<ServerTls>,
    drain: Duration,
}

impl Server {
    pub fn builder(store: Arc<dyn ObjectStore>) -> ServerBuilder {
        ServerBuilder {
            node: Node::builder(store),
            tls: None,
            drain: DEFAULT_DRAIN,
        }
    }

    /// What this server's requests share below the wire: plan and run tickets on it
    /// in-process (the baselines, the tests) exactly as its Flight requests do.
    pub fn node(&self) -> &Arc<Node> {
        &self.state.node
    }

    /// Plans `request` as `GetFlightInfo` does: result schema, shape, estimates, tickets.
    pub async fn plan(&self, request: &pushdown_protocol::ScanRequest) -> Result<Planned> {
        self.state.node.plan(request, &Arc::new(Grant::All)).await
    }

    /// Runs `ticket` in this process as its `DoGet` does, fragment cache included: see
    /// [`Node::run_ticket`].
    pub async fn run_ticket(&self, ticket: &pushdown_protocol::ShardTicket) -> Result<TicketStream> {
        let all = Arc::new(Grant::All);
        self.state.node.run_ticket(ticket, &all, CacheUse::Read).await
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        self.state.node.metrics()
    }

    /// Whether an endpoint is opened ahead now, waiting for its reader (see
    /// `ServerConfig::read_ahead`).
    pub fn holds_read_ahead(&self) -> bool {
        self.state.node.holds_read_ahead()
    }

    /// The decorated store every read goes through.
    pub fn store(&self) -> &Arc<InstrumentedStore> {
        self.state.node.store()
    }

    pub fn catalog(&self) -> &Arc<Catalog> {
        self.state.node.catalog()
    }

    /// The tokens requests must carry, if any (replace them to reload: SIGHUP in `serve`).
    pub fn tokens(&self) -> Option<&Arc<Tokens>> {
        self.state.node.tokens()
    }

    /// The tonic service, with message limits and compression set.
    pub fn service(&self) -> FlightServiceServer<PushdownService> {
        let config = self.state.node.config();
        FlightServiceServer::new(PushdownService::new(Arc::clone(&self.state)))
            .max_decoding_message_size(config.max_message_bytes)
            .max_encoding_message_size(config.max_message_bytes)
    }

    /// Serves Flight on `listener` until `shutdown` completes, then lets the streams in
    /// flight finish within the drain deadline ([`ServerBuilder::drain`]).
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl std::future::Future<Output = ()> + Send,
    ) -> Result<(), StartupError> {
        // No Nagle: a stream's last frames and trailers (and every small response) would wait
        // for the peer's delayed ACK, ~40 ms per request. The builder's `tcp_nodelay` covers
        // only listeners tonic binds itself, so it is set on the accepted sockets here.
        // Each socket lingers once its connection is done (see `linger`).
        let incoming = futures::TryStreamExt::map_ok(
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
            Lingering::new,
        );
        // grpc.health.v1 for probes and load balancers: SERVING for the whole server ("") and
        // for Flight once the catalog is open (it is, by the time a Server exists).
        let (health, health_service) = tonic_health::server::health_reporter();
        health.set_serving::<FlightServiceServer<PushdownService>>().await;
        let mut builder = tonic::transport::Server::builder();
        if let Some(tls) = &self.tls {
            builder = builder
                .tls_config(tls.config())
                .map_err(|e| StartupError::Tls(Box::new(e)))?;
        }
        let shutdown = futures::FutureExt::shared(shutdown);
        let serving = builder
            // Large windows: a stream of multi-MiB messages must not stall on 64 KiB acks.
            .initial_stream_window_size(Some(8 << 20))
            .initial_connection_window_size(Some(32 << 20))
            .http2_keepalive_interval(Some(Duration::from_secs(30)))
            .add_service(health_service)
            .add_service(self.service())
            .serve_with_incoming_shutdown(incoming, shutdown.clone());
        tokio::pin!(serving);
        tokio::select! {
            served = &mut serving => return served.map_err(|e| StartupError::Serve(Box::new(e))),
            () = shutdown => {}
        }
        self.drain_then_end(serving)
            .await
            .map_err(|e| StartupError::Serve(Box::new(e)))
    }

    /// Asked to stop, `serving` takes no new requests and ends once its streams have:
    /// waits for that within the drain deadline, then ends the streams still open.
    async fn drain_then_end<E>(
        &self,
        mut serving: impl Future<Output = Result<(), E>> + Unpin,
    ) -> Result<(), E> {
        let open = || self.state.node.metrics().active_streams.get();
        tracing::info!(streams = open(), drain = ?self.drain, "stopping: no new requests; streams in flight finish");
        if let Ok(served) = tokio::time::timeout(self.drain, &mut serving).await {
            return served;
        }
        tracing::warn!(
            streams = open(),
            drain = ?self.drain,
            "the drain deadline passed: ending the streams still open (UNAVAILABLE: their clients read on elsewhere)"
        );
        self.state.end_streams();
        // Each stream's error waits for its client to take it; one that never reads is not
        // waited for past this.
        match tokio::time::timeout(ENDED_STREAMS_GRACE, serving).await {
            Ok(served) => served,
            Err(_) => {
                tracing::warn!(
                    streams = open(),
                    "clients that do not read their streams' end: stopping without them"
                );
                Ok(())
            }
        }
    }

    /// Binds `addr` and serves in the background (tests, the demo).
    pub async fn spawn(self, addr: SocketAddr) -> Result<RunningServer, StartupError> {
        let bind = |source| StartupError::Bind { addr, cause: source };
        let listener = TcpListener::bind(addr).await.map_err(bind)?;
        let addr = listener.local_addr().map_err(bind)?;
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let task = Task::spawn(self.serve(listener, async {
            let _ = rx.await;
        }));
        Ok(RunningServer {
            addr,
            scheme,
            shutdown: Some(tx),
            task: Some(task),
        })
    }
}

/// A server serving in the background; stops when shut down or dropped.
#[derive(Debug)]
pub struct RunningServer {
    addr: SocketAddr,
    /// `https` when serving TLS.
    scheme: &'static str,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    /// Aborted when dropped: a server dropped without `shutdown` stops at once.
    task: Option<Task<Result<(), StartupError>>>,
}

impl RunningServer {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://addr` (`https://` with TLS), for clients.
    pub fn url(&self) -> String {
        format!("{}://{}", self.scheme, self.addr)
    }

    /// Stops accepting, waits for the server to wind down.
    pub async fn shutdown(mut self) -> Result<(), StartupError> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        match self.task.take() {
            Some(task) => task.await.map_err(|e| StartupError::Serve(Box::new(e)))?,
            None => Ok(()),
        }
    }
}
