//! The sample order, pure: which rows a rank reads in an epoch and in what order, as a
//! function of (seed, epoch, rank, world size, batching, echo) and the shards' row counts —
//! never of timing or of which server answered. No I/O, no async runtime: the loader's
//! producer follows what this module computes, and a saved [`LoaderState`] is all a restored
//! loader needs to compute it again.
//!
//! * epoch `e`'s shards are permuted by `(seed, e)` ([`shard_order`]) and their rows
//!   concatenated; rank `r` of `W` reads positions `[r·L, (r+1)·L)` of that sequence
//!   ([`rank_range`]), cut into parts of shards ([`segments`]);
//! * each window of the shuffle buffer is permuted by `(seed, e, r, window)`
//!   ([`window_rng`]), repeated `k` times when echoing ([`echoed_order`]);
//! * batch `b`'s random ops draw from `(seed, e, r, b)` ([`batch_key`]).

use pushdown_ops::mix;
use pushdown_protocol::{Compression, ScanRequest};
use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;

use crate::error::{ClientError, Result};

/// What a rank's sample sequence depends on, beside the query, the batching and the
/// dataset's version.
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

/// Where a loader is: the next batch is batch `batches` of epoch `epoch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoaderState {
    /// Identifies the query, seed, rank, world size and batching the state belongs to.
    pub fingerprint: u64,
    pub epoch: u64,
    pub batches: u64,
    /// The shards `epoch` was planned on (files, versions, row groups), when `batches > 0`:
    /// resuming mid-epoch needs that same dataset version. 0 at an epoch boundary.
    pub version: u64,
    /// Times `epoch` repeats each sample (data echoing; 1: not echoed).
    pub echo: u64,
}

const STATE_MAGIC: &[u8; 4] = b"PDL3";
const STATE_LEN: usize = 4 + 5 * 8;
/// States saved before data echoing: no echo word.
const STATE_MAGIC_V2: &[u8; 4] = b"PDL2";

impl LoaderState {
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = STATE_MAGIC.to_vec();
        for v in [
            self.fingerprint,
            self.epoch,
            self.batches,
            self.version,
            self.echo,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        if bytes.starts_with(b"PDL1") {
            return Err(ClientError::Invalid(
                "a loader state saved by an older pushdown (PDL1, without the dataset version): \
                 restart the epoch it was saved in"
                    .into(),
            ));
        }
        let bad = || {
            ClientError::Invalid(format!(
                "not a pushdown loader state (expected {STATE_LEN} bytes starting PDL3)"
            ))
        };
        let v2 = bytes.len() == STATE_LEN - 8 && bytes.starts_with(STATE_MAGIC_V2);
        if !v2 && (bytes.len() != STATE_LEN || &bytes[..4] != STATE_MAGIC) {
            return Err(bad());
        }
        let word = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&bytes[4 + 8 * i..12 + 8 * i]);
            u64::from_le_bytes(b)
        };
        Ok(Self {
            fingerprint: word(0),
            epoch: word(1),
            batches: word(2),
            version: word(3),
            echo: if v2 { 1 } else { word(4).max(1) },
        })
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

/// What the sample sequence depends on, but the dataset's version (that is [`Shards`]'s).
pub(crate) fn fingerprint(request: &ScanRequest, o: &Sequence, batch: usize, window: usize) -> u64 {
    let mut h = Fnv::new();
    // The codec does not change the samples, and the planner's choice of it depends on
    // timings: a state must restore whatever codec the restoring process picks.
    let mut request = request.clone();
    request.compression = Compression::default();
    h.eat(&request.encode());
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

/// Rows per rank and the first of rank `r`'s rows in the (wrapping) epoch sequence.
pub(crate) fn rank_range(n: u64, o: &Sequence) -> (u64, u64) {
    let w = o.world_size;
    let per_rank = if o.drop_last { n / w } else { n.div_ceil(w) };
    (per_rank, o.rank * per_rank)
}

pub(crate) fn batches_in(rows: u64, batch: u64, drop_last: bool) -> u64 {
    if drop_last {
        rows / batch
    } else {
        rows.div_ceil(batch)
    }
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

/// The permutation of window `window` of `epoch`.
pub(crate) fn window_rng(o: &Sequence, epoch: u64, window: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(mix(mix(mix(o.seed, epoch), o.rank + 1), window))
}

/// The seed of batch `batch` of `epoch`'s random ops.
pub(crate) fn batch_key(o: &Sequence, epoch: u64, batch: u64) -> u64 {
    mix(mix(mix(o.seed ^ 0x5EED, epoch), o.rank), batch)
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

    fn sequence(rank: usize, world: usize, drop_last: bool) -> Sequence {
        Sequence {
            seed: 0,
            rank: rank as u64,
            world_size: world as u64,
            drop_last,
            echo: Echo::Off,
        }
    }

    #[test]
    fn ranks_cover_the_epoch_exactly_once_or_pad_by_wrapping() {
        let counts = [5u64, 0, 7, 3, 11];
        let n: u64 = counts.iter().sum();
        let order = shard_order(9, 2, counts.len());
        for world in 1..=4 {
            for drop_last in [true, false] {
                let mut seen = Vec::new();
                for rank in 0..world {
                    let (len, start) = rank_range(n, &sequence(rank, world, drop_last));
                    let parts = segments(&counts, &order, start, start + len);
                    let rows: u64 = parts.iter().map(|p| p.2).sum();
                    assert_eq!(rows, len, "every rank gets the same rows");
                    for (shard, skip, take) in parts {
                        assert!(skip + take <= counts[shard]);
                        seen.extend((skip..skip + take).map(|r| (shard, r)));
                    }
                }
                let total = seen.len() as u64;
                seen.sort_unstable();
                seen.dedup();
                if drop_last {
                    assert_eq!(total, n / world as u64 * world as u64);
                    assert_eq!(seen.len() as u64, total, "no row twice");
                } else {
                    assert_eq!(seen.len() as u64, n, "every row at least once");
                    assert!(total - n < world as u64, "padding is less than one row per rank");
                }
            }
        }
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
            fingerprint: 7,
            epoch: 2,
            batches: 31,
            version: 0xfeed,
            echo: 3,
        };
        assert_eq!(LoaderState::from_bytes(&s.to_bytes()).expect("state"), s);
        assert!(LoaderState::from_bytes(b"PDL3").is_err());
        // A state saved before echoing had no echo word: it resumes unechoed.
        let mut v2 = s.to_bytes();
        v2[..4].copy_from_slice(b"PDL2");
        v2.truncate(STATE_LEN - 8);
        let echo = LoaderState { echo: 1, ..s };
        assert_eq!(LoaderState::from_bytes(&v2).expect("v2 state"), echo);
        assert!(LoaderState::from_bytes(&[0u8; STATE_LEN]).is_err());
        let old = LoaderState::from_bytes(&[&b"PDL1"[..], &[0u8; 24]].concat()).expect_err("old");
        assert!(old.to_string().contains("older pushdown"), "{old}");
    }
}
