//! Whisper's log-mel features, as `transformers.WhisperFeatureExtractor` computes them on its
//! numpy path: the clip zero-padded or cut to `max_seconds`, reflect-padded by half a window
//! on each side, a periodic Hann window of `n_fft` every `hop` samples, the power spectrum
//! (realfft, in `f64`), Slaney-normalised triangular mel filters on the Slaney mel scale from
//! 0 to 8 kHz, `log10(max(1e-10, ·))`, the last frame dropped, values clamped to 8 below the
//! clip's maximum, then `(x + 4) / 4`.

use std::sync::Arc;

use realfft::{RealFftPlanner, RealToComplex};

/// The floor under mel energies before the logarithm (transformers' `mel_floor`).
const MEL_FLOOR: f64 = 1e-10;
/// Whisper's upper mel band edge.
const MAX_FREQUENCY: f64 = 8000.0;

/// The feature extractor for one `(sample_rate, n_mels, n_fft, hop, max_seconds)`.
pub(crate) struct LogMel {
    n_mels: usize,
    n_fft: usize,
    hop: usize,
    /// Samples the clip is padded or cut to.
    samples: usize,
    window: Vec<f64>,
    /// Per mel band: its first FFT bin and its weights from there.
    filters: Vec<(usize, Vec<f64>)>,
    fft: Arc<dyn RealToComplex<f64>>,
}

impl std::fmt::Debug for LogMel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogMel")
            .field("n_mels", &self.n_mels)
            .field("n_fft", &self.n_fft)
            .field("hop", &self.hop)
            .field("samples", &self.samples)
            .finish_non_exhaustive()
    }
}

impl LogMel {
    /// Frames of output: the STFT's `1 + samples / hop` frames, less the last.
    pub fn frames_for(samples: usize, hop: usize) -> usize {
        samples / hop
    }

    pub fn new(sample_rate: u32, n_mels: usize, n_fft: usize, hop: usize, samples: usize) -> Self {
        // numpy's `hanning(n + 1)[:-1]`: the periodic window.
        let window = (0..n_fft)
            .map(|i| 0.5 - 0.5 * (2.0 * std::f64::consts::PI * i as f64 / n_fft as f64).cos())
            .collect();
        let fft = RealFftPlanner::<f64>::new().plan_fft_forward(n_fft);
        Self {
            n_mels,
            n_fft,
            hop,
            samples,
            window,
            filters: mel_filters(sample_rate, n_mels, n_fft),
            fft,
        }
    }

    pub fn frames(&self) -> usize {
        Self::frames_for(self.samples, self.hop)
    }

    /// `[n_mels, frames]` features of `pcm`, mel-major, into `out`.
    pub fn compute(&self, pcm: &[f32], out: &mut Vec<f32>) {
        let pad = self.n_fft / 2;
        let n = self.samples;
        let real = pcm.len().min(n);
        // The clip cut or zero-padded to `n`, reflect-padded by `pad` on each side.
        let mut x = vec![0f64; n + 2 * pad];
        for (dst, &s) in x[pad..pad + real].iter_mut().zip(pcm) {
            *dst = f64::from(s);
        }
        for i in 0..pad {
            x[i] = x[pad + reflect(pad - i, n)];
            x[pad + n + i] = x[pad + reflect(n + i, n)];
        }
        let frames = self.frames();
        let bins = self.n_fft / 2 + 1;
        let mut log = vec![0f64; self.n_mels * frames];
        let mut frame = self.fft.make_input_vec();
        let mut spectrum = self.fft.make_output_vec();
        let mut power = vec![0f64; bins];
        let floor = MEL_FLOOR.log10();
        for t in 0..frames {
            let start = t * self.hop;
            let window = &x[start..start + self.n_fft];
            // A window wholly in the zero padding has no energy: every band is at the floor.
            if window.iter().all(|&v| v == 0.0) {
                for m in 0..self.n_mels {
                    log[m * frames + t] = floor;
                }
                continue;
            }
            for ((f, &v), &w) in frame.iter_mut().zip(window).zip(&self.window) {
                *f = v * w;
            }
            // Lengths are the planner's own: the transform cannot fail.
            if self.fft.process(&mut frame, &mut spectrum).is_err() {
                continue;
            }
            for (p, c) in power.iter_mut().zip(&spectrum) {
                *p = c.norm_sqr();
            }
            for (m, (first, weights)) in self.filters.iter().enumerate() {
                let e: f64 = weights.iter().zip(&power[*first..]).map(|(w, p)| w * p).sum();
                log[m * frames + t] = e.max(MEL_FLOOR).log10();
            }
        }
        let max = log.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        out.extend(log.iter().map(|&v| ((v.max(max - 8.0) + 4.0) / 4.0) as f32));
    }
}

/// numpy's `reflect` padding index for position `i` of a signal of `n` (n ≥ 2), `i` in
/// `-(n-1)..2n-1` given as `i` for the left side (mirrored about 0) and past the end.
fn reflect(i: usize, n: usize) -> usize {
    if n < 2 {
        return 0;
    }
    let period = 2 * (n - 1);
    let i = i % period;
    if i < n { i } else { period - i }
}

/// Slaney's mel scale: linear below 1 kHz, logarithmic above.
fn hz_to_mel(f: f64) -> f64 {
    let logstep = 27.0 / 6.4f64.ln();
    if f >= 1000.0 {
        15.0 + (f / 1000.0).ln() * logstep
    } else {
        3.0 * f / 200.0
    }
}

fn mel_to_hz(m: f64) -> f64 {
    let logstep = 6.4f64.ln() / 27.0;
    if m >= 15.0 {
        1000.0 * (logstep * (m - 15.0)).exp()
    } else {
        200.0 * m / 3.0
    }
}

/// transformers' `mel_filter_bank(1 + n_fft // 2, n_mels, 0, 8000, sample_rate, "slaney",
/// "slaney")`, each band kept as its non-zero run of weights.
fn mel_filters(sample_rate: u32, n_mels: usize, n_fft: usize) -> Vec<(usize, Vec<f64>)> {
    let bins = n_fft / 2 + 1;
    let top = MAX_FREQUENCY.min(f64::from(sample_rate / 2));
    let (lo, hi) = (hz_to_mel(0.0), hz_to_mel(top));
    let centers: Vec<f64> = (0..n_mels + 2)
        .map(|i| mel_to_hz(lo + (hi - lo) * i as f64 / (n_mels + 1) as f64))
        .collect();
    // numpy's `linspace(0, sample_rate // 2, bins)`.
    let nyquist = f64::from(sample_rate / 2);
    let fft_freqs: Vec<f64> = (0..bins)
        .map(|i| nyquist * i as f64 / (bins - 1) as f64)
        .collect();
    (0..n_mels)
        .map(|m| {
            let (left, center, right) = (centers[m], centers[m + 1], centers[m + 2]);
            let norm = 2.0 / (right - left);
            let weights: Vec<f64> = fft_freqs
                .iter()
                .map(|&f| {
                    let down = (f - left) / (center - left);
                    let up = (right - f) / (right - center);
                    down.min(up).max(0.0) * norm
                })
                .collect();
            let first = weights.iter().position(|&w| w > 0.0).unwrap_or(0);
            let last = weights.iter().rposition(|&w| w > 0.0).map_or(first, |l| l + 1);
            (first, weights[first..last.max(first)].to_vec())
        })
        .collect()
}
