//! The codec of a stream's batches, batch by batch.
//!
//! Arrow IPC compresses each record batch message on its own (its header names the codec),
//! so a stream may change codec between batches and any IPC reader — pyarrow's included —
//! decodes the mix. [`Governor`] uses that for clients that could not choose: it compresses
//! while the socket holds the stream back (sends wait for the client) and stops while the
//! server's CPU does (the client waits for us, and compressing would only add to it).

use std::time::Duration;

use arrow::array::RecordBatch;
use arrow::datatypes::Schema;
use arrow::ipc::writer::{DictionaryTracker, IpcDataGenerator, IpcWriteContext, IpcWriteOptions};
use arrow_flight::FlightData;
use pushdown_protocol::Compression;

/// Batches judged together before the codec changes.
const WINDOW: u32 = 8;
/// A window whose sends waited for more than this share of its time was held back by the
/// socket: compress more.
const LINK_BOUND: f64 = 0.3;
/// A window whose sends waited for less than this share of its time was held back by the
/// server's CPU: compress less.
const CPU_BOUND: f64 = 0.05;

/// The codec of each batch: fixed, or adapted to where the stream waits.
#[derive(Debug, Clone)]
pub struct Governor {
    codec: Compression,
    adaptive: bool,
    batches: u32,
    producing: Duration,
    sending: Duration,
}

impl Governor {
    /// A governor for a stream that asked for `requested`; [`Compression::Adaptive`] starts
    /// uncompressed and adapts.
    pub fn new(requested: Compression) -> Self {
        let adaptive = requested == Compression::Adaptive;
        Self {
            codec: if adaptive { Compression::None } else { requested },
            adaptive,
            batches: 0,
            producing: Duration::ZERO,
            sending: Duration::ZERO,
        }
    }

    /// The codec for the next batch (never [`Compression::Adaptive`]).
    pub fn codec(&self) -> Compression {
        self.codec
    }

    /// One batch sent: `producing` from the previous send's end until this batch was encoded
    /// (the scan, the ops, the codec), `sending` waiting for the client to take it.
    pub fn observe(&mut self, producing: Duration, sending: Duration) {
        if !self.adaptive {
            return;
        }
        self.batches += 1;
        self.producing += producing;
        self.sending += sending;
        if self.batches < WINDOW {
            return;
        }
        let total = (self.producing + self.sending).as_secs_f64();
        let waiting = if total > 0.0 {
            self.sending.as_secs_f64() / total
        } else {
            0.0
        };
        self.codec = if waiting > LINK_BOUND {
            match self.codec {
                Compression::None => Compression::Lz4,
                _ => Compression::Zstd,
            }
        } else if waiting < CPU_BOUND {
            match self.codec {
                Compression::Zstd => Compression::Lz4,
                _ => Compression::None,
            }
        } else {
            self.codec
        };
        self.batches = 0;
        self.producing = Duration::ZERO;
        self.sending = Duration::ZERO;
    }
}

/// Encodes a stream's schema and batches as Flight messages, each batch in the codec asked
/// for it, split to about `max_message_bytes` of buffers per message. Dictionaries are sent
/// before the first batch that uses them and again whenever they change (each message names
/// its own codec, so they decode whatever the batch's).
pub struct Encoder {
    generator: IpcDataGenerator,
    context: IpcWriteContext,
    dictionaries: DictionaryTracker,
    max_message_bytes: usize,
    options: [IpcWriteOptions; 3],
}

impl Encoder {
    pub fn new(max_message_bytes: usize) -> Result<Self, arrow::error::ArrowError> {
        use arrow::ipc::CompressionType;
        let with = |codec| IpcWriteOptions::default().try_with_compression(codec);
        // Each message's body starts in a buffer as large as the last one's, not an empty one
        // grown by doubling (a copy of the body per message, and fresh pages to zero). The
        // buffer is the stream's largest message so far: about `max_message_bytes`, more only
        // when a single row is larger; it lives as long as the stream.
        let mut context = IpcWriteContext::default();
        context.set_reserve_scratch(true);
        Ok(Self {
            generator: IpcDataGenerator::default(),
            context,
            dictionaries: DictionaryTracker::new(false),
            max_message_bytes: max_message_bytes.max(1),
            options: [
                with(None)?,
                with(Some(CompressionType::LZ4_FRAME))?,
                with(Some(CompressionType::ZSTD))?,
            ],
        })
    }

    /// The stream's first message; it numbers the dictionaries the batches then carry.
    pub fn schema(&mut self, schema: &Schema) -> FlightData {
        self.dictionaries = DictionaryTracker::new(false);
        FlightData::from(self.generator.schema_to_bytes_with_dictionary_tracker(
            schema,
            &mut self.dictionaries,
            &self.options[0],
        ))
    }

    /// `batch` as Flight messages (its dictionaries first) in `codec`.
    pub fn batch(
        &mut self,
        batch: &RecordBatch,
        codec: Compression,
    ) -> Result<Vec<FlightData>, arrow::error::ArrowError> {
        let options = &self.options[match codec {
            Compression::None | Compression::Adaptive => 0,
            Compression::Lz4 => 1,
            Compression::Zstd => 2,
        }];
        let bytes: usize = batch.columns().iter().map(|c| c.get_buffer_memory_size()).sum();
        let pieces = bytes.div_ceil(self.max_message_bytes).max(1);
        let rows_per_piece = batch.num_rows().div_ceil(pieces).max(1);
        let mut out = Vec::with_capacity(pieces);
        let mut offset = 0;
        loop {
            let len = rows_per_piece.min(batch.num_rows() - offset);
            let (dicts, data) = self.generator.encode(
                &batch.slice(offset, len),
                &mut self.dictionaries,
                options,
                &mut self.context,
            )?;
            out.extend(dicts.into_iter().map(FlightData::from));
            out.push(FlightData::from(data));
            offset += len;
            if offset >= batch.num_rows() {
                return Ok(out);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(g: &mut Governor, batches: u32, producing_ms: u64, sending_ms: u64) -> Compression {
        for _ in 0..batches {
            g.observe(
                Duration::from_millis(producing_ms),
                Duration::from_millis(sending_ms),
            );
        }
        g.codec()
    }

    #[test]
    fn a_stream_held_by_the_socket_compresses_more_and_one_held_by_the_cpu_less() {
        let mut g = Governor::new(Compression::Adaptive);
        assert_eq!(g.codec(), Compression::None);
        // Sends wait 80% of the time: the link is the bottleneck.
        assert_eq!(run(&mut g, WINDOW - 1, 2, 8), Compression::None, "a window first");
        assert_eq!(run(&mut g, 1, 2, 8), Compression::Lz4);
        assert_eq!(run(&mut g, WINDOW, 2, 8), Compression::Zstd);
        assert_eq!(run(&mut g, WINDOW, 2, 8), Compression::Zstd, "the most it does");
        // Between the thresholds nothing changes.
        assert_eq!(run(&mut g, WINDOW, 10, 1), Compression::Zstd);
        // Sends never wait: the server's CPU is the bottleneck.
        assert_eq!(run(&mut g, WINDOW, 10, 0), Compression::Lz4);
        assert_eq!(run(&mut g, WINDOW, 10, 0), Compression::None);
        assert_eq!(run(&mut g, WINDOW, 10, 0), Compression::None);
    }

    #[test]
    fn a_codec_the_client_chose_is_kept() {
        for codec in [Compression::None, Compression::Lz4, Compression::Zstd] {
            let mut g = Governor::new(codec);
            assert_eq!(run(&mut g, 4 * WINDOW, 1, 100), codec);
            assert_eq!(run(&mut g, 4 * WINDOW, 100, 0), codec);
        }
    }

    #[test]
    fn batches_are_split_to_the_message_size_and_decode_whatever_their_codec() {
        use arrow::array::{Int64Array, StringArray};
        use std::sync::Arc;
        let n = 10_000;
        let batch = RecordBatch::try_from_iter([
            ("id", Arc::new(Int64Array::from_iter_values(0..n)) as _),
            (
                "s",
                Arc::new(StringArray::from_iter_values((0..n).map(|i| format!("row {i}")))) as _,
            ),
        ])
        .unwrap();
        let mut encoder = Encoder::new(32 << 10).unwrap();
        let mut messages = vec![encoder.schema(&batch.schema())];
        for codec in [Compression::None, Compression::Zstd, Compression::Lz4] {
            let pieces = encoder.batch(&batch, codec).unwrap();
            assert!(pieces.len() > 3, "{} pieces", pieces.len());
            assert!(pieces.iter().all(|m| m.data_body.len() <= 64 << 10));
            messages.extend(pieces);
        }
        let decoded = arrow_flight::utils::flight_data_to_batches(&messages).unwrap();
        let rows: usize = decoded.iter().map(|b| b.num_rows()).sum();
        assert_eq!(rows, 3 * n as usize);
        let whole = arrow::compute::concat_batches(&batch.schema(), &decoded).unwrap();
        let three = arrow::compute::concat_batches(&batch.schema(), [&batch, &batch, &batch]).unwrap();
        assert_eq!(whole, three);
    }

    #[test]
    fn dictionary_columns_decode_in_every_batch() {
        use arrow::array::{DictionaryArray, Int32Array};
        use arrow::datatypes::Int32Type;
        use std::sync::Arc;
        let dict: DictionaryArray<Int32Type> =
            vec![Some("a"), None, Some("b"), Some("a")].into_iter().collect();
        let batch = RecordBatch::try_from_iter([
            ("i", Arc::new(Int32Array::from(vec![1, 2, 3, 4])) as _),
            ("cat", Arc::new(dict) as _),
        ])
        .unwrap();
        let mut encoder = Encoder::new(1 << 20).unwrap();
        let mut messages = vec![encoder.schema(&batch.schema())];
        for codec in [Compression::None, Compression::Zstd] {
            messages.extend(encoder.batch(&batch, codec).unwrap());
        }
        // The full decoder (dictionary messages included), as a Flight client runs it.
        let stream = arrow_flight::decode::FlightRecordBatchStream::new_from_flight_data(
            futures::stream::iter(messages.into_iter().map(Ok)),
        );
        let decoded: Vec<RecordBatch> =
            futures::executor::block_on(futures::TryStreamExt::try_collect(stream)).unwrap();
        assert_eq!(decoded, vec![batch.clone(), batch]);
    }
}
