//! What the client checks of a server's Arrow IPC message before Arrow decodes it.
//!
//! A compressed IPC buffer starts with the length it claims uncompressed, and Arrow's
//! decoder allocates that length before decompressing: one corrupt or hostile message
//! claiming petabytes aborted the trainer's process (found by the `client_ipc` fuzz target,
//! `crates/fuzz-targets`); a buffer past the body's end made Arrow panic (the same). Both are
//! checked first, and such a message is then the stream's error. What the check does not
//! cover (Arrow's decoder panics on other malformed headers too: a misaligned buffer, found
//! the same way) is contained by [`next_decoded`], as the server contains it for a client's
//! parameters.

use std::panic::AssertUnwindSafe;

use arrow_flight::FlightData;
use arrow_flight::decode::{DecodedFlightData, FlightDataDecoder};
use arrow_flight::error::FlightError;
use futures::{FutureExt, StreamExt};

/// The most bytes one buffer of a record batch may claim uncompressed: 4× the largest batch
/// a server cuts (`ServerConfig::max_op_batch_bytes`, 256 MiB by default).
pub const MAX_DECODED_BUFFER_BYTES: u64 = 1 << 30;

/// Whether `data` (a message with an IPC header) may be handed to Arrow's decoder: every
/// buffer of a batch lies within the message body (Arrow slices them unchecked and panics
/// past the end), and a compressed buffer claims at most [`MAX_DECODED_BUFFER_BYTES`]
/// uncompressed. Schemas and the rest of a header are Arrow's to check.
pub fn check_message(data: &FlightData) -> Result<(), String> {
    use arrow::ipc::MessageHeader;
    let Ok(message) = arrow::ipc::root_as_message(&data.data_header) else {
        return Ok(()); // Arrow's decoder names the malformed header.
    };
    let batch = match message.header_type() {
        MessageHeader::RecordBatch => message.header_as_record_batch(),
        MessageHeader::DictionaryBatch => message.header_as_dictionary_batch().and_then(|d| d.data()),
        _ => None,
    };
    let Some(batch) = batch else {
        return Ok(());
    };
    let compressed = batch.compression().is_some();
    let body = &data.data_body;
    for (i, buffer) in batch.buffers().into_iter().flatten().enumerate() {
        let range = usize::try_from(buffer.offset())
            .ok()
            .zip(usize::try_from(buffer.length()).ok())
            .and_then(|(start, len)| Some(start..start.checked_add(len)?))
            .filter(|range| range.end <= body.len())
            .ok_or_else(|| format!("buffer {i} lies outside the message body"))?;
        if !compressed || range.is_empty() {
            continue;
        }
        let prefix = body
            .get(range.start..range.start.saturating_add(8))
            .filter(|_| range.len() >= 8)
            .ok_or_else(|| format!("compressed buffer {i} is shorter than its length prefix"))?;
        let claimed = i64::from_le_bytes(prefix.try_into().map_err(|_| "a short buffer".to_string())?);
        // -1: the buffer was left uncompressed.
        if claimed != -1 && u64::try_from(claimed).map_or(true, |n| n > MAX_DECODED_BUFFER_BYTES) {
            return Err(format!(
                "compressed buffer {i} claims {claimed} bytes uncompressed (at most \
                 {MAX_DECODED_BUFFER_BYTES})"
            ));
        }
    }
    Ok(())
}

/// The next message of `decoder`, with a panic of Arrow's decoder (a malformed message it
/// does not check) as the stream's error.
pub async fn next_decoded(decoder: &mut FlightDataDecoder) -> Option<Result<DecodedFlightData, FlightError>> {
    match AssertUnwindSafe(decoder.next()).catch_unwind().await {
        Ok(item) => item,
        Err(panic) => Some(Err(FlightError::DecodeError(format!(
            "malformed Arrow IPC: {}",
            pushdown_task::panic_message(&*panic)
        )))),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Int64Array, RecordBatch};
    use arrow::ipc::CompressionType;
    use arrow::ipc::writer::{DictionaryTracker, IpcDataGenerator, IpcWriteOptions};

    use super::*;

    /// A batch of 1,000 integers as one Flight message, its buffers compressed with `codec`.
    fn message(codec: CompressionType) -> FlightData {
        let column = Arc::new(Int64Array::from_iter_values(0..1000));
        let batch = RecordBatch::try_from_iter([("n", column as _)]).expect("a batch");
        let options = IpcWriteOptions::default()
            .try_with_compression(Some(codec))
            .expect("options");
        let (_, encoded) = IpcDataGenerator::default()
            .encode(
                &batch,
                &mut DictionaryTracker::new(false),
                &options,
                &mut Default::default(),
            )
            .expect("encoded");
        encoded.into()
    }

    /// Where the first non-empty buffer of `data`'s batch starts in its body.
    fn first_buffer(data: &FlightData) -> usize {
        let message = arrow::ipc::root_as_message(&data.data_header).expect("a message");
        let batch = message.header_as_record_batch().expect("a batch");
        let buffer = batch
            .buffers()
            .expect("buffers")
            .iter()
            .find(|b| b.length() > 0)
            .expect("one");
        usize::try_from(buffer.offset()).expect("an offset")
    }

    #[test]
    fn a_compressed_buffer_claiming_too_much_is_refused_before_decoding() {
        for codec in [CompressionType::LZ4_FRAME, CompressionType::ZSTD] {
            let good = message(codec);
            assert_eq!(check_message(&good), Ok(()));
            // The claim the fuzzer found: 2^51 bytes (Arrow would allocate them first).
            let at = first_buffer(&good);
            let mut body = good.data_body.to_vec();
            body[at..at + 8].copy_from_slice(&(1i64 << 51).to_le_bytes());
            let bad = FlightData {
                data_body: body.into(),
                ..good.clone()
            };
            let e = check_message(&bad).expect_err("refused");
            assert!(e.contains("claims 2251799813685248 bytes"), "{e}");
            // A body cut short of a buffer's claim is refused too.
            let cut = FlightData {
                data_body: good.data_body.slice(..at + 3),
                ..good.clone()
            };
            assert!(check_message(&cut).expect_err("cut").contains("outside"));
        }
    }
}
