//! The soak's section of `benches/RESULTS.md`, and the checks that fail the run.

use std::collections::BTreeMap;
use std::path::Path;

use super::servers::{CACHE_MEMORY_MIB, MAX_STREAMS, MEMORY_MIB, PER_SLOT_MIB, QUEUE_TIMEOUT_SECS};
use super::{RSS_GROWTH, SLACK, Sample, SoakArgs, Tally};

pub struct Report<'a> {
    pub args: &'a SoakArgs,
    pub command: &'a str,
    pub samples: &'a [Sample],
    pub tallies: &'a BTreeMap<&'static str, Tally>,
    /// Restarts of the second server.
    pub restarts: u32,
    /// Rows of a loader's epoch.
    pub epoch_rows: usize,
    pub panics: &'a [String],
    pub plot: Option<&'a Path>,
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
}

impl Report<'_> {
    /// The section's Markdown, and the checks that failed (none: the soak passed).
    pub fn render(&self) -> (String, Vec<String>) {
        let mut failures = Vec::new();
        let clients = self.clients(&mut failures);
        let servers = self.servers(&mut failures);
        let growth = self.rss_growth(&mut failures);
        let minutes = self.samples.last().map_or(0.0, |s| s.minute);
        let plot = self.plot.map_or_else(
            || "(no plot: matplotlib missing; `scripts/setup-python.sh --bench`)".to_owned(),
            |p| {
                format!(
                    "![RSS, descriptors, threads and streams of each server]({})",
                    relative(p)
                )
            },
        );
        let body = format!(
            "## Soak: two servers under mixed load, one SIGKILLed and restarted\n\n\
             Command: `{}`  \nMachine: {}.  \n\
             **{minutes:.1} minutes**: load phases of {} s, each followed by {} s quiet; server 1 SIGKILLed \
             and restarted on its ports every {} min ({} restarts); samples every {} s in `{}`.  \n\
             Servers: `pushdown serve --cpu-threads 1 --max-streams {MAX_STREAMS} --queue-timeout-secs \
             {QUEUE_TIMEOUT_SECS} --memory-mib {MEMORY_MIB} --max-query-memory-mib {} --cache-memory-mib \
             {CACHE_MEMORY_MIB}`, the rest defaults.  \n\
             Each phase runs at once: 2 loaders (epoch after epoch of {} rows over both servers, ids \
             against the fault-free sequence), 2 clients cancelling streams after 0–3 batches, a malformed request \
             every 200 ms (6 kinds, each with its status), a burst of {} streams held on server 0, \
             pyarrow's plain Flight client and ADBC's Flight SQL driver (answers against the \
             fault-free ones).\n\n\
             | client | requests | exact / as meant | refused as expected | failed in an outage | wrong | unexpected |\n\
             |---|---:|---:|---|---:|---:|---:|\n{clients}\n\
             | server | lives | RSS min–max | peak RSS (bound) | descriptors at quiet points (baseline) | \
             threads at quiet points (baseline) | cache max | panics |\n\
             |---|---:|---:|---:|---|---|---:|---:|\n{servers}\n\
             {growth}\n\n{}\n\n{plot}\n\n",
            self.command,
            crate::machine(),
            self.args.phase_secs,
            self.args.quiet_secs,
            self.args.kill_every,
            self.restarts,
            self.args.sample_secs,
            relative(&self.args.out.join("samples.csv")),
            super::servers::MAX_QUERY_MEMORY_MIB,
            self.epoch_rows,
            3 * MAX_STREAMS,
            self.verdict(&failures),
        );
        (body, failures)
    }

    fn verdict(&self, failures: &[String]) -> String {
        let panics = if self.panics.is_empty() {
            "no server panicked (logs and `pushdown_panics_contained_total`)".to_owned()
        } else {
            format!(
                "{} panic lines, the first: `{}`",
                self.panics.len(),
                self.panics[0]
            )
        };
        if failures.is_empty() {
            format!(
                "**Passed**: every loader epoch exact, every refusal the expected status, {panics}, \
                 descriptors and threads back to their baseline at every quiet point, peak RSS under \
                 its bound."
            )
        } else {
            format!("**Failed**: {}; {panics}.", failures.join("; "))
        }
    }

    fn clients(&self, failures: &mut Vec<String>) -> String {
        let mut rows = String::new();
        for (name, t) in self.tallies {
            let refused: Vec<String> = t.refused.iter().map(|(code, n)| format!("{n} {code}")).collect();
            rows.push_str(&format!(
                "| {name} | {} | {} | {} | {} | {} | {} |\n",
                t.requests,
                t.exact,
                if refused.is_empty() {
                    "–".into()
                } else {
                    refused.join(", ")
                },
                t.outage,
                t.wrong,
                t.unexpected
            ));
            if t.wrong > 0 {
                failures.push(format!(
                    "{name}: {} wrong, the first: {}",
                    t.wrong,
                    t.first_wrong.as_deref().unwrap_or("?")
                ));
            }
            if t.unexpected > 0 {
                failures.push(format!(
                    "{name}: {} unexpected, the first: {}",
                    t.unexpected,
                    t.first_unexpected.as_deref().unwrap_or("?")
                ));
            }
            if t.requests == 0 {
                failures.push(format!("{name}: no requests"));
            }
        }
        let burst = self.tallies.get("burst past the slots");
        if burst.is_some_and(|b| !b.refused.contains_key("ResourceExhausted")) {
            failures.push("the bursts past the slots were never refused with RESOURCE_EXHAUSTED".into());
        }
        if !self.panics.is_empty() {
            failures.push(format!("{} panics logged", self.panics.len()));
        }
        rows
    }

    /// A row per server; quiet points over their life's baseline, and a peak over the
    /// memory bound, are failures.
    fn servers(&self, failures: &mut Vec<String>) -> String {
        let mut rows = String::new();
        for server in 0..2 {
            let mine: Vec<&Sample> = self.samples.iter().filter(|s| s.server == server).collect();
            let Some(first) = mine.first() else { continue };
            let lives = mine.iter().map(|s| s.life).max().unwrap_or(0) + 1;
            let rss = |f: fn(u64, u64) -> u64| mine.iter().map(|s| s.probe.rss).reduce(f).unwrap_or(0);
            let peak = mine.iter().map(|s| s.probe.peak_rss).max().unwrap_or(0);
            let bound =
                first.probe.rss + ((MEMORY_MIB + CACHE_MEMORY_MIB + MAX_STREAMS as u64 * PER_SLOT_MIB) << 20);
            if peak > bound {
                failures.push(format!(
                    "server {server}: peak RSS {} over its bound {}",
                    mib(peak),
                    mib(bound)
                ));
            }
            let (fds, threads) = self.back_to_baseline(server, failures);
            let panics = mine.iter().map(|s| s.probe.panics).max().unwrap_or(0);
            if panics > 0 {
                failures.push(format!("server {server}: {panics} panics contained"));
            }
            rows.push_str(&format!(
                "| {server} | {lives} | {}–{} | {} ({}) | {fds} | {threads} | {} | {panics} |\n",
                mib(rss(u64::min)),
                mib(rss(u64::max)),
                mib(peak),
                mib(bound),
                mib(mine.iter().map(|s| s.probe.cache_bytes).max().unwrap_or(0)),
            ));
        }
        rows
    }

    /// Descriptors and threads at each quiet point of each life against that life's first
    /// quiet point: the cells' text (values, baselines) for `server`.
    fn back_to_baseline(&self, server: usize, failures: &mut Vec<String>) -> (String, String) {
        let quiet: Vec<&Sample> = self
            .samples
            .iter()
            .filter(|s| s.server == server && s.phase == "quiet")
            .collect();
        let mut cells = (Vec::new(), Vec::new());
        let mut baseline: Option<&Sample> = None;
        for s in quiet {
            let base = match baseline {
                Some(b) if b.life == s.life => b,
                _ => {
                    baseline = Some(s);
                    cells.0.push(format!("({})", s.probe.fds));
                    cells.1.push(format!("({})", s.probe.threads));
                    continue;
                }
            };
            cells.0.push(s.probe.fds.to_string());
            cells.1.push(s.probe.threads.to_string());
            for (what, now, then) in [
                ("descriptors", s.probe.fds, base.probe.fds),
                ("threads", s.probe.threads, base.probe.threads),
            ] {
                if now > then + SLACK {
                    failures.push(format!(
                        "server {server}: {now} {what} at minute {:.1}, baseline {then}",
                        s.minute
                    ));
                }
            }
        }
        (cells.0.join(" "), cells.1.join(" "))
    }

    /// Server 0's RSS from the first quiet point at or after minute 10 (a fifth of a shorter
    /// run) to the last; enforced on runs of 20 minutes or more.
    fn rss_growth(&self, failures: &mut Vec<String>) -> String {
        let from = (self.args.minutes / 5.0).min(10.0);
        let quiet: Vec<&Sample> = self
            .samples
            .iter()
            .filter(|s| s.server == 0 && s.phase == "quiet" && s.minute >= from)
            .collect();
        let (Some(first), Some(last)) = (quiet.first(), quiet.last()) else {
            return "RSS growth: no quiet points to compare.".into();
        };
        let growth = last.probe.rss as f64 / first.probe.rss.max(1) as f64 - 1.0;
        let enforced = self.args.minutes >= 20.0;
        let ok = growth <= RSS_GROWTH;
        if enforced && !ok {
            failures.push(format!(
                "server 0's RSS grew {:.1}% from minute {from:.0}",
                growth * 100.0
            ));
        }
        format!(
            "**RSS growth of server 0 (never killed) from minute {:.1} to minute {:.1}: {:+.1}%** ({} → {}, \
             quiet points; target ≤ {:.0}%{}).",
            first.minute,
            last.minute,
            growth * 100.0,
            mib(first.probe.rss),
            mib(last.probe.rss),
            RSS_GROWTH * 100.0,
            if enforced {
                ""
            } else {
                ", checked on runs of 20 minutes or more"
            }
        )
    }
}

/// `path` as RESULTS.md (in `benches/`) links it.
fn relative(path: &Path) -> String {
    let text = path.to_string_lossy();
    text.strip_prefix("benches/").unwrap_or(&text).to_owned()
}
