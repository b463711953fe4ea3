//! What the Flight service shares among its requests: the node, and what only the front
//! end keeps (what adaptive streams learnt of each peer's link).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use parking_lot::Mutex;
use pushdown_engine::{ClientId, Node};
use tokio::sync::watch;

use crate::codec::LinkMemory;

/// Shared by every request of a server.
#[derive(Debug)]
pub(crate) struct State {
    pub(crate) node: Arc<Node>,
    /// What adaptive streams learnt of each peer's link, for the next stream to it.
    pub(crate) links: Mutex<HashMap<IpAddr, LinkMemory>>,
    /// Set when a shutdown's drain deadline passes: the streams still open end then.
    ending: watch::Sender<bool>,
}

impl State {
    pub(crate) fn new(node: Arc<Node>) -> Self {
        Self {
            links: Mutex::default(),
            node,
            ending: watch::Sender::new(false),
        }
    }

    /// Ends every stream still open (each with `ShuttingDown`, see [`State::streams_end`]).
    pub(crate) fn end_streams(&self) {
        self.ending.send_replace(true);
    }

    /// Completes once [`State::end_streams`] is called.
    pub(crate) async fn streams_end(&self) {
        let mut ending = self.ending.subscribe();
        // The sender is `self`'s, alive while this borrows it: `wait_for` ends only when set.
        let _ = ending.wait_for(|end| *end).await;
    }
}

/// Whose stream it is, as the engine compares clients: the reader the request named
/// (`READER_HEADER`: one loader, over however many connections, a reconnect included, and
/// never another loader on the same one), else its connection; a connection with no
/// address is another client's to every stream.
pub(crate) fn client_id(reader: Option<u64>, peer: Option<SocketAddr>) -> ClientId {
    match (reader, peer) {
        (Some(reader), _) => ClientId::new(("reader", reader)),
        (None, Some(peer)) => ClientId::new(("connection", peer)),
        (None, None) => ClientId::UNKNOWN,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(port: u16) -> Option<SocketAddr> {
        Some(SocketAddr::from(([127, 0, 0, 1], port)))
    }

    #[test]
    fn a_named_reader_is_one_client_over_any_connection() {
        assert_eq!(client_id(Some(7), addr(1)), client_id(Some(7), addr(2)));
        // Another loader on the first one's connection is another client.
        assert_ne!(client_id(Some(7), addr(1)), client_id(Some(8), addr(1)));
        // Unnamed, a connection is a client, and a reader is never a connection.
        assert_eq!(client_id(None, addr(1)), client_id(None, addr(1)));
        assert_ne!(client_id(None, addr(1)), client_id(None, addr(2)));
        assert_ne!(client_id(Some(1), None), client_id(None, addr(1)));
        assert_eq!(client_id(None, None), ClientId::UNKNOWN);
    }
}
