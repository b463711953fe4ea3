//! Who reduced alone: the streams running on the reducing cores, each with its client, so a
//! stream can say whether another client's ran there alongside it
//! (`StreamStats::reduced_alone`). A trainer whose shards wait there only behind its own
//! learns nothing of the server's other load from their wait; one that waited behind
//! another client's does.

use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;

/// Whose stream it is, as the front end knows its clients (a reader the request named, a
/// connection): opaque to the engine, which only compares two of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientId(Option<u64>);

impl ClientId {
    /// A client known by `key` (streams with equal keys are one client's).
    pub fn new(key: impl Hash) -> Self {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        key.hash(&mut hasher);
        Self(Some(hasher.finish()))
    }

    /// A client the front end cannot name: another client's to every stream.
    pub const UNKNOWN: ClientId = ClientId(None);
}

/// The streams running on the reducing cores now.
#[derive(Debug, Default)]
pub(crate) struct Company {
    running: Mutex<Vec<Running>>,
}

#[derive(Debug)]
struct Running {
    client: ClientId,
    /// Shared with the stream's [`Seat`].
    accompanied: Arc<AtomicBool>,
}

impl Company {
    /// Counts a stream of `client`'s among the running ones until the returned seat drops.
    /// Two streams overlap from the later one's start: each overlap is seen here.
    pub(crate) fn join(self: &Arc<Self>, client: ClientId) -> Seat {
        let accompanied = Arc::new(AtomicBool::new(false));
        let mut running = self.running.lock();
        for other in running.iter() {
            if client == ClientId::UNKNOWN || other.client != client {
                other.accompanied.store(true, Ordering::Relaxed);
                accompanied.store(true, Ordering::Relaxed);
            }
        }
        running.push(Running {
            client,
            accompanied: Arc::clone(&accompanied),
        });
        Seat {
            company: Arc::clone(self),
            accompanied,
        }
    }
}

/// A stream's seat among the running ones (see [`Company::join`]).
#[derive(Debug)]
pub(crate) struct Seat {
    company: Arc<Company>,
    accompanied: Arc<AtomicBool>,
}

impl Seat {
    /// No other client's stream ran on the reducing cores since this one joined.
    pub(crate) fn alone(&self) -> bool {
        !self.accompanied.load(Ordering::Relaxed)
    }
}

impl Drop for Seat {
    fn drop(&mut self) {
        self.company
            .running
            .lock()
            .retain(|r| !Arc::ptr_eq(&r.accompanied, &self.accompanied));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(port: u16) -> ClientId {
        ClientId::new(("connection", port))
    }

    #[test]
    fn a_stream_is_alone_until_another_clients_runs_beside_it() {
        let company = Arc::new(Company::default());
        let first = company.join(client(1));
        let own = company.join(client(1));
        assert!(
            first.alone() && own.alone(),
            "the same client's streams are no company"
        );
        let other = company.join(client(2));
        assert!(!first.alone() && !own.alone() && !other.alone());
        drop((first, own, other));
        // Once the others have ended, a new stream runs alone again.
        let later = company.join(client(2));
        assert!(later.alone());
        // A stream of a client the front end cannot name is another client's to everyone.
        let unknown = company.join(ClientId::UNKNOWN);
        assert!(!later.alone() && !unknown.alone());
        drop((later, unknown));
        assert!(company.running.lock().is_empty());
    }

    #[test]
    fn a_stream_that_came_and_went_meanwhile_still_counts() {
        let company = Arc::new(Company::default());
        let long = company.join(client(1));
        drop(company.join(client(2)));
        assert!(!long.alone());
    }
}
