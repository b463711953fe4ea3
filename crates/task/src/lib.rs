//! The one way pushdown spawns async work, on servers and clients alike.
//!
//! A [`Task`] is owned: dropping it aborts the work. A query whose client disconnected, a
//! shard stream the loader dropped, a producer of an epoch nobody reads any more all stop
//! with their owner instead of running on, holding cores, memory and connections. Work that
//! must outlive every owner and ends by itself (a best-effort report, a server's accept
//! loop handed to the caller) says so with [`detach`].
//!
//! `tokio::spawn` and `Handle::spawn` are banned in the workspace's `clippy.toml`
//! (`disallowed-methods`); this crate is the one place that calls them.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use pushdown_task::Task;
//! let task = Task::spawn(async { 6 * 7 });
//! assert_eq!(task.await.unwrap(), 42);
//!
//! let forever = Task::spawn(std::future::pending::<()>());
//! drop(forever); // aborted: nothing keeps running
//! # }
//! ```
#![allow(clippy::disallowed_methods)]

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::runtime::Handle;
use tokio::task::{JoinError, JoinHandle};

/// A spawned task owned by this value: dropping it aborts the task. Awaiting it gives the
/// task's output, or the [`JoinError`] of a task that panicked or was aborted.
#[derive(Debug)]
#[must_use = "a task is aborted when its handle is dropped; use `detach` for work nobody owns"]
pub struct Task<T> {
    handle: JoinHandle<T>,
}

impl<T: Send + 'static> Task<T> {
    /// Runs `future` on the runtime this is called from. Panics outside a runtime, as
    /// `tokio::spawn` does.
    pub fn spawn<F>(future: F) -> Self
    where
        F: Future<Output = T> + Send + 'static,
    {
        Self {
            handle: tokio::spawn(future),
        }
    }

    /// Runs `future` on the runtime of `handle` (another runtime than the caller's: a
    /// server's CPU runtime, a client's own).
    pub fn spawn_on<F>(handle: &Handle, future: F) -> Self
    where
        F: Future<Output = T> + Send + 'static,
    {
        Self {
            handle: handle.spawn(future),
        }
    }
}

impl<T> Task<T> {
    /// Whether the task has ended (finished, panicked or aborted).
    pub fn is_finished(&self) -> bool {
        self.handle.is_finished()
    }

    /// Aborts the task now, keeping the handle to await its end.
    pub fn abort(&self) {
        self.handle.abort();
    }
}

impl<T> Drop for Task<T> {
    fn drop(&mut self) {
        self.handle.abort();
    }
}

impl<T> Future for Task<T> {
    type Output = Result<T, JoinError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.handle).poll(cx)
    }
}

/// Runs `future` on the runtime this is called from, owned by nobody: for work that ends by
/// itself and must not stop with the caller (a best-effort report).
pub fn detach<F>(future: F)
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    drop(tokio::spawn(future));
}

/// [`detach`] on the runtime of `handle`.
pub fn detach_on<F>(handle: &Handle, future: F)
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    drop(handle.spawn(future));
}

/// What a caught panic said (`catch_unwind`'s payload, or a task's).
pub fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".to_owned())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use super::*;

    /// Sets its flag when dropped: the future it lives in was dropped (aborted or done).
    struct Flag(Arc<AtomicBool>);

    impl Drop for Flag {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    #[tokio::test]
    async fn dropping_the_task_aborts_it() {
        let dropped = Arc::new(AtomicBool::new(false));
        let flag = Flag(Arc::clone(&dropped));
        let task = Task::spawn(async move {
            let _flag = flag;
            std::future::pending::<()>().await;
        });
        tokio::task::yield_now().await;
        assert!(!dropped.load(Ordering::SeqCst));
        drop(task);
        for _ in 0..100 {
            if dropped.load(Ordering::SeqCst) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the task kept running after its handle was dropped");
    }

    #[tokio::test]
    async fn a_detached_task_runs_to_its_end() {
        let (tx, rx) = tokio::sync::oneshot::channel();
        detach(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let _ = tx.send(7);
        });
        assert_eq!(rx.await.unwrap(), 7);
    }

    #[tokio::test]
    async fn a_panic_is_the_awaiters_error() {
        let task: Task<u32> = Task::spawn(async {
            let boom = true;
            assert!(!boom, "boom");
            1
        });
        let err = task.await.unwrap_err();
        assert!(err.is_panic());
    }
}
