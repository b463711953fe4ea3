//! Server processes of a benchmark, and CPU/memory accounting from `/proc`.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use anyhow::{Context, Result, bail};

/// CPU seconds (user + system) process `pid` (or `"self"`) has used, all threads; `None`
/// where `/proc` does not say (no such process).
pub fn cpu_seconds(pid: &str) -> Option<f64> {
    // USER_HZ: Linux fixes the clock ticks of `/proc/*/stat` times at 100.
    const TICKS: f64 = 100.0;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces: fields follow the last `)`.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    // After the name: state(3) ... utime(14), stime(15); `rest` starts at field 3.
    let utime: f64 = fields.nth(11)?.parse().ok()?;
    let stime: f64 = fields.next()?.parse().ok()?;
    Some((utime + stime) / TICKS)
}

/// Nanoseconds each of `pid`'s live threads has spent ready to run but waiting for a CPU
/// (the run queue's wait in `/proc/PID/task/*/schedstat`), by thread id. For a process
/// pinned to one core this is its threads waiting for each other as well as for anything
/// else on that core. `None` where no thread's schedstat can be read.
pub fn run_queue_waits(pid: &str) -> Option<RunQueueWaits> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut waits = std::collections::BTreeMap::new();
    for task in tasks.flatten() {
        // A thread may exit between the listing and the read: it is skipped.
        let Ok(stat) = std::fs::read_to_string(task.path().join("schedstat")) else {
            continue;
        };
        if let Some(ns) = stat.split_whitespace().nth(1).and_then(|n| n.parse::<u64>().ok()) {
            waits.insert(task.file_name().to_string_lossy().into_owned(), ns);
        }
    }
    (!waits.is_empty()).then_some(RunQueueWaits(waits))
}

/// A process's threads' run-queue waits at one moment (see [`run_queue_waits`]).
#[derive(Debug, Clone, Default)]
pub struct RunQueueWaits(std::collections::BTreeMap<String, u64>);

impl RunQueueWaits {
    /// Seconds waited since `earlier` by the threads alive now (a thread started since
    /// counts from zero). A thread that exited meanwhile (a runtime's idle blocking thread)
    /// takes its wait with it: summing whole processes' totals then went negative.
    pub fn since(&self, earlier: &RunQueueWaits) -> f64 {
        let ns: u64 = self
            .0
            .iter()
            .map(|(tid, &ns)| ns.saturating_sub(earlier.0.get(tid).copied().unwrap_or(0)))
            .sum();
        ns as f64 / 1e9
    }
}

/// Peak resident set size of `pid` in bytes (`VmHWM`).
pub fn peak_rss(pid: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Resident set size of `pid` now, in bytes (`VmRSS`); `None` once it has exited.
pub fn current_rss(pid: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Resets `pid`'s peak RSS to its current RSS (Linux ≥ 4.0: write 5 to clear_refs).
pub fn reset_peak_rss(pid: &str) {
    let _ = std::fs::write(format!("/proc/{pid}/clear_refs"), "5");
}

/// Pins every thread of this process to `cpus` (e.g. "1"), so threads it creates inherit it.
pub fn pin_self(cpus: &str) -> bool {
    Command::new("taskset")
        .args(["-a", "-p", "-c", cpus, &std::process::id().to_string()])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A `harness serve` (or `harness finished`) child process.
#[derive(Debug)]
pub struct ServerProcess {
    child: Child,
    pub addr: SocketAddr,
}

impl ServerProcess {
    /// Starts `harness serve` over `data`, in `namespace` when given, pinned to `cpus`.
    pub fn start(
        data: &Path,
        listen: &str,
        threads: usize,
        namespace: Option<&str>,
        cpus: Option<&str>,
    ) -> Result<Self> {
        Self::start_with(
            "serve",
            &data.to_string_lossy(),
            listen,
            threads,
            namespace,
            cpus,
            &[],
        )
    }

    /// Starts `harness <subcommand> --data <data> --listen <listen> --threads <threads>` (a
    /// subcommand that prints `listening on ADDR` first), with `env` added to its environment.
    pub fn start_with(
        subcommand: &str,
        data: &str,
        listen: &str,
        threads: usize,
        namespace: Option<&str>,
        cpus: Option<&str>,
        env: &[(String, String)],
    ) -> Result<Self> {
        let argv = Self::argv(subcommand, data, listen, threads, namespace, cpus)?;
        Self::start_argv(&argv, env)
    }

    /// The command line of a server process (see [`ServerProcess::start_with`]).
    pub fn argv(
        subcommand: &str,
        data: &str,
        listen: &str,
        threads: usize,
        namespace: Option<&str>,
        cpus: Option<&str>,
    ) -> Result<Vec<String>> {
        let exe = std::env::current_exe().context("locating the harness binary")?;
        let mut argv: Vec<String> = Vec::new();
        if let Some(ns) = namespace {
            argv.extend(["ip", "netns", "exec", ns].map(String::from));
        }
        if let Some(c) = cpus {
            argv.extend(["taskset", "-c", c].map(String::from));
        }
        argv.push(exe.to_string_lossy().into_owned());
        argv.extend([
            subcommand.to_owned(),
            "--data".to_owned(),
            data.to_owned(),
            "--listen".to_owned(),
            listen.to_owned(),
            "--threads".to_owned(),
            threads.to_string(),
        ]);
        Ok(argv)
    }

    /// Starts `argv` (a server command line, perhaps wrapped) and waits for its address.
    pub fn start_argv(argv: &[String], env: &[(String, String)]) -> Result<Self> {
        let mut child = Command::new(&argv[0])
            .args(&argv[1..])
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting {}", argv.join(" ")))?;
        let stdout = child.stdout.take().context("server stdout")?;
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line)?;
        let Some(addr) = line.trim().strip_prefix("listening on ") else {
            let _ = child.kill();
            bail!("server did not start: {line:?}");
        };
        let addr = addr.parse().with_context(|| format!("server address {addr:?}"))?;
        Ok(Self { child, addr })
    }

    pub fn pid(&self) -> String {
        self.child.id().to_string()
    }

    pub fn cpu_seconds(&self) -> f64 {
        cpu_seconds(&self.pid()).unwrap_or(f64::NAN)
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `benches/python/SCRIPT ARGS…` pinned to `cpus`, its one line of JSON parsed. The
/// interpreter is `PUSHDOWN_PYTHON`, else `.venv/bin/python` (pyarrow and what the script
/// needs; torch for its DataLoader where installed).
pub fn python_bench(script: &str, args: &[String], cpus: &str) -> anyhow::Result<serde_json::Value> {
    use anyhow::{Context, bail};
    let python = std::env::var_os("PUSHDOWN_PYTHON").map_or_else(
        || std::path::Path::new(".venv/bin/python").to_owned(),
        std::path::PathBuf::from,
    );
    if std::env::var_os("PUSHDOWN_PYTHON").is_none() && !python.exists() {
        bail!("no .venv: run scripts/setup-python.sh --bench (or set PUSHDOWN_PYTHON)");
    }
    let out = std::process::Command::new("taskset")
        .args(["-c", cpus])
        .arg(&python)
        .arg(format!("benches/python/{script}"))
        .args(args)
        .output()
        .with_context(|| format!("running {script}"))?;
    if !out.status.success() {
        bail!("{script} failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    serde_json::from_slice(&out.stdout).with_context(|| format!("{script}'s JSON"))
}
