//! `pushdown run --mixture FILE`: a mixture of sources by weight, read as a trainer's loader
//! of world size 1 reads it, and what it delivered.
//!
//! ```toml
//! batch_size = 64          # rows per global batch (default 256)
//! shuffle_buffer = 1024    # rows per shuffle window (default: no shuffle)
//!
//! [[source]]
//! sql = "SELECT id, text FROM web"
//! weight = 0.7
//!
//! [[source]]
//! pipeline = "code.toml"   # relative to this file
//! weight = 0.3
//! servers = ["http://code-store:50051"]   # default: the command's servers
//! ```

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use pushdown_client::{Loader, LoaderSource, MixtureSource};
use pushdown_planner::Pipeline;
use serde::Deserialize;

/// A mixture file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MixtureFile {
    pub batch_size: Option<usize>,
    pub shuffle_buffer: Option<usize>,
    pub source: Vec<SourceEntry>,
}

/// One `[[source]]`: `sql` or `pipeline`, its weight and (optionally) its servers.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceEntry {
    pub sql: Option<String>,
    pub pipeline: Option<std::path::PathBuf>,
    pub weight: f64,
    pub servers: Option<Vec<String>>,
}

impl MixtureFile {
    /// Reads a mixture file (TOML); each source's pipeline file relative to it.
    pub fn from_file(path: &Path) -> Result<(Self, Vec<MixtureSource>)> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let file: Self = toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        let base = path.parent().unwrap_or(Path::new("."));
        let sources = file
            .source
            .iter()
            .enumerate()
            .map(|(i, entry)| {
                let source = match (&entry.sql, &entry.pipeline) {
                    (Some(sql), None) => LoaderSource::Sql(sql.clone()),
                    (None, Some(pipeline)) => LoaderSource::Pipeline(
                        Pipeline::from_file(&base.join(pipeline))
                            .with_context(|| format!("mixture source {i}"))?,
                    ),
                    _ => anyhow::bail!("mixture source {i}: give sql or pipeline, one of them"),
                };
                Ok(MixtureSource {
                    source,
                    weight: entry.weight,
                    servers: entry.servers.clone(),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        if sources.is_empty() {
            anyhow::bail!("{}: a mixture needs at least one [[source]]", path.display());
        }
        Ok((file, sources))
    }
}

/// What a mixture's or packed loader's run delivered.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MixtureReport {
    /// `mixture` or `packed`.
    pub what: &'static str,
    pub epochs: u64,
    pub batches_per_epoch: u64,
    pub batches: u64,
    pub rows: u64,
    pub bytes_received: u64,
    pub elapsed: Duration,
}

impl std::fmt::Display for MixtureReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let secs = self.elapsed.as_secs_f64().max(1e-9);
        writeln!(
            f,
            "{}: {} epoch(s) of {} global batches; delivered {} rows in {} batches, {} \
             received, in {:.2} s ({:.0} rows/s)",
            self.what,
            self.epochs,
            self.batches_per_epoch,
            self.rows,
            self.batches,
            pushdown_client::run::bytes(self.bytes_received),
            secs,
            self.rows as f64 / secs
        )
    }
}

/// Reads every epoch of a world-size-1 `loader` (a mixture's, a packed one's). Blocks.
pub fn read_loader(mut loader: Loader, what: &'static str) -> Result<MixtureReport> {
    let start = Instant::now();
    let (_, batches_per_epoch) = loader.epoch_len();
    let (mut batches, mut rows) = (0, 0);
    let mut epochs = 0;
    for batch in loader.by_ref() {
        let batch = batch?;
        epochs = epochs.max(batch.epoch + 1);
        batches += 1;
        rows += batch.rows as u64;
    }
    Ok(MixtureReport {
        what,
        epochs,
        batches_per_epoch,
        batches,
        rows,
        bytes_received: loader.stats().bytes_received,
        elapsed: start.elapsed(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).expect("write");
        path
    }

    #[test]
    fn mixture_files_read_their_sources_and_name_what_is_wrong() {
        let dir = tempfile::tempdir().expect("dir");
        write(
            dir.path(),
            "code.toml",
            "dataset = \"code\"\nsteps = [{ op = \"select\", columns = [\"id\"] }]\n",
        );
        let path = write(
            dir.path(),
            "mix.toml",
            "batch_size = 8\n[[source]]\nsql = \"SELECT id FROM web\"\nweight = 0.7\n\
             [[source]]\npipeline = \"code.toml\"\nweight = 0.3\nservers = [\"http://a:1\"]\n",
        );
        let (file, sources) = MixtureFile::from_file(&path).expect("mixture");
        assert_eq!(file.batch_size, Some(8));
        assert_eq!(sources.len(), 2);
        assert!(matches!(&sources[0].source, LoaderSource::Sql(sql) if sql.contains("web")));
        assert!(matches!(&sources[1].source, LoaderSource::Pipeline(p) if p.dataset == "code"));
        assert_eq!(
            sources[1].servers.as_deref(),
            Some(&["http://a:1".to_owned()][..])
        );
        for (text, named) in [
            ("[[source]]\nsql = \"x\"\nwieght = 1.0\n", "wieght"),
            ("[[source]]\nweight = 1.0\n", "give sql or pipeline"),
            (
                "[[source]]\nsql = \"x\"\npipeline = \"code.toml\"\nweight = 1.0\n",
                "give sql or pipeline",
            ),
            (
                "[[source]]\npipeline = \"missing.toml\"\nweight = 1.0\n",
                "mixture source 0",
            ),
            ("batch_size = 8\n", "source"),
        ] {
            let path = write(dir.path(), "bad.toml", text);
            let e = format!("{:#}", MixtureFile::from_file(&path).expect_err(text));
            assert!(e.contains(named), "{text}: {e}");
        }
    }
}
