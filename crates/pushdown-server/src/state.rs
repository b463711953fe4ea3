//! What the Flight service shares among its requests: the node, and what only the front
//! end keeps (stream admission, what adaptive streams learnt of each peer's link).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

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
}

impl State {
    pub(crate) fn new(node: Arc<Node>) -> Self {
        Self {
            streams: Arc::new(Semaphore::new(node.config.max_concurrent_streams.max(1))),
            links: Mutex::default(),
            node,
        }
    }
}
