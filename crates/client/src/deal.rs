//! Dealing items to shares by weight, deterministically: each item to the share furthest
//! behind its weight, so after any `t` items every share is within one of `w·t`. A mixture
//! deals rows to sources with it (`mixture.rs`), a bucketed loader global batches to
//! buckets (`bucket.rs`). Pure: no I/O.

/// The share furthest behind its weight when item `t` is dealt (`counts`: items of each
/// dealt before it): the largest `w·(t+1) − count`, the first on a tie.
pub fn furthest_behind(weights: &[f64], counts: &[u64], t: u64) -> usize {
    let target = (t + 1) as f64;
    let mut best = (0, f64::NEG_INFINITY);
    for (s, (&w, &c)) in weights.iter().zip(counts).enumerate() {
        let behind = w * target - c as f64;
        if behind > best.1 {
            best = (s, behind);
        }
    }
    best.0
}
