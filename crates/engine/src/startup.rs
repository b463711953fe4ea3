//! Why a server could not start, or stopped serving: the operator's configuration (a data
//! root, a catalog file, a cache directory, a certificate, a port) or the transport, named
//! with its cause. A request's errors are
//! [`ServerError`]s, mapped to gRPC statuses; these never reach a client.

use std::net::SocketAddr;
use std::path::PathBuf;

use datafusion::error::DataFusionError;

use crate::error::ServerError;

#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    #[error("--data {data}: {cause}")]
    DataRoot { data: String, cause: std::io::Error },

    #[error("--data {data}: {cause}")]
    DataUrl { data: String, cause: url::ParseError },

    /// The object store the data root names could not be set up (its URL or settings).
    #[error("--data {data}: {cause}")]
    Store {
        data: String,
        cause: object_store::Error,
    },

    /// A store setting that cannot work, named with the setting that mends it.
    #[error("--data {data}: {why}")]
    StoreSetting { data: String, why: String },

    #[error("reading {}: {cause}", path.display())]
    Read { path: PathBuf, cause: std::io::Error },

    #[error("catalog file {}: {cause}", path.display())]
    Views { path: PathBuf, cause: Box<ServerError> },

    #[error("cache directory {}: {cause}", dir.display())]
    CacheDir { dir: PathBuf, cause: std::io::Error },

    #[error("starting the CPU runtime: {0}")]
    CpuRuntime(std::io::Error),

    #[error("setting up the query engine: {0}")]
    Engine(DataFusionError),

    #[error("listing the data root: {0}")]
    Listing(Box<ServerError>),

    /// A certificate or key the TLS stack refused (the front end's error, boxed: the
    /// engine names no transport).
    #[error("TLS certificate or key: {0}")]
    Tls(Box<dyn std::error::Error + Send + Sync>),

    /// The transport failed while serving, or the serving task ended abnormally (boxed: the
    /// engine names no transport).
    #[error("serving: {0}")]
    Serve(Box<dyn std::error::Error + Send + Sync>),

    #[error("binding {addr}: {cause}")]
    Bind { addr: SocketAddr, cause: std::io::Error },
}
