//! Keeping the loader's threads off the training process's other cores
//! ([`LoaderOptions::cpu_affinity`](crate::LoaderOptions::cpu_affinity)): a trainer whose
//! CPU is busy launches its accelerator's kernels late (the "noisy neighbour" SPDL measured),
//! so the loader's network and op threads can be confined to CPUs of their own.

use crate::error::{ClientError, Result};

/// The environment variable naming the loader's CPUs when the options name none
/// (`0-3,8`: the list form `taskset -c` and cgroups' `cpuset.cpus` take).
pub const LOADER_CPUS_ENV: &str = "PUSHDOWN_LOADER_CPUS";

/// CPUs in the list form `0-3,8,10-11`, sorted, each once.
pub fn parse_cpus(text: &str) -> Result<Vec<usize>> {
    let bad = |why: &str| ClientError::Invalid(format!("CPU list {text:?}: {why} (the form is 0-3,8)"));
    let mut cpus = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let number = |s: &str| {
            s.trim()
                .parse::<usize>()
                .map_err(|_| bad(&format!("{s:?} is not a CPU number")))
        };
        match part.split_once('-') {
            Some((first, last)) => {
                let (first, last) = (number(first)?, number(last)?);
                if first > last {
                    return Err(bad(&format!("the range {part} runs backwards")));
                }
                cpus.extend(first..=last);
            }
            None => cpus.push(number(part)?),
        }
    }
    if cpus.is_empty() {
        return Err(bad("no CPU named"));
    }
    cpus.sort_unstable();
    cpus.dedup();
    Ok(cpus)
}

/// The CPUs the loader's threads are confined to: `given`, else [`LOADER_CPUS_ENV`], else
/// none (the threads run wherever the process may). Each must be one this process may run
/// on: a CPU outside its set is an error naming the set, never a silent no-op.
pub(crate) fn loader_cpus(given: Option<&[usize]>) -> Result<Option<Vec<usize>>> {
    let cpus = match given {
        Some([]) => {
            return Err(ClientError::Invalid("cpu_affinity names no CPU".into()));
        }
        Some(cpus) => cpus.to_vec(),
        None => match std::env::var(LOADER_CPUS_ENV) {
            Ok(text) if !text.trim().is_empty() => {
                parse_cpus(&text).map_err(|e| ClientError::Invalid(format!("{LOADER_CPUS_ENV}: {e}")))?
            }
            _ => return Ok(None),
        },
    };
    let allowed = allowed_cpus()?;
    let outside: Vec<usize> = cpus.iter().copied().filter(|c| !allowed.contains(c)).collect();
    if !outside.is_empty() {
        return Err(ClientError::Invalid(format!(
            "cpu_affinity names CPU(s) {outside:?}, outside the CPUs this process may run on \
             {allowed:?}"
        )));
    }
    Ok(Some(cpus))
}

/// The CPUs this process may run on: its main thread's set (the calling thread may have
/// been confined to fewer, as a training thread pinned to its own CPU is).
#[cfg(target_os = "linux")]
pub fn allowed_cpus() -> Result<Vec<usize>> {
    use nix::sched::{CpuSet, sched_getaffinity};
    use nix::unistd::Pid;
    let set = sched_getaffinity(Pid::this())
        .map_err(|e| ClientError::io("reading this process's CPUs", std::io::Error::from(e)))?;
    Ok((0..CpuSet::count())
        .filter(|&c| set.is_set(c).unwrap_or(false))
        .collect())
}

#[cfg(not(target_os = "linux"))]
pub fn allowed_cpus() -> Result<Vec<usize>> {
    Err(ClientError::Invalid("cpu_affinity works on Linux only".into()))
}

/// Confines the calling thread to `cpus`.
#[cfg(target_os = "linux")]
pub fn confine_current_thread(cpus: &[usize]) -> Result<()> {
    use nix::sched::{CpuSet, sched_setaffinity};
    use nix::unistd::Pid;
    let mut set = CpuSet::new();
    for &cpu in cpus {
        set.set(cpu)
            .map_err(|_| ClientError::Invalid(format!("CPU {cpu} is beyond the CPUs a set can name")))?;
    }
    sched_setaffinity(Pid::from_raw(0), &set).map_err(|e| {
        ClientError::io(
            format!("confining a thread to CPUs {cpus:?}"),
            std::io::Error::from(e),
        )
    })
}

#[cfg(not(target_os = "linux"))]
pub fn confine_current_thread(_cpus: &[usize]) -> Result<()> {
    Err(ClientError::Invalid("cpu_affinity works on Linux only".into()))
}

/// [`confine_current_thread`] for a loader thread (`cpus` checked by [`loader_cpus`]): a
/// refusal is logged, never fatal (the thread runs on, unconfined).
pub(crate) fn confine_this_thread(cpus: &[usize]) {
    if let Err(e) = confine_current_thread(cpus) {
        tracing::warn!(error = %e, "cpu_affinity: a loader thread runs unconfined");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_parse_as_taskset_writes_them() {
        assert_eq!(parse_cpus("0-3,8").unwrap(), vec![0, 1, 2, 3, 8]);
        assert_eq!(parse_cpus(" 5 , 1-2,2 ").unwrap(), vec![1, 2, 5]);
        for bad in ["", "a", "3-1", "1-", ",", "-1"] {
            assert!(matches!(parse_cpus(bad), Err(ClientError::Invalid(_))), "{bad:?}");
        }
    }

    /// The calling thread's own CPUs.
    fn this_thread() -> Vec<usize> {
        use nix::sched::{CpuSet, sched_getaffinity};
        let set = sched_getaffinity(nix::unistd::Pid::from_raw(0)).unwrap();
        (0..CpuSet::count())
            .filter(|&c| set.is_set(c).unwrap_or(false))
            .collect()
    }

    #[test]
    fn a_thread_is_confined_to_the_cpus_given() {
        let allowed = allowed_cpus().unwrap();
        let (first, last) = (allowed[0], *allowed.last().unwrap());
        let cpus = loader_cpus(Some(&[first])).unwrap().unwrap();
        let (seen, process, from_confined) = std::thread::spawn(move || {
            confine_this_thread(&cpus);
            // A thread confined to one CPU (a training thread) may still give the loader
            // another CPU of the process.
            (this_thread(), allowed_cpus().unwrap(), loader_cpus(Some(&[last])))
        })
        .join()
        .unwrap();
        assert_eq!(seen, vec![first]);
        assert_eq!(
            process, allowed,
            "the process's CPUs are its own, not the calling thread's"
        );
        assert_eq!(from_confined.unwrap(), Some(vec![last]));
        assert_eq!(this_thread(), allowed, "other threads are untouched");
        let outside = allowed.iter().max().unwrap() + 1;
        let err = loader_cpus(Some(&[outside])).unwrap_err().to_string();
        assert!(err.contains("outside the CPUs this process may run on"), "{err}");
    }
}
