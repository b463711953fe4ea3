//! One function per decoder of outside input: the bytes a client, a trainer's saved state or
//! a data file brings. Each function is a property: any input gives an answer or an error,
//! never a panic; where a decoder has an encoder, what decodes re-encodes to what decodes
//! alike.
//!
//! libFuzzer runs them (`fuzz/fuzz_targets/<name>.rs`, one line each; `scripts/fuzz.sh NAME
//! SECONDS`, nightly Rust), and the test suite replays each one's checked-in corpus
//! (`fuzz/corpus/<name>/`) on stable Rust, so a crash once found stays fixed.
//!
//! A panic that the code under test contains on purpose (the engine decodes Parquet footers
//! and the server a client's Arrow IPC parameters under `catch_unwind`, and answers an
//! error; the client contains Arrow's decoder the same way) is the answer, not a crash: the
//! targets that reach such code (`sql`, `parquet`, `parameters`, `client_ipc`) count them ([`contained_panics`]) instead of letting libFuzzer's
//! hook abort on them. A panic that escapes a function is a crash in every target.
//!
//! Inputs of several messages (a Flight stream) are split by [`split_messages`].

mod client;
mod engine;
mod messages;
mod seeds;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, Once};

pub use client::{client_ipc, loader_state};
pub use engine::{audio, parquet, sql, tokens, views};
pub use messages::{
    command, flight_sql, join_messages, messages, parameters, pipeline, prepared_handle, split_messages,
    ticket,
};
pub use seeds::seeds;

/// A fuzz target: the property its input must hold.
pub type Target = fn(&[u8]);

/// Every target by name: the name of its corpus folder and of its libFuzzer binary.
pub const TARGETS: &[(&str, Target)] = &[
    ("ticket", ticket),
    ("command", command),
    ("messages", messages),
    ("flight_sql", flight_sql),
    ("parameters", parameters),
    ("prepared_handle", prepared_handle),
    ("sql", sql),
    ("pipeline", pipeline),
    ("loader_state", loader_state),
    ("parquet", parquet),
    ("client_ipc", client_ipc),
    ("tokens", tokens),
    ("views", views),
    ("audio", audio),
];

static CONTAINED: AtomicU64 = AtomicU64::new(0);
static LAST: Mutex<String> = Mutex::new(String::new());
static HOOK: Once = Once::new();

/// Panics contained by the code under test (caught and answered as errors) so far in this
/// process.
pub fn contained_panics() -> u64 {
    CONTAINED.load(Ordering::Relaxed)
}

/// The last panic's message and place, contained or not.
pub fn last_panic() -> String {
    LAST.lock().map(|m| m.clone()).unwrap_or_default()
}

/// Counts panics and keeps the last one's message instead of printing it. libFuzzer's hook
/// aborts on any panic, a caught one included; this one does not, and a panic that escapes a
/// target still aborts the fuzzer (libFuzzer's harness catches it) and fails the corpus
/// replay (which reports [`last_panic`]).
pub(crate) fn count_contained_panics() {
    HOOK.call_once(|| {
        // `RUST_BACKTRACE` set: the last panic keeps where it came from too (a replay's
        // failure then says which code panicked, not only the panic's own line).
        let traced = std::env::var_os("RUST_BACKTRACE").is_some_and(|v| v != "0");
        std::panic::set_hook(Box::new(move |info| {
            CONTAINED.fetch_add(1, Ordering::Relaxed);
            if let Ok(mut last) = LAST.lock() {
                *last = if traced {
                    format!("{info}\n{}", std::backtrace::Backtrace::force_capture())
                } else {
                    info.to_string()
                };
            }
        }));
    });
}

#[cfg(test)]
mod tests;
