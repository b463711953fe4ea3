//! The `pushdown` command line: `serve`, `gen`, `run`, `explain`, `demo`, `scaling`.
//!
//! The whole command is [`command::main`], a library function so that one build gives both
//! the `pushdown` binary and the Python package's `pushdown` console script (the wheel carries
//! the command inside its native module). Beside it: the demo ([`demo`]) and `run --mixture`
//! ([`mixture`]), tested here. Everything the commands drive lives in the crates below: `run`
//! is `pushdown_client::run` (built on the loader's preparation and order), the generators are
//! `pushdown-datasets`. No test or benchmark crate depends on this one.

//!
//! | layer | modules |
//! |---|---|
//! | the command line | [`command`] |
//! | the demo, `run --mixture`, error reports (independent of one another) | [`demo`], [`mixture`], [`report`] |

pub mod command;

pub mod demo;

pub mod mixture;

pub mod report;

pub use report::error_report;

// The `pushdown` binary's allocator (the Python package keeps the interpreter's).
#[cfg(feature = "mimalloc")]
use mimalloc as _;
