//! The codec of a stream's batches, batch by batch.
//!
//! Arrow IPC compresses each record batch message on its own (its header names the codec),
//! so a stream may change codec between batches and any IPC reader — pyarrow's included —
//! decodes the mix. [`Governor`] uses that for clients that could not choose, or asked it to
//! ([`Compression::Adaptive`]): it compresses while the socket holds the stream back (sends
//! wait for the client) and stops while the server's CPU does (the client waits for us, and
//! compressing would only add to it).
//!
//! Stopping needs care: a stream compressed *because* the link was slow stops waiting on it,
//! and looks CPU-bound. So the governor measures the link: a window whose sends waited
//! (the link bound it) gives its wire rate as the link's; any window's wire rate is a floor
//! under it. A compressed stream goes back to fewer bytes' work only when its uncompressed
//! bytes would fit that link; without a measurement it goes back as before. The choice is
//! revised every [`WINDOW`] batches, so a link that slows down mid-stream (or speeds up) is
//! followed.

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
/// server's CPU: compress less (if the link can carry it).
const CPU_BOUND: f64 = 0.05;
/// A compressed stream goes back to a lighter codec only when the bytes it would send fit
/// this share of the measured link…
const FITS: f64 = 0.8;
/// … or, to find a link that became faster (a compressed stream cannot see it), after this
/// many windows in a row that did not wait on the link: one window is tried lighter.
const PROBE_AFTER: u32 = 16;

/// What one adaptive stream learnt of its peer's link, for the next stream to the same peer
/// to go on from: a shard's stream is often shorter than the windows a codec takes to
/// settle, and a loader reads many in a row over the same link.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkMemory {
    pub codec: Compression,
    /// The link's rate as measured, bytes/s.
    pub link: Option<f64>,
    patience: u32,
}

/// The codec of each batch: fixed, or adapted to where the stream waits.
#[derive(Debug, Clone)]
pub struct Governor {
    codec: Compression,
    adaptive: bool,
    batches: u32,
    producing: Duration,
    sending: Duration,
    /// The window's bytes before any codec (Arrow IPC bodies uncompressed) and as sent.
    raw_bytes: u64,
    wire_bytes: u64,
    /// The link's rate as measured (bytes/s), once a window was held back by it.
    link: Option<f64>,
    /// Windows in a row that were not held back but kept their codec for the link's sake.
    patience: u32,
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
            raw_bytes: 0,
            wire_bytes: 0,
            link: None,
            patience: 0,
        }
    }

    /// [`Governor::new`], an adaptive one going on from what an earlier stream over the same
    /// link learnt.
    pub fn resume(requested: Compression, memory: Option<LinkMemory>) -> Self {
        let mut g = Self::new(requested);
        if let (true, Some(m)) = (g.adaptive, memory) {
            (g.codec, g.link, g.patience) = (m.codec, m.link, m.patience);
        }
        g
    }

    /// What this stream learnt of its link (adaptive streams, once a window was judged).
    pub fn memory(&self) -> Option<LinkMemory> {
        let learnt = self.link.is_some() || self.codec != Compression::None;
        (self.adaptive && learnt).then_some(LinkMemory {
            codec: self.codec,
            link: self.link,
            patience: self.patience,
        })
    }

    /// The codec for the next batch (never [`Compression::Adaptive`]).
    pub fn codec(&self) -> Compression {
        self.codec
    }

    /// The link's rate as this stream measured it (bytes/s), once its sends were held back.
    pub fn link(&self) -> Option<f64> {
        self.link
    }

    /// One batch sent: `producing` from the previous send's end until this batch was encoded
    /// (the scan, the ops, the codec), `sending` waiting for the client to take it; `raw`
    /// its bytes uncompressed, `wire` as sent.
    pub fn observe(&mut self, producing: Duration, sending: Duration, raw: u64, wire: u64) {
        if !self.adaptive {
            return;
        }
        self.batches += 1;
        self.producing += producing;
        self.sending += sending;
        self.raw_bytes += raw;
        self.wire_bytes += wire;
        if self.batches < WINDOW {
            return;
        }
        let total = (self.producing + self.sending).as_secs_f64();
        let waiting = if total > 0.0 {
            self.sending.as_secs_f64() / total
        } else {
            0.0
        };
        if total > 0.0 {
            let wire_rate = self.wire_bytes as f64 / total;
            self.link = if waiting > LINK_BOUND {
                // Held back by the link: its rate.
                Some(wire_rate)
            } else {
                // The link carried at least this much.
                Some(self.link.map_or(wire_rate, |l| l.max(wire_rate)))
            };
        }
        let lighter = match self.codec {
            Compression::Zstd => Compression::Lz4,
            _ => Compression::None,
        };
        self.codec = if waiting > LINK_BOUND {
            match self.codec {
                Compression::None => Compression::Lz4,
                _ => Compression::Zstd,
            }
        } else if waiting < CPU_BOUND && self.codec != Compression::None {
            self.patience += 1;
            if self.fits(lighter, total) || self.patience >= PROBE_AFTER {
                self.patience = 0;
                lighter
            } else {
                self.codec
            }
        } else {
            self.codec
        };
        if waiting > LINK_BOUND {
            self.patience = 0;
        }
        self.reset();
    }

    /// A new window.
    fn reset(&mut self) {
        self.batches = 0;
        self.producing = Duration::ZERO;
        self.sending = Duration::ZERO;
        self.raw_bytes = 0;
        self.wire_bytes = 0;
    }

    /// Whether the window's bytes in `lighter` would fit the measured link. Uncompressed is
    /// known (the raw bytes); LZ4 from zstd is taken to send twice the bytes. Unmeasured:
    /// yes (nothing says the link is slow).
    fn fits(&self, lighter: Compression, secs: f64) -> bool {
        let Some(link) = self.link else { return true };
        if self.codec == Compression::None || secs <= 0.0 {
            return true;
        }
        let bytes = match lighter {
            Compression::None => self.raw_bytes as f64,
            _ => 2.0 * self.wire_bytes as f64,
        };
        bytes / secs <= FITS * link
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
        let bytes = addressed_bytes(batch);
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

/// The bytes `batch`'s columns address (their slices of their buffers), which is what IPC
/// copies; not the allocations they point into: a fragment-cache hit's buffers are slices
/// of one whole entry, and counting allocations would count the entry once per buffer.
pub fn addressed_bytes(batch: &RecordBatch) -> usize {
    batch
        .columns()
        .iter()
        .map(|c| {
            c.to_data()
                .get_slice_memory_size()
                .unwrap_or_else(|_| c.get_buffer_memory_size())
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(g: &mut Governor, batches: u32, producing_ms: u64, sending_ms: u64) -> Compression {
        for _ in 0..batches {
            g.observe(
                Duration::from_millis(producing_ms),
                Duration::from_millis(sending_ms),
                1000,
                1000,
            );
        }
        g.codec()
    }

    /// A stream over a link of 10 MB/s producing 1 MB batches every 10 ms (100 MB/s raw)
    /// that compress 20×: each batch's send waits for what the link takes for its wire bytes.
    fn over_link(g: &mut Governor, batches: u32, link: f64) -> Compression {
        for _ in 0..batches {
            let raw = 1_000_000u64;
            let wire = match g.codec() {
                Compression::None => raw,
                Compression::Lz4 => raw / 10,
                _ => raw / 20,
            };
            let producing = Duration::from_millis(match g.codec() {
                Compression::Zstd => 14,
                Compression::Lz4 => 11,
                _ => 10,
            });
            let on_wire = Duration::from_secs_f64(wire as f64 / link);
            g.observe(producing, on_wire.saturating_sub(producing), raw, wire);
        }
        g.codec()
    }

    #[test]
    fn a_stream_compressed_for_a_slow_link_stays_compressed_and_follows_the_link() {
        let mut g = Governor::new(Compression::Adaptive);
        // A fast link: never held back, never compressed.
        assert_eq!(over_link(&mut g, 4 * WINDOW, 1e12), Compression::None);
        // The link drops to 10 MB/s: compressed, and kept so although sends stop waiting
        // (1 MB raw per 10 ms would need 100 MB/s).
        over_link(&mut g, 2 * WINDOW, 10e6);
        let mut codecs = Vec::new();
        for _ in 0..8 {
            codecs.push(over_link(&mut g, WINDOW, 10e6));
        }
        assert!(codecs.iter().all(|c| *c != Compression::None), "{codecs:?}");
        let link = g.link().expect("measured");
        assert!((5e6..=20e6).contains(&link), "{link}");
        // The link comes back: the wire rate it carries lifts the estimate, and the stream
        // sheds its codec.
        let mut last = g.codec();
        for _ in 0..40 {
            last = over_link(&mut g, WINDOW, 1e12);
        }
        assert_eq!(last, Compression::None, "link {:?}", g.link());
    }

    #[test]
    fn a_stream_held_by_the_socket_compresses_more_and_one_held_by_the_cpu_less() {
        let mut g = Governor::new(Compression::Adaptive);
        assert_eq!(g.codec(), Compression::None);
        // A link of 1 MB/s for 100 MB/s of batches: held back by the socket.
        assert_eq!(
            over_link(&mut g, WINDOW - 1, 1e6),
            Compression::None,
            "a window first"
        );
        assert_eq!(over_link(&mut g, 1, 1e6), Compression::Lz4);
        assert_eq!(over_link(&mut g, WINDOW, 1e6), Compression::Zstd);
        assert_eq!(
            over_link(&mut g, WINDOW, 1e6),
            Compression::Zstd,
            "the most it does"
        );
        // Between the thresholds nothing changes.
        assert_eq!(run(&mut g, WINDOW, 10, 1), Compression::Zstd);
        // Sends never wait: the server's CPU is the bottleneck. But the link was measured
        // slower than these bytes uncompressed: each step down is a probe, after
        // `PROBE_AFTER` windows.
        assert_eq!(
            over_link(&mut g, (PROBE_AFTER - 1) * WINDOW, 1e12),
            Compression::Zstd
        );
        assert_eq!(over_link(&mut g, WINDOW, 1e12), Compression::Lz4);
        assert_eq!(over_link(&mut g, PROBE_AFTER * WINDOW, 1e12), Compression::None);
        assert_eq!(over_link(&mut g, WINDOW, 1e12), Compression::None);
    }

    #[test]
    fn a_stream_starts_from_what_the_last_one_to_its_peer_learnt() {
        let mut g = Governor::new(Compression::Adaptive);
        over_link(&mut g, 3 * WINDOW, 10e6);
        let memory = g.memory().expect("learnt");
        assert_ne!(memory.codec, Compression::None);
        let next = Governor::resume(Compression::Adaptive, Some(memory));
        assert_eq!((next.codec(), next.link()), (memory.codec, memory.link));
        // A client that chose a codec keeps it whatever was learnt.
        assert_eq!(
            Governor::resume(Compression::Lz4, Some(memory)).codec(),
            Compression::Lz4
        );
        assert_eq!(
            Governor::new(Compression::Adaptive).memory(),
            None,
            "nothing learnt yet"
        );
    }

    #[test]
    fn a_codec_the_client_chose_is_kept() {
        for codec in [Compression::None, Compression::Lz4, Compression::Zstd] {
            let mut g = Governor::new(codec);
            assert_eq!(run(&mut g, 4 * WINDOW, 1, 100), codec);
            assert_eq!(run(&mut g, 4 * WINDOW, 100, 0), codec);
        }
    }

    /// A batch of slices into a larger allocation (as a cache hit's are) is split by the
    /// bytes it holds, not by the allocation's size.
    #[test]
    fn a_sliced_batch_is_split_by_what_it_addresses() {
        use arrow::array::Int64Array;
        use std::sync::Arc;
        let whole = Int64Array::from_iter_values(0..1_000_000);
        let batch =
            RecordBatch::try_from_iter([("id", Arc::new(whole.slice(5_000, 1_000)) as _)]).expect("batch");
        assert_eq!(addressed_bytes(&batch), 8_000);
        let mut encoder = Encoder::new(32 << 10).expect("encoder");
        let pieces = encoder.batch(&batch, Compression::None).expect("encode");
        assert_eq!(pieces.len(), 1, "8 KB is one message of 32 KB at most");
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
        .expect("batch");
        let mut encoder = Encoder::new(32 << 10).expect("encoder");
        let mut messages = vec![encoder.schema(&batch.schema())];
        for codec in [Compression::None, Compression::Zstd, Compression::Lz4] {
            let pieces = encoder.batch(&batch, codec).expect("encode");
            assert!(pieces.len() > 3, "{} pieces", pieces.len());
            assert!(pieces.iter().all(|m| m.data_body.len() <= 64 << 10));
            messages.extend(pieces);
        }
        let decoded = arrow_flight::utils::flight_data_to_batches(&messages).expect("decode");
        let rows: usize = decoded.iter().map(|b| b.num_rows()).sum();
        assert_eq!(rows, 3 * n as usize);
        let whole = arrow::compute::concat_batches(&batch.schema(), &decoded).expect("concat");
        let three =
            arrow::compute::concat_batches(&batch.schema(), [&batch, &batch, &batch]).expect("concat");
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
        .expect("batch");
        let mut encoder = Encoder::new(1 << 20).expect("encoder");
        let mut messages = vec![encoder.schema(&batch.schema())];
        for codec in [Compression::None, Compression::Zstd] {
            messages.extend(encoder.batch(&batch, codec).expect("encode"));
        }
        // The full decoder (dictionary messages included), as a Flight client runs it.
        let stream = arrow_flight::decode::FlightRecordBatchStream::new_from_flight_data(
            futures::stream::iter(messages.into_iter().map(Ok)),
        );
        let decoded: Vec<RecordBatch> =
            futures::executor::block_on(futures::TryStreamExt::try_collect(stream)).expect("decode");
        assert_eq!(decoded, vec![batch.clone(), batch]);
    }
}
