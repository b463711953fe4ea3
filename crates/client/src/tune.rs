//! Streams in flight, tuned while an epoch runs.
//!
//! With shards read in order ([`crate::Order::Sequential`], what the loader reads) the
//! streams behind the one being read only prefetch: how many there are never changes the
//! sequence, only how far the servers' cores and the link run ahead of the consumer. Too few,
//! and the consumer waits for the head shard while servers idle; too many, and memory (each
//! stream reads up to its buffer and its HTTP/2 window ahead) and server slots are held for
//! nothing. No fixed number suits both a 2-core server over a slow link and a 64-core one
//! next door, so the stream sizes itself, the way tf.data's autotune sizes its parallelism
//! from what it measures:
//!
//! ```text
//!  every window (≥ 300 ms and ≥ 3 batches): rate (rows/s) and the consumer's wait
//!  the window after a change is not judged (new streams must open first)
//!  a step up under trial:  rate ≥ 1.05 × before  → kept      else → stepped back, no trial for 10 windows
//!  consumer waits > 5%:    step up by max(1, level / 4), up to the memory bound
//!  consumer waits < 1% for 8 windows in a row:  one stream less, down to the start
//!  a stream shed and the consumer waits:  taken back, and never shed below that again
//! ```
//!
//! A step up pays only while the servers have idle cores and the link room: when either is
//! the bound, the rate does not rise and the step is taken back. Pure: no clock of its own,
//! no tokio; the stream feeds it.

use std::time::{Duration, Instant};

/// The shortest window judged, and the fewest batches in it.
const WINDOW: Duration = Duration::from_millis(300);
const WINDOW_BATCHES: u64 = 3;
/// The consumer waits more than this share of a window: more streams may help.
const WAITING: f64 = 0.05;
/// … less than this: it has what it needs.
const CALM: f64 = 0.01;
/// A step up is kept when the rate rose by this much.
const GAIN: f64 = 0.05;
/// Windows without a trial after one that did not pay.
const HOLD: u32 = 10;
/// Calm windows in a row before a stream is shed.
const SHED_AFTER: u32 = 8;

/// The tuned count of streams in flight.
#[derive(Debug, Clone)]
pub(crate) struct Tuner {
    level: usize,
    max: usize,
    window_start: Option<Instant>,
    waited: Duration,
    rows: u64,
    batches: u64,
    /// A step up under trial: the level before it and the rate measured there.
    trial: Option<(usize, f64)>,
    /// Windows left unjudged after a change.
    settle: u32,
    /// Windows left without a trial after one that did not pay.
    hold: u32,
    /// Calm windows in a row.
    calm: u32,
    /// A stream just shed: the level before.
    shed: Option<usize>,
    /// No stream is shed below this: a shed there made the consumer wait.
    floor: usize,
}

impl Tuner {
    /// Starts at `start` streams, never below it, never above `max`.
    pub(crate) fn new(start: usize, max: usize) -> Self {
        let min = start.max(1);
        Self {
            level: min,
            max: max.max(min),
            window_start: None,
            waited: Duration::ZERO,
            rows: 0,
            batches: 0,
            trial: None,
            settle: 0,
            hold: 0,
            calm: 0,
            shed: None,
            floor: min,
        }
    }

    /// Streams in flight now.
    #[cfg(test)]
    pub(crate) fn level(&self) -> usize {
        self.level
    }

    /// A batch of `rows` handed to the consumer at `now`, after it waited `waited` for it.
    /// Returns the level from now on.
    pub(crate) fn observe(&mut self, now: Instant, waited: Duration, rows: u64) -> usize {
        let start = *self.window_start.get_or_insert(now);
        self.waited += waited;
        self.rows += rows;
        self.batches += 1;
        let elapsed = now.saturating_duration_since(start);
        if elapsed >= WINDOW && self.batches >= WINDOW_BATCHES {
            let secs = elapsed.as_secs_f64();
            let rate = self.rows as f64 / secs;
            let wait = (self.waited.as_secs_f64() / secs).min(1.0);
            self.judge(rate, wait);
            self.window_start = Some(now);
            self.waited = Duration::ZERO;
            self.rows = 0;
            self.batches = 0;
        }
        self.level
    }

    /// One window's rate (rows/s) and the share of it the consumer waited.
    fn judge(&mut self, rate: f64, wait: f64) {
        if self.settle > 0 {
            self.settle -= 1;
            return;
        }
        if let Some((before, base)) = self.trial.take()
            && rate < base * (1.0 + GAIN)
        {
            // It did not pay: the bound is elsewhere (server CPU, link, this client).
            self.level = before;
            self.hold = HOLD;
            self.settle = 1;
            return;
        }
        if let Some(before) = self.shed.take()
            && wait > WAITING
        {
            // Shed one too many: back, and no lower from now on.
            self.level = before;
            self.floor = before;
            self.settle = 1;
            return;
        }
        self.hold = self.hold.saturating_sub(1);
        if wait > WAITING {
            self.calm = 0;
            if self.hold == 0 && self.level < self.max {
                self.trial = Some((self.level, rate));
                self.level = (self.level + (self.level / 4).max(1)).min(self.max);
                self.settle = 1;
            }
        } else if wait < CALM {
            self.calm += 1;
            if self.calm >= SHED_AFTER && self.level > self.floor {
                self.shed = Some(self.level);
                self.level -= 1;
                self.calm = 0;
                self.settle = 1;
            }
        } else {
            self.calm = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A simulated pipeline: `servers` streams' worth of decoding feeds a consumer that takes
    /// `demand` rows/s; each stream in flight adds `per_stream` rows/s of supply up to the
    /// servers' cores (`cores × per_stream`). Runs `windows` windows through the tuner and
    /// returns its levels.
    fn simulate(tuner: &mut Tuner, per_stream: f64, cores: usize, demand: f64, windows: usize) -> Vec<usize> {
        let mut now = Instant::now();
        let mut levels = Vec::new();
        for _ in 0..windows {
            let supply = per_stream * tuner.level().min(cores) as f64;
            let rate = supply.min(demand);
            let wait = if supply < demand {
                1.0 - supply / demand
            } else {
                0.0
            };
            // One window of 4 batches of 100 ms each.
            for _ in 0..4 {
                now += Duration::from_millis(100);
                tuner.observe(now, Duration::from_secs_f64(0.1 * wait), (rate * 0.1) as u64);
            }
            levels.push(tuner.level());
        }
        levels
    }

    #[test]
    fn it_climbs_to_the_servers_cores_and_stays_there() {
        // 12 server cores, one core's worth of rows per stream, a consumer wanting 20 cores'.
        let mut t = Tuner::new(4, 64);
        let levels = simulate(&mut t, 1000.0, 12, 20_000.0, 80);
        let last = &levels[40..];
        // Past 12 nothing pays: it tries now and then, and comes back.
        assert!(last.iter().all(|&l| (12..=15).contains(&l)), "{levels:?}");
        assert!(
            last.iter().filter(|&&l| l == 12).count() > last.len() / 2,
            "{levels:?}"
        );
    }

    #[test]
    fn it_stops_where_the_consumer_stops_waiting() {
        // The consumer takes 6 cores' worth: 6 streams suffice, and 8 calm windows shed the
        // rest of any overshoot, down to no fewer than the start.
        let mut t = Tuner::new(2, 64);
        let levels = simulate(&mut t, 1000.0, 16, 6_000.0, 120);
        assert!(levels[60..].iter().all(|&l| l == 6), "{levels:?}");
        let mut calm = Tuner::new(4, 64);
        let levels = simulate(&mut calm, 1000.0, 16, 1_000.0, 60);
        assert!(
            levels.iter().all(|&l| l == 4),
            "never below the start: {levels:?}"
        );
    }

    #[test]
    fn a_link_or_server_that_is_the_bound_gets_no_more_streams() {
        // Supply never rises past 2 streams' worth: every trial is taken back.
        let mut t = Tuner::new(2, 64);
        let levels = simulate(&mut t, 1000.0, 2, 50_000.0, 100);
        assert!(levels.iter().all(|&l| l <= 3), "{levels:?}");
        assert!(levels.iter().filter(|&&l| l == 2).count() > 75, "{levels:?}");
    }

    #[test]
    fn it_never_passes_its_memory_bound() {
        let mut t = Tuner::new(4, 9);
        let levels = simulate(&mut t, 1000.0, 64, 100_000.0, 100);
        assert_eq!(levels.iter().max(), Some(&9));
    }
}
