//! How a failed command says why.

/// A failed command's error as the one line it prints: the error, then each cause, joined
/// by `: ` (anyhow's `Caused by:` list would break the line, and `RUST_BACKTRACE` would add
/// a backtrace to a typo in a query). Every error type of the project states its cause in
/// its message or returns it as its source, never both (the rule in `pushdown-engine`'s
/// `error` module), so each cause is said once.
pub fn error_report(error: &anyhow::Error) -> String {
    error
        .chain()
        .map(ToString::to_string)
        .filter(|part| !part.is_empty())
        .collect::<Vec<_>>()
        .join(": ")
}

#[cfg(test)]
mod tests {
    use super::error_report;

    #[test]
    fn each_link_of_the_chain_is_said_once_in_order() {
        let io = std::io::Error::new(std::io::ErrorKind::TimedOut, "timed out");
        let chained = anyhow::Error::new(io)
            .context("reading p.toml")
            .context("the last run timed out");
        assert_eq!(
            error_report(&chained),
            "the last run timed out: reading p.toml: timed out"
        );
    }

    /// The project's errors say their causes once: a startup error over an io error is one
    /// link, its cause in its message.
    #[test]
    fn the_projects_errors_need_no_deduplication() {
        let err = pushdown_server::open_store("/no/such/root/anywhere").expect_err("no root");
        let report = error_report(&anyhow::Error::new(err).context("serving"));
        assert!(
            report.starts_with("serving: --data /no/such/root/anywhere: "),
            "{report}"
        );
        let cause = report.rsplit(": ").next().expect("a cause");
        assert_eq!(report.matches(cause).count(), 1, "{report}");
    }
}
