//! The sample order, pure: which rows a rank reads in an epoch and in what order, as a
//! function of (seed, epoch, global batch, shuffle window, partitions, echo) and the shards'
//! row counts — never of the world size, of timing or of which server answered. No I/O, no
//! async runtime: the loader's producer follows what this module computes, and a saved
//! [`LoaderState`] (the same bytes on every rank) is all a restored loader needs to compute it
//! again, at any world size that divides the partitions.
//!
//! * epoch `e`'s shards are permuted by `(seed, e)` ([`shard_order`]) and their rows
//!   concatenated: the epoch sequence of `n` rows;
//! * it is cut into `P` contiguous *partitions* (canonical ranks, as Mosaic Streaming's
//!   canonical nodes), sized so that each global batch of `G` rows takes a fixed chunk of
//!   each ([`Shape`]): partition `p` gives `⌊(p+1)G/P⌋ − ⌊pG/P⌋` rows to every full global
//!   batch, and its share of the last one likewise (a partition is one contiguous range: the
//!   epoch is cut in `P` places, each a shard that two readers share);
//! * rank `r` of `W` (`W` divides `P`) reads partitions `[rP/W, (r+1)P/W)`, one contiguous
//!   range of the epoch sequence, and its batch is their chunks, in partition order: its
//!   slice `[r·G/W, (r+1)·G/W)` of the global batch, `G/W` rows on every rank;
//! * each partition's rows are permuted by window of `K` global batches, by
//!   `(seed, e, p, window)` ([`window_rng`]), in `k` rounds when echoing ([`echoed_order`]);
//!   a window's batches are cut round by round;
//! * without `drop_last`, a last global batch of fewer than `G` rows is split the same way,
//!   and a rank whose share is one row short of the others' repeats the epoch's row `r`
//!   (so at most `W − 1` rows repeat, as `DistributedSampler` pads);
//! * batch `t`'s random ops draw from `(seed, e, first partition, t)` ([`batch_key`]).
//!
//! With `P = W` each rank reads `[r·n/W, …)` in windows of its own: the per-rank order of
//! earlier versions, which the global order costs nothing over (benches/RESULTS.md,
//! "Global order").

use pushdown_ops::mix;
use pushdown_protocol::{Compression, ScanRequest};
use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;

use crate::bucket::BucketPos;
use crate::error::{ClientError, Result};
use crate::pack::PackPos;

/// What a rank's sample sequence depends on, beside the query, the batching and the
/// dataset's version: the order's parameters ([`Order`]) and where the rank is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Sequence {
    pub(crate) seed: u64,
    pub(crate) rank: u64,
    pub(crate) world_size: u64,
    pub(crate) drop_last: bool,
    pub(crate) echo: Echo,
}

/// Data echoing (Choi et al., "Faster Neural Network Training with Data Echoing"): each
/// reduced sample is repeated before the client's random ops, so every repeat is augmented
/// anew, and the repeats are spread through the shuffle window, never adjacent. An epoch of
/// a loader echoing `k` times delivers `k` × its rows; the sequence is a function of the
/// seed, epoch, rank and `k`, and `k` is part of the state a loader resumes from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Echo {
    /// Every sample once.
    #[default]
    Off,
    /// Every sample `k` times per epoch.
    Fixed(u32),
    /// `k` chosen when each epoch starts, from the share of the previous epoch the consumer
    /// spent waiting: `⌈1 / (1 − wait)⌉` repeats cover the stall, at most `max`. The first
    /// epoch is not echoed.
    Auto { max: u32 },
}

impl Echo {
    /// Repeats in an epoch that follows one whose consumer waited `wait` of its time (none
    /// measured yet: `None`).
    pub fn factor(self, wait: Option<f64>) -> u64 {
        match self {
            Self::Off => 1,
            Self::Fixed(k) => u64::from(k.max(1)),
            Self::Auto { max } => match wait {
                Some(w) if w.is_finite() => {
                    let k = (1.0 / (1.0 - w.clamp(0.0, 0.99))).ceil() as u64;
                    k.clamp(1, u64::from(max.max(1)))
                }
                _ => 1,
            },
        }
    }

    pub(crate) fn code(self) -> u64 {
        match self {
            Self::Off => 1,
            Self::Fixed(k) => u64::from(k.max(1)),
            Self::Auto { max } => (1 << 32) | u64::from(max),
        }
    }
}

/// What the global order is, beside the dataset's version: the same on every rank, and the
/// same at every world size that divides `partitions`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Order {
    /// A hash of the query (or pipeline) and its servers-side shape: what is read.
    pub sources: u64,
    pub seed: u64,
    /// Rows per global batch: `batch_size × world_size`.
    pub global_batch: u64,
    /// Global batches per shuffle window (`shuffle_buffer / batch_size`, rounded up); 0: no
    /// shuffle.
    pub window: u64,
    /// Canonical partitions (a multiple of every world size the order serves).
    pub partitions: u64,
    pub drop_last: bool,
    /// [`Echo::code`].
    pub echo: u64,
}

impl Order {
    /// Whether windows are permuted (a window of 0 global batches: no shuffle).
    pub(crate) fn shuffled(&self) -> bool {
        self.window > 0
    }

    /// The same order over `partitions` partitions (a restored state's).
    pub(crate) fn with_partitions(self, partitions: u64) -> Self {
        Self { partitions, ..self }
    }

    /// The first difference from `saved` that makes its sequence another, in words, with
    /// what this loader would need to continue it (`None`: the same order). `partitions`
    /// is left to the caller (a restored loader may take the state's).
    pub(crate) fn differs(&self, saved: &Order, world_size: u64) -> Option<String> {
        let per_rank = |rows: u64| rows as f64 / world_size as f64;
        if saved.sources != self.sources {
            return Some("the state was saved by another query or pipeline (its sources differ)".into());
        }
        if saved.seed != self.seed {
            return Some(format!(
                "the state's seed is {}, this loader's {}",
                saved.seed, self.seed
            ));
        }
        if saved.global_batch != self.global_batch {
            return Some(format!(
                "the state's global batch is {} rows (batch_size × world_size), this loader's {}: \
                 at world size {world_size} pass batch_size={}",
                saved.global_batch,
                self.global_batch,
                per_rank(saved.global_batch)
            ));
        }
        if saved.window != self.window {
            return Some(format!(
                "the state's shuffle window is {} global batches, this loader's {}: at world size \
                 {world_size} pass shuffle_buffer={}",
                saved.window,
                self.window,
                per_rank(saved.window.max(1) * saved.global_batch)
            ));
        }
        if saved.drop_last != self.drop_last {
            return Some(format!(
                "the state's drop_last is {}, this loader's {}",
                saved.drop_last, self.drop_last
            ));
        }
        if saved.echo != self.echo {
            return Some("the state was saved with another data echoing setting".into());
        }
        None
    }
}

/// Where a loader is: the next batch is global batch `batches` of epoch `epoch` (every rank
/// is at the same one), in `order`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoaderState {
    pub order: Order,
    pub epoch: u64,
    pub batches: u64,
    /// The shards `epoch` was planned on (files, versions, row groups), when `batches > 0`:
    /// resuming mid-epoch needs that same dataset version. 0 at an epoch boundary.
    pub version: u64,
    /// Times `epoch` repeats each sample (data echoing; 1: not echoed).
    pub echo: u64,
    /// A state saved by a per-rank order (before the global order, `PDL2`/`PDL3`): its
    /// fingerprint of (query, seed, rank, world size, batching). It restores at an epoch
    /// boundary; mid-epoch its sequence is not this version's.
    pub per_rank: Option<u64>,
    /// A mixture's state (`PDM1`): the rows taken of each source from each partition. Its
    /// `version` is then its sources' together, needed at any position (a source's epochs
    /// run across the mixture's).
    pub mixture: Option<Taken>,
    /// A packed (`PDK1`) or bucketed (`PDB1`) loader's state: where each partition's packer
    /// or bucketer is, known for the partitions the saving rank read (`None` for the others:
    /// a state of every partition is [`LoaderState::merge`]d from every rank's).
    pub parts: Option<Vec<Option<PartPos>>>,
}

/// Where one partition of a packed or bucketed loader is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PartPos {
    Pack(PackPos),
    Bucket(BucketPos),
}

const STATE_MAGIC: &[u8; 4] = b"PDL4";
/// A mixture's state: a `PDL4` state's words, then sources `S`, partitions `P` and the
/// `S × P` rows taken.
const MIXTURE_MAGIC: &[u8; 4] = b"PDM1";
/// A packed loader's state: a `PDL4` state's words, then partitions `P` and, per partition,
/// documents done (`u64::MAX`: not known to this rank) and tokens into the next.
const PACK_MAGIC: &[u8; 4] = b"PDK1";
/// A bucketed loader's state: a `PDL4` state's words, then partitions `P` and, per
/// partition, its first row still queued (`u64::MAX`: not known to this rank), the words
/// `n` of its bitmap of rows given after it, and those `n` words.
const BUCKET_MAGIC: &[u8; 4] = b"PDB1";
const STATE_WORDS: usize = 11;
const STATE_LEN: usize = 4 + STATE_WORDS * 8;
/// States of the per-rank order: a fingerprint, epoch, batches, version and (`PDL3`) echo.
const STATE_LEN_V3: usize = 4 + 5 * 8;

impl LoaderState {
    pub fn to_bytes(&self) -> Vec<u8> {
        let o = &self.order;
        let mut out = STATE_MAGIC.to_vec();
        for v in [
            o.sources,
            o.seed,
            o.global_batch,
            o.window,
            o.partitions,
            u64::from(o.drop_last),
            o.echo,
            self.epoch,
            self.batches,
            self.version,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&self.echo.to_le_bytes());
        if let Some(Taken(taken)) = &self.mixture {
            out[..4].copy_from_slice(MIXTURE_MAGIC);
            let partitions = taken.first().map_or(0, Vec::len);
            for v in [taken.len(), partitions] {
                out.extend_from_slice(&(v as u64).to_le_bytes());
            }
            for rows in taken.iter().flatten() {
                out.extend_from_slice(&rows.to_le_bytes());
            }
        }
        if let Some(parts) = &self.parts {
            let bucketed = parts.iter().flatten().any(|p| matches!(p, PartPos::Bucket(_)));
            out[..4].copy_from_slice(if bucketed { BUCKET_MAGIC } else { PACK_MAGIC });
            out.extend_from_slice(&(parts.len() as u64).to_le_bytes());
            for pos in parts {
                let words = match pos {
                    None => vec![u64::MAX, 0],
                    Some(PartPos::Pack(p)) => vec![p.done, p.offset],
                    Some(PartPos::Bucket(b)) => {
                        let mut w = vec![b.first, b.given.len().div_ceil(8) as u64];
                        w.extend(b.given.chunks(8).map(|c| {
                            let mut word = [0u8; 8];
                            word[..c.len()].copy_from_slice(c);
                            u64::from_le_bytes(word)
                        }));
                        w
                    }
                };
                for w in words {
                    out.extend_from_slice(&w.to_le_bytes());
                }
            }
        }
        out
    }

    /// A packed (`PDK1`) or bucketed (`PDB1`) loader's state: the `PDL4` words, then each
    /// partition's packer or bucketer.
    fn parts_from_bytes(bytes: &[u8]) -> Result<Self> {
        let bucketed = bytes.starts_with(BUCKET_MAGIC);
        let bad = || {
            let kind = if bucketed {
                "bucketed-loader state (PDB1)"
            } else {
                "packed-loader state (PDK1)"
            };
            ClientError::Invalid(format!(
                "a damaged pushdown {kind}: its length does not match its partitions"
            ))
        };
        if bytes.len() < STATE_LEN + 8 || !(bytes.len() - STATE_LEN).is_multiple_of(8) {
            return Err(bad());
        }
        let mut head = bytes[..STATE_LEN].to_vec();
        head[..4].copy_from_slice(STATE_MAGIC);
        let mut state = Self::from_bytes(&head)?;
        let words: Vec<u64> = bytes[STATE_LEN..]
            .chunks_exact(8)
            .map(|w| u64::from_le_bytes(w.try_into().unwrap_or_default()))
            .collect();
        let partitions = words[0] as usize;
        if partitions as u64 != state.order.partitions {
            return Err(bad());
        }
        let mut rest = &words[1..];
        let mut parts = Vec::with_capacity(partitions.min(rest.len()));
        for _ in 0..partitions {
            // A packer's two words; a bucketer's first row, its bitmap's words and the bitmap.
            let [first, second, tail @ ..] = rest else {
                return Err(bad());
            };
            let n = if bucketed {
                usize::try_from(*second).map_err(|_| bad())?
            } else {
                0
            };
            if tail.len() < n {
                return Err(bad());
            }
            parts.push((*first != u64::MAX).then(|| match bucketed {
                false => PartPos::Pack(PackPos {
                    done: *first,
                    offset: *second,
                }),
                true => {
                    let mut given: Vec<u8> = tail[..n].iter().flat_map(|w| w.to_le_bytes()).collect();
                    while given.last() == Some(&0) {
                        given.pop();
                    }
                    PartPos::Bucket(BucketPos { first: *first, given })
                }
            }));
            rest = &tail[n..];
        }
        if !rest.is_empty() {
            return Err(bad());
        }
        state.parts = Some(parts);
        Ok(state)
    }

    /// One state from every rank's (a packed loader's ranks each know their own
    /// partitions): the same order and position, each partition from the state that knows
    /// it. Other states merge only with themselves.
    pub fn merge(states: &[LoaderState]) -> Result<LoaderState> {
        let Some(first) = states.first() else {
            return Err(ClientError::Invalid("no states to merge".into()));
        };
        let mut out = first.clone();
        for (i, s) in states.iter().enumerate().skip(1) {
            let (mut a, mut b) = (out.clone(), s.clone());
            a.parts = None;
            b.parts = None;
            if a != b {
                return Err(ClientError::Invalid(format!(
                    "state {i} is not at state 0's position in the same loader (epoch {} batch {} \
                     against epoch {} batch {}, or another query, seed or batching): merge the \
                     states every rank saved at one step",
                    s.epoch, s.batches, first.epoch, first.batches
                )));
            }
            let (Some(merged), Some(theirs)) = (out.parts.as_mut(), s.parts.as_ref()) else {
                continue;
            };
            for (p, (m, t)) in merged.iter_mut().zip(theirs).enumerate() {
                match (&*m, t) {
                    (Some(x), Some(y)) if x != y => {
                        return Err(ClientError::Invalid(format!(
                            "states 0 and {i} disagree on partition {p}'s position: they come \
                             from different runs"
                        )));
                    }
                    (None, Some(y)) => *m = Some(y.clone()),
                    _ => {}
                }
            }
        }
        Ok(out)
    }

    /// A mixture's state: the `PDL4` words, then its rows taken.
    fn mixture_from_bytes(bytes: &[u8]) -> Result<Self> {
        let bad = || {
            ClientError::Invalid(
                "a damaged pushdown mixture state (PDM1): its length does not match its sources \
                 and partitions"
                    .into(),
            )
        };
        if bytes.len() < STATE_LEN + 16 {
            return Err(bad());
        }
        let mut head = bytes[..STATE_LEN].to_vec();
        head[..4].copy_from_slice(STATE_MAGIC);
        let mut state = Self::from_bytes(&head)?;
        let words: Vec<u64> = bytes[STATE_LEN..]
            .chunks(8)
            .map(|w| w.try_into().map(u64::from_le_bytes).map_err(|_| bad()))
            .collect::<Result<_>>()?;
        let (sources, partitions) = (words[0] as usize, words[1] as usize);
        let cells = sources.checked_mul(partitions).ok_or_else(bad)?;
        // No partitions: nothing to take rows from (`chunks(0)` would panic), and a count of
        // cells near `usize::MAX` must not overflow (both found by the `loader_state` fuzz
        // target).
        if sources == 0
            || partitions == 0
            || partitions as u64 != state.order.partitions
            || Some(words.len()) != cells.checked_add(2)
        {
            return Err(bad());
        }
        state.mixture = Some(Taken(
            words[2..].chunks(partitions).map(<[u64]>::to_vec).collect(),
        ));
        Ok(state)
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        if bytes.starts_with(MIXTURE_MAGIC) {
            return Self::mixture_from_bytes(bytes);
        }
        if bytes.starts_with(PACK_MAGIC) || bytes.starts_with(BUCKET_MAGIC) {
            return Self::parts_from_bytes(bytes);
        }
        if bytes.starts_with(b"PDL1") {
            return Err(ClientError::Invalid(
                "a loader state saved by an older pushdown (PDL1, without the dataset version): \
                 restart the epoch it was saved in"
                    .into(),
            ));
        }
        let word = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&bytes[4 + 8 * i..12 + 8 * i]);
            u64::from_le_bytes(b)
        };
        let v2 = bytes.len() == STATE_LEN_V3 - 8 && bytes.starts_with(b"PDL2");
        let v3 = bytes.len() == STATE_LEN_V3 && bytes.starts_with(b"PDL3");
        if v2 || v3 {
            return Ok(Self {
                order: Order {
                    sources: 0,
                    seed: 0,
                    global_batch: 0,
                    window: 0,
                    partitions: 0,
                    drop_last: false,
                    echo: 0,
                },
                epoch: word(1),
                batches: word(2),
                version: word(3),
                echo: if v2 { 1 } else { word(4).max(1) },
                per_rank: Some(word(0)),
                mixture: None,
                parts: None,
            });
        }
        if bytes.len() != STATE_LEN || &bytes[..4] != STATE_MAGIC {
            return Err(ClientError::Invalid(format!(
                "not a pushdown loader state (expected {STATE_LEN} bytes starting PDL4)"
            )));
        }
        Ok(Self {
            order: Order {
                sources: word(0),
                seed: word(1),
                global_batch: word(2),
                window: word(3),
                partitions: word(4),
                drop_last: word(5) != 0,
                echo: word(6),
            },
            epoch: word(7),
            batches: word(8),
            version: word(9),
            echo: word(10).max(1),
            per_rank: None,
            mixture: None,
            parts: None,
        })
    }
}

/// Where a mixture is: the rows taken of each source from each canonical partition,
/// `[source][partition]`, since the loader's start. The same on every rank (each computes
/// every partition's chunks), and all a resumed mixture needs beside its sources' versions:
/// the feed of partition `p` for source `s` has read `taken[s][p]` rows of the source, over
/// its epochs (`loader/mixed.rs` finds where that is).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Taken(pub Vec<Vec<u64>>);

impl Taken {
    /// Nothing taken yet.
    pub fn start(sources: usize, partitions: u64) -> Self {
        Self(vec![vec![0; partitions as usize]; sources])
    }

    /// Rows taken of each source, all partitions together (the schedule's state).
    pub fn per_source(&self) -> Vec<u64> {
        self.0.iter().map(|parts| parts.iter().sum()).collect()
    }
}

/// FNV-1a: stable across processes and versions (unlike `std`'s hasher).
pub(crate) struct Fnv(u64);

impl Fnv {
    pub(crate) fn new() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }

    pub(crate) fn eat(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    pub(crate) fn finish(&self) -> u64 {
        self.0
    }
}

/// The query as the order knows it: what is read, not how (the codec is left out: the
/// planner's choice of it depends on timings, and a state must restore whatever codec the
/// restoring process picks).
fn canonical(request: &ScanRequest) -> bytes::Bytes {
    let mut request = request.clone();
    request.compression = Compression::default();
    request.encode()
}

/// A hash of [`canonical`]: the order's sources.
pub(crate) fn sources(request: &ScanRequest) -> u64 {
    let mut h = Fnv::new();
    h.eat(&canonical(request));
    h.finish()
}

/// The fingerprint states of the per-rank order carried (`PDL2`/`PDL3`): what their sequence
/// depended on but the dataset's version. Computed to recognise such a state.
pub(crate) fn per_rank_fingerprint(request: &ScanRequest, o: &Sequence, batch: usize, window: usize) -> u64 {
    let mut h = Fnv::new();
    h.eat(&canonical(request));
    for v in [
        o.seed,
        o.rank,
        o.world_size,
        batch as u64,
        window as u64,
        u64::from(o.drop_last),
        o.echo.code(),
    ] {
        h.eat(&v.to_le_bytes());
    }
    h.finish()
}

/// The default number of partitions: with a shuffle, 8 (world sizes 1, 2, 4 and 8 see the
/// same global batches), or the least multiple of 8 that the world size divides; without
/// one, the world size (each rank reads its contiguous range in order: the dataset's order
/// at world size 1).
pub(crate) fn default_partitions(world_size: u64, shuffled: bool) -> u64 {
    let w = world_size.max(1);
    if !shuffled {
        return w;
    }
    let gcd = |mut a: u64, mut b: u64| {
        while b != 0 {
            (a, b) = (b, a % b);
        }
        a
    };
    8 / gcd(8, w) * w
}

/// `⌊(p+1)·rows/parts⌋ − ⌊p·rows/parts⌋`: partition `p`'s share of `rows` (the shares of
/// `parts` partitions sum to `rows`; any aligned run of `parts/W` of them to `rows/W`,
/// rounded down or up).
fn share(rows: u64, p: u64, parts: u64) -> u64 {
    cut(rows, p + 1, parts) - cut(rows, p, parts)
}

/// `⌊p·rows/parts⌋`, without overflow.
pub(crate) fn cut(rows: u64, p: u64, parts: u64) -> u64 {
    (u128::from(rows) * u128::from(p) / u128::from(parts.max(1))) as u64
}

/// One epoch of the global order: `n` rows in the epoch's shard order, cut into global
/// batches of `global` rows, each taking a chunk of each of `partitions` partitions, shuffled
/// by windows of `window` global batches (see the module's documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shape {
    pub(crate) n: u64,
    pub(crate) global: u64,
    pub(crate) partitions: u64,
    /// Global batches per window (at least 1).
    pub(crate) window: u64,
    pub(crate) drop_last: bool,
}

impl Shape {
    pub(crate) fn new(n: u64, order: &Order) -> Self {
        Self {
            n,
            global: order.global_batch.max(1),
            partitions: order.partitions.max(1),
            window: order.window.max(1),
            drop_last: order.drop_last,
        }
    }

    /// Full global batches.
    pub(crate) fn full(&self) -> u64 {
        self.n / self.global
    }

    /// Rows of the last, partial global batch (0: none, or dropped).
    pub(crate) fn tail(&self) -> u64 {
        if self.drop_last { 0 } else { self.n % self.global }
    }

    /// Global batches in the epoch (not echoed).
    pub(crate) fn batches(&self) -> u64 {
        self.full() + u64::from(self.tail() > 0)
    }

    pub(crate) fn windows(&self) -> u64 {
        self.batches().div_ceil(self.window)
    }

    /// The global batches of window `w`.
    pub(crate) fn window_batches(&self, w: u64) -> std::ops::Range<u64> {
        (w * self.window).min(self.batches())..((w + 1) * self.window).min(self.batches())
    }

    /// Items of partition `p` (its rows, in partition order) before global batch `batch`.
    pub(crate) fn items_before(&self, p: u64, batch: u64) -> u64 {
        let full = batch.min(self.full());
        let mut items = full * share(self.global, p, self.partitions);
        if batch > self.full() {
            items += share(self.tail(), p, self.partitions);
        }
        items
    }

    /// Where partition `p`'s items `items` are in the epoch sequence. A partition is one
    /// contiguous range, its share of the full batches then of the last one, so that the
    /// epoch is cut in `partitions` places only (each cut is a shard two readers share).
    pub(crate) fn positions(&self, p: u64, items: std::ops::Range<u64>) -> std::ops::Range<u64> {
        let parts = self.partitions;
        let start = self.full() * cut(self.global, p, parts) + cut(self.tail(), p, parts);
        start + items.start..start + items.end
    }

    /// Where partition `p`'s item `item` is: the global batch holding it, and the items of
    /// `p` before it in that batch.
    pub(crate) fn item_at(&self, p: u64, item: u64) -> (u64, u64) {
        let per = share(self.global, p, self.partitions);
        let batch = match per {
            0 => self.full(),
            per => (item / per).min(self.full()),
        };
        (batch, item - self.items_before(p, batch))
    }

    /// The rows rank `rank` of `world` repeats in the last batch so that its batch is as
    /// long as every other rank's: 0 or 1.
    pub(crate) fn pad(&self, rank: u64, world: u64) -> u64 {
        let tail = self.tail();
        if tail == 0 {
            return 0;
        }
        tail.div_ceil(world) - (cut(tail, rank + 1, world) - cut(tail, rank, world))
    }
}

/// The partitions rank `rank` of `world` reads; `world` divides `partitions`.
pub(crate) fn rank_partitions(partitions: u64, rank: u64, world: u64) -> std::ops::Range<u64> {
    let per = partitions / world.max(1);
    rank * per..(rank + 1) * per
}

/// Refuses a world size that does not divide the partitions, naming the fix.
pub(crate) fn check_world(partitions: u64, world: u64) -> Result<()> {
    if world == 0 || !partitions.is_multiple_of(world) {
        return Err(ClientError::Invalid(format!(
            "world size {world} does not divide the order's {partitions} partitions (every rank \
             reads whole partitions): set partitions to a multiple of every world size the job \
             will run at, e.g. {}, from its first run",
            default_partitions(world, true).max(64)
        )));
    }
    Ok(())
}

/// What a rank reads of an epoch: its partitions, and whether its last batch repeats a row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RankSlice {
    pub(crate) parts: std::ops::Range<u64>,
    pub(crate) pad: bool,
}

impl RankSlice {
    pub(crate) fn new(shape: &Shape, rank: u64, world: u64) -> Self {
        Self {
            parts: rank_partitions(shape.partitions, rank, world),
            pad: shape.pad(rank, world) > 0,
        }
    }
}

/// How a window's rows are permuted: by `(seed, epoch, partition, window)`, in `echo`
/// rounds; without a shuffle, in order, once.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Permutation {
    pub(crate) seed: u64,
    pub(crate) epoch: u64,
    pub(crate) echo: u64,
    pub(crate) shuffled: bool,
}

impl Permutation {
    /// Items `0..rows` of partition `partition`'s window `window` as delivered: `echo`
    /// rounds of a permutation (in order once, without a shuffle).
    pub(crate) fn apply(&self, rows: usize, partition: u64, window: u64) -> Vec<usize> {
        if !self.shuffled {
            return (0..rows).collect();
        }
        let items: Vec<(u32, u32)> = (0..rows as u32).map(|k| (0, k)).collect();
        let mut rng = window_rng(self.seed, self.epoch, partition, window);
        echoed_order(items, self.echo, &mut rng)
            .into_iter()
            .map(|(_, k)| k as usize)
            .collect()
    }

    pub(crate) fn rounds(&self) -> u64 {
        if self.shuffled { self.echo.max(1) } else { 1 }
    }
}

/// A rank's window of the global order: the items it takes from each of its partitions
/// (the repeated row last, where the rank pads), and its batches as `(partition of the rank,
/// item)` pairs, the first of them output batch `first` of the epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WindowPlan {
    pub(crate) needs: Vec<usize>,
    pub(crate) batches: Vec<Vec<(usize, usize)>>,
    pub(crate) first: u64,
}

/// Window `w` of `shape` for the rank reading `slice`: each partition's items permuted, and
/// each batch the chunks of every partition in partition order, round after round.
pub(crate) fn plan_window(shape: &Shape, slice: &RankSlice, permutation: &Permutation, w: u64) -> WindowPlan {
    plan_window_at(shape, slice, permutation, w, w)
}

/// [`plan_window`], its permutations drawn as window `drawn`'s (a window counted apart from
/// its shape's, as a stream not counted ahead cuts its windows one at a time).
pub(crate) fn plan_window_at(
    shape: &Shape,
    slice: &RankSlice,
    permutation: &Permutation,
    w: u64,
    drawn: u64,
) -> WindowPlan {
    let batches = shape.window_batches(w);
    let last = w + 1 == shape.windows();
    let len = (batches.end - batches.start) as usize;
    let mut needs = Vec::new();
    // Per partition: its delivered items, its batch cuts, its repeated row.
    let mut partitions = Vec::new();
    for (i, p) in slice.parts.clone().enumerate() {
        let before = shape.items_before(p, batches.start);
        let real = (shape.items_before(p, batches.end) - before) as usize;
        let pad = last && slice.pad && p + 1 == slice.parts.end;
        needs.push(real + usize::from(pad));
        let cuts: Vec<usize> = batches
            .clone()
            .map(|b| (shape.items_before(p, b) - before) as usize)
            .chain(std::iter::once(real))
            .collect();
        let order = permutation.apply(real, p, drawn);
        partitions.push((i, order, cuts, pad.then_some(real)));
    }
    let mut out = Vec::with_capacity(len * permutation.rounds() as usize);
    for round in 0..permutation.rounds() as usize {
        for j in 0..len {
            let mut batch = Vec::new();
            for (i, order, cuts, pad) in &partitions {
                let base = round * cuts[len];
                batch.extend(order[base + cuts[j]..base + cuts[j + 1]].iter().map(|&k| (*i, k)));
                if j + 1 == len
                    && let Some(k) = pad
                {
                    batch.push((*i, *k));
                }
            }
            out.push(batch);
        }
    }
    WindowPlan {
        needs,
        batches: out,
        first: w
            .saturating_mul(shape.window)
            .saturating_mul(permutation.rounds()),
    }
}

/// Where output batch `t` of an epoch is, when each window gives its batches `echo` times
/// (rounds): its window, round, and place in the round.
pub(crate) fn locate(shape: &Shape, echo: u64, t: u64) -> (u64, u64, u64) {
    let per_window = shape.window * echo.max(1);
    let w = (t / per_window).min(shape.windows().saturating_sub(1));
    let len = (shape.window_batches(w).count() as u64).max(1);
    let offset = t - w * per_window;
    (w, offset / len, offset % len)
}

/// Epoch `epoch`'s shard order.
pub(crate) fn shard_order(seed: u64, epoch: u64, shards: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..shards).collect();
    order.shuffle(&mut ChaCha8Rng::seed_from_u64(mix(seed, epoch)));
    order
}

/// The parts of shards holding positions `[start, end)` of the epoch sequence (wrapping).
pub(crate) fn segments(counts: &[u64], order: &[usize], start: u64, end: u64) -> Vec<(usize, u64, u64)> {
    let n: u64 = counts.iter().sum();
    let mut out = Vec::new();
    if n == 0 {
        return out;
    }
    let mut pos = start;
    while pos < end {
        let mut g = pos % n;
        for &shard in order {
            let c = counts[shard];
            if g < c {
                let take = (c - g).min(end - pos);
                out.push((shard, g, take));
                pos += take;
                break;
            }
            g -= c;
        }
    }
    out
}

/// The permutation of partition `partition`'s window `window` of `epoch`.
pub(crate) fn window_rng(seed: u64, epoch: u64, partition: u64, window: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(mix(mix(mix(seed, epoch), partition + 1), window))
}

/// The seed of the random ops of batch `batch` of `epoch`, on the rank whose first partition
/// is `partition`.
pub(crate) fn batch_key(seed: u64, epoch: u64, partition: u64, batch: u64) -> u64 {
    mix(mix(mix(seed ^ 0x5EED, epoch), partition), batch)
}

/// A window's rows in the order they are delivered: `echo` rounds, each a permutation of the
/// window drawn from `rng`, so a sample's repeats are a round apart; where one round ends with
/// the row the next begins with, the next round's first two are swapped (never adjacent).
pub(crate) fn echoed_order(rows: Vec<(u32, u32)>, echo: u64, rng: &mut ChaCha8Rng) -> Vec<(u32, u32)> {
    let mut out: Vec<(u32, u32)> = Vec::with_capacity(rows.len() * echo as usize);
    for _ in 0..echo {
        let mut round = rows.clone();
        round.shuffle(rng);
        if round.len() > 1 && out.last() == round.first() {
            round.swap(0, 1);
        }
        out.extend(round);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every batch of an epoch for each rank of `world`, as epoch-sequence positions.
    fn epoch(shape: &Shape, world: u64, permutation: &Permutation) -> Vec<Vec<Vec<u64>>> {
        (0..world)
            .map(|rank| {
                let slice = RankSlice::new(shape, rank, world);
                let mut batches = Vec::new();
                for w in 0..shape.windows() {
                    let plan = plan_window(shape, &slice, permutation, w);
                    assert_eq!(plan.first, batches.len() as u64, "windows are numbered in turn");
                    // Each partition's items of the window, from where the window starts.
                    let items: Vec<Vec<u64>> = slice
                        .parts
                        .clone()
                        .zip(&plan.needs)
                        .map(|(p, &need)| {
                            let from = shape.items_before(p, shape.window_batches(w).start);
                            let mut at: Vec<u64> = shape
                                .positions(p, from..shape.items_before(p, shape.batches()))
                                .collect();
                            at.truncate(need);
                            // The repeated row: the epoch's row `rank` (wrapping).
                            at.resize(need, rank % shape.n.max(1));
                            at
                        })
                        .collect();
                    for batch in plan.batches {
                        batches.push(batch.into_iter().map(|(i, k)| items[i][k]).collect());
                    }
                }
                batches
            })
            .collect()
    }

    fn shape(n: u64, global: u64, partitions: u64, window: u64, drop_last: bool) -> Shape {
        Shape {
            n,
            global,
            partitions,
            window,
            drop_last,
        }
    }

    fn shuffled(echo: u64) -> Permutation {
        Permutation {
            seed: 3,
            epoch: 1,
            echo,
            shuffled: true,
        }
    }

    #[test]
    fn global_batches_are_the_same_at_every_world_size_dividing_the_partitions() {
        for (n, global, partitions, window) in [(101, 12, 4, 3), (96, 8, 8, 2), (7, 8, 8, 1), (250, 24, 8, 5)]
        {
            for drop_last in [false, true] {
                let shape = shape(n, global, partitions, window, drop_last);
                let whole = epoch(&shape, 1, &shuffled(1));
                for world in [2u64, 4, 8]
                    .into_iter()
                    .filter(|w| partitions % w == 0 && global % w == 0)
                {
                    let ranks = epoch(&shape, world, &shuffled(1));
                    for (t, one) in whole[0].iter().enumerate() {
                        let mut alone: Vec<u64> = one.clone();
                        let mut joined: Vec<u64> = ranks.iter().flat_map(|r| r[t].clone()).collect();
                        let sizes: Vec<usize> = ranks.iter().map(|r| r[t].len()).collect();
                        assert!(
                            sizes.iter().all(|&s| s == sizes[0]),
                            "equal batches on every rank: {sizes:?}"
                        );
                        if (t as u64) + 1 < shape.batches() || shape.tail().is_multiple_of(world) {
                            // As a sequence too: rank r's batch is slice r of the global one.
                            assert_eq!(
                                joined, alone,
                                "n={n} G={global} P={partitions} W={world} batch {t}"
                            );
                        } else {
                            // The last, padded batch: its rows, and fewer than W repeated.
                            let extra = joined.len() - alone.len();
                            assert!(extra < world as usize);
                            for row in &alone {
                                let at = joined
                                    .iter()
                                    .position(|x| x == row)
                                    .expect("every row of the batch");
                                joined.remove(at);
                            }
                            assert_eq!(joined.len(), extra);
                            joined = alone.clone();
                        }
                        alone.sort_unstable();
                        joined.sort_unstable();
                        assert_eq!(joined, alone, "the same rows: n={n} W={world} batch {t}");
                    }
                    assert_eq!(
                        ranks.iter().map(|r| r.len()).collect::<Vec<_>>(),
                        vec![whole[0].len(); world as usize]
                    );
                }
            }
        }
    }

    #[test]
    fn every_row_once_per_epoch_and_at_most_one_repeat_per_rank() {
        for (n, global, partitions, window, world) in [(101, 12, 4, 3, 4), (37, 6, 6, 2, 3), (5, 8, 8, 4, 8)]
        {
            for drop_last in [false, true] {
                let shape = shape(n, global, partitions, window, drop_last);
                let ranks = epoch(&shape, world, &shuffled(1));
                let mut rows: Vec<u64> = ranks.iter().flatten().flatten().copied().collect();
                let total = rows.len() as u64;
                rows.sort_unstable();
                rows.dedup();
                if drop_last {
                    assert_eq!(total, n / global * global);
                    assert_eq!(rows.len() as u64, total, "no row twice");
                } else {
                    assert_eq!(rows.len() as u64, n, "every row");
                    assert!(total - n < world, "{} repeats at world size {world}", total - n);
                }
            }
        }
    }

    #[test]
    fn echo_gives_each_row_k_times_in_rounds_and_locate_finds_every_batch() {
        let shape = shape(101, 12, 4, 3, false);
        let batches = &epoch(&shape, 2, &shuffled(3))[1];
        assert_eq!(batches.len() as u64, shape.batches() * 3);
        let mut at = 0;
        for w in 0..shape.windows() {
            let len = shape.window_batches(w).count() as u64;
            for round in 0..3 {
                for j in 0..len {
                    assert_eq!(locate(&shape, 3, at), (w, round, j));
                    at += 1;
                }
            }
        }
        let rows: Vec<u64> = batches.iter().flatten().copied().collect();
        let mut once = rows.clone();
        once.sort_unstable();
        once.dedup();
        for row in &once {
            assert_eq!(rows.iter().filter(|r| *r == row).count(), 3, "row {row}");
        }
    }

    #[test]
    fn without_a_shuffle_one_partition_is_the_epoch_in_order() {
        let shape = shape(30, 8, 1, 1, false);
        let order = Permutation {
            shuffled: false,
            ..shuffled(1)
        };
        let rows: Vec<u64> = epoch(&shape, 1, &order)[0].concat();
        assert_eq!(rows, (0..30).collect::<Vec<_>>());
    }

    #[test]
    fn the_default_partitions_serve_the_usual_world_sizes() {
        for w in [1, 2, 4, 8] {
            assert_eq!(default_partitions(w, true), 8);
        }
        assert_eq!(default_partitions(3, true), 24);
        assert_eq!(default_partitions(16, true), 16);
        assert_eq!(default_partitions(4, false), 4);
        assert!(
            check_world(8, 3)
                .unwrap_err()
                .to_string()
                .contains("does not divide")
        );
    }

    #[test]
    fn echoed_windows_repeat_each_row_k_times_never_adjacent() {
        let rows: Vec<(u32, u32)> = (0..10).map(|r| (0, r)).collect();
        for seed in 0..200 {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let order = echoed_order(rows.clone(), 3, &mut rng);
            assert_eq!(order.len(), 30);
            for r in &rows {
                assert_eq!(order.iter().filter(|x| *x == r).count(), 3);
            }
            assert!(order.windows(2).all(|w| w[0] != w[1]), "seed {seed}: {order:?}");
        }
        // Without echoing the order is the plain shuffle of the window (sequences saved
        // before echoing existed are unchanged).
        let mut plain = rows.clone();
        plain.shuffle(&mut ChaCha8Rng::seed_from_u64(9));
        assert_eq!(echoed_order(rows, 1, &mut ChaCha8Rng::seed_from_u64(9)), plain);
    }

    #[test]
    fn automatic_echo_covers_the_measured_stall() {
        let auto = Echo::Auto { max: 4 };
        assert_eq!(auto.factor(None), 1, "nothing measured yet");
        assert_eq!(auto.factor(Some(0.0)), 1);
        assert_eq!(
            auto.factor(Some(0.5)),
            2,
            "waiting half the time: twice the samples"
        );
        assert_eq!(auto.factor(Some(0.6)), 3);
        assert_eq!(auto.factor(Some(0.99)), 4, "capped");
        assert_eq!(Echo::Fixed(3).factor(Some(0.9)), 3);
        assert_eq!(Echo::Off.factor(Some(0.9)), 1);
    }

    #[test]
    fn shard_orders_change_by_epoch_and_are_reproducible() {
        assert_eq!(shard_order(1, 0, 50), shard_order(1, 0, 50));
        assert_ne!(shard_order(1, 0, 50), shard_order(1, 1, 50));
        assert_ne!(shard_order(1, 0, 50), shard_order(2, 0, 50));
    }

    #[test]
    fn states_round_trip_and_reject_garbage() {
        let s = LoaderState {
            order: Order {
                sources: 11,
                seed: 7,
                global_batch: 96,
                window: 4,
                partitions: 8,
                drop_last: true,
                echo: 1,
            },
            epoch: 2,
            batches: 31,
            version: 0xfeed,
            echo: 3,
            per_rank: None,
            mixture: None,
            parts: None,
        };
        assert_eq!(LoaderState::from_bytes(&s.to_bytes()).expect("state"), s);
        // A packed loader's partitions travel with it, the unknown ones too; ranks' states
        // merge into one that knows every partition.
        let at = |done, offset| Some(PartPos::Pack(PackPos { done, offset }));
        let rank0 = LoaderState {
            parts: Some(vec![at(3, 5), at(4, 0), None, None, None, None, None, None]),
            ..s.clone()
        };
        let mut rank1 = rank0.clone();
        rank1.parts = Some(vec![
            None,
            None,
            at(1, 1),
            at(9, 2),
            at(0, 0),
            at(5, 5),
            at(6, 0),
            at(2, 30),
        ]);
        for state in [&rank0, &rank1] {
            let bytes = state.to_bytes();
            assert!(bytes.starts_with(b"PDK1"));
            assert_eq!(&LoaderState::from_bytes(&bytes).expect("packed state"), state);
            let e = LoaderState::from_bytes(&bytes[..bytes.len() - 8]).expect_err("damaged");
            assert!(e.to_string().contains("damaged"), "{e}");
        }
        let merged = LoaderState::merge(&[rank0.clone(), rank1.clone()]).expect("merge");
        assert!(merged.parts.as_ref().expect("parts").iter().all(Option::is_some));
        assert_eq!(merged.parts.as_ref().expect("parts")[3], at(9, 2));
        let mut later = rank1.clone();
        later.batches += 1;
        assert!(
            LoaderState::merge(&[rank0.clone(), later])
                .expect_err("another step")
                .to_string()
                .contains("at one step")
        );
        let mut other = rank1;
        other.parts.as_mut().expect("parts")[0] = at(7, 7);
        assert!(
            LoaderState::merge(&[rank0, other])
                .expect_err("disagree")
                .to_string()
                .contains("partition 0")
        );
        // A bucketed loader's bitmaps travel with it, of any length.
        let bucket = |first, given: Vec<u8>| Some(PartPos::Bucket(BucketPos { first, given }));
        let bucketed = LoaderState {
            parts: Some(vec![
                bucket(4, vec![]),
                None,
                bucket(9, vec![1, 0, 255, 3, 5, 6, 7, 8, 9, 10]),
                bucket(0, vec![0x80]),
                None,
                None,
                None,
                None,
            ]),
            ..s.clone()
        };
        let bytes = bucketed.to_bytes();
        assert!(bytes.starts_with(b"PDB1"));
        assert_eq!(LoaderState::from_bytes(&bytes).expect("bucketed state"), bucketed);
        for cut in [bytes.len() - 8, STATE_LEN + 8 * 5] {
            let e = LoaderState::from_bytes(&bytes[..cut]).expect_err("damaged");
            assert!(e.to_string().contains("damaged pushdown bucketed"), "{e}");
        }
        // A mixture's rows taken travel with it; a damaged one is refused.
        let mixed = LoaderState {
            mixture: Some(Taken(vec![(0..8).collect(), (10..18).collect()])),
            ..s.clone()
        };
        let bytes = mixed.to_bytes();
        assert!(bytes.starts_with(b"PDM1"));
        assert_eq!(LoaderState::from_bytes(&bytes).expect("mixture state"), mixed);
        for cut in [bytes.len() - 8, bytes.len() - 3, STATE_LEN + 8] {
            let e = LoaderState::from_bytes(&bytes[..cut])
                .expect_err("damaged")
                .to_string();
            assert!(e.contains("damaged"), "{e}");
        }
        assert!(LoaderState::from_bytes(b"PDL4").is_err());
        assert!(LoaderState::from_bytes(&[0u8; STATE_LEN]).is_err());
        // A mixture of no partitions (as its order says) is damaged, not a panic (found by
        // the `loader_state` fuzz target; its input is in fuzz/corpus/loader_state/).
        let mut none = LoaderState {
            order: Order {
                partitions: 0,
                ..s.order
            },
            ..s.clone()
        }
        .to_bytes();
        none[..4].copy_from_slice(MIXTURE_MAGIC);
        none.extend([1u64, 0].iter().flat_map(|w| w.to_le_bytes()));
        let e = LoaderState::from_bytes(&none)
            .expect_err("no partitions")
            .to_string();
        assert!(e.contains("damaged"), "{e}");
        // Sources × partitions near `usize::MAX`: damaged, no overflow.
        let mut huge = LoaderState {
            order: Order {
                partitions: 1,
                ..s.order
            },
            ..s.clone()
        }
        .to_bytes();
        huge[..4].copy_from_slice(MIXTURE_MAGIC);
        huge.extend([u64::MAX, 1, 0].iter().flat_map(|w| w.to_le_bytes()));
        let e = LoaderState::from_bytes(&huge).expect_err("overflow").to_string();
        assert!(e.contains("damaged"), "{e}");
        // The per-rank order's states are recognised (to restore at an epoch boundary).
        let mut v3 = b"PDL3".to_vec();
        for word in [5u64, 2, 0, 0, 2] {
            v3.extend_from_slice(&word.to_le_bytes());
        }
        let old = LoaderState::from_bytes(&v3).expect("v3 state");
        assert_eq!(
            (old.per_rank, old.epoch, old.batches, old.echo),
            (Some(5), 2, 0, 2)
        );
        let mut v2 = v3.clone();
        v2[..4].copy_from_slice(b"PDL2");
        v2.truncate(STATE_LEN_V3 - 8);
        assert_eq!(LoaderState::from_bytes(&v2).expect("v2 state").echo, 1);
        let old = LoaderState::from_bytes(&[&b"PDL1"[..], &[0u8; 24]].concat()).expect_err("old");
        assert!(old.to_string().contains("older pushdown"), "{old}");
        // What differs is named.
        let here = Order {
            global_batch: 48,
            ..s.order
        };
        let why = here.differs(&s.order, 2).expect("differs");
        assert!(
            why.contains("global batch is 96") && why.contains("batch_size=48"),
            "{why}"
        );
        let here = Order { seed: 1, ..s.order };
        assert!(here.differs(&s.order, 2).expect("seed").contains("seed"));
        let here = Order { window: 2, ..s.order };
        assert!(
            here.differs(&s.order, 4)
                .expect("window")
                .contains("shuffle_buffer=96")
        );
        assert_eq!(s.order.differs(&s.order, 4), None);
    }
}
