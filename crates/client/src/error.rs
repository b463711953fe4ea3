//! What can go wrong for a client, by whom it is to be fixed.

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("invalid server URL `{url}`: {reason}")]
    BadUrl { url: String, reason: String },
    #[error("server {url}: {status}")]
    Server {
        url: String,
        #[source]
        status: Box<tonic::Status>,
    },
    #[error("decoding the stream of shard {endpoint}: {reason}")]
    Decode { endpoint: usize, reason: String },
    #[error("shard {endpoint} ({shard}) failed after {attempts} attempts on [{}]: {status}", servers.join(", "))]
    Stream {
        endpoint: usize,
        shard: String,
        attempts: usize,
        /// Every server tried, in order.
        servers: Vec<String>,
        #[source]
        status: Box<tonic::Status>,
    },
    #[error("no server can serve shard {endpoint} ({shard}): {}", refusals.join("; "))]
    NoServer {
        endpoint: usize,
        shard: String,
        /// Each holder's refusal.
        refusals: Vec<String>,
    },
    #[error(
        "shard {endpoint} ({shard}) ended after {delivered} rows of the {planned} it was planned \
         to have: its file changed or was truncated"
    )]
    ShortShard {
        endpoint: usize,
        shard: String,
        delivered: u64,
        planned: u64,
    },
    #[error(
        "the stream of a query that is not row-wise failed after {delivered} rows and cannot be \
         resumed (it has no total order); run it again: {status}"
    )]
    NotResumable {
        delivered: u64,
        #[source]
        status: Box<tonic::Status>,
    },
    #[error(
        "shard {endpoint}: {server} produced {output} rows and sent {sent}, but {received} arrived \
         and {delivered} are held: rows lost or repeated"
    )]
    Miscount {
        endpoint: usize,
        server: String,
        delivered: u64,
        output: u64,
        sent: u64,
        received: u64,
    },
    #[error("servers disagree about {about}: {detail}")]
    ServersDisagree { about: String, detail: String },
    /// No server could be asked, or none answered.
    #[error("{0}")]
    NoAnswer(String),
    /// An answer that did not come in time (a server that stopped answering).
    #[error("{what}: no answer in {after:?}")]
    Timeout {
        what: String,
        after: std::time::Duration,
    },
    /// What the query was planned on changed (its schema, its files' versions): plan or
    /// restore again as the message says.
    #[error("{0}")]
    Changed(String),
    #[error(
        "server {server} is unreachable ({reason}) and no other server offers {}: planning \
         without it would leave them out",
        files.join(", ")
    )]
    Unreachable {
        server: String,
        files: Vec<String>,
        reason: String,
    },
    #[error(transparent)]
    Arrow(#[from] arrow::error::ArrowError),
    #[error(transparent)]
    Plan(#[from] pushdown_planner::PlanError),
    #[error(transparent)]
    Op(#[from] pushdown_ops::OpError),
    /// A server answered, but not as the protocol says (an action with no result, a body
    /// that does not decode): a server of another version, or a bug; not retried.
    #[error("{what}: {reason}")]
    Reply { what: &'static str, reason: String },
    /// A local file or thread the caller asked for could not be used.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// Writing the output file.
    #[error("writing the output: {0}")]
    Output(#[source] parquet::errors::ParquetError),
    /// A client task (a loader worker, a batch's completion) panicked or was cancelled.
    #[error("{what}: {source}")]
    Task {
        what: &'static str,
        #[source]
        source: tokio::task::JoinError,
    },
    /// The loader was shut down, or its consumer went away.
    #[error("{0}")]
    Closed(&'static str),
    /// The caller's arguments, options or saved state.
    #[error("{0}")]
    Invalid(String),
}

impl ClientError {
    pub(crate) fn server(url: &str, status: tonic::Status) -> Self {
        ClientError::Server {
            url: url.to_owned(),
            status: Box::new(status),
        }
    }

    /// A malformed answer to `what`.
    pub(crate) fn reply(what: &'static str, reason: impl std::fmt::Display) -> Self {
        ClientError::Reply {
            what,
            reason: reason.to_string(),
        }
    }

    /// `what` failed on a local file or thread.
    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        ClientError::Io {
            what: what.into(),
            source,
        }
    }
}

pub type Result<T, E = ClientError> = std::result::Result<T, E>;
