//! The trainer-side client: pulls reduced streams from pushdown servers and applies the
//! steps that must run near the accelerator.
//!
//! ```text
//!  PushdownClient ──GetFlightInfo──▶ endpoints (one per shard)
//!     │  fan out: ≤ k DoGet streams at once, each into a bounded channel (back-pressure)
//!     │  shards in order (the loader) or round-robin over the k in flight; a failed stream
//!     │  is retried from its last delivered row (ticket skip_rows): no row lost, none
//!     │  duplicated
//!     ▼
//!  Prepared (loader.rs): shards permuted per epoch, windows permuted, batches, client ops
//!     ├─ Loader: tensors for a trainer, by rank, resumable
//!     └─ run: record batches for `pushdown run` (the same sequence)
//! ```
//!
//! The interleave order depends only on each shard's batches, never on network timing, so
//! with a seed the delivered sequence is reproducible.

mod loader;
mod plan;
pub mod run;
mod steps;
mod stream;

use std::time::Duration;

use arrow::datatypes::SchemaRef;
use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::{Action, Criteria, FlightDescriptor, FlightInfo};
use futures::TryStreamExt;
use pushdown_ops::Tokenizers;
use pushdown_protocol::{ActionKind, CountReply, PlanEstimate, ScanRequest};
use tonic::transport::{Channel, Endpoint};

pub use loader::{
    Column, EpochBatches, Loader, LoaderOptions, LoaderSource, LoaderState, LoaderStats, Prepared, Push,
    TensorBatch,
};
pub use plan::{Link, costed_plan};
pub use steps::RowSteps;
pub use stream::{Order, Segment, ShardStream, StreamOptions, StreamTotals};

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("connecting to {url}: {source}")]
    Connect {
        url: String,
        #[source]
        source: tonic::transport::Error,
    },
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
    #[error("shard {endpoint} failed after {attempts} attempts: {status}")]
    Stream {
        endpoint: usize,
        attempts: usize,
        #[source]
        status: Box<tonic::Status>,
    },
    #[error(transparent)]
    Arrow(#[from] arrow::error::ArrowError),
    #[error(transparent)]
    Plan(#[from] pushdown_planner::PlanError),
    #[error(transparent)]
    Op(#[from] pushdown_ops::OpError),
    #[error("{0}")]
    Invalid(String),
}

impl ClientError {
    fn server(url: &str, status: tonic::Status) -> Self {
        ClientError::Server {
            url: url.to_owned(),
            status: Box::new(status),
        }
    }
}

pub type Result<T, E = ClientError> = std::result::Result<T, E>;

/// Message size accepted from servers (a server's default Flight message is ~2 MiB).
pub const MAX_MESSAGE_BYTES: usize = 64 << 20;

/// Connections to one or more pushdown servers serving the same catalog.
#[derive(Debug, Clone)]
pub struct PushdownClient {
    servers: Vec<(String, FlightServiceClient<Channel>)>,
}

impl PushdownClient {
    /// Connects to every URL (`http://host:port` or `grpc://host:port`).
    pub async fn connect<S: AsRef<str>>(urls: &[S]) -> Result<Self> {
        if urls.is_empty() {
            return Err(ClientError::Invalid("at least one server URL is needed".into()));
        }
        let mut servers = Vec::with_capacity(urls.len());
        for url in urls {
            let url = url.as_ref();
            servers.push((url.to_owned(), connect_one(url).await?));
        }
        Ok(Self { servers })
    }

    pub fn urls(&self) -> impl Iterator<Item = &str> {
        self.servers.iter().map(|(u, _)| u.as_str())
    }

    pub(crate) fn server(&self, i: usize) -> &(String, FlightServiceClient<Channel>) {
        &self.servers[i % self.servers.len()]
    }

    /// Plans a request: the FlightInfo with one endpoint per shard.
    pub async fn plan(&self, request: &ScanRequest) -> Result<FlightInfo> {
        let (url, client) = self.server(0);
        let descriptor = FlightDescriptor::new_cmd(request.encode());
        client
            .clone()
            .get_flight_info(descriptor)
            .await
            .map(tonic::Response::into_inner)
            .map_err(|s| ClientError::server(url, s))
    }

    /// The schema of a dataset of the catalog.
    pub async fn dataset_schema(&self, dataset: &str) -> Result<SchemaRef> {
        let (url, client) = self.server(0);
        let descriptor = FlightDescriptor::new_path(vec![dataset.to_owned()]);
        let result = client
            .clone()
            .get_schema(descriptor)
            .await
            .map_err(|s| ClientError::server(url, s))?
            .into_inner();
        let schema = arrow::datatypes::Schema::try_from(&result)?;
        Ok(std::sync::Arc::new(schema))
    }

    /// The catalog: (dataset, rows, bytes, schema) per dataset.
    pub async fn list_datasets(&self) -> Result<Vec<(String, i64, i64, SchemaRef)>> {
        let (url, client) = self.server(0);
        let infos: Vec<FlightInfo> = client
            .clone()
            .list_flights(Criteria::default())
            .await
            .map_err(|s| ClientError::server(url, s))?
            .into_inner()
            .try_collect()
            .await
            .map_err(|s| ClientError::server(url, s))?;
        infos
            .into_iter()
            .map(|info| {
                let name = info
                    .flight_descriptor
                    .as_ref()
                    .and_then(|d| d.path.first().cloned())
                    .unwrap_or_default();
                let (rows, bytes) = (info.total_records, info.total_bytes);
                let schema = info.try_decode_schema()?;
                Ok((name, rows, bytes, std::sync::Arc::new(schema)))
            })
            .collect()
    }

    /// Runs a server action, returning the bodies of its results.
    pub async fn action(&self, kind: ActionKind, body: bytes::Bytes) -> Result<Vec<bytes::Bytes>> {
        let (url, client) = self.server(0);
        let results: Vec<arrow_flight::Result> = client
            .clone()
            .do_action(Action::new(kind.name(), body))
            .await
            .map_err(|s| ClientError::server(url, s))?
            .into_inner()
            .try_collect()
            .await
            .map_err(|s| ClientError::server(url, s))?;
        Ok(results.into_iter().map(|r| r.body).collect())
    }

    /// Runs the server's `profile` action on the fragment of `request`.
    pub async fn profile(&self, request: &ScanRequest) -> Result<pushdown_protocol::Profile> {
        let bodies = self.action(ActionKind::Profile, request.encode()).await?;
        let body = bodies
            .first()
            .ok_or_else(|| ClientError::Invalid("the profile action returned nothing".into()))?;
        pushdown_protocol::Profile::decode(body).map_err(|e| ClientError::Invalid(e.to_string()))
    }

    /// The rows the DoGet of `ticket` would stream, counted by the server (the `count`
    /// action: only the filter's columns are read).
    pub async fn count(&self, ticket: bytes::Bytes) -> Result<u64> {
        let bodies = self.action(ActionKind::Count, ticket).await?;
        let body = bodies
            .first()
            .ok_or_else(|| ClientError::Invalid("the count action returned nothing".into()))?;
        Ok(CountReply::decode(body)
            .map_err(|e| ClientError::Invalid(e.to_string()))?
            .rows)
    }

    /// The tokenizer shipped with `dataset` (its `tokenizer.json`), from the server.
    pub async fn tokenizer(&self, dataset: &str) -> Result<std::sync::Arc<pushdown_ops::TokenizerModel>> {
        let bodies = self
            .action(ActionKind::Tokenizer, bytes::Bytes::from(dataset.to_owned()))
            .await?;
        let body = bodies
            .first()
            .ok_or_else(|| ClientError::Invalid("the tokenizer action returned nothing".into()))?;
        pushdown_ops::load_tokenizer(body)
            .map(std::sync::Arc::new)
            .map_err(ClientError::Invalid)
    }

    /// The resources the client-side `steps` of a pipeline over `dataset` need, as their ops
    /// declare them ([`pushdown_ops::Op::needs`]): the tokenizers their calls name, or
    /// `dataset`'s for calls that name none.
    pub async fn resources_for(&self, steps: &[pushdown_planner::Step], dataset: &str) -> Result<Tokenizers> {
        let mut tokenizers = Tokenizers::new(Some(dataset.to_owned()));
        for step in steps {
            let pushdown_planner::Step::Map(m) = step else {
                continue;
            };
            for need in m.call().needs()? {
                match need {
                    pushdown_ops::Need::Tokenizer(name) => {
                        let name = name.unwrap_or_else(|| dataset.to_owned());
                        if !tokenizers.contains(&name) {
                            let tokenizer = self.tokenizer(&name).await?;
                            tokenizers.insert(name, tokenizer);
                        }
                    }
                }
            }
        }
        Ok(tokenizers)
    }

    /// Streams every endpoint of `info`.
    pub fn stream(&self, info: &FlightInfo, options: StreamOptions) -> Result<ShardStream> {
        ShardStream::start(self.clone(), info, options)
    }
}

/// The server's cost estimate carried in a FlightInfo, when present.
pub fn plan_estimate(info: &FlightInfo) -> Option<PlanEstimate> {
    PlanEstimate::decode(&info.app_metadata).ok()
}

async fn connect_one(url: &str) -> Result<FlightServiceClient<Channel>> {
    let http = match url.split_once("://") {
        Some(("grpc" | "grpc+tcp", rest)) => format!("http://{rest}"),
        Some(("http" | "https", _)) => url.to_owned(),
        _ => {
            return Err(ClientError::BadUrl {
                url: url.to_owned(),
                reason: "expected http://host:port or grpc://host:port".into(),
            });
        }
    };
    let endpoint = Endpoint::from_shared(http).map_err(|e| ClientError::BadUrl {
        url: url.to_owned(),
        reason: e.to_string(),
    })?;
    let channel = endpoint
        .connect_timeout(Duration::from_secs(10))
        .tcp_nodelay(true)
        .initial_stream_window_size(Some(8 << 20))
        .initial_connection_window_size(Some(32 << 20))
        .connect()
        .await
        .map_err(|source| ClientError::Connect {
            url: url.to_owned(),
            source,
        })?;
    Ok(FlightServiceClient::new(channel)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES))
}
