//! The `pushdown` command line: `serve`, `gen`, `run`, `explain`, `demo`.
//!
//! The library half holds the demo ([`demo`]) and `run --mixture` ([`mixture`]), tested here. Everything the commands drive
//! lives in the crates below: `run` is `pushdown_client::run` (built on the loader's
//! preparation and order), the generators are `pushdown-datasets`. No test or benchmark
//! crate depends on this one.

//!
//! | layer | modules |
//! |---|---|
//! | the demo, `run --mixture`, error reports (independent of one another) | [`demo`], [`mixture`], [`report`] |

pub mod demo;

pub mod mixture;

pub mod report;

pub use report::error_report;

// Dependencies of the `pushdown` binary alone.
use clap as _;
use mimalloc as _;
use pushdown_task as _;
use tokio as _;
use tracing as _;
use tracing_subscriber as _;
