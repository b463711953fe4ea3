//! The `pushdown` command line: `serve`, `gen`, `run`, `explain`, `demo`.
//!
//! The library half holds what the binary and the end-to-end tests share: the demo
//! ([`demo`]) and the `run` driver ([`run`]). The dataset generators are their own crate,
//! `pushdown-datasets`.

pub mod demo;
pub mod run;

// Dependencies of the `pushdown` binary alone.
use clap as _;
use mimalloc as _;
use tokio as _;
use tracing as _;
use tracing_subscriber as _;
