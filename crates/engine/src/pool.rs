//! One query's share of the server's memory: every query draws from the server's pool (the
//! total, `--memory-mib`) through a pool of its own with a smaller limit
//! (`--max-query-memory-mib`), so one query (a huge op output, a large sort) fails alone
//! with `ResourceExhausted` while the others keep their memory.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use datafusion::common::{Result, resources_datafusion_err};
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryLimit, MemoryPool, MemoryReservation};

/// A query's pool: a limit of its own over the shared pool beneath.
#[derive(Debug)]
pub struct QueryPool {
    shared: Arc<dyn MemoryPool>,
    limit: usize,
    used: AtomicUsize,
}

impl QueryPool {
    pub fn new(shared: Arc<dyn MemoryPool>, limit: usize) -> Self {
        Self {
            shared,
            limit,
            used: AtomicUsize::new(0),
        }
    }
}

impl std::fmt::Display for QueryPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "query pool: {} of {} bytes, over {}",
            self.used.load(Ordering::Relaxed),
            self.limit,
            self.shared
        )
    }
}

impl MemoryPool for QueryPool {
    fn name(&self) -> &str {
        "query"
    }

    fn register(&self, consumer: &MemoryConsumer) {
        self.shared.register(consumer);
    }

    fn unregister(&self, consumer: &MemoryConsumer) {
        self.shared.unregister(consumer);
    }

    fn grow(&self, reservation: &MemoryReservation, additional: usize) {
        self.shared.grow(reservation, additional);
        self.used.fetch_add(additional, Ordering::Relaxed);
    }

    fn shrink(&self, reservation: &MemoryReservation, shrink: usize) {
        self.shared.shrink(reservation, shrink);
        self.used.fetch_sub(shrink, Ordering::Relaxed);
    }

    fn try_grow(&self, reservation: &MemoryReservation, additional: usize) -> Result<()> {
        // This query's share first, then the server's: both must hold the bytes.
        self.used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                used.checked_add(additional).filter(|&n| n <= self.limit)
            })
            .map_err(|used| {
                resources_datafusion_err!(
                    "{} wants {additional} more bytes, over this query's memory limit of {} \
                     bytes ({used} in use by the query)",
                    reservation.consumer().name(),
                    self.limit
                )
            })?;
        if let Err(e) = self.shared.try_grow(reservation, additional) {
            self.used.fetch_sub(additional, Ordering::Relaxed);
            return Err(e);
        }
        Ok(())
    }

    fn reserved(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    fn memory_limit(&self) -> MemoryLimit {
        MemoryLimit::Finite(self.limit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::execution::memory_pool::GreedyMemoryPool;

    #[test]
    fn a_query_is_held_to_its_share_and_the_server_to_its_total() {
        let shared: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(1000));
        let a: Arc<dyn MemoryPool> = Arc::new(QueryPool::new(Arc::clone(&shared), 600));
        let b: Arc<dyn MemoryPool> = Arc::new(QueryPool::new(Arc::clone(&shared), 600));
        let ra = MemoryConsumer::new("a").register(&a);
        let rb = MemoryConsumer::new("b").register(&b);
        ra.try_grow(500).unwrap();
        let over = ra.try_grow(200).unwrap_err().to_string();
        assert!(over.contains("this query's memory limit of 600"), "{over}");
        assert_eq!(a.reserved(), 500);
        // The total binds b before its own share does; a refusal takes nothing.
        assert!(rb.try_grow(550).is_err());
        assert_eq!((b.reserved(), shared.reserved()), (0, 500));
        rb.try_grow(500).unwrap();
        drop(ra);
        assert_eq!((a.reserved(), shared.reserved()), (0, 500));
    }
}
