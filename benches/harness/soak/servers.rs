//! The soak's servers: real `pushdown serve` processes with their budgets set by flags,
//! restartable on the same ports, and what `/proc` and their metrics endpoints say of them.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// DoGet streams a server runs at once (`--max-streams`); more wait for a slot.
pub const MAX_STREAMS: usize = 16;
/// How long one waits for a slot before `RESOURCE_EXHAUSTED` (`--queue-timeout-secs`).
pub const QUEUE_TIMEOUT_SECS: u64 = 5;
/// The query engine's memory pool (`--memory-mib`) and one query's share of it.
pub const MEMORY_MIB: u64 = 256;
pub const MAX_QUERY_MEMORY_MIB: u64 = 128;
/// The fragment cache's memory budget (`--cache-memory-mib`).
pub const CACHE_MEMORY_MIB: u64 = 64;
/// What a stream slot may hold beyond the pool (as `harness load` states it): two encoded
/// Flight messages queued to the socket, the batch being encoded, the decoder's pages.
pub const PER_SLOT_MIB: u64 = 16;

/// The `pushdown` binary: `PUSHDOWN_BIN`, else the one built beside this harness.
pub fn pushdown_bin() -> Result<PathBuf> {
    if let Some(bin) = std::env::var_os("PUSHDOWN_BIN") {
        return Ok(bin.into());
    }
    let exe = std::env::current_exe().context("locating the harness binary")?;
    let sibling = exe.with_file_name("pushdown");
    if !sibling.exists() {
        bail!(
            "no pushdown binary beside {} (build -p pushdown-cli too, or set PUSHDOWN_BIN)",
            exe.display()
        );
    }
    Ok(sibling)
}

/// One life of a `pushdown serve` process (a restart is a new life on the same ports).
#[derive(Debug)]
pub struct Served {
    pub life: u32,
    pub addr: SocketAddr,
    pub metrics: SocketAddr,
    child: Child,
}

impl Served {
    /// Starts server `index` over `data` (its stderr to `logs/server-INDEX-life-LIFE.log`),
    /// on `ports` (Flight, metrics) or free ones, and waits until it listens.
    pub fn start(index: usize, life: u32, data: &Path, logs: &Path, ports: (u16, u16)) -> Result<Self> {
        let log_path = logs.join(format!("server-{index}-life-{life}.log"));
        let log =
            std::fs::File::create(&log_path).with_context(|| format!("creating {}", log_path.display()))?;
        let mut child = Command::new(pushdown_bin()?)
            .arg("serve")
            .arg("--data")
            .arg(data)
            .args(["--listen", &format!("127.0.0.1:{}", ports.0)])
            .args(["--metrics-listen", &format!("127.0.0.1:{}", ports.1)])
            .args(["--cpu-threads", "1"])
            .args(["--max-streams", &MAX_STREAMS.to_string()])
            .args(["--queue-timeout-secs", &QUEUE_TIMEOUT_SECS.to_string()])
            .args(["--memory-mib", &MEMORY_MIB.to_string()])
            .args(["--max-query-memory-mib", &MAX_QUERY_MEMORY_MIB.to_string()])
            .args(["--cache-memory-mib", &CACHE_MEMORY_MIB.to_string()])
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .context("starting pushdown serve")?;
        let stdout = child.stdout.take().context("the server's stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let (mut addr, mut metrics) = (None, None);
        while addr.is_none() {
            let Some(line) = lines.next().transpose()? else {
                let _ = child.kill();
                let _ = child.wait();
                bail!(
                    "server {index} exited before listening: see {}",
                    log_path.display()
                );
            };
            if let Some(a) = line.strip_prefix("listening on ") {
                addr = Some(a.trim().parse::<SocketAddr>().context("the server's address")?);
            }
            if let Some(m) = line.strip_prefix("metrics on http://") {
                metrics = Some(m.trim().trim_end_matches("/metrics").parse::<SocketAddr>()?);
            }
        }
        // The rest of stdout is drained, so a chatty server never blocks on a full pipe.
        std::thread::spawn(move || lines.for_each(drop));
        Ok(Self {
            life,
            addr: addr.context("address")?,
            metrics: metrics.context("the server printed no metrics address")?,
            child,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// SIGKILL, and the process reaped.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One server at one moment.
#[derive(Debug, Clone, Default)]
pub struct Probe {
    pub rss: u64,
    /// Peak RSS of this life so far (`VmHWM`).
    pub peak_rss: u64,
    pub fds: u64,
    pub threads: u64,
    /// In-flight DoGet streams (`pushdown_active_streams`).
    pub streams: u64,
    /// The fragment cache's bytes in memory and on disk.
    pub cache_bytes: u64,
    /// Panics caught and turned into errors (`pushdown_panics_contained_total`).
    pub panics: u64,
}

/// What `/proc/PID` and the metrics endpoint say now; `None` when the process is gone.
pub async fn probe(pid: u32, metrics: SocketAddr) -> Option<Probe> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64;
    let text = scrape(metrics).await.unwrap_or_default();
    Some(Probe {
        rss: field("VmRSS:") * 1024,
        peak_rss: field("VmHWM:") * 1024,
        threads: field("Threads:"),
        fds,
        streams: metric(&text, "pushdown_active_streams") as u64,
        cache_bytes: (metric(&text, "pushdown_cache_memory_bytes")
            + metric(&text, "pushdown_cache_disk_bytes")) as u64,
        panics: metric(&text, "pushdown_panics_contained_total") as u64,
    })
}

/// `GET /metrics` (HTTP/1.0: the body ends with the connection).
async fn scrape(addr: SocketAddr) -> Result<String> {
    let get = async {
        let mut socket = tokio::net::TcpStream::connect(addr).await?;
        socket
            .write_all(b"GET /metrics HTTP/1.0\r\nHost: soak\r\n\r\n")
            .await?;
        let mut text = String::new();
        socket.read_to_string(&mut text).await?;
        anyhow::Ok(text)
    };
    tokio::time::timeout(Duration::from_secs(5), get)
        .await
        .context("the metrics endpoint did not answer in 5 s")?
}

/// The sum of every series of metric `name` in Prometheus text.
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (key, value) = l.rsplit_once(' ')?;
            (key.split('{').next()? == name).then(|| value.parse::<f64>().ok())?
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_metric_sums_its_series_and_ignores_its_neighbours() {
        let text = "# HELP pushdown_active_streams x\npushdown_active_streams 3\n\
                    pushdown_active_streams_total 9\npushdown_cache_memory_bytes{a=\"1\"} 10\n\
                    pushdown_cache_memory_bytes{a=\"2\"} 5\n";
        assert_eq!(metric(text, "pushdown_active_streams"), 3.0);
        assert_eq!(metric(text, "pushdown_cache_memory_bytes"), 15.0);
        assert_eq!(metric(text, "pushdown_nope"), 0.0);
    }
}
