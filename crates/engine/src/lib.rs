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
//! | a node: what requests share, one method per request kind; the one ticket → batches path | `node`, `requests`, `ticket` |
//! | read-ahead of opened queries, profiles of a query's ops | `prefetch`, `profile` |
//! | planning and opening queries | `query` |
//! | what a query is made of: views, UDFs, shard tables, conjunctions, prepared statements | `views`, `udf`, `table`, `conjunction`, `prepared` |
//! | the SQL allow-list | `allow` |
//! | limits | `config` |
//! | the fragment cache, clips' durations | `cache`, `durations` |
//! | access, tokenizers, storage | `auth`, `tokenizers`, `store` |
//! | the catalog | `catalog` |
//! | accounting, scheduling, who reduced alone, startup settings, file layout, a footer's schema depth, errors | `metrics`, `scaling`, `runtime`, `pool`, `company`, `startup`, `layout`, `footer_schema`, `error` |
//!
//! The crate depends on neither `tonic` nor `arrow-flight` (`scripts/test.sh` checks it):
//! the Flight front end (`pushdown-server`) turns requests into calls on a [`Node`] and its
//! batches into Flight data; the baselines and the fuzz targets run the same node in-process.

mod allow;
mod auth;
mod cache;
mod catalog;
mod company;
mod config;
mod conjunction;
mod durations;
mod error;
mod footer_schema;
mod layout;
mod metrics;
mod node;
mod pool;
mod prefetch;
mod prepared;
mod profile;
mod query;
mod requests;
mod runtime;
mod scaling;
mod startup;
mod store;
mod table;
mod ticket;
mod tokenizers;
mod udf;
mod views;

pub use allow::{CATALOG, MAX_EXPR_DEPTH, SCHEMA};
pub use auth::{Caller, Grant, MIN_TOKEN_LEN, Tokens, TokensError};
pub use cache::{CacheConfig, CacheMode};
pub use catalog::{Catalog, DataFile, Dataset};
pub use company::ClientId;
pub use config::ServerConfig;
pub use error::{Result, ServerError, redact_paths};
pub use metrics::Metrics;
pub use node::{Node, NodeBuilder};
pub use prepared::PreparedStatement;
/// Stream codecs, as `ServerConfig::plain_client_codec` takes them.
pub use pushdown_protocol::Compression;
pub use query::{Planned, Shape, checked_dataframe, dataframe};
pub use requests::{Listed, ListedKind, Prepared, Slot};
pub use scaling::to_json as scaling_json;
pub use startup::StartupError;
pub use store::{InstrumentedStore, ReadRequest, open_store, reads_in_flight_for};
pub use ticket::{CacheUse, OpenedStream, TicketStream};
pub use udf::{DatasetResources, OpLimits, udfs};
pub use views::{View, ViewDecl, Views};
