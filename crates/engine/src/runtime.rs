//! A dedicated runtime for CPU-heavy work: Parquet decoding, filters, ops and IPC encoding.
//!
//! The Flight service's async threads only move messages; queries run here, so a burst of
//! decoding never delays accepting connections or answering `GetFlightInfo` (the pattern of
//! IOx's `DedicatedExecutor`). Every spawned task is owned by a [`pushdown_task::Task`] that aborts
//! it when dropped: when a client disconnects, tonic drops the response stream, the task goes
//! with it, and the query stops. The one exception, [`CpuRuntime::spawn_detached`], is for
//! work that ends by itself.

use std::future::Future;

use pushdown_task::Task;
use tokio::runtime::{Handle, Runtime};

/// Stack of each CPU thread.
const CPU_THREAD_STACK: usize = 32 << 20;

#[derive(Debug)]
pub struct CpuRuntime {
    runtime: Option<Runtime>,
    handle: Handle,
}

impl CpuRuntime {
    /// A runtime of `threads` threads called `name`.
    pub fn named(threads: usize, name: &str) -> std::io::Result<Self> {
        Self::yielding(threads, name, 0)
    }

    /// A runtime of `threads` threads called `name`, each `nice` steps below the priority of
    /// the thread that builds it (Linux; elsewhere, and where the kernel refuses, the same
    /// priority, with a warning). Lowering one's own priority needs no privilege.
    pub fn yielding(threads: usize, name: &str, nice: u8) -> std::io::Result<Self> {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        builder
            .worker_threads(threads.max(1))
            .thread_name(name)
            // Planning and execution recurse over query trees: deep stacks (reserved, not
            // committed until touched) keep a legal but deep query from overflowing.
            .thread_stack_size(CPU_THREAD_STACK)
            .enable_all();
        if nice > 0 {
            let base = priority::own();
            builder.on_thread_start(move || priority::set_own(base, nice));
        }
        let runtime = builder.build()?;
        let handle = runtime.handle().clone();
        Ok(Self {
            runtime: Some(runtime),
            handle,
        })
    }

    /// Runs `task` on the CPU runtime to its end, owned by nobody: for work that bounds
    /// itself (a read-ahead that expires). It stops with the runtime.
    pub fn spawn_detached<F>(&self, task: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        pushdown_task::detach_on(&self.handle, task);
    }

    /// Runs `task` on the CPU runtime; the task is aborted when its handle is dropped.
    pub fn spawn<F>(&self, task: F) -> Task<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        Task::spawn_on(&self.handle, task)
    }
}

impl Drop for CpuRuntime {
    fn drop(&mut self) {
        // Never blocks, so it is safe to drop from async code.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// The calling thread's nice value (Linux: it is per thread).
pub(crate) mod priority {
    /// The highest nice value (the lowest priority).
    const LOWEST: i32 = 19;

    /// The calling thread's nice value; 0 where it cannot be read.
    pub(crate) fn own() -> i32 {
        #[cfg(target_os = "linux")]
        {
            rustix::process::getpriority_process(Some(rustix::thread::gettid())).unwrap_or(0)
        }
        #[cfg(not(target_os = "linux"))]
        {
            0
        }
    }

    /// Sets the calling thread's nice value to `base + by` (at most the lowest priority).
    pub(super) fn set_own(base: i32, by: u8) {
        let nice = (base + i32::from(by)).min(LOWEST);
        #[cfg(target_os = "linux")]
        let result = rustix::process::setpriority_process(Some(rustix::thread::gettid()), nice)
            .map_err(std::io::Error::from);
        #[cfg(not(target_os = "linux"))]
        let result: std::io::Result<()> = Err(std::io::ErrorKind::Unsupported.into());
        if let Err(error) = result {
            tracing::warn!(%error, nice, "the CPU runtime's threads keep their priority");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_os = "linux")]
    #[test]
    fn a_yielding_runtimes_threads_run_below_the_builders_priority() {
        let base = priority::own();
        let nice_on = |runtime: &CpuRuntime| {
            let (tx, rx) = std::sync::mpsc::channel();
            runtime.spawn_detached(async move {
                let _ = tx.send(priority::own());
            });
            rx.recv_timeout(std::time::Duration::from_secs(30))
                .expect("the task ran")
        };
        let lowered = CpuRuntime::yielding(2, "test-yielding", 5).expect("runtime");
        assert_eq!(nice_on(&lowered), (base + 5).min(19));
        let plain = CpuRuntime::named(2, "test-plain").expect("runtime");
        assert_eq!(nice_on(&plain), base, "the same priority");
        // The builder's own thread is untouched.
        assert_eq!(priority::own(), base);
    }
}
