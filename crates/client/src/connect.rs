//! How a client reaches its servers (credentials, TLS, message sizes) and what their
//! FlightInfo carries beyond Flight's own fields.

use std::sync::Arc;
use std::time::Duration;

use arrow_flight::FlightInfo;
use pushdown_protocol::PlanEstimate;

use crate::error::{ClientError, Result};

/// The default [`ConnectOptions::call_timeout`]: the stream's default stall timeout, so a
/// server silent that long is passed over whether it is planning or streaming.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// How a client reaches its servers: the token it presents, the TLS it trusts, and how long
/// it waits for an answer. Its `Debug` never shows the token or a key.
#[derive(Clone)]
pub struct ConnectOptions {
    /// Sent as `authorization: Bearer <token>` with every request.
    pub token: Option<String>,
    /// CA certificates (PEM) that `https://` servers' certificates must chain to; none: the
    /// system's roots.
    pub tls_ca: Option<Vec<u8>>,
    /// This client's certificate chain and key (PEM), for servers that require mutual TLS.
    pub tls_identity: Option<(Vec<u8>, Vec<u8>)>,
    /// The deadline of every call made before streaming: planning (each server's answer,
    /// its retries included), schemas, counts, profiles, tokenizers and every other action,
    /// connecting included. A server that gives no answer in time is passed over like one
    /// that failed (it rests, and a plan goes on without it where the others hold its
    /// files). Streams have their own deadline, [`crate::StreamOptions::stall_timeout`].
    pub call_timeout: Duration,
    /// A `tokenizer.json` the trainer gives: given to each server that does not keep it
    /// when a request is planned, and the tokenizer of every call that names none (on the
    /// servers and here alike). None: a call's tokenizer is the dataset's.
    pub tokenizer: Option<Arc<Vec<u8>>>,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        Self {
            token: None,
            tls_ca: None,
            tls_identity: None,
            call_timeout: DEFAULT_CALL_TIMEOUT,
            tokenizer: None,
        }
    }
}

impl std::fmt::Debug for ConnectOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectOptions")
            .field("token", &self.token.as_ref().map(|_| "…"))
            .field("tls_ca", &self.tls_ca.is_some())
            .field("tls_identity", &self.tls_identity.is_some())
            .field("call_timeout", &self.call_timeout)
            .field("tokenizer", &self.tokenizer.as_ref().map(|t| t.len()))
            .finish()
    }
}

impl ConnectOptions {
    /// From the environment, as the CLI and the Python package read it: `PUSHDOWN_TOKEN`,
    /// `PUSHDOWN_TLS_CA` (a PEM file), `PUSHDOWN_TLS_CLIENT_CERT` + `PUSHDOWN_TLS_CLIENT_KEY`
    /// (PEM files).
    pub fn from_env() -> Result<Self> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        Self::from_parts(
            var("PUSHDOWN_TOKEN"),
            var("PUSHDOWN_TLS_CA").as_deref(),
            var("PUSHDOWN_TLS_CLIENT_CERT").as_deref(),
            var("PUSHDOWN_TLS_CLIENT_KEY").as_deref(),
        )
    }

    /// A token, and the paths of PEM files: CA, client certificate, client key.
    pub fn from_parts(
        token: Option<String>,
        ca: Option<&str>,
        cert: Option<&str>,
        key: Option<&str>,
    ) -> Result<Self> {
        let read =
            |path: &str| std::fs::read(path).map_err(|e| ClientError::io(format!("reading {path}"), e));
        let tls_identity = match (cert, key) {
            (Some(c), Some(k)) => Some((read(c)?, read(k)?)),
            (None, None) => None,
            _ => {
                return Err(ClientError::Invalid(
                    "a client certificate needs its key, and a key its certificate".into(),
                ));
            }
        };
        Ok(Self {
            token,
            tls_ca: ca.map(read).transpose()?,
            tls_identity,
            call_timeout: DEFAULT_CALL_TIMEOUT,
            tokenizer: None,
        })
    }
}

/// Message size accepted from servers (a server's default Flight message is ~2 MiB).
pub const MAX_MESSAGE_BYTES: usize = 64 << 20;

/// The server's cost estimate carried in a FlightInfo, when present.
pub fn plan_estimate(info: &FlightInfo) -> Option<PlanEstimate> {
    PlanEstimate::decode(&info.app_metadata).ok()
}
