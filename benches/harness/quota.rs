//! A real CPU throttle for shapes that need more cores than the machine has: a cgroup whose
//! CFS bandwidth quota holds every process started in it to a share of one core.
//!
//! "One server core shared by three trainers, each on a core of its own" needs four cores.
//! On two, every participant held to 0.45 of a core keeps the shape (the server has what
//! each trainer has, and they are four) at 0.45× the speed, with 0.2 of a core left for the
//! harness, the link and the kernel. The quota is enforced by the kernel's scheduler over
//! 10 ms periods: throughput is the share's; a process may wait up to a period for its turn.
//!
//! cgroup v1 (`/sys/fs/cgroup/cpu`) and v2 (`/sys/fs/cgroup` with the `cpu` controller) are
//! both supported; either needs root. The group is removed when dropped.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};

/// CFS period: short, so a throttled process waits at most this long for its share.
const PERIOD_US: u64 = 10_000;

/// A cgroup holding its processes to `cores` of CPU time a second.
pub struct CpuQuota {
    dir: PathBuf,
    procs: PathBuf,
    pub cores: f64,
}

impl CpuQuota {
    /// A new group called `name` (made unique by this process's id) with `cores` of quota.
    pub fn new(name: &str, cores: f64) -> Result<Self> {
        if cores.is_nan() || cores <= 0.0 {
            bail!("a CPU quota must be positive, not {cores}");
        }
        let quota_us = ((cores * PERIOD_US as f64).round() as u64).max(1_000);
        let leaf = format!("pushdown-bench-{}-{name}", std::process::id());
        let v1 = PathBuf::from("/sys/fs/cgroup/cpu");
        let v2 = PathBuf::from("/sys/fs/cgroup");
        let (dir, procs) = if v1.join("cpu.cfs_quota_us").exists() {
            let dir = v1.join(&leaf);
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            write(&dir.join("cpu.cfs_period_us"), &PERIOD_US.to_string())?;
            write(&dir.join("cpu.cfs_quota_us"), &quota_us.to_string())?;
            (dir.clone(), dir.join("cgroup.procs"))
        } else if std::fs::read_to_string(v2.join("cgroup.controllers")).is_ok_and(|c| c.contains("cpu")) {
            // The controller must be enabled for the root's children.
            let _ = std::fs::write(v2.join("cgroup.subtree_control"), "+cpu");
            let dir = v2.join(&leaf);
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            write(&dir.join("cpu.max"), &format!("{quota_us} {PERIOD_US}"))?;
            (dir.clone(), dir.join("cgroup.procs"))
        } else {
            bail!("no writable cgroup cpu controller (cgroup v1 /sys/fs/cgroup/cpu or v2 with `cpu`)");
        };
        Ok(Self { dir, procs, cores })
    }

    /// `argv` run inside the group: a shell joins it, then becomes the command, so every
    /// thread the command starts is held to the quota from its first instruction.
    pub fn wrap(&self, argv: &[String]) -> Vec<String> {
        let mut out = vec![
            "sh".to_owned(),
            "-c".to_owned(),
            format!("echo $$ > {} && exec \"$@\"", self.procs.display()),
            "sh".to_owned(),
        ];
        out.extend(argv.iter().cloned());
        out
    }
}

fn write(path: &std::path::Path, value: &str) -> Result<()> {
    std::fs::write(path, value).with_context(|| format!("writing {value:?} to {}", path.display()))
}

impl Drop for CpuQuota {
    fn drop(&mut self) {
        // Fails while a process is still inside; the harness kills its children first.
        let _ = std::fs::remove_dir(&self.dir);
    }
}
