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
//!
//! The layers, the top first; a module imports only its own layer and those below it
//! (`scripts/check-layers.py` reads this table and enforces it). `order`, `mixture`, `deal`,
//! `pack`, `bucket` and `control` are pure: no I/O, no runtime.
//!
//! | layer | modules |
//! |---|---|
//! | `pushdown run`; plans for readers that stream the shards themselves (Ray Data) | `run`, `readers` |
//! | the trainer's pipeline; client ops and their costed placement | `loader`, `plan`, `steps` |
//! | the client ([`PushdownClient`]) | `client` |
//! | shard streams, holding the fleet | `stream` |
//! | the one retry loop of every call to a holder; the shared completion; the streams-in-flight tuner | `retry`, `completion`, `tune` |
//! | mixtures of datasets | `mixture` |
//! | the sample order; connections and the ranking of holders; the adaptive split's control loop | `order`, `fleet`, `control` |
//! | length buckets; options and message sizes | `bucket`, `connect` |
//! | dealing by weight, packed blocks, confining the loader's threads, errors; the check of a server's IPC message | `deal`, `pack`, `affinity`, `error`, `ipc` |
//!
//! This root only documents and re-exports.

pub mod affinity;
pub mod bucket;
mod client;
mod completion;
mod connect;
mod control;
mod deal;
mod error;
mod fleet;
mod ipc;
mod loader;
pub mod mixture;
mod order;
pub mod pack;
mod plan;
pub mod readers;
mod retry;
pub mod run;
mod steps;
mod stream;
mod tune;

pub use client::{PushdownClient, SCALING_TIMEOUT};
pub use completion::{Completion, CompletionTotals, ShardPlacement};
pub use connect::{ConnectOptions, DEFAULT_CALL_TIMEOUT, MAX_MESSAGE_BYTES, plan_estimate};
pub use error::{ClientError, ErrorKind, Result, status_text};
pub use ipc::{MAX_DECODED_BUFFER_BYTES, check_message as check_ipc_message, next_decoded};
pub use loader::{
    Column, EpochBatches, Loader, LoaderOptions, LoaderSource, LoaderStats, MixtureSource, Prepared, Push,
    TensorBatch,
};
pub use order::{Echo, LoaderState, PartPos};
pub use plan::{Link, LinkSource, costed_plan, costed_plan_for_ranks, is_on_this_host};
pub use steps::RowSteps;
pub use stream::{Order, READ_AHEAD_BYTES, Segment, ShardStream, SharedTotals, StreamOptions, StreamTotals};
