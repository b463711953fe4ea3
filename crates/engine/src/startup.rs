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
    #[error("--data {data}: {source}")]
    DataRoot {
        data: String,
        #[source]
        source: std::io::Error,
    },

    #[error("--data {data}: {source}")]
    DataUrl {
        data: String,
        #[source]
        source: url::ParseError,
    },

    /// The object store the data root names could not be set up (its URL or settings).
    #[error("--data {data}: {source}")]
    Store {
        data: String,
        #[source]
        source: object_store::Error,
    },

    /// A store setting that cannot work, named with the setting that mends it.
    #[error("--data {data}: {why}")]
    StoreSetting { data: String, why: String },

    #[error("reading {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("catalog file {}: {source}", path.display())]
    Views {
        path: PathBuf,
        #[source]
        source: Box<ServerError>,
    },

    #[error("cache directory {}: {source}", dir.display())]
    CacheDir {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("starting the CPU runtime: {0}")]
    CpuRuntime(#[source] std::io::Error),

    #[error("setting up the query engine: {0}")]
    Engine(#[source] DataFusionError),

    #[error("listing the data root: {0}")]
    Listing(#[source] Box<ServerError>),

    /// A certificate or key the TLS stack refused (the front end's error, boxed: the
    /// engine names no transport).
    #[error("TLS certificate or key: {0}")]
    Tls(#[source] Box<dyn std::error::Error + Send + Sync>),

    /// The transport failed while serving, or the serving task ended abnormally (boxed: the
    /// engine names no transport).
    #[error("serving: {0}")]
    Serve(#[source] Box<dyn std::error::Error + Send + Sync>),

    #[error("binding {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}
