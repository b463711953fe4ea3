//! A mixture of sources by weight, pure: how many rows of each source every global batch
//! holds, and which of the batch's places they take. No I/O: like `order.rs`, a
//! function of the weights, the global batch, the partitions and the rows of each source
//! given so far, never of the world size.
//!
//! The layout this schedule is built for, which the loader follows (`loader/mixed.rs`):
//!
//! * every source keeps its own global order (`order.rs`) over the same `P`
//!   partitions, with its own epochs: a source that runs out begins its next epoch, its rows
//!   once per its own epoch, counted apart from the others';
//! * global batch `b` of `G` rows holds `n_s(b)` rows of source `s` ([`Schedule::batch`]): the
//!   mixture's rows are dealt one at a time to the source furthest behind its weight (the
//!   largest `w_s·(t+1) − c_s`, ties to the first), so after any `t` rows each source has
//!   within a row of its `w_s·t` (tested), over any run of batches within two rows;
//! * within the batch its places are dealt by the same rule ([`Schedule::places`]), so the
//!   chunk of places of each canonical partition (`⌊(p+1)G/P⌋ − ⌊pG/P⌋` of them, as in
//!   `order::Shape`) holds each source in proportion ([`Schedule::chunks`]);
//!   partition `p` of the mixture takes its rows of source `s` from partition `p` of source
//!   `s`. Rank `r` of `W` holds places `[r·G/W, (r+1)·G/W)`, which are its partitions'
//!   chunks: it reads only its partitions of every source, and the global batches, as sets of
//!   rows, are the same at every world size dividing `P`;
//! * the mixture's epoch is `⌊Σ_s n_s / G⌋` global batches (as many rows as the sources hold
//!   together): it ends on a batch count, never on one source running out.

use crate::deal::furthest_behind;
use crate::error::{ClientError, Result};
pub use crate::order::Taken;

/// The mixture's weights (normalized), its global batch and its partitions.
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    weights: Vec<f64>,
    global: u64,
    partitions: u64,
}

impl Schedule {
    /// A schedule of sources weighted `weights` (any positive scale: `[7, 2, 1]` is
    /// `[0.7, 0.2, 0.1]`), in global batches of `global` rows cut into `partitions` chunks.
    pub fn new(weights: &[f64], global: u64, partitions: u64) -> Result<Self> {
        if weights.is_empty() {
            return Err(ClientError::Invalid("a mixture needs at least one source".into()));
        }
        if let Some((i, w)) = weights
            .iter()
            .enumerate()
            .find(|(_, w)| !w.is_finite() || **w <= 0.0)
        {
            return Err(ClientError::Invalid(format!(
                "the mixture's source {i} has weight {w}: weights are positive numbers"
            )));
        }
        if global == 0 || partitions == 0 {
            return Err(ClientError::Invalid(
                "a mixture's global batch and partitions are at least 1".into(),
            ));
        }
        let sum: f64 = weights.iter().sum();
        Ok(Self {
            weights: weights.iter().map(|w| w / sum).collect(),
            global,
            partitions,
        })
    }

    /// The weights, summing to 1.
    pub fn weights(&self) -> &[f64] {
        &self.weights
    }

    /// Rows of each source in the next global batch, after `taken[s]` rows of source `s`
    /// were given in the batches before it (all of the mixture's rows so far: the schedule's
    /// state).
    pub fn batch(&self, taken: &[u64]) -> Vec<u64> {
        let mut counts = taken.to_vec();
        let before: u64 = taken.iter().sum();
        for t in before..before + self.global {
            let s = furthest_behind(&self.weights, &counts, t);
            counts[s] += 1;
        }
        counts.iter().zip(taken).map(|(c, t)| c - t).collect()
    }

    /// The source of each of a global batch's `G` places, for a batch holding `counts[s]`
    /// rows of source `s`, after `taken` (the rows of each source each partition gave so
    /// far). The batch's rows are dealt one at a time to the (partition, source) furthest
    /// behind its weight of the partition's places by the batch's end, among partitions with
    /// places left and sources with rows left. So every partition gives each source its
    /// weight over time (tested: within two rows), and where the partitions hold as many
    /// places each (`P` divides `G`, as a mixture asks), a source's partitions advance
    /// together: a partition given a fixed share of each batch instead would cycle through
    /// its rows faster than its neighbours. Within a partition's chunk the sources are
    /// spread evenly.
    pub fn places(&self, counts: &[u64], taken: &Taken) -> Vec<usize> {
        let (g, parts) = (self.global, self.partitions as usize);
        let mut left = counts.to_vec();
        let mut room: Vec<u64> = (0..parts as u64)
            .map(|p| cut(g, p + 1, self.partitions) - cut(g, p, self.partitions))
            .collect();
        let mut behind: Vec<Vec<f64>> = (0..parts)
            .map(|p| {
                let end = taken.0.iter().map(|row| row[p]).sum::<u64>() + room[p];
                (self.weights.iter().zip(&taken.0))
                    .map(|(w, row)| w * end as f64 - row[p] as f64)
                    .collect()
            })
            .collect();
        let mut chunks = vec![vec![0u64; counts.len()]; parts];
        for _ in 0..g {
            let mut best = (0, 0, f64::NEG_INFINITY);
            for p in (0..parts).filter(|&p| room[p] > 0) {
                for s in (0..counts.len()).filter(|&s| left[s] > 0) {
                    if behind[p][s] > best.2 {
                        best = (p, s, behind[p][s]);
                    }
                }
            }
            let (p, s, _) = best;
            chunks[p][s] += 1;
            behind[p][s] -= 1.0;
            room[p] -= 1;
            left[s] -= 1;
        }
        chunks.iter().flat_map(|chunk| spread(chunk)).collect()
    }

    /// Rows of each source in each partition's chunk of a batch whose places are `places`:
    /// `chunks[p][s]`. Partition `p` holds places `[⌊pG/P⌋, ⌊(p+1)G/P⌋)`.
    pub fn chunks(&self, places: &[usize], sources: usize) -> Vec<Vec<u64>> {
        let (g, p) = (places.len() as u64, self.partitions);
        (0..p)
            .map(|i| {
                let mut chunk = vec![0u64; sources];
                for &s in &places[(i * g / p) as usize..((i + 1) * g / p) as usize] {
                    chunk[s] += 1;
                }
                chunk
            })
            .collect()
    }

    /// Global batches in the mixture's epoch, for sources of `rows[s]` rows each: as many
    /// rows as they hold together, in whole batches.
    pub fn epoch_batches(&self, rows: &[u64]) -> u64 {
        rows.iter().sum::<u64>() / self.global
    }

    /// The canonical partitions.
    pub fn partitions(&self) -> u64 {
        self.partitions
    }

    /// The next global batch after `taken`, which it advances: the source of each of its
    /// places ([`Self::places`]).
    pub fn step(&self, taken: &mut Taken) -> Vec<usize> {
        let sources = self.weights.len();
        let counts = self.batch(&taken.per_source());
        let places = self.places(&counts, taken);
        for (p, chunk) in self.chunks(&places, sources).into_iter().enumerate() {
            for (s, rows) in chunk.into_iter().enumerate() {
                taken.0[s][p] += rows;
            }
        }
        places
    }

    /// Where the mixture is after its first `batches` global batches (replayed from the
    /// start: a loader that moves to another epoch without a state computes it so).
    pub fn replay(&self, batches: u64) -> Taken {
        let mut taken = Taken::start(self.weights.len(), self.partitions);
        for _ in 0..batches {
            self.step(&mut taken);
        }
        taken
    }
}

/// A chunk holding `chunk[s]` rows of each source, its sources spread evenly: each place
/// to the source furthest behind its share of the chunk.
fn spread(chunk: &[u64]) -> Vec<usize> {
    let total: u64 = chunk.iter().sum();
    let mut dealt = vec![0u64; chunk.len()];
    (0..total)
        .map(|t| {
            let target = (t + 1) as f64 / total as f64;
            let mut best = (0, f64::NEG_INFINITY);
            for (s, (&c, &d)) in chunk.iter().zip(&dealt).enumerate() {
                let behind = c as f64 * target - d as f64;
                if d < c && behind > best.1 {
                    best = (s, behind);
                }
            }
            dealt[best.0] += 1;
            best.0
        })
        .collect()
}

/// `⌊p·rows/parts⌋`: where partition `p`'s places begin.
fn cut(rows: u64, p: u64, parts: u64) -> u64 {
    crate::order::cut(rows, p, parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Batches `0..n` of `schedule` from the start: each batch's counts.
    fn run(schedule: &Schedule, n: usize) -> Vec<Vec<u64>> {
        let mut taken = vec![0u64; schedule.weights().len()];
        (0..n)
            .map(|_| {
                let counts = schedule.batch(&taken);
                for (t, c) in taken.iter_mut().zip(&counts) {
                    *t += c;
                }
                counts
            })
            .collect()
    }

    #[test]
    fn every_batch_is_whole_and_each_source_stays_within_a_row_of_its_weight() {
        for (weights, global) in [
            (vec![0.7, 0.2, 0.1], 32),
            (vec![0.7, 0.2, 0.1], 256),
            (vec![1.0, 1.0], 7),
            (vec![5.0, 3.0, 1.0, 0.5], 100),
            (vec![0.98, 0.01, 0.01], 64),
        ] {
            let schedule = Schedule::new(&weights, global, 8).expect("schedule");
            let batches = run(&schedule, 500);
            let mut taken = vec![0u64; weights.len()];
            for (b, counts) in batches.iter().enumerate() {
                assert_eq!(counts.iter().sum::<u64>(), global, "{weights:?} batch {b}");
                for (t, c) in taken.iter_mut().zip(counts) {
                    *t += c;
                }
                let rows = (b as u64 + 1) * global;
                for (s, (&t, &w)) in taken.iter().zip(schedule.weights()).enumerate() {
                    let off = (t as f64 - w * rows as f64).abs();
                    assert!(
                        off < 1.0 + 1e-9,
                        "{weights:?}: source {s} off by {off} after batch {b}"
                    );
                }
            }
        }
    }

    #[test]
    fn shares_hold_over_ten_batches_and_over_an_epoch() {
        let weights = [0.7, 0.2, 0.1];
        for global in [64u64, 256, 1024] {
            let schedule = Schedule::new(&weights, global, 8).expect("schedule");
            let batches = run(&schedule, 1000);
            let share = |range: std::ops::Range<usize>, s: usize| {
                let rows: u64 = batches[range.clone()].iter().map(|c| c[s]).sum();
                rows as f64 / (range.len() as u64 * global) as f64
            };
            for start in 0..990 {
                for (s, w) in weights.iter().enumerate() {
                    let got = share(start..start + 10, s);
                    assert!(
                        (got - w).abs() <= 0.1 * w,
                        "G={global}: batches {start}..+10, source {s}: {got}"
                    );
                }
            }
            for (s, w) in weights.iter().enumerate() {
                let got = share(0..1000, s);
                assert!(
                    (got - w).abs() <= 0.02 * w,
                    "G={global}: the epoch, source {s}: {got}"
                );
            }
        }
    }

    #[test]
    fn the_schedule_continues_from_the_rows_taken() {
        // A resumed mixture computes its next batch from the rows taken: the same batches as
        // the uninterrupted run, wherever it stopped.
        let schedule = Schedule::new(&[3.0, 2.0, 2.0], 48, 8).expect("schedule");
        let whole = run(&schedule, 40);
        let mut taken = vec![0u64; 3];
        for counts in &whole[..17] {
            for (t, c) in taken.iter_mut().zip(counts) {
                *t += c;
            }
        }
        let resumed: Vec<_> = (17..40)
            .map(|_| {
                let counts = schedule.batch(&taken);
                for (t, c) in taken.iter_mut().zip(&counts) {
                    *t += c;
                }
                counts
            })
            .collect();
        assert_eq!(resumed, whole[17..]);
    }

    #[test]
    fn every_partition_holds_each_source_in_proportion() {
        // Per batch, each partition's chunk holds each source within two rows of its share;
        // over time, each partition gives each source its weight within two rows, even
        // where chunks are a row or two (so a source's partitions run out together).
        for (weights, global) in [
            (vec![0.7, 0.2, 0.1], 240),
            (vec![0.7, 0.3], 10),
            (vec![0.5, 0.3, 0.2], 12),
        ] {
            let schedule = Schedule::new(&weights, global, 8).expect("schedule");
            let mut taken = Taken::start(weights.len(), 8);
            for b in 0..500 {
                let counts = schedule.batch(&taken.per_source());
                let places = schedule.step(&mut taken);
                assert_eq!(places.len(), global as usize);
                let chunks = schedule.chunks(&places, weights.len());
                for (s, &count) in counts.iter().enumerate() {
                    // The chunks hold the batch's rows of each source, all of them.
                    assert_eq!(chunks.iter().map(|c| c[s]).sum::<u64>(), count);
                    for (p, chunk) in chunks.iter().enumerate() {
                        let expected = count as f64 / 8.0;
                        assert!(
                            global < 64 || (chunk[s] as f64 - expected).abs() <= 2.0,
                            "batch {b} partition {p} holds {} rows of source {s}, its share is {expected}",
                            chunk[s]
                        );
                    }
                }
                for p in 0..8 {
                    let total: u64 = taken.0.iter().map(|row| row[p]).sum();
                    for (s, w) in weights.iter().enumerate() {
                        let off = taken.0[s][p] as f64 - w * total as f64;
                        assert!(
                            off.abs() <= 2.0,
                            "{weights:?} G={global} batch {b}: partition {p} gave source {s} {} \
                             rows of {total}",
                            taken.0[s][p]
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn a_rank_holds_its_partitions_places_at_any_world_size() {
        // Rank r of W holds places [r·G/W, (r+1)·G/W): the chunks of partitions
        // [rP/W, (r+1)P/W). So the rows a rank reads of each source are its partitions'.
        let schedule = Schedule::new(&[0.5, 0.3, 0.2], 96, 8).expect("schedule");
        let counts = schedule.batch(&[0, 0, 0]);
        let places = schedule.places(&counts, &Taken::start(3, 8));
        let chunks = schedule.chunks(&places, 3);
        for world in [1u64, 2, 4, 8] {
            let per_rank = 96 / world;
            for rank in 0..world {
                let range = (rank * per_rank) as usize..((rank + 1) * per_rank) as usize;
                let parts = crate::order::rank_partitions(8, rank, world);
                let mut from_partitions = vec![0u64; 3];
                for p in parts {
                    for (sum, rows) in from_partitions.iter_mut().zip(&chunks[p as usize]) {
                        *sum += rows;
                    }
                }
                let held: Vec<u64> = (0..3)
                    .map(|s| places[range.clone()].iter().filter(|&&x| x == s).count() as u64)
                    .collect();
                assert_eq!(held, from_partitions, "W={world} rank {rank}");
            }
        }
    }

    #[test]
    fn stepping_follows_the_chunks_and_replays_from_the_start() {
        let schedule = Schedule::new(&[0.6, 0.4], 40, 4).expect("schedule");
        let mut taken = Taken::start(2, 4);
        let mut totals = vec![0u64; 2];
        for _ in 0..25 {
            let counts = schedule.batch(&totals);
            let before = taken.clone();
            let places = schedule.step(&mut taken);
            assert_eq!(places, schedule.places(&counts, &before));
            for (t, c) in totals.iter_mut().zip(&counts) {
                *t += c;
            }
            assert_eq!(taken.per_source(), totals);
        }
        assert_eq!(schedule.replay(25), taken);
    }

    #[test]
    fn bad_weights_are_refused_by_source() {
        for (weights, named) in [
            (vec![0.5, 0.0], "source 1 has weight 0"),
            (vec![-1.0], "source 0 has weight -1"),
            (vec![1.0, f64::NAN], "source 1 has weight NaN"),
        ] {
            let e = Schedule::new(&weights, 32, 8).expect_err("refused").to_string();
            assert!(e.contains(named), "{e}");
        }
        assert!(Schedule::new(&[], 32, 8).is_err());
        assert_eq!(
            Schedule::new(&[7.0, 2.0, 1.0], 10, 8).expect("ok").weights(),
            [0.7, 0.2, 0.1]
        );
        assert_eq!(
            Schedule::new(&[1.0, 1.0], 10, 8)
                .expect("ok")
                .epoch_batches(&[95, 30]),
            12
        );
    }
}
