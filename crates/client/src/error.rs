//! What can go wrong for a client, by whom it is to be fixed.
//!
//! As every error type of the project, an error here states its cause in its message and
//! keeps it as a field, never also as its `source()` (see `pushdown-engine`'s `error`):
//! a report walking the chain says each cause once.

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("invalid server URL `{url}`: {reason}")]
    BadUrl { url: String, reason: String },
    #[error("server {url}: {}", status_text(status))]
    Server { url: String, status: Box<tonic::Status> },
    #[error("decoding the stream of shard {endpoint}: {reason}")]
    Decode { endpoint: usize, reason: String },
    #[error(
        "shard {endpoint} ({shard}) failed after {attempts} attempts on [{}]: {}",
        servers.join(", "),
        status_text(status)
    )]
    Stream {
        endpoint: usize,
        shard: String,
        attempts: usize,
        /// Every server tried, in order.
        servers: Vec<String>,
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
         resumed (it has no total order); run it again: {}",
        status_text(status)
    )]
    NotResumable {
        delivered: u64,
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
    #[error("{what}: {cause}")]
    Io { what: String, cause: std::io::Error },
    /// Writing the output file.
    #[error("writing the output: {0}")]
    Output(parquet::errors::ParquetError),
    /// A client task (a loader worker, a batch's completion) panicked or was cancelled.
    #[error("{what}: {cause}")]
    Task {
        what: &'static str,
        cause: tokio::task::JoinError,
    },
    /// The loader was shut down, or its consumer went away.
    #[error("{0}")]
    Closed(&'static str),
    /// A null in a column that arrives as a tensor (a number, or pixels), which has no
    /// null: the data's, named, never a silent switch to an Arrow array.
    #[error(
        "column `{column}` is null at row {row} of batch {batch}, and it arrives as a tensor: \
         leave such rows out (`WHERE {column} IS NOT NULL`) or fill them (`COALESCE({column}, 0)`)"
    )]
    NullInTensor { column: String, batch: u64, row: usize },
    /// The caller's arguments, options or saved state.
    #[error("{0}")]
    Invalid(String),
}

/// What kind of failure an error is, named as gRPC's codes name them: what a caller tells
/// apart (retry later, fix the request, fix the credentials, plan again).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The caller's query, options, state or data values: the same on every retry.
    InvalidArgument,
    /// A dataset, file or tokenizer that is not there.
    NotFound,
    /// No server could be reached, or none answered: may succeed later.
    Unavailable,
    /// An answer that did not come in time.
    TimedOut,
    /// No credentials, or ones the server does not accept.
    Unauthenticated,
    /// Credentials that do not grant what was asked.
    PermissionDenied,
    /// Data that is corrupt, or rows lost or repeated on the way.
    DataLoss,
    /// What was planned on changed (files, versions, schema): plan or restore again.
    Changed,
    /// A server's budgets (streams, memory) are spent: may succeed later.
    ResourceExhausted,
    /// A bug or a broken peer: the message says which.
    Internal,
}

impl ErrorKind {
    /// The kind of a server's status code.
    pub fn of_code(code: tonic::Code) -> Self {
        use tonic::Code;
        match code {
            Code::InvalidArgument | Code::OutOfRange | Code::FailedPrecondition | Code::AlreadyExists => {
                ErrorKind::InvalidArgument
            }
            Code::NotFound => ErrorKind::NotFound,
            Code::Unavailable | Code::Cancelled | Code::Aborted => ErrorKind::Unavailable,
            Code::DeadlineExceeded => ErrorKind::TimedOut,
            Code::Unauthenticated => ErrorKind::Unauthenticated,
            Code::PermissionDenied => ErrorKind::PermissionDenied,
            Code::DataLoss => ErrorKind::DataLoss,
            Code::ResourceExhausted => ErrorKind::ResourceExhausted,
            Code::Ok | Code::Unknown | Code::Internal | Code::Unimplemented => ErrorKind::Internal,
        }
    }

    /// The kind's name (`InvalidArgument`): Python's error classes are named after it.
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::InvalidArgument => "InvalidArgument",
            ErrorKind::NotFound => "NotFound",
            ErrorKind::Unavailable => "Unavailable",
            ErrorKind::TimedOut => "TimedOut",
            ErrorKind::Unauthenticated => "Unauthenticated",
            ErrorKind::PermissionDenied => "PermissionDenied",
            ErrorKind::DataLoss => "DataLoss",
            ErrorKind::Changed => "Changed",
            ErrorKind::ResourceExhausted => "ResourceExhausted",
            ErrorKind::Internal => "Internal",
        }
    }
}

impl ClientError {
    /// What kind of failure this is: a server's status by its code, the client's own by
    /// who is to fix it.
    pub fn kind(&self) -> ErrorKind {
        match self {
            ClientError::Server { status, .. }
            | ClientError::Stream { status, .. }
            | ClientError::NotResumable { status, .. } => ErrorKind::of_code(status.code()),
            ClientError::BadUrl { .. }
            | ClientError::Plan(_)
            | ClientError::Op(_)
            | ClientError::NullInTensor { .. }
            | ClientError::Invalid(_) => ErrorKind::InvalidArgument,
            ClientError::NoServer { .. } | ClientError::NoAnswer(_) | ClientError::Unreachable { .. } => {
                ErrorKind::Unavailable
            }
            ClientError::Timeout { .. } => ErrorKind::TimedOut,
            ClientError::Decode { .. } | ClientError::Miscount { .. } => ErrorKind::DataLoss,
            ClientError::ShortShard { .. }
            | ClientError::Changed(_)
            | ClientError::ServersDisagree { .. } => ErrorKind::Changed,
            ClientError::Arrow(_)
            | ClientError::Reply { .. }
            | ClientError::Io { .. }
            | ClientError::Output(_)
            | ClientError::Task { .. }
            | ClientError::Closed(_) => ErrorKind::Internal,
        }
    }

    /// The server's status, for the errors a server's answer caused (they print it, and do
    /// not return it as their `source`).
    pub fn status(&self) -> Option<&tonic::Status> {
        match self {
            ClientError::Server { status, .. }
            | ClientError::Stream { status, .. }
            | ClientError::NotResumable { status, .. } => Some(status),
            _ => None,
        }
    }

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
            cause: source,
        }
    }
}

pub type Result<T, E = ClientError> = std::result::Result<T, E>;

/// A server's answer (or the transport's failure to reach it) as a person reads it: what
/// kind of failure in words, the message, and the root cause beneath it where the message
/// does not already say it — `unavailable: tcp connect error: Connection refused (os error
/// 111)`, not tonic's `code: 'The service is currently unavailable', message: "tcp connect
/// error", source: tonic::transport::Error(Transport, ConnectError(…))`. The errors that
/// carry a status print it so and keep it as a field, not as their `source`: a reporter
/// walking the chain would print it twice.
pub fn status_text(status: &tonic::Status) -> String {
    let mut text = code_words(status.code());
    let message = status.message();
    // A server whose message already begins with its kind (`unauthenticated: …`) says it once.
    let said = message.len() > text.len()
        && message.is_char_boundary(text.len())
        && message[..text.len()].eq_ignore_ascii_case(&text)
        && message[text.len()..].starts_with(':');
    if said {
        text = message.to_owned();
    } else if !message.is_empty() {
        text = format!("{text}: {message}");
    }
    let mut root = None;
    let mut source = std::error::Error::source(status);
    while let Some(cause) = source {
        root = Some(cause);
        source = cause.source();
    }
    if let Some(cause) = root.map(ToString::to_string)
        && !cause.is_empty()
        && !text.contains(&cause)
    {
        text = format!("{text}: {cause}");
    }
    text
}

/// A gRPC code in lower-case words: `InvalidArgument` → "invalid argument".
fn code_words(code: tonic::Code) -> String {
    let mut words = String::new();
    for (i, c) in format!("{code:?}").chars().enumerate() {
        if c.is_uppercase() && i > 0 {
            words.push(' ');
        }
        words.push(c.to_ascii_lowercase());
    }
    words
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn a_status_reads_as_its_kind_its_message_and_its_root_cause() {
        let refused = tonic::Status::invalid_argument("invalid query: no field `x`");
        assert_eq!(
            status_text(&refused),
            "invalid argument: invalid query: no field `x`"
        );
        let mut unreachable = tonic::Status::unavailable("tcp connect error");
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "Connection refused");
        unreachable.set_source(Arc::new(io));
        assert_eq!(
            status_text(&unreachable),
            "unavailable: tcp connect error: Connection refused"
        );
        let said = ClientError::server("http://h:1", unreachable).to_string();
        assert_eq!(
            said,
            "server http://h:1: unavailable: tcp connect error: Connection refused"
        );
        let server = ClientError::server("u", refused);
        assert_eq!(
            server.status().map(tonic::Status::code),
            Some(tonic::Code::InvalidArgument)
        );
        assert!(std::error::Error::source(&server).is_none(), "said once");
        assert_eq!(
            status_text(&tonic::Status::deadline_exceeded("")),
            "deadline exceeded"
        );
        // The kind is said once where the server's message begins with it.
        assert_eq!(
            status_text(&tonic::Status::unauthenticated("unauthenticated: no token")),
            "unauthenticated: no token"
        );
        assert_eq!(
            status_text(&tonic::Status::unauthenticated("unauthenticatedly")),
            "unauthenticated: unauthenticatedly"
        );
    }

    #[test]
    fn every_error_has_the_kind_a_caller_catches() {
        let server = |code| ClientError::server("u", tonic::Status::new(code, "m"));
        for (code, kind) in [
            (tonic::Code::InvalidArgument, ErrorKind::InvalidArgument),
            (tonic::Code::NotFound, ErrorKind::NotFound),
            (tonic::Code::Unavailable, ErrorKind::Unavailable),
            (tonic::Code::DeadlineExceeded, ErrorKind::TimedOut),
            (tonic::Code::Unauthenticated, ErrorKind::Unauthenticated),
            (tonic::Code::PermissionDenied, ErrorKind::PermissionDenied),
            (tonic::Code::DataLoss, ErrorKind::DataLoss),
            (tonic::Code::ResourceExhausted, ErrorKind::ResourceExhausted),
            (tonic::Code::Internal, ErrorKind::Internal),
        ] {
            assert_eq!(server(code).kind(), kind, "{code:?}");
        }
        assert_eq!(ClientError::Changed("c".into()).kind(), ErrorKind::Changed);
        assert_eq!(
            ClientError::Invalid("i".into()).kind(),
            ErrorKind::InvalidArgument
        );
        let timeout = ClientError::Timeout {
            what: "plan".into(),
            after: std::time::Duration::from_secs(1),
        };
        assert_eq!(timeout.kind(), ErrorKind::TimedOut);
        assert_eq!(
            ClientError::NoAnswer("none".into()).kind(),
            ErrorKind::Unavailable
        );
    }
}
