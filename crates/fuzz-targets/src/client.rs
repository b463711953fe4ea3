//! What a client decodes: a trainer's saved loader state and a server's `DoGet` stream.

use std::sync::LazyLock;

use arrow_flight::decode::{DecodedPayload, FlightDataDecoder};
use arrow_flight::error::FlightError;
use pushdown_client::LoaderState;
use pushdown_protocol::StreamStats;

use crate::{count_contained_panics, split_messages};

/// `LoaderState` bytes (a checkpoint's, from any version of pushdown): decoded to a state or
/// an error; a decoded state re-encodes to bytes that decode to the same state.
pub fn loader_state(data: &[u8]) {
    if let Ok(state) = LoaderState::from_bytes(data) {
        let bytes = state.to_bytes();
        let again = LoaderState::from_bytes(&bytes).expect("a re-encoded state decodes");
        assert_eq!(again.to_bytes(), bytes);
    }
}

static RUNTIME: LazyLock<tokio::runtime::Runtime> = LazyLock::new(|| {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime")
});

/// A server's `DoGet` stream (split by [`split_messages`]) as the client reads it: a
/// metadata-only message is the server's trailer (`StreamStats`), every other one is
/// checked (`pushdown_client::check_ipc_message`) and goes to Arrow Flight's IPC decoder
/// (`pushdown_client::next_decoded`), and each batch decoded is read through.
pub fn client_ipc(data: &[u8]) {
    // The client contains what Arrow's decoder panics on (`next_decoded`): its answer.
    count_contained_panics();
    let mut messages = Vec::new();
    for message in split_messages(data) {
        if message.data_header.is_empty() {
            let _ = StreamStats::decode(&message.app_metadata);
        } else {
            // As the client's stream does: checked, then decoded.
            let checked = pushdown_client::check_ipc_message(&message).map(|()| message);
            messages.push(checked.map_err(FlightError::DecodeError));
        }
    }
    RUNTIME.block_on(async {
        let mut decoder = FlightDataDecoder::new(futures::stream::iter(messages));
        while let Some(item) = pushdown_client::next_decoded(&mut decoder).await {
            match item {
                Ok(decoded) => {
                    if let DecodedPayload::RecordBatch(batch) = decoded.payload {
                        // What the loader does first with a batch: its rows, sliced.
                        let half = batch.num_rows() / 2;
                        let _ = batch.slice(half, batch.num_rows() - half).get_array_memory_size();
                    }
                }
                Err(_) => break,
            }
        }
    });
}
