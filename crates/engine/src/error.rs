//! The server's one error type. Its exhaustive mapping to gRPC statuses is the front end's
//! (`pushdown-server`'s `status` module).
//!
//! The project's error rule, for every error type it defines: an error states its cause in
//! its `Display` and keeps it as a field (`cause`), never also as its `source()`. A message
//! sent to a client is then whole in one line, and a report walking the chain (`pushdown`'s
//! `error_report`, anyhow's) says each thing once, with nothing to deduplicate.

use datafusion::error::DataFusionError;
use pushdown_protocol::ProtocolError;

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("unknown dataset `{name}`; known datasets: [{}]", known.join(", "))]
    UnknownDataset { name: String, known: Vec<String> },

    #[error("{0}")]
    NoResource(String),

    /// What the query needs is missing from the server's data or configuration (a
    /// dataset without the `tokenizer.json` a call uses): the same on every retry here.
    #[error("{0}")]
    Misconfigured(String),

    #[error("malformed ticket: {0}")]
    BadTicket(ProtocolError),

    #[error("malformed command: {0}")]
    BadCommand(ProtocolError),

    #[error("{0}")]
    BadRequest(String),

    #[error("invalid query: {0}")]
    BadQuery(String),

    /// A part of the caller's query (a predicate, a parameter's value, a view's statement)
    /// that does not parse or plan; `reason` is the cause's own words.
    #[error("invalid query: {what}: {reason}")]
    BadPart {
        what: String,
        reason: String,
        cause: Box<dyn std::error::Error + Send + Sync>,
    },

    #[error("only read-only SELECT queries over the catalog are accepted: {0}")]
    NotReadOnly(String),

    #[error("dataset `{dataset}` has no file `{file}` (the catalog changed since the ticket was issued?)")]
    UnknownShard { dataset: String, file: String },

    #[error(
        "dataset `{dataset}`: file `{file}` changed since the ticket was issued (planned on \
         {planned}, now {now}); plan the query again"
    )]
    FileChanged {
        dataset: String,
        file: String,
        planned: pushdown_protocol::FileVersion,
        now: pushdown_protocol::FileVersion,
    },

    #[error("{op} failed on row {row} of {shard}: {reason}")]
    BadValue {
        op: &'static str,
        /// The row's position in the stream's output (counting rows skipped on resume).
        row: u64,
        shard: String,
        reason: String,
    },

    #[error("dataset `{dataset}`: file `{file}` is unreadable: {reason}")]
    CorruptFile {
        dataset: String,
        file: String,
        reason: String,
    },

    #[error("stored data is unreadable: {0}")]
    CorruptData(String),

    #[error("server busy: {0}")]
    Overloaded(String),

    #[error("request exceeded its deadline of {0:?}")]
    Deadline(std::time::Duration),

    /// The server was asked to stop and its drain deadline passed with this stream open.
    #[error(
        "the server is shutting down and ended this stream (its drain deadline passed); read it from another server or again once this one is back"
    )]
    ShuttingDown,

    #[error("{0} is not supported by pushdown servers")]
    Unsupported(std::borrow::Cow<'static, str>),

    /// A protocol message from the caller that does not decode (a Flight SQL command, an
    /// action's body).
    #[error("malformed {what}: {cause}")]
    BadMessage {
        what: &'static str,
        cause: Box<dyn std::error::Error + Send + Sync>,
    },

    #[error("query failed: {0}")]
    Query(DataFusionError),

    /// The store failed; may succeed on retry. (Its message already holds its causes.)
    #[error("storage error: {0}")]
    Storage(object_store::Error),

    /// The store refused the server's credentials: an operator's error, the same on retry
    /// (another server's credentials may work).
    #[error("{0}")]
    StorageDenied(String),

    #[error("internal error: {0}")]
    Internal(String),

    /// The server's own step `what` failed with `source` (a UDF missing from its session, a
    /// tokenizer that does not serialize).
    #[error("internal error: {what}: {cause}")]
    Failed {
        what: String,
        cause: Box<dyn std::error::Error + Send + Sync>,
    },

    /// Arrow refused to encode what the server built (a schema, a batch, IPC options).
    #[error("internal error: {what}: {cause}")]
    Encode {
        what: &'static str,
        cause: arrow::error::ArrowError,
    },

    /// Work run on the CPU runtime panicked or was cancelled.
    #[error("internal error: the {what} task: {cause}")]
    Task {
        what: String,
        cause: tokio::task::JoinError,
    },

    /// No credentials, or credentials this server does not accept.
    #[error("unauthenticated: {0}")]
    Unauthenticated(String),

    /// A valid caller asking for something outside its grant.
    #[error("permission denied: {0}")]
    PermissionDenied(String),
}

impl ServerError {
    /// Arrow failed `what`: the server's own failure.
    pub fn encode(what: &'static str) -> impl FnOnce(arrow::error::ArrowError) -> Self {
        move |cause| ServerError::Encode { what, cause }
    }

    /// DataFusion refused `what`, a part of the caller's query: named by its root cause.
    pub fn bad_part(what: impl Into<String>, cause: DataFusionError) -> Self {
        ServerError::BadPart {
            what: what.into(),
            reason: query_message(cause.find_root()),
            cause: Box::new(cause),
        }
    }

    /// `what`, the caller's text, does not parse.
    pub fn bad_syntax(
        what: impl Into<String>,
        cause: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        ServerError::BadPart {
            what: what.into(),
            reason: cause.to_string(),
            cause: Box::new(cause),
        }
    }

    /// The server's own step `what` failed.
    pub fn failed(
        what: impl Into<String>,
        cause: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        ServerError::Failed {
            what: what.into(),
            cause: cause.into(),
        }
    }
}

pub type Result<T, E = ServerError> = std::result::Result<T, E>;

impl From<DataFusionError> for ServerError {
    /// Sorts DataFusion's errors into the caller's mistakes and the server's failures.
    fn from(e: DataFusionError) -> Self {
        if let Some(missing @ pushdown_ops::OpError::MissingResource { .. }) = op_failure(&e) {
            return ServerError::Misconfigured(missing.to_string());
        }
        let root = e.find_root();
        match root {
            DataFusionError::SQL(..) | DataFusionError::Plan(_) | DataFusionError::SchemaError(..) => {
                ServerError::BadQuery(query_message(root))
            }
            DataFusionError::ArrowError(err, _) => match err.as_ref() {
                arrow::error::ArrowError::CastError(_)
                | arrow::error::ArrowError::ComputeError(_)
                | arrow::error::ArrowError::DivideByZero
                | arrow::error::ArrowError::ArithmeticOverflow(_)
                | arrow::error::ArrowError::InvalidArgumentError(_)
                | arrow::error::ArrowError::ParseError(_) => ServerError::BadQuery(err.to_string()),
                _ => ServerError::Query(e),
            },
            DataFusionError::ResourcesExhausted(msg) => ServerError::Overloaded(msg.clone()),
            DataFusionError::ObjectStore(store) => match denied(store) {
                Some(reason) => ServerError::StorageDenied(reason),
                None => ServerError::Query(e),
            },
            DataFusionError::NotImplemented(msg) => ServerError::BadQuery(format!("not supported: {msg}")),
            _ => ServerError::Query(e),
        }
    }
}

/// What a DataFusion error says of a query, as its caller reads it: a parser's error is its
/// message (`Expected: an SQL statement, found: SELEC at Line: 1, Column: 1`), not the
/// `ParserError("…")` DataFusion's own message quotes.
pub(crate) fn query_message(e: &DataFusionError) -> String {
    use datafusion::sql::sqlparser::parser::ParserError;
    match e {
        DataFusionError::SQL(parser, _) => match parser.as_ref() {
            ParserError::ParserError(m) | ParserError::TokenizerError(m) => m.clone(),
            ParserError::RecursionLimitExceeded => "the query nests too deeply to parse".into(),
        },
        other => other.message().into_owned(),
    }
}

impl ServerError {
    /// A failure of the store: credentials it refuses are named as such (retrying will not
    /// help), anything else may be transient.
    pub fn storage(e: object_store::Error) -> Self {
        match denied(&e) {
            Some(reason) => ServerError::StorageDenied(reason),
            None => ServerError::Storage(e),
        }
    }
}

/// Whether `e` is the store refusing the server's credentials, and then what to tell the
/// operator. S3 stores report a refused signature or key as a generic error carrying the
/// HTTP status and the S3 error code.
fn denied(e: &object_store::Error) -> Option<String> {
    const CODES: [&str; 6] = [
        "SignatureDoesNotMatch",
        "InvalidAccessKeyId",
        "AccessDenied",
        "ExpiredToken",
        "InvalidToken",
        "TokenRefreshRequired",
    ];
    let text = e.to_string();
    let code = CODES.iter().find(|c| text.contains(*c)).copied();
    let by_kind = matches!(
        e,
        object_store::Error::PermissionDenied { .. } | object_store::Error::Unauthenticated { .. }
    );
    let by_status = text.contains("403 Forbidden") || text.contains("401 Unauthorized");
    if code.is_none() && !by_kind && !by_status {
        return None;
    }
    Some(format!(
        "the object store refused this server's credentials ({}): check AWS_ACCESS_KEY_ID and \
         AWS_SECRET_ACCESS_KEY (or the role the server runs as); the store said: {text}",
        code.unwrap_or("access denied")
    ))
}

impl ServerError {
    /// An error of a running scan. A failure to decode stored data (a corrupt page, a bad
    /// encoding) is deterministic: the same bytes fail again on any retry, so it is the file's
    /// `DataLoss`, naming the file when the scan is one shard's, never a transient `Internal`.
    pub fn from_scan(e: DataFusionError, shard: Option<&pushdown_protocol::Shard>) -> Self {
        if let Some(pushdown_ops::OpError::BadValue { op, row, reason }) = op_failure(&e) {
            return ServerError::BadValue {
                op,
                row: *row as u64,
                shard: shard.map_or_else(|| "the query".to_owned(), pushdown_protocol::Shard::label),
                reason: reason.clone(),
            };
        }
        match (decoding_failure(&e), shard) {
            (Some(reason), Some(shard)) => ServerError::CorruptFile {
                dataset: shard.dataset.clone(),
                file: shard.file.clone(),
                reason,
            },
            (Some(reason), None) => ServerError::CorruptData(reason),
            (None, _) => ServerError::from(e),
        }
    }
}

impl ServerError {
    /// Places a [`ServerError::BadValue`]'s batch-relative row in the stream: `offset` output
    /// rows came before the failing batch.
    pub fn after_rows(self, offset: u64) -> Self {
        match self {
            ServerError::BadValue {
                op,
                row,
                shard,
                reason,
            } => ServerError::BadValue {
                op,
                row: row + offset,
                shard,
                reason,
            },
            other => other,
        }
    }
}

/// An op's error on one value inside `e`: deterministic, the caller's data.
fn op_failure(e: &DataFusionError) -> Option<&pushdown_ops::OpError> {
    match e.find_root() {
        DataFusionError::External(inner) => inner.downcast_ref::<pushdown_ops::OpError>(),
        _ => None,
    }
}

/// The Parquet decoder's error inside `e`, if that is what failed.
fn decoding_failure(e: &DataFusionError) -> Option<String> {
    fn in_arrow(e: &arrow::error::ArrowError) -> Option<String> {
        match e {
            arrow::error::ArrowError::ParquetError(msg) => Some(msg.clone()),
            arrow::error::ArrowError::ExternalError(inner) => inner
                .downcast_ref::<parquet::errors::ParquetError>()
                .map(|p| p.to_string()),
            _ => None,
        }
    }
    match e.find_root() {
        DataFusionError::ParquetError(p) => Some(p.to_string()),
        DataFusionError::ArrowError(a, _) => in_arrow(a),
        DataFusionError::External(inner) => inner
            .downcast_ref::<parquet::errors::ParquetError>()
            .map(|p| p.to_string())
            .or_else(|| {
                inner
                    .downcast_ref::<arrow::error::ArrowError>()
                    .and_then(in_arrow)
            }),
        _ => None,
    }
}

/// `message` with every absolute filesystem path cut to its last two components (the
/// dataset folder and the file, which the caller knows): where the server keeps its data is
/// not the caller's business. Paths the stores report (`Object at location /srv/data/…`) and
/// I/O errors' are the ones this catches.
pub fn redact_paths(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(i) = rest.find('/') {
        let (before, from) = rest.split_at(i);
        out.push_str(before);
        // A path starts at a '/' that begins a word ("at /srv/…", "`/srv/…`", "(/srv/…").
        let starts_word = before
            .chars()
            .next_back()
            .is_none_or(|c| c.is_whitespace() || matches!(c, '`' | '\'' | '"' | '(' | '[' | '=' | ':'));
        let end = from
            .find(|c: char| c.is_whitespace() || matches!(c, '`' | '\'' | '"' | ')' | ']' | ',' | ';'))
            .unwrap_or(from.len());
        let (word, tail) = from.split_at(end);
        let parts: Vec<&str> = word.split('/').filter(|p| !p.is_empty()).collect();
        if starts_word && parts.len() > 2 {
            out.push_str("…/");
            out.push_str(&parts[parts.len() - 2..].join("/"));
        } else {
            out.push_str(word);
        }
        rest = tail;
    }
    out.push_str(rest);
    out
}

impl ServerError {
    /// This failure's label in the requests-by-outcome metric.
    pub fn outcome(&self) -> &'static str {
        match self {
            ServerError::UnknownDataset { .. }
            | ServerError::UnknownShard { .. }
            | ServerError::NoResource(_) => "not_found",
            ServerError::BadTicket(_)
            | ServerError::BadCommand(_)
            | ServerError::BadMessage { .. }
            | ServerError::BadRequest(_)
            | ServerError::BadQuery(_)
            | ServerError::BadPart { .. }
            | ServerError::NotReadOnly(_)
            | ServerError::BadValue { .. }
            | ServerError::Unsupported(_) => "invalid",
            ServerError::FileChanged { .. } => "changed",
            ServerError::Misconfigured(_) => "misconfigured",
            ServerError::Unauthenticated(_) => "unauthenticated",
            ServerError::PermissionDenied(_) => "denied",
            ServerError::Overloaded(_) => "overloaded",
            ServerError::Deadline(_) => "deadline",
            ServerError::ShuttingDown => "shutting_down",
            ServerError::CorruptFile { .. }
            | ServerError::CorruptData(_)
            | ServerError::Query(_)
            | ServerError::Storage(_)
            | ServerError::StorageDenied(_)
            | ServerError::Internal(_)
            | ServerError::Failed { .. }
            | ServerError::Encode { .. }
            | ServerError::Task { .. } => "error",
        }
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error;

    use super::*;

    /// A refused part of a query names the part and DataFusion's root cause, keeps the whole
    /// error as its cause (not its source: the rule), and is the caller's error; a failed
    /// step of the server's own is the server's.
    #[test]
    fn refused_parts_keep_their_cause() {
        let root = DataFusionError::Plan("no field named `nope`".into());
        let e = ServerError::bad_part(
            "predicate `nope > 1`",
            DataFusionError::Context("parsing".into(), Box::new(root)),
        );
        assert_eq!(
            e.to_string(),
            "invalid query: predicate `nope > 1`: no field named `nope`"
        );
        // The whole cause is kept, said once: in the message, not again as the source.
        let ServerError::BadPart { cause, .. } = &e else {
            panic!("{e:?}")
        };
        assert!(cause.to_string().contains("parsing"), "{cause}");
        assert!(e.source().is_none());
        assert_eq!(e.outcome(), "invalid");

        let failed = ServerError::failed("serializing the tokenizer", std::io::Error::other("full"));
        assert_eq!(
            failed.to_string(),
            "internal error: serializing the tokenizer: full"
        );
        assert!(failed.source().is_none(), "its cause is in its message");
        assert_eq!(failed.outcome(), "error");
    }
}
