//! The scaling signal: how many servers would remove the clients' stall.
//!
//! ```text
//!  loaders ── report (every ~1 s: rows, seconds waited, seconds elapsed, fleet size) ──┐
//!                                                                                      ▼
//!  this server: its CPU seconds (/proc) over the window ÷ (window × cores) = busy  b
//!               clients' demand  F = Σ rows/(elapsed − wait) ÷ Σ rows/elapsed
//!               servers now      N = the largest fleet a client reports
//!                                                                                      │
//!  wait, and b ≥ 0.75 (the server's CPU limits them):  wanted = ⌈N · b · F⌉ (≥ N + 1)
//!  wait, and b < 0.75 (the link or the clients do):     wanted = N, bottleneck not_server
//!  no wait:                                             wanted = ⌈N · b / 0.75⌉ (≤ N)
//! ```
//!
//! tf.data service's autoscaler makes the same estimate — the consumers' target rate over
//! one worker's measured rate — from rates the workers time; here the clients' own wait says
//! how much faster they would consume, so a stall the server does not cause (a slow link, a
//! client short of CPU) is named instead of answered with servers that would not help. Every
//! server of a homogeneous fleet sees the same clients and answers about the same number;
//! `load_ratio` (wanted ÷ now) is the per-server form a Kubernetes HPA averages.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use pushdown_protocol::{ClientReport, ScalingSignal};

/// A stall is a wait above this share of the clients' time (5% wait ≈ demand 1.05×).
const STALL_DEMAND: f64 = 1.05;
/// A server this busy limits its clients; below it, their wait comes from elsewhere.
const SATURATED: f64 = 0.75;
/// Waits are capped at this share of a report's time: a client that got nothing says
/// "at least 20× more", not infinity.
const MAX_WAIT: f64 = 0.95;
/// Reports kept per client (about a minute at one a second).
const MAX_REPORTS: usize = 64;
/// Clients tracked at once: reports from more (a flood of made-up ids) are ignored until
/// some age out, so memory stays bounded whatever callers send.
const MAX_CLIENTS: usize = 4096;
/// The largest fleet a report may claim (more is taken as this many).
const MAX_SERVERS: u32 = 100_000;

/// What the server measures for the signal: its CPU over time and the clients' reports.
#[derive(Debug)]
pub struct Scaling {
    cores: usize,
    window: Duration,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// (when, process CPU seconds), oldest first: one at or before the window's start.
    cpu: VecDeque<(Instant, f64)>,
    reports: HashMap<u64, VecDeque<(Instant, ClientReport)>>,
}

impl Scaling {
    pub fn new(cores: usize, window: Duration) -> Self {
        let s = Self {
            cores: cores.max(1),
            window: window.max(Duration::from_millis(100)),
            inner: Mutex::default(),
        };
        s.with_sample(|_, _| ());
        s
    }

    /// Takes a CPU sample now, drops what has left the window, then runs `f`.
    fn with_sample<T>(&self, f: impl FnOnce(&mut Inner, Instant) -> T) -> T {
        let now = Instant::now();
        let mut inner = self.inner.lock();
        if let Some(cpu) = process_cpu_seconds() {
            inner.cpu.push_back((now, cpu));
        }
        let start = now.checked_sub(self.window).unwrap_or(now);
        // Keep the newest sample at or before the window's start as the baseline.
        while inner.cpu.len() > 2 && inner.cpu[1].0 <= start {
            inner.cpu.pop_front();
        }
        inner.reports.retain(|_, reports| {
            while reports.front().is_some_and(|(t, _)| *t < start) {
                reports.pop_front();
            }
            !reports.is_empty()
        });
        f(&mut inner, now)
    }

    /// Records a client's report.
    pub fn record(&self, report: ClientReport) {
        self.with_sample(|inner, now| {
            if inner.reports.len() >= MAX_CLIENTS && !inner.reports.contains_key(&report.client) {
                tracing::warn!(
                    clients = MAX_CLIENTS,
                    "scaling: too many clients reporting; report ignored"
                );
                return;
            }
            // A report covers about a second: an hour bounds any honest one, and keeps sums
            // of many finite.
            let elapsed_seconds = report.elapsed_seconds.min(3600.0);
            let report = ClientReport {
                servers: report.servers.min(MAX_SERVERS),
                elapsed_seconds,
                wait_seconds: report.wait_seconds.min(elapsed_seconds),
                ..report
            };
            let reports = inner.reports.entry(report.client).or_default();
            if reports.len() == MAX_REPORTS {
                reports.pop_front();
            }
            reports.push_back((now, report));
        });
    }

    /// The signal from the last window's measurements.
    pub fn signal(&self) -> ScalingSignal {
        self.with_sample(|inner, now| {
            let busy = match (inner.cpu.front(), inner.cpu.back()) {
                (Some((t0, c0)), Some((t1, c1))) if t1 > t0 => {
                    let wall = t1.duration_since(*t0).as_secs_f64();
                    ((c1 - c0) / (wall * self.cores as f64)).clamp(0.0, 1.0)
                }
                _ => 0.0,
            };
            let window = inner
                .cpu
                .front()
                .map_or(0.0, |(t0, _)| now.duration_since(*t0).as_secs_f64())
                .min(self.window.as_secs_f64());
            let mut clients = Vec::new();
            for reports in inner.reports.values() {
                let mut c = Client::default();
                for (_, r) in reports {
                    c.elapsed += r.elapsed_seconds;
                    c.wait += r.wait_seconds.min(r.elapsed_seconds);
                    c.rows += r.rows as f64;
                    c.servers = r.servers;
                }
                if c.elapsed > 0.0 {
                    clients.push(c);
                }
            }
            let cpu_seconds = inner.cpu.back().map_or(0.0, |(_, c)| *c);
            ScalingSignal {
                cpu_seconds,
                ..decide(busy, &clients, self.cores, window)
            }
        })
    }
}

#[derive(Debug, Default, Clone, Copy)]
struct Client {
    elapsed: f64,
    wait: f64,
    rows: f64,
    servers: u32,
}

impl Client {
    /// How much faster this client would consume if it never waited.
    fn demand(&self) -> f64 {
        1.0 / (1.0 - (self.wait / self.elapsed).min(MAX_WAIT))
    }
}

/// The decision, from the measurements (separate from the clock for tests).
fn decide(busy: f64, clients: &[Client], cores: usize, window: f64) -> ScalingSignal {
    let servers = clients.iter().map(|c| c.servers).max().unwrap_or(1).max(1);
    let elapsed: f64 = clients.iter().map(|c| c.elapsed).sum();
    let wait_fraction = if elapsed > 0.0 {
        clients.iter().map(|c| c.wait).sum::<f64>() / elapsed
    } else {
        0.0
    };
    let demand = demand_factor(clients, elapsed);
    let n = f64::from(servers);
    let (wanted, bottleneck, reason) = if clients.is_empty() {
        (
            1,
            "none",
            "no client reported in the window: one server is enough for nobody".to_owned(),
        )
    } else if demand > STALL_DEMAND && busy >= SATURATED {
        let wanted = ((n * busy * demand - 0.05).ceil() as u32).max(servers.saturating_add(1));
        (
            wanted,
            "server_cpu",
            format!(
                "clients wait {:.0}% of their time and this server is {:.0}% busy: {servers} \
                 server(s) × {busy:.2} busy × {demand:.2} demand = {:.2}",
                wait_fraction * 100.0,
                busy * 100.0,
                n * busy * demand
            ),
        )
    } else if demand > STALL_DEMAND {
        (
            servers,
            "not_server",
            format!(
                "clients wait {:.0}% of their time but this server is only {:.0}% busy: the \
                 stall is the link, the clients' CPU or too few streams, and more servers would \
                 not remove it",
                wait_fraction * 100.0,
                busy * 100.0
            ),
        )
    } else {
        let wanted = ((n * busy / SATURATED - 0.05).ceil() as u32).clamp(1, servers);
        (
            wanted,
            "none",
            format!(
                "clients wait {:.0}% of their time; {wanted} of {servers} server(s) would keep \
                 them fed at {:.0}% busy each",
                wait_fraction * 100.0,
                (n * busy / f64::from(wanted) * 100.0).min(100.0)
            ),
        )
    };
    ScalingSignal {
        servers,
        servers_wanted: wanted,
        busy_fraction: busy,
        wait_fraction,
        demand_factor: demand,
        clients: clients.len() as u32,
        window_seconds: window,
        bottleneck: bottleneck.to_owned(),
        reason,
        cores: cores as u32,
        cpu_seconds: 0.0,
    }
}

/// How much faster the clients would consume together if they never waited (`elapsed`:
/// the sum of their times).
fn demand_factor(clients: &[Client], elapsed: f64) -> f64 {
    // Rates weighted by what each client consumes now; clients that got nothing count by
    // their time.
    let delivered: f64 = clients.iter().map(|c| c.rows / c.elapsed).sum();
    if delivered > 0.0 {
        clients
            .iter()
            .map(|c| c.rows / c.elapsed * c.demand())
            .sum::<f64>()
            / delivered
    } else if elapsed > 0.0 {
        clients.iter().map(|c| c.elapsed * c.demand()).sum::<f64>() / elapsed
    } else {
        1.0
    }
}

/// CPU seconds (user + system) this process has used, all threads.
fn process_cpu_seconds() -> Option<f64> {
    cpu_time::ProcessTime::try_now()
        .ok()
        .map(|t| t.as_duration().as_secs_f64())
}

/// The signal as JSON, for `/scaling` (KEDA's metrics-api scaler, curl).
pub fn to_json(s: &ScalingSignal) -> String {
    let escape = |t: &str| t.replace('\\', "\\\\").replace('"', "\\\"");
    format!(
        "{{\"servers\":{},\"servers_wanted\":{},\"load_ratio\":{:.4},\"busy_fraction\":{:.4},\
         \"wait_fraction\":{:.4},\"demand_factor\":{:.4},\"clients\":{},\"cores\":{},\
         \"window_seconds\":{:.1},\"bottleneck\":\"{}\",\"reason\":\"{}\"}}",
        s.servers,
        s.servers_wanted,
        load_ratio(s),
        s.busy_fraction,
        s.wait_fraction,
        s.demand_factor,
        s.clients,
        s.cores,
        s.window_seconds,
        escape(&s.bottleneck),
        escape(&s.reason)
    )
}

/// Servers wanted per server now: the per-pod value an HPA averages against a target of 1.
pub fn load_ratio(s: &ScalingSignal) -> f64 {
    f64::from(s.servers_wanted) / f64::from(s.servers.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(wait: f64, rows: f64, servers: u32) -> Client {
        Client {
            elapsed: 10.0,
            wait,
            rows,
            servers,
        }
    }

    #[test]
    fn a_saturated_server_asks_for_the_demand_it_cannot_meet() {
        // Waiting half the time: twice the rate wanted; one busy server → two.
        let s = decide(1.0, &[client(5.0, 1000.0, 1)], 1, 10.0);
        assert_eq!(
            (s.servers, s.servers_wanted, s.bottleneck.as_str()),
            (1, 2, "server_cpu")
        );
        assert!((s.demand_factor - 2.0).abs() < 1e-9);
        // Two clients of a fleet of 3, waiting 2/3 of the time: 3× → 9 servers.
        let s = decide(0.95, &[client(6.67, 10.0, 3), client(6.67, 10.0, 3)], 2, 10.0);
        assert_eq!(s.servers_wanted, 9, "{s:?}");
        // A small stall on a busy server still asks for one more.
        let s = decide(0.8, &[client(1.0, 10.0, 2)], 1, 10.0);
        assert_eq!(s.servers_wanted, 3);
    }

    #[test]
    fn a_stall_the_server_does_not_cause_is_named_not_scaled() {
        let s = decide(0.3, &[client(5.0, 1000.0, 2)], 1, 10.0);
        assert_eq!((s.servers_wanted, s.bottleneck.as_str()), (2, "not_server"));
        assert!(s.reason.contains("30% busy"), "{}", s.reason);
    }

    #[test]
    fn idle_fleets_shrink_and_fed_ones_hold() {
        let s = decide(0.3, &[client(0.0, 1000.0, 4)], 1, 10.0);
        assert_eq!((s.servers_wanted, s.bottleneck.as_str()), (2, "none"));
        let s = decide(1.0, &[client(0.1, 1000.0, 1)], 1, 10.0);
        assert_eq!(s.servers_wanted, 1, "fed clients never ask for more");
        let s = decide(0.0, &[], 1, 10.0);
        assert_eq!((s.servers, s.servers_wanted), (1, 1));
    }

    #[test]
    fn hostile_reports_neither_overflow_nor_grow_without_bound() {
        let s = decide(1.0, &[client(9.0, 1.0, u32::MAX)], 1, 10.0);
        assert_eq!(s.servers_wanted, u32::MAX, "saturates, never wraps or panics");
        let scaling = Scaling::new(1, Duration::from_secs(60));
        for id in 0..(MAX_CLIENTS as u64 + 10) {
            scaling.record(ClientReport {
                client: id,
                servers: u32::MAX,
                elapsed_seconds: f64::MAX,
                wait_seconds: f64::MAX,
                rows: u64::MAX,
            });
        }
        let signal = scaling.signal();
        assert_eq!(signal.clients as usize, MAX_CLIENTS);
        assert_eq!(signal.servers, MAX_SERVERS);
        assert!(
            signal.demand_factor.is_finite() && signal.wait_fraction <= 1.0,
            "{signal:?}"
        );
    }

    #[test]
    fn clients_that_got_nothing_count_at_the_cap() {
        let s = decide(1.0, &[client(10.0, 0.0, 1)], 1, 10.0);
        assert!((s.demand_factor - 20.0).abs() < 1e-9);
        assert_eq!(s.servers_wanted, 20);
    }

    #[test]
    fn reports_age_out_of_the_window_and_cpu_is_measured() {
        let scaling = Scaling::new(1, Duration::from_millis(200));
        scaling.record(ClientReport {
            client: 7,
            servers: 1,
            elapsed_seconds: 1.0,
            wait_seconds: 0.5,
            rows: 100,
        });
        assert_eq!(scaling.signal().clients, 1);
        // Burn some CPU so the busy fraction is measurably above zero.
        let start = Instant::now();
        let mut x = 0u64;
        while start.elapsed() < Duration::from_millis(300) {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        let s = scaling.signal();
        assert_eq!(s.clients, 0, "the report left the window");
        if process_cpu_seconds().is_some() {
            assert!(s.busy_fraction > 0.2, "{s:?}");
        }
        let json = to_json(&s);
        assert!(json.starts_with("{\"servers\":1,\"servers_wanted\":1,"), "{json}");
    }
}
