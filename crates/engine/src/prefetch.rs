//! Read-ahead across endpoints, for a lone reader taking them in order.
//!
//! A plain Flight client (pyarrow's `do_get` on each endpoint in turn) leaves the server idle
//! between two endpoints: while it finishes one stream and asks for the next, and while the
//! next one is opened and its first partition decoded. When a stream opens with no other
//! stream running, the server opens the endpoint that follows it in the same `FlightInfo`
//! and lets its partitions decode ahead within their budget (see
//! [`crate::query::ordered_stream`]). The client's `DoGet` for that ticket then takes the
//! stream as it is. Only the caller it was opened for can take it, and only unchanged: a
//! ticket placed differently (its ops left to the client) is opened afresh. Any other stream
//! that opens drops it, since the server no longer serves one reader; so does
//! [`HELD_FOR`] unclaimed, and a file that changed since. A shard the fragment cache holds
//! is not read ahead. What is held is bounded by one
//! stream's decode budget (about 32 MiB).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;

use crate::query::Opened;

/// The successors remembered, in ticket bytes; the oldest plans are forgotten first.
const SUCCESSOR_BYTES: usize = 16 << 20;

/// How long a stream opened ahead waits for its reader.
pub const HELD_FOR: Duration = Duration::from_secs(30);

/// What is held is an opened stream; the tests hold stand-ins.
pub struct Prefetch<T = Opened> {
    successors: Mutex<Successors>,
    held: Mutex<Option<Held<T>>>,
    /// Bumped by every stream that opens: a read-ahead started before it is stale.
    generation: AtomicU64,
}

impl<T> Default for Prefetch<T> {
    fn default() -> Self {
        Self {
            successors: Mutex::default(),
            held: Mutex::new(None),
            generation: AtomicU64::new(0),
        }
    }
}

impl<T> std::fmt::Debug for Prefetch<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prefetch")
            .field("successors", &self.successors.lock().map.len())
            .field("held", &self.held.lock().is_some())
            .finish()
    }
}

#[derive(Default)]
struct Successors {
    map: HashMap<Bytes, Bytes>,
    order: VecDeque<Bytes>,
    bytes: usize,
}

/// A stream opened ahead for `principal`'s `ticket`.
struct Held<T> {
    principal: Arc<str>,
    ticket: Bytes,
    opened: T,
    generation: u64,
}

/// What [`Prefetch::pick_up`] found.
#[cfg_attr(test, derive(PartialEq))]
#[derive(Debug)]
pub enum Pickup<T> {
    /// Nothing was held.
    None,
    /// The stream held for this caller's ticket.
    Taken(T),
    /// A stream held for another ticket or caller, now dropped.
    Dropped,
}

impl<T> Prefetch<T> {
    /// Remembers the tickets of one plan, in endpoint order: each one's successor.
    pub fn remember(&self, tickets: &[Bytes]) {
        let mut s = self.successors.lock();
        for pair in tickets.windows(2) {
            let (ticket, next) = (&pair[0], &pair[1]);
            match s.map.insert(ticket.clone(), next.clone()) {
                None => {
                    s.bytes += ticket.len() + next.len();
                    s.order.push_back(ticket.clone());
                }
                // A new plan gave the ticket another successor (a file in between changed).
                Some(old) => s.bytes = s.bytes + next.len() - old.len(),
            }
        }
        while s.bytes > SUCCESSOR_BYTES {
            let Some(old) = s.order.pop_front() else {
                break;
            };
            if let Some(next) = s.map.remove(&old) {
                s.bytes -= old.len() + next.len();
            }
        }
    }

    /// The ticket planned after `ticket`, if one was.
    pub fn successor(&self, ticket: &[u8]) -> Option<Bytes> {
        self.successors.lock().map.get(ticket).cloned()
    }

    /// A stream opens for `principal`'s `ticket`: takes what was opened ahead for it, or
    /// drops what was opened ahead for anything else. Read-aheads still opening are stale.
    pub fn pick_up(&self, principal: &str, ticket: &[u8]) -> Pickup<T> {
        self.generation.fetch_add(1, Ordering::SeqCst);
        match self.held.lock().take() {
            None => Pickup::None,
            Some(h) if &*h.principal == principal && h.ticket == ticket => Pickup::Taken(h.opened),
            Some(_) => Pickup::Dropped,
        }
    }

    /// Starts a read-ahead: its generation, which [`Prefetch::hold`] checks.
    pub fn begin(&self) -> u64 {
        self.generation.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// Holds `opened` for `principal`'s `ticket`, unless a stream opened since the read-ahead
    /// began. Returns whether it is held.
    pub fn hold(&self, generation: u64, principal: Arc<str>, ticket: Bytes, opened: T) -> bool {
        let mut held = self.held.lock();
        if self.generation.load(Ordering::SeqCst) != generation {
            return false;
        }
        *held = Some(Held {
            principal,
            ticket,
            opened,
            generation,
        });
        true
    }

    /// Whether a stream is held now.
    pub fn holds(&self) -> bool {
        self.held.lock().is_some()
    }

    /// Drops the read-ahead of `generation` if it is still held: its reader never came.
    pub fn expire(&self, generation: u64) -> bool {
        let mut held = self.held.lock();
        if held.as_ref().is_some_and(|h| h.generation == generation) {
            *held = None;
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use std::sync::Arc;

    use super::{Pickup, Prefetch, SUCCESSOR_BYTES};

    #[test]
    fn only_its_caller_takes_a_held_stream_and_a_stale_one_is_never_held() {
        let p: Prefetch<u32> = Prefetch::default();
        let (me, ticket) = (Arc::<str>::from("me"), Bytes::from_static(b"t1"));
        // Held, then taken by the same caller for the same ticket: once.
        let g = p.begin();
        assert!(p.hold(g, Arc::clone(&me), ticket.clone(), 1));
        assert!(p.holds());
        assert_eq!(p.pick_up("me", b"t1"), Pickup::Taken(1));
        assert_eq!(p.pick_up("me", b"t1"), Pickup::None);
        // Another caller, or another ticket, drops it.
        for (who, t) in [("you", &b"t1"[..]), ("me", &b"t2"[..])] {
            let g = p.begin();
            assert!(p.hold(g, Arc::clone(&me), ticket.clone(), 2));
            assert_eq!(p.pick_up(who, t), Pickup::Dropped);
            assert!(!p.holds());
        }
        // A stream that opened while the read-ahead was opening makes it stale: not held.
        let g = p.begin();
        assert_eq!(p.pick_up("you", b"t9"), Pickup::None);
        assert!(!p.hold(g, Arc::clone(&me), ticket.clone(), 3));
        assert!(!p.holds());
        // Expiry drops its own read-ahead, never a newer one.
        let old = p.begin();
        assert!(p.hold(old, Arc::clone(&me), ticket.clone(), 4));
        assert!(p.expire(old));
        assert!(!p.holds());
        let newer = p.begin();
        assert!(p.hold(newer, Arc::clone(&me), ticket.clone(), 5));
        assert!(!p.expire(old));
        assert_eq!(p.pick_up("me", b"t1"), Pickup::Taken(5));
    }

    #[test]
    fn successors_follow_the_plan_and_old_plans_are_forgotten() {
        let p: Prefetch<()> = Prefetch::default();
        let t = |s: &str| Bytes::from(s.to_owned());
        p.remember(&[t("a"), t("b"), t("c")]);
        assert_eq!(p.successor(b"a"), Some(t("b")));
        assert_eq!(p.successor(b"b"), Some(t("c")));
        assert_eq!(p.successor(b"c"), None);
        // A later plan with another successor replaces it, and its bytes.
        p.remember(&[t("b"), t("dd")]);
        assert_eq!(p.successor(b"b"), Some(t("dd")));
        assert_eq!(p.successors.lock().bytes, 2 + 3);
        // Plans past the byte budget push the oldest out.
        let big: Vec<Bytes> = (0..40)
            .map(|i| Bytes::from(format!("{i}:{}", "x".repeat(SUCCESSOR_BYTES / 32))))
            .collect();
        p.remember(&big);
        assert_eq!(p.successor(b"a"), None);
        assert_eq!(p.successor(&big[38]), Some(big[39].clone()));
    }
}
