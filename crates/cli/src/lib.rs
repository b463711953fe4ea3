//! The `pushdown` command line: `serve`, `gen`, `run`, `explain`, `demo`.
//!
//! The library half holds what the binary and the end-to-end tests share: the seeded
//! dataset generators ([`datasets`]) and the demo ([`demo`]).

pub mod datasets;
pub mod demo;
pub mod run;

// Dependencies of the `pushdown` binary alone.
use mimalloc as _;
use tokio as _;
use tracing as _;
use tracing_subscriber as _;
