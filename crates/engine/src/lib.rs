//! The pushdown engine: everything a server does below the wire, with no gRPC in it.
//!
//! ```text
//!  --data DIR | s3://…        ┌──────────────────────── Node ─────────────────────────┐
//!  ┌──────────────┐  list,   │ Catalog: dataset → files → row groups (footers cached) │
//!  │ images/*.pq  │◀─footers─┤ Engine:  DataFusion; ShardTable per ticket             │
//!  │ clicks/*.pq  │◀─ranges──┤   (projection, statistics/page/bloom pruning, filters) │
//!  └──────────────┘          │ FragmentCache: reduced shards kept for the next epoch  │
//!   InstrumentedStore        │ CpuRuntime: decode + ops off the async threads         │
//!   (bytes, requests)        │ Metrics: counters a front end exposes                  │
//!                            └────────────────────────────────────────────────────────┘
//! ```
//!
//! The layers, the top first; a module imports only its own layer and those below it
//! (`scripts/check-layers.py` reads this table and enforces it):
//!
//! | layer | modules |
//! |---|---|
//! | a node: what requests share; the one ticket → batches path | [`node`], [`ticket`] |
//! | read-ahead of opened queries, profiles of a query's ops | [`prefetch`], [`profile`] |
//! | planning and opening queries | [`query`] |
//! | what a query is made of: views, UDFs, shard tables, conjunctions, prepared statements | [`views`], [`udf`], [`table`], [`conjunction`], [`prepared`] |
//! | the SQL allow-list | [`allow`] |
//! | limits | [`config`] |
//! | the fragment cache | [`cache`] |
//! | access, tokenizers, storage | [`auth`], [`tokenizers`], [`store`] |
//! | the catalog | [`catalog`] |
//! | accounting, scheduling, startup settings, file layout, errors | [`metrics`], [`scaling`], [`runtime`], [`pool`], [`startup`], [`layout`], [`error`] |
//!
//! The crate depends on neither `tonic` nor `arrow-flight` (`scripts/test.sh` checks it):
//! the Flight front end (`pushdown-server`) turns requests into calls on a [`Node`] and its
//! batches into Flight data; the baselines and the fuzz targets run the same node in-process.

pub mod allow;
pub mod auth;
pub mod cache;
pub mod catalog;
pub mod config;
pub mod conjunction;
pub mod error;
pub mod layout;
pub mod metrics;
pub mod node;
pub mod pool;
pub mod prefetch;
pub mod prepared;
pub mod profile;
pub mod query;
pub mod runtime;
pub mod scaling;
pub mod startup;
pub mod store;
pub mod table;
pub mod ticket;
pub mod tokenizers;
pub mod udf;
pub mod views;

pub use allow::{CheckedQuery, MAX_EXPR_DEPTH};
pub use auth::{Caller, Grant, MIN_TOKEN_LEN, Tokens};
pub use cache::{CacheConfig, CacheMode};
pub use catalog::{Catalog, DataFile, Dataset};
pub use config::ServerConfig;
pub use error::ServerError;
pub use metrics::Metrics;
pub use node::{Node, NodeBuilder};
pub use prepared::PreparedStatement;
/// Stream codecs, as `ServerConfig::plain_client_codec` takes them.
pub use pushdown_protocol::Compression;
pub use query::{Planned, Shape, checked_dataframe, dataframe};
pub use scaling::to_json as scaling_json;
pub use startup::StartupError;
pub use store::{InstrumentedStore, ReadRequest, open_store, reads_in_flight_for};
pub use ticket::{CacheUse, TicketStream};
pub use udf::{DatasetResources, OpLimits, udfs};
pub use views::{View, ViewDecl, Views};
