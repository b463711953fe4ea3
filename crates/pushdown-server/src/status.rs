//! The exhaustive mapping of [`ServerError`] to gRPC statuses.
//!
//! User errors (bad SQL, unknown datasets, garbage tickets) become `InvalidArgument` /
//! `NotFound` with a message that helps the caller and are logged at `debug`; internal
//! failures are logged once at `error` with context, and the caller gets a safe message.
//! The mapping is a `match` with no catch-all arm: a new variant does not compile until
//! someone decides its status code and log level.

use pushdown_engine::{ServerError, redact_paths};
use tonic::{Code, Status};

/// The status a failed request answers with.
pub(crate) fn status(e: ServerError) -> Status {
    // Both the code and whether the server logs it as its own failure.
    let (code, internal) = match &e {
        ServerError::UnknownDataset { .. } => (Code::NotFound, false),
        ServerError::UnknownShard { .. } => (Code::NotFound, false),
        ServerError::FileChanged { .. } => (Code::FailedPrecondition, false),
        ServerError::BadValue { .. } => (Code::InvalidArgument, false),
        ServerError::NoResource(_) => (Code::NotFound, false),
        ServerError::Misconfigured(_) => (Code::FailedPrecondition, false),
        ServerError::BadTicket(_) => (Code::InvalidArgument, false),
        ServerError::BadCommand(_) => (Code::InvalidArgument, false),
        ServerError::BadMessage { .. } => (Code::InvalidArgument, false),
        ServerError::BadRequest(_) => (Code::InvalidArgument, false),
        ServerError::BadQuery(_) => (Code::InvalidArgument, false),
        ServerError::BadPart { .. } => (Code::InvalidArgument, false),
        ServerError::NotReadOnly(_) => (Code::InvalidArgument, false),
        ServerError::Unsupported(_) => (Code::Unimplemented, false),
        ServerError::Overloaded(_) => (Code::ResourceExhausted, false),
        ServerError::Deadline(_) => (Code::DeadlineExceeded, false),
        ServerError::ShuttingDown => (Code::Unavailable, false),
        ServerError::CorruptFile { .. } => (Code::DataLoss, true),
        ServerError::CorruptData(_) => (Code::DataLoss, true),
        ServerError::Query(_) => (Code::Internal, true),
        ServerError::Storage(_) => (Code::Unavailable, true),
        ServerError::StorageDenied(_) => (Code::FailedPrecondition, true),
        ServerError::Internal(_) => (Code::Internal, true),
        ServerError::Failed { .. } => (Code::Internal, true),
        ServerError::Encode { .. } => (Code::Internal, true),
        ServerError::Task { .. } => (Code::Internal, true),
        ServerError::Unauthenticated(_) => (Code::Unauthenticated, false),
        ServerError::PermissionDenied(_) => (Code::PermissionDenied, false),
    };
    if internal {
        tracing::error!(error = %e, "request failed");
    } else {
        tracing::debug!(error = %e, "request rejected");
    }
    let message = match &e {
        // Internal details stay in the server log; the caller gets what it can act on.
        ServerError::Internal(_)
        | ServerError::Failed { .. }
        | ServerError::Encode { .. }
        | ServerError::Task { .. } => "internal error (see server log)".to_string(),
        // The store's own words may carry its layout or credentials' ids: the operator
        // reads them in the log, the caller gets what to do.
        ServerError::StorageDenied(_) => {
            "the server cannot read its storage (its credentials were refused; the operator \
                 sees why in the server log)"
                .to_string()
        }
        _ => redact_paths(&e.to_string()),
    };
    Status::new(code, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_messages_never_carry_absolute_paths() {
        let e = ServerError::storage(object_store::Error::NotFound {
            path: "/srv/pushdown/data/images/part-00001.parquet".into(),
            source: "No such file or directory".into(),
        });
        let answer = status(e);
        assert!(!answer.message().contains("/srv"), "{}", answer.message());
        assert!(
            answer.message().contains("images/part-00001.parquet"),
            "{}",
            answer.message()
        );
        assert_eq!(
            redact_paths("reading `/a/b/c/d.parquet` (at /x/y/z): 1/2 of a/b/c failed"),
            "reading `…/c/d.parquet` (at …/y/z): 1/2 of a/b/c failed"
        );
        let denied = status(ServerError::StorageDenied(
            "the object store refused … AWSAccessKeyId AKIAEXAMPLE".into(),
        ));
        assert!(!denied.message().contains("AKIA"), "{}", denied.message());
        assert_eq!(denied.code(), Code::FailedPrecondition);
    }
}
