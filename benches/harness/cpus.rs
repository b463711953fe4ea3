//! Where the harness's processes run: its own CPU, and the order in which the suites that
//! run on a lent many-core machine (`fleet`, `shared`, `scale`) pin their far processes
//! (servers, trainer processes) to the others. The suites built for one server core and one
//! trainer core pin the server to CPU 0 and the trainer to CPU 1, as their reports say.
//!
//! A far process takes a physical core of its own before any takes a hardware thread whose
//! sibling is busy: two SMT siblings share a core's execution units, so a server pinned next
//! to the harness's loader, or next to another server, does less work per CPU second (on a
//! lent 16-core machine, one server core shared by four in-process trainers spent 3–12% more
//! CPU per sample than with one, where the 2-core machine here, without SMT, stayed flat).

use std::sync::OnceLock;

/// The harness's own CPU (its loader, pacing proxies and in-process contenders).
pub const HARNESS_CPU: usize = 1;

/// The `i`-th CPU a suite gives its far processes; wraps past the last. See [`far_order`].
pub fn far_cpu(i: usize) -> usize {
    static ORDER: OnceLock<Vec<usize>> = OnceLock::new();
    let order = ORDER.get_or_init(|| far_order(&online(), siblings));
    order[i % order.len()]
}

/// The machine's CPUs (not `available_parallelism`: the harness pins itself to one).
pub fn cores() -> usize {
    online().len()
}

/// The CPUs online, by id (ids need not be 0..n: SMT turned off leaves every other one).
pub fn online_cpus() -> Vec<usize> {
    online()
}

fn online() -> Vec<usize> {
    static ONLINE: OnceLock<Vec<usize>> = OnceLock::new();
    ONLINE
        .get_or_init(|| {
            std::fs::read_to_string("/sys/devices/system/cpu/online")
                .ok()
                .and_then(|list| parse_cpu_list(list.trim()))
                .filter(|list| !list.is_empty())
                .unwrap_or_else(|| {
                    let n = std::fs::read_to_string("/proc/cpuinfo")
                        .map(|s| s.lines().filter(|l| l.starts_with("processor")).count())
                        .unwrap_or(1);
                    (0..n.max(1)).collect()
                })
        })
        .clone()
}

/// How the machine's CPUs share physical cores, for the reports: "no SMT" or the hardware
/// threads per core and the harness's sibling.
pub fn topology() -> String {
    let width = online().into_iter().map(|c| siblings(c).len()).max().unwrap_or(1);
    if width <= 1 {
        return "no SMT siblings".into();
    }
    let others: Vec<String> = siblings(HARNESS_CPU)
        .into_iter()
        .filter(|&c| c != HARNESS_CPU)
        .map(|c| c.to_string())
        .collect();
    if others.is_empty() {
        format!(
            "up to {width} hardware threads per core (the harness's CPU {HARNESS_CPU} has its core alone)"
        )
    } else {
        format!(
            "up to {width} hardware threads per core (the harness's CPU {HARNESS_CPU} shares its core with CPU {})",
            others.join(", ")
        )
    }
}

/// The far processes' CPUs (of those `online`) in the order they are given: first one
/// hardware thread of each physical core the harness is not on, by id (on a machine without
/// SMT, every CPU but the harness's: 0, 2, 3, …), then those cores' other threads, then the
/// harness's siblings, and the harness's own CPU last. On 2 cores: 0, then 1. Where the
/// harness's CPU is offline, the first online CPU stands for it.
fn far_order(online: &[usize], siblings: impl Fn(usize) -> Vec<usize>) -> Vec<usize> {
    let harness = if online.contains(&HARNESS_CPU) {
        HARNESS_CPU
    } else {
        online.first().copied().unwrap_or(0)
    };
    let near = siblings(harness);
    let mut order: Vec<(bool, usize, usize)> = online
        .iter()
        .copied()
        .filter(|&c| c != harness)
        .map(|c| {
            let core = siblings(c);
            let thread = core.iter().position(|&s| s == c).unwrap_or(0);
            (core.contains(&harness) || near.contains(&c), thread, c)
        })
        .collect();
    order.sort_unstable();
    order.into_iter().map(|(.., c)| c).chain([harness]).collect()
}

/// The hardware threads sharing `cpu`'s physical core, itself included, in the kernel's
/// order; just `cpu` where the kernel does not say.
fn siblings(cpu: usize) -> Vec<usize> {
    let path = format!("/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list");
    std::fs::read_to_string(path)
        .ok()
        .and_then(|list| parse_cpu_list(list.trim()))
        .filter(|list| list.contains(&cpu))
        .unwrap_or_else(|| vec![cpu])
}

/// A kernel CPU list such as `0-1,8-9` or `3,11`.
fn parse_cpu_list(list: &str) -> Option<Vec<usize>> {
    pushdown_client::affinity::parse_cpus(list).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alone(cpu: usize) -> Vec<usize> {
        vec![cpu]
    }

    #[test]
    fn without_smt_far_processes_take_the_harness_core_last() {
        let order = |cores: usize| far_order(&(0..cores).collect::<Vec<_>>(), alone);
        assert_eq!(order(1), [0]);
        assert_eq!(order(2), [0, 1]);
        assert_eq!(order(4), [0, 2, 3, 1]);
        let sixteen = order(16);
        assert_eq!(&sixteen[..4], [0, 2, 3, 4]);
        assert_eq!(sixteen[15], HARNESS_CPU);
        let mut distinct = sixteen.clone();
        distinct.sort_unstable();
        assert_eq!(distinct, (0..16).collect::<Vec<_>>());
    }

    #[test]
    fn adjacent_siblings_give_each_far_process_a_core_of_its_own_first() {
        // Pairs (0,1), (2,3), …: the harness on CPU 1 shares its core with CPU 0.
        let pairs = |c: usize| vec![c & !1, c | 1];
        let order = far_order(&(0..8).collect::<Vec<_>>(), pairs);
        assert_eq!(order, [2, 4, 6, 3, 5, 7, 0, 1]);
    }

    #[test]
    fn offline_cpus_are_never_given() {
        // SMT turned off on the pairs above: the odd ids are gone, the harness's CPU with them.
        let order = far_order(&[0, 2, 4, 6], alone);
        assert_eq!(order, [2, 4, 6, 0]);
    }

    #[test]
    fn split_siblings_give_each_far_process_a_core_of_its_own_first() {
        // Cores (0,8), (1,9), …: the harness's sibling is CPU 9.
        let halves = |c: usize| vec![c % 8, c % 8 + 8];
        let order = far_order(&(0..16).collect::<Vec<_>>(), halves);
        assert_eq!(&order[..7], [0, 2, 3, 4, 5, 6, 7]);
        assert_eq!(&order[7..], [8, 10, 11, 12, 13, 14, 15, 9, 1]);
    }

    #[test]
    fn kernel_cpu_lists_parse() {
        assert_eq!(parse_cpu_list("0-1"), Some(vec![0, 1]));
        assert_eq!(parse_cpu_list("3,11"), Some(vec![3, 11]));
        assert_eq!(parse_cpu_list("0-1,8-9"), Some(vec![0, 1, 8, 9]));
        assert_eq!(parse_cpu_list("x"), None);
        assert_eq!(
            siblings(usize::MAX / 2),
            vec![usize::MAX / 2],
            "no such CPU: itself"
        );
    }
}
