//! The `pushdown` command line: `serve`, `gen`, `run`, `explain`, `demo`.
//!
//! The library half holds the demo ([`demo`]), tested here. Everything the commands drive
//! lives in the crates below: `run` is `pushdown_client::run` (built on the loader's
//! preparation and order), the generators are `pushdown-datasets`. No test or benchmark
//! crate depends on this one.

pub mod demo;

/// A failed command's error as the one line it prints: the error, then each cause its text
/// does not already quote (anyhow's `Caused by:` list repeats every cause an error's own
/// message includes, and `RUST_BACKTRACE` would add a backtrace to a typo in a query).
pub fn error_report(error: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in error.chain() {
        let part = cause.to_string();
        if part.is_empty() || text.contains(&part) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&part);
    }
    text
}

// Dependencies of the `pushdown` binary alone.
use clap as _;
use mimalloc as _;
use pushdown_task as _;
use tokio as _;
use tracing as _;
use tracing_subscriber as _;

#[cfg(test)]
mod tests {
    use super::error_report;

    #[test]
    fn each_cause_is_reported_once() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        let quoted = anyhow::Error::new(io).context("reading p.toml: no such file");
        assert_eq!(error_report(&quoted), "reading p.toml: no such file");
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        let chained = anyhow::Error::new(io)
            .context("reading p.toml")
            .context("the pipeline");
        assert_eq!(
            error_report(&chained),
            "the pipeline: reading p.toml: no such file"
        );
    }
}
