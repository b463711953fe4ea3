//! The network between a trainer and a storage host, with a fixed bandwidth.
//!
//! * [`Link::netns`]: a real path: the server runs in its own network namespace, joined to
//!   this one by a veth pair whose two ends are shaped by `tc tbf` at the link rate. Bytes on
//!   the wire are the veth's own counters. Needs root and iproute2; torn down on drop.
//! * [`Link::proxy`]: where namespaces are unavailable, a TCP proxy on loopback that paces
//!   each direction with a token bucket and counts what it forwards.
//! * [`Link::loopback`]: no shaping; bytes are not counted on a wire (the client's count is
//!   reported instead).

use std::net::SocketAddr;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Mutex;

const NAMESPACE: &str = "pushdown-bench";
const HOST_IF: &str = "pdb-host";
const PEER_IF: &str = "pdb-peer";
const HOST_ADDR: &str = "10.233.0.1";
const PEER_ADDR: &str = "10.233.0.2";

/// How the link is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Netns,
    Proxy,
    Loopback,
}

/// A link of `rate_bits` bits per second (both directions), or unshaped loopback.
pub struct Link {
    pub kind: Kind,
    pub rate_bits: Option<u64>,
    proxy: Option<Proxy>,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("kind", &self.kind)
            .field("rate_bits", &self.rate_bits)
            .finish()
    }
}

fn run(cmd: &[&str]) -> Result<()> {
    let out = Command::new(cmd[0])
        .args(&cmd[1..])
        .output()
        .with_context(|| format!("running {}", cmd.join(" ")))?;
    if !out.status.success() {
        bail!(
            "{}: {}",
            cmd.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

fn teardown_netns() {
    let _ = Command::new("ip").args(["link", "del", HOST_IF]).output();
    let _ = Command::new("ip").args(["netns", "del", NAMESPACE]).output();
}

impl Link {
    pub fn loopback() -> Self {
        Self {
            kind: Kind::Loopback,
            rate_bits: None,
            proxy: None,
        }
    }

    /// A veth pair into a fresh namespace, both ends shaped to `rate_bits` with `tc tbf`.
    pub fn netns(rate_bits: u64) -> Result<Self> {
        teardown_netns();
        let rate = format!("{rate_bits}bit");
        // A burst of at least one jiffy's worth of bytes at the rate, as tbf needs.
        let burst = format!("{}", (rate_bits / 8 / 250).max(64 * 1024));
        let peer = |args: &[&str]| -> Vec<String> {
            ["ip", "netns", "exec", NAMESPACE]
                .iter()
                .chain(args)
                .map(|s| s.to_string())
                .collect()
        };
        let steps: Vec<Vec<String>> = vec![
            vec!["ip".into(), "netns".into(), "add".into(), NAMESPACE.into()],
            "ip link add pdb-host type veth peer name pdb-peer"
                .split(' ')
                .map(String::from)
                .collect(),
            vec![
                "ip".into(),
                "link".into(),
                "set".into(),
                PEER_IF.into(),
                "netns".into(),
                NAMESPACE.into(),
            ],
            vec![
                "ip".into(),
                "addr".into(),
                "add".into(),
                format!("{HOST_ADDR}/24"),
                "dev".into(),
                HOST_IF.into(),
            ],
            vec![
                "ip".into(),
                "link".into(),
                "set".into(),
                HOST_IF.into(),
                "up".into(),
            ],
            peer(&["ip", "addr", "add", &format!("{PEER_ADDR}/24"), "dev", PEER_IF]),
            peer(&["ip", "link", "set", PEER_IF, "up"]),
            peer(&["ip", "link", "set", "lo", "up"]),
            vec![
                "tc".into(),
                "qdisc".into(),
                "add".into(),
                "dev".into(),
                HOST_IF.into(),
                "root".into(),
                "tbf".into(),
                "rate".into(),
                rate.clone(),
                "burst".into(),
                burst.clone(),
                "latency".into(),
                "50ms".into(),
            ],
            peer(&[
                "tc", "qdisc", "add", "dev", PEER_IF, "root", "tbf", "rate", &rate, "burst", &burst,
                "latency", "50ms",
            ]),
        ];
        for step in &steps {
            let step: Vec<&str> = step.iter().map(String::as_str).collect();
            if let Err(e) = run(&step) {
                teardown_netns();
                return Err(e);
            }
        }
        Ok(Self {
            kind: Kind::Netns,
            rate_bits: Some(rate_bits),
            proxy: None,
        })
    }

    /// A proxy link whose upstream is not known yet: [`Self::proxy`] makes the real one.
    pub fn pending_proxy(rate_bits: u64) -> Self {
        Self {
            kind: Kind::Proxy,
            rate_bits: Some(rate_bits),
            proxy: None,
        }
    }

    /// A pacing TCP proxy on loopback to `upstream`.
    pub async fn proxy(rate_bits: u64, upstream: SocketAddr) -> Result<Self> {
        Ok(Self {
            kind: Kind::Proxy,
            rate_bits: Some(rate_bits),
            proxy: Some(Proxy::start(rate_bits, upstream).await?),
        })
    }

    /// The link's rate in bytes per second (unlimited on loopback), as the planner is told.
    pub fn rate_bytes(&self) -> f64 {
        self.rate_bits.map_or(f64::INFINITY, |r| r as f64 / 8.0)
    }

    /// The namespace a server of this link runs in, if any.
    pub fn namespace(&self) -> Option<&'static str> {
        (self.kind == Kind::Netns).then_some(NAMESPACE)
    }

    /// The address a server of this link listens on.
    pub fn server_listen(&self) -> &'static str {
        match self.kind {
            Kind::Netns => "10.233.0.2:50551",
            _ => "127.0.0.1:0",
        }
    }

    /// The URL a client uses to reach a server that listens at `server`.
    pub fn client_url(&self, server: SocketAddr) -> String {
        match (&self.proxy, self.kind) {
            (Some(p), _) => format!("http://{}", p.addr),
            (None, Kind::Netns) => format!("http://{PEER_ADDR}:{}", server.port()),
            (None, _) => format!("http://{server}"),
        }
    }

    /// Bytes that crossed the link so far, both directions; `None` on loopback.
    pub fn bytes(&self) -> Option<u64> {
        match self.kind {
            Kind::Netns => {
                let read = |what: &str| {
                    std::fs::read_to_string(format!("/sys/class/net/{HOST_IF}/statistics/{what}"))
                        .ok()
                        .and_then(|s| s.trim().parse::<u64>().ok())
                };
                Some(read("rx_bytes")? + read("tx_bytes")?)
            }
            Kind::Proxy => self.proxy.as_ref().map(|p| p.bytes.load(Ordering::Relaxed)),
            Kind::Loopback => None,
        }
    }

    pub fn describe(&self) -> String {
        let rate = |r: u64| {
            if r >= 1_000_000_000 {
                format!("{} Gbit/s", r / 1_000_000_000)
            } else {
                format!("{} Mbit/s", r / 1_000_000)
            }
        };
        match (self.kind, self.rate_bits) {
            (Kind::Netns, Some(r)) => format!("{} (veth + tc tbf)", rate(r)),
            (Kind::Proxy, Some(r)) => format!("{} (pacing proxy)", rate(r)),
            _ => "loopback".to_owned(),
        }
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        if self.kind == Kind::Netns {
            teardown_netns();
        }
        if let Some(p) = &self.proxy {
            p.task.abort();
        }
    }
}

/// A token bucket shared by every connection in one direction.
struct Bucket {
    rate: f64,
    state: Mutex<(f64, Instant)>,
}

impl Bucket {
    const BURST: f64 = 256.0 * 1024.0;

    fn new(rate_bytes: f64) -> Self {
        Self {
            rate: rate_bytes,
            state: Mutex::new((Self::BURST, Instant::now())),
        }
    }

    async fn take(&self, n: usize) {
        let wait = {
            let mut s = self.state.lock().await;
            let now = Instant::now();
            s.0 = (s.0 + now.duration_since(s.1).as_secs_f64() * self.rate).min(Self::BURST);
            s.1 = now;
            s.0 -= n as f64;
            (s.0 < 0.0).then(|| Duration::from_secs_f64(-s.0 / self.rate))
        };
        if let Some(w) = wait {
            tokio::time::sleep(w).await;
        }
    }
}

struct Proxy {
    addr: SocketAddr,
    bytes: Arc<AtomicU64>,
    task: pushdown_task::Task<()>,
}

impl Proxy {
    async fn start(rate_bits: u64, upstream: SocketAddr) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let bytes = Arc::new(AtomicU64::new(0));
        let up = Arc::new(Bucket::new(rate_bits as f64 / 8.0));
        let down = Arc::new(Bucket::new(rate_bits as f64 / 8.0));
        let counter = Arc::clone(&bytes);
        let task = pushdown_task::Task::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (up, down, counter) = (Arc::clone(&up), Arc::clone(&down), Arc::clone(&counter));
                pushdown_task::detach(async move {
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    let a = pump(cr, sw, up, Arc::clone(&counter));
                    let b = pump(sr, cw, down, counter);
                    let _ = tokio::join!(a, b);
                });
            }
        });
        Ok(Self { addr, bytes, task })
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    bucket: Arc<Bucket>,
    counter: Arc<AtomicU64>,
) -> std::io::Result<()> {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            return to.shutdown().await;
        }
        bucket.take(n).await;
        to.write_all(&buf[..n]).await?;
        counter.fetch_add(n as u64, Ordering::Relaxed);
    }
}
