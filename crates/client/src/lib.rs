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
//! Layers, each importing only those above it: `error`; `affinity` (confining the loader's
//! threads); `connect` (options, message sizes);
//! `fleet` (connections, ranking of holders); `retry` (the one retry loop of every call to
//! a holder: planning, a call any server may answer, a shard's stream); `control` (the adaptive split's control loop:
//! pure, no I/O); `completion` and `tune` (the shared completion and the streams-in-flight
//! tuner); `stream` (shard streams, holding the fleet); `client` ([`PushdownClient`]);
//! `steps` and `plan` (client ops, costed placement); `order` (the sample order: pure, no I/O, no runtime),
//! with `deal`, `mixture`, `pack` and `bucket` (dealing by weight, mixtures, packed blocks,
//! length buckets: pure too); `loader`, `run` and `readers` (plans for readers that stream the
//! shards themselves: Ray Data) on top. This root only documents and re-exports.

pub mod affinity;
pub mod bucket;
mod client;
mod completion;
mod connect;
mod control;
mod deal;
mod error;
mod fleet;
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
pub use loader::{
    Column, EpochBatches, Loader, LoaderOptions, LoaderSource, LoaderStats, MixtureSource, Prepared, Push,
    TensorBatch,
};
pub use order::{Echo, LoaderState, PartPos};
pub use plan::{Link, LinkSource, costed_plan, costed_plan_for_ranks, is_on_this_host};
pub use steps::RowSteps;
pub use stream::{Order, READ_AHEAD_BYTES, Segment, ShardStream, StreamOptions, StreamTotals};
