//! How a failed command says why.

/// A failed command's error as the one line it prints: the error, then each cause the one
/// before it does not already quote (an error written `"{what}: {source}"` quotes its
/// source; anyhow's `Caused by:` list would repeat it, and `RUST_BACKTRACE` would add a
/// backtrace to a typo in a query).
pub fn error_report(error: &anyhow::Error) -> String {
    let mut text = String::new();
    let mut previous = String::new();
    for cause in error.chain() {
        let part = cause.to_string();
        if !part.is_empty() && !previous.contains(&part) {
            if !text.is_empty() {
                text.push_str(": ");
            }
            text.push_str(&part);
        }
        previous = part;
    }
    text
}

#[cfg(test)]
mod tests {
    use super::error_report;

    #[test]
    fn a_cause_the_error_before_it_quotes_is_not_repeated() {
        // A short cause an earlier, unrelated link happens to contain is still said.
        let io = std::io::Error::new(std::io::ErrorKind::TimedOut, "timed out");
        let apart = anyhow::Error::new(io)
            .context("reading p.toml")
            .context("the last run timed out");
        assert_eq!(
            error_report(&apart),
            "the last run timed out: reading p.toml: timed out"
        );
    }

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
