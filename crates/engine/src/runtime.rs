//! A dedicated runtime for CPU-heavy work: Parquet decoding, filters, ops and IPC encoding.
//!
//! The Flight service's async threads only move messages; queries run here, so a burst of
//! decoding never delays accepting connections or answering `GetFlightInfo` (the pattern of
//! IOx's `DedicatedExecutor`). Every spawned task is owned by a [`TaskGuard`] that aborts it
//! when dropped: when a client disconnects, tonic drops the response stream, the guard goes
//! with it, and the query stops. The one exception, [`CpuRuntime::spawn_detached`], is for
//! work that ends by itself.

use std::future::Future;

use tokio::runtime::{Handle, Runtime};
use tokio::task::JoinHandle;

/// Stack of each CPU thread.
const CPU_THREAD_STACK: usize = 32 << 20;

#[derive(Debug)]
pub struct CpuRuntime {
    runtime: Option<Runtime>,
    handle: Handle,
}

impl CpuRuntime {
    pub fn new(threads: usize) -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads.max(1))
            .thread_name("pushdown-cpu")
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
        drop(self.handle.spawn(task));
    }

    /// Runs `task` on the CPU runtime; the task is aborted when the guard is dropped.
    pub fn spawn<F>(&self, task: F) -> TaskGuard<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        TaskGuard(self.handle.spawn(task))
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

/// Owns a spawned task: dropping the guard aborts it.
#[derive(Debug)]
pub struct TaskGuard<T>(JoinHandle<T>);

impl<T> Drop for TaskGuard<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl<T: Send + 'static> TaskGuard<T> {
    /// Runs `task` on the runtime this is called from, owned by the guard.
    pub fn spawn_here<F>(task: F) -> Self
    where
        F: Future<Output = T> + Send + 'static,
    {
        TaskGuard(tokio::spawn(task))
    }
}

impl<T> TaskGuard<T> {
    /// Waits for the task; a panic in it becomes an error.
    pub async fn join(mut self) -> Result<T, tokio::task::JoinError> {
        (&mut self.0).await
    }
}
