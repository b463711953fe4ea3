//! What the Flight service shares among its requests: the node, and what only the front
//! end keeps (stream admission, what adaptive streams learnt of each peer's link).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;
use pushdown_engine::Node;
use tokio::sync::Semaphore;

use crate::codec::LinkMemory;

/// Shared by every request of a server.
#[derive(Debug)]
pub(crate) struct State {
    pub(crate) node: Arc<Node>,
    /// `DoGet` streams admitted at once (`ServerConfig::max_concurrent_streams`).
    pub(crate) streams: Arc<Semaphore>,
    /// What adaptive streams learnt of each peer's link, for the next stream to it.
    pub(crate) links: Mutex<HashMap<IpAddr, LinkMemory>>,
    /// The streams on the reducing cores, by client connection.
    pub(crate) reducing: Reducing,
}

impl State {
    pub(crate) fn new(node: Arc<Node>) -> Self {
        Self {
            streams: Arc::new(Semaphore::new(node.config.max_concurrent_streams.max(1))),
            links: Mutex::default(),
            reducing: Reducing::default(),
            node,
        }
    }
}

/// The streams running on the reducing cores (the CPU runtime), each with its client's
/// connection: tells a stream whether another client's ran there alongside it
/// (`StreamStats::reduced_alone`). A trainer whose shards wait there only behind its own
/// learns nothing of the server's other load from their wait; one that waited behind
/// another client's does.
#[derive(Debug, Default)]
pub(crate) struct Reducing {
    running: Mutex<Vec<Running>>,
}

#[derive(Debug)]
struct Running {
    client: Client,
    /// Shared with the stream's [`Place`], which it also names.
    accompanied: Arc<AtomicBool>,
}

/// Whose stream it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Client {
    /// The reader the request named (`READER_HEADER`): one loader, over however many
    /// connections (a reconnect keeps it), and never another loader on the same one.
    Reader(u64),
    /// A request that named none: its connection.
    Connection(SocketAddr),
    /// A connection with no address: another client's to every stream.
    Unknown,
}

impl Client {
    pub(crate) fn of(reader: Option<u64>, peer: Option<SocketAddr>) -> Self {
        match (reader, peer) {
            (Some(reader), _) => Client::Reader(reader),
            (None, Some(peer)) => Client::Connection(peer),
            (None, None) => Client::Unknown,
        }
    }
}

impl Reducing {
    /// Counts a stream of `client`'s among the running ones until the returned place drops.
    /// Two streams overlap from the later one's start: each overlap is seen here.
    pub(crate) fn join(&self, client: Client) -> Place<'_> {
        let accompanied = Arc::new(AtomicBool::new(false));
        let mut running = self.running.lock();
        for other in running.iter() {
            if client == Client::Unknown || other.client != client {
                other.accompanied.store(true, Ordering::Relaxed);
                accompanied.store(true, Ordering::Relaxed);
            }
        }
        running.push(Running {
            client,
            accompanied: Arc::clone(&accompanied),
        });
        Place {
            reducing: self,
            accompanied,
        }
    }
}

/// A stream's place among the running ones (see [`Reducing::join`]).
pub(crate) struct Place<'a> {
    reducing: &'a Reducing,
    accompanied: Arc<AtomicBool>,
}

impl Place<'_> {
    /// No other client's stream ran on the reducing cores since this one joined.
    pub(crate) fn alone(&self) -> bool {
        !self.accompanied.load(Ordering::Relaxed)
    }
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        self.reducing
            .running
            .lock()
            .retain(|r| !Arc::ptr_eq(&r.accompanied, &self.accompanied));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(port: u16) -> Client {
        Client::Connection(SocketAddr::from(([127, 0, 0, 1], port)))
    }

    #[test]
    fn a_stream_is_alone_until_another_clients_runs_beside_it() {
        let reducing = Reducing::default();
        let first = reducing.join(addr(1));
        let own = reducing.join(addr(1));
        assert!(
            first.alone() && own.alone(),
            "the same client's streams are no company"
        );
        let other = reducing.join(addr(2));
        assert!(!first.alone() && !own.alone() && !other.alone());
        drop((first, own, other));
        // Once the others have ended, a new stream runs alone again.
        let later = reducing.join(addr(2));
        assert!(later.alone());
        // A stream of a connection with no address is another client's to everyone.
        let unknown = reducing.join(Client::Unknown);
        assert!(!later.alone() && !unknown.alone());
        drop((later, unknown));
        assert!(reducing.running.lock().is_empty());
    }

    #[test]
    fn a_named_reader_is_one_client_over_any_connection() {
        let reducing = Reducing::default();
        let first = reducing.join(Client::of(Some(7), addr_of(1)));
        let reconnected = reducing.join(Client::of(Some(7), addr_of(2)));
        assert!(first.alone() && reconnected.alone());
        // Another loader on the first one's connection is another client.
        let other = reducing.join(Client::of(Some(8), addr_of(1)));
        assert!(!first.alone() && !other.alone());
    }

    fn addr_of(port: u16) -> Option<SocketAddr> {
        Some(SocketAddr::from(([127, 0, 0, 1], port)))
    }

    #[test]
    fn a_stream_that_came_and_went_meanwhile_still_counts() {
        let reducing = Reducing::default();
        let long = reducing.join(addr(1));
        drop(reducing.join(addr(2)));
        assert!(!long.alone());
    }
}
