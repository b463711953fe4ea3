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
    pub fn new(threads: usize) -> std::io::Result<Self> {
        Self::named(threads, "pushdown-cpu")
    }

    /// A runtime of `threads` threads called `name`.
    pub fn named(threads: usize, name: &str) -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads.max(1))
            .thread_name(name)
            // Planning and execution recurse over query trees: deep stacks (reserved, not
            // committed until touched) keep a legal but deep query from overflowing.
            .thread_stack_size(CPU_THREAD_STACK)
            .enable_all()
            .build()?;
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
