//! The pushdown server's Flight front end: a [`Node`] (`pushdown-engine`) served over Arrow
//! Flight and Flight SQL, with TLS, tokens, health and Prometheus metrics.
//!
//! ```text
//!  client ──gRPC──▶ PushdownService ──▶ Node (pushdown-engine)
//!                   │ GetFlightInfo: plan → endpoints      catalog, DataFusion, cache,
//!                   │ DoGet: ticket → batches → encode     CPU runtime, metrics
//!                   │   (codec governor) → Flight data
//!                   │ DoAction: typed actions
//!                   └ Flight SQL (decoded once, matched by command): ADBC, JDBC
//! ```
//!
//! A client sends `GetFlightInfo` with a `ScanRequest` (or SQL); the reply has one endpoint
//! per shard (file × row-group range). Each `DoGet` streams that shard's reduced rows as
//! compressed Arrow IPC. Bad input of any kind is an error status for that request only: the
//! server never panics on input and stays up.
//!
//! The layers, the top first; a module imports only its own layer and those below it
//! (`scripts/check-layers.py` reads this table and enforces it). Nothing here is imported by
//! the engine: the dependency points one way.
//!
//! | layer | modules |
//! |---|---|
//! | the builder, the socket, TLS ([`Server`]); the decoders' entry points for fuzzing (feature `fuzzing`) | `server`, `fuzzing` |
//! | the Flight service: requests decoded, dispatched, encoded | `service` |
//! | Flight SQL, decoded once and matched by command | `flight_sql` |
//! | what every handler shares (authentication, accounting, contained panics, planning); a `DoGet` stream's stages after the engine's ticket stream (the encoding sink, the trailer, the outcome) | `context`, `doget` |
//! | the node and the front end's own admission and link memory | `state` |
//! | IPC encoding and the codec governor; errors to gRPC statuses; the metrics endpoint; sockets that linger when closed | `codec`, `status`, `http`, `linger` |
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use pushdown_server::{Server, ServerConfig, open_store};
//! let store = open_store("./data")?;
//! let server = Server::builder(store).config(ServerConfig::default()).open().await?;
//! let running = server.spawn("127.0.0.1:0".parse()?).await?;
//! assert_ne!(running.addr().port(), 0);
//! running.shutdown().await?;
//! # Ok(()) }
//! ```

mod codec;
mod context;
mod doget;
mod flight_sql;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
mod http;
mod linger;
mod server;
mod service;
mod state;
mod status;

pub use http::serve_metrics;
pub use pushdown_engine::{
    CacheConfig, CacheMode, Caller, Catalog, Compression, DataFile, Dataset, DatasetResources, Grant,
    InstrumentedStore, MAX_EXPR_DEPTH, MIN_TOKEN_LEN, Metrics, Node, NodeBuilder, OpLimits, Planned,
    PreparedStatement, ReadRequest, ServerConfig, ServerError, Shape, StartupError, Tokens, View, ViewDecl,
    Views, dataframe, open_store, reads_in_flight_for, scaling_json, udfs,
};
pub use server::{
    DEFAULT_DRAIN, ENDED_STREAMS_GRACE, RunningServer, Server, ServerBuilder, ServerTls, read_pem,
};
pub use service::PushdownService;
