//! Speech and audio ops: decode + resample to PCM, Whisper's log-mel features, durations from
//! the container's header (deterministic: either side), and the trainer's random crops and
//! SpecAugment masks.
//!
//! PCM travels as `List<Float32>` (mono: `[samples]`) or `FixedSizeList<List<Float32>, C>`
//! (`[channels, samples]`), its field tagged with its `pushdown.sample_rate`; fixed-length
//! outputs (`log_mel`, `random_audio_crop`) are `FixedSizeList` tensors with their
//! `pushdown.shape`, so trainers get dense `[B, n_mels, frames]` or `[B, samples]` batches.

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, FixedSizeListArray, Float16Array, Float32Array, Float64Array, LargeListArray,
    ListArray, UInt16Array,
};
use arrow::buffer::{NullBuffer, OffsetBuffer};
use arrow::datatypes::{DataType, Field, Float16Type, Float32Type, UInt16Type};
use half::{bf16, f16};
use rand::Rng;

use crate::audio::{MAX_PCM_BYTES, Pcm, Resamplers, decode, duration, mix};
use crate::media::{Media, encoded_input, encoded_nullable, for_each_encoded};
use crate::mel::LogMel;
use crate::op::{Op, OpError, Result, SHAPE_METADATA_KEY, Value, expect_params, fixed_width, int_param};
use crate::tensor_ops::{FloatType, row_rng};

/// Field metadata carrying the sample rate of a PCM column, so later ops (`log_mel`,
/// `random_audio_crop`) know what a second is.
pub const SAMPLE_RATE_METADATA_KEY: &str = "pushdown.sample_rate";

const MAX_RATE: i64 = 384_000;
const MAX_CHANNELS: i64 = 8;

fn arrow_err(op: &'static str) -> impl Fn(arrow::error::ArrowError) -> OpError {
    move |cause| OpError::Arrow { op, cause }
}

fn bad_args(op: &'static str, reason: String) -> OpError {
    OpError::BadArguments { op, reason }
}

/// The field of PCM at `rate` with `channels`, named `output`.
fn pcm_field(output: &str, rate: u32, channels: usize, nullable: bool) -> Field {
    let samples = DataType::List(Arc::new(Field::new("item", DataType::Float32, false)));
    let data_type = match channels {
        1 => samples,
        c => DataType::FixedSizeList(Arc::new(Field::new("item", samples, false)), c as i32),
    };
    Field::new(output, data_type, nullable)
        .with_metadata([(SAMPLE_RATE_METADATA_KEY.to_string(), rate.to_string())].into())
}

/// Builds a PCM column from per-row planes (`None`: a null row).
fn pcm_array(op: &'static str, rows: Vec<Option<Vec<Vec<f32>>>>, channels: usize) -> Result<ArrayRef> {
    let valid: Vec<bool> = rows.iter().map(Option::is_some).collect();
    let nulls = valid.contains(&false).then(|| NullBuffer::from(valid));
    let mut lengths = Vec::with_capacity(rows.len() * channels);
    let mut values = Vec::new();
    for row in rows {
        match row {
            Some(planes) => {
                for plane in planes {
                    lengths.push(plane.len());
                    values.extend_from_slice(&plane);
                }
            }
            None => lengths.extend(std::iter::repeat_n(0, channels)),
        }
    }
    let item = Arc::new(Field::new("item", DataType::Float32, false));
    let lists = ListArray::try_new(
        item,
        OffsetBuffer::from_lengths(lengths),
        Arc::new(Float32Array::from(values)),
        if channels == 1 { nulls.clone() } else { None },
    )
    .map_err(arrow_err(op))?;
    if channels == 1 {
        return Ok(Arc::new(lists));
    }
    let item = Arc::new(Field::new("item", lists.data_type().clone(), false));
    FixedSizeListArray::try_new(item, channels as i32, Arc::new(lists), nulls)
        .map(|a| Arc::new(a) as ArrayRef)
        .map_err(arrow_err(op))
}

/// What a PCM input column is: its channels and its rate (from the field's metadata).
#[derive(Debug, Clone, Copy)]
struct PcmInput {
    channels: usize,
    rate: Option<u32>,
}

impl PcmInput {
    fn of(op: &'static str, field: &Field) -> Result<Self> {
        let float_list = |t: &DataType| match t {
            DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) => {
                f.data_type() == &DataType::Float32
            }
            _ => false,
        };
        let channels = match field.data_type() {
            t if float_list(t) => 1,
            DataType::FixedSizeList(f, c) if float_list(f.data_type()) => *c as usize,
            other => {
                return Err(bad_args(
                    op,
                    format!(
                        "expects encoded audio (binary, or the Hub's struct<bytes, path>) or PCM \
                         (list<float32> from decode_audio), got {other}"
                    ),
                ));
            }
        };
        let rate = field
            .metadata()
            .get(SAMPLE_RATE_METADATA_KEY)
            .and_then(|r| r.parse().ok());
        Ok(Self { channels, rate })
    }
}

/// One row's samples of a mono PCM column of any list layout.
fn mono_rows<'a>(op: &'static str, input: &'a ArrayRef) -> Result<Vec<Option<&'a [f32]>>> {
    fn rows<'a>(
        list: &'a dyn Array,
        offsets: impl Fn(usize) -> (usize, usize),
        values: &'a [f32],
    ) -> Vec<Option<&'a [f32]>> {
        (0..list.len())
            .map(|i| {
                list.is_valid(i).then(|| {
                    let (a, b) = offsets(i);
                    &values[a..b]
                })
            })
            .collect()
    }
    fn floats<'b>(op: &'static str, a: &'b ArrayRef) -> Result<&'b [f32]> {
        a.as_primitive_opt::<Float32Type>()
            .map(|p| p.values().as_ref())
            .ok_or_else(|| bad_args(op, format!("expects float32 PCM, got {}", a.data_type())))
    }
    match input.data_type() {
        DataType::List(_) => {
            let l = input.as_list::<i32>();
            let o = l.value_offsets();
            Ok(rows(
                l,
                |i| (o[i] as usize, o[i + 1] as usize),
                floats(op, l.values())?,
            ))
        }
        DataType::LargeList(_) => {
            let l: &LargeListArray = input.as_list::<i64>();
            let o = l.value_offsets();
            Ok(rows(
                l,
                |i| (o[i] as usize, o[i + 1] as usize),
                floats(op, l.values())?,
            ))
        }
        DataType::FixedSizeList(_, n) => {
            let l = input.as_fixed_size_list();
            let n = *n as usize;
            let off = l.offset();
            Ok(rows(
                l,
                |i| ((off + i) * n, (off + i + 1) * n),
                floats(op, l.values())?,
            ))
        }
        other => Err(bad_args(op, format!("expects mono PCM, got {other}"))),
    }
}

/// Rows of a PCM column as planes (`[channels][samples]`; `None`: null).
fn pcm_rows<'a>(
    op: &'static str,
    input: &'a ArrayRef,
    channels: usize,
) -> Result<Vec<Option<Vec<&'a [f32]>>>> {
    if channels == 1 {
        return Ok(mono_rows(op, input)?
            .into_iter()
            .map(|r| r.map(|s| vec![s]))
            .collect());
    }
    let outer = input.as_fixed_size_list();
    let planes = mono_rows(op, outer.values())?;
    let first = outer.offset() * channels;
    Ok((0..outer.len())
        .map(|row| {
            outer.is_valid(row).then(|| {
                planes[first + row * channels..first + (row + 1) * channels]
                    .iter()
                    .map(|p| p.unwrap_or(&[]))
                    .collect()
            })
        })
        .collect())
}

/// A sample-rate parameter.
fn rate_param(op: &'static str, params: &[Value], i: usize) -> Result<u32> {
    Ok(int_param(op, params, i, "sample_rate", 1000..=MAX_RATE, None)? as u32)
}

/// The longest clip a decoded value may hold at `rate` × `channels`.
fn max_seconds(rate: u32, channels: usize) -> f64 {
    MAX_PCM_BYTES as f64 / (4.0 * f64::from(rate) * channels as f64)
}

/// Decodes, mixes and resamples one encoded clip.
fn decode_to(
    op: &'static str,
    row: usize,
    bytes: &[u8],
    rate: u32,
    channels: usize,
    resamplers: &mut Resamplers,
) -> Result<Pcm> {
    let pcm = decode(op, row, bytes, max_seconds(rate, channels))?;
    let pcm = mix(op, row, pcm, channels)?;
    Ok(resamplers.resample(pcm, rate))
}

/// `decode_audio(audio, sample_rate[, channels])`: encoded audio (WAV, FLAC, MP3, Ogg
/// Vorbis, Ogg Opus) to `float32` PCM in [-1, 1] at `sample_rate`; mono (the channels'
/// mean) unless `channels` says otherwise.
#[derive(Debug)]
pub struct DecodeAudio;

impl DecodeAudio {
    fn params(params: &[Value]) -> Result<(u32, usize)> {
        let op = "decode_audio";
        expect_params(op, params, 1, 2)?;
        let rate = rate_param(op, params, 0)?;
        let channels = int_param(op, params, 1, "channels", 1..=MAX_CHANNELS, Some(1))? as usize;
        Ok((rate, channels))
    }
}

impl Op for DecodeAudio {
    fn name(&self) -> &'static str {
        "decode_audio"
    }

    fn signature(&self) -> &'static str {
        "decode_audio(audio, sample_rate[, channels])"
    }

    fn output_field(&self, input: &Field, params: &[Value], output: &str) -> Result<Field> {
        encoded_input(self.name(), input, Media::Audio)?;
        let (rate, channels) = Self::params(params)?;
        Ok(pcm_field(output, rate, channels, encoded_nullable(input)))
    }

    /// A clip decodes to at most `MAX_PCM_BYTES` (16 MiB) (longer ones are refused by row).
    fn max_output_bytes_per_row(&self, input: &Field, params: &[Value]) -> Result<Option<u64>> {
        self.output_field(input, params, "output")?;
        Ok(Some(MAX_PCM_BYTES))
    }

    fn apply_field(
        &self,
        input: &ArrayRef,
        _field: &Field,
        params: &[Value],
        _seed: u64,
    ) -> Result<ArrayRef> {
        let (rate, channels) = Self::params(params)?;
        let mut resamplers = Resamplers::default();
        let mut rows = Vec::with_capacity(input.len());
        for_each_encoded(self.name(), input, Media::Audio, |row, bytes| {
            rows.push(match bytes {
                Some(b) => Some(decode_to(self.name(), row, b, rate, channels, &mut resamplers)?.planes),
                None => None,
            });
            Ok(())
        })?;
        pcm_array(self.name(), rows, channels)
    }
}

/// `audio_seconds(audio)`: the clip's duration in seconds (`Float64`), read from the
/// container without decoding, for filters at the server.
#[derive(Debug)]
pub struct AudioSeconds;

impl Op for AudioSeconds {
    fn name(&self) -> &'static str {
        "audio_seconds"
    }

    fn signature(&self) -> &'static str {
        "audio_seconds(audio)"
    }

    fn output_field(&self, input: &Field, params: &[Value], output: &str) -> Result<Field> {
        encoded_input(self.name(), input, Media::Audio)?;
        expect_params(self.name(), params, 0, 0)?;
        Ok(Field::new(output, DataType::Float64, encoded_nullable(input)))
    }

    fn apply_field(
        &self,
        input: &ArrayRef,
        _field: &Field,
        params: &[Value],
        _seed: u64,
    ) -> Result<ArrayRef> {
        expect_params(self.name(), params, 0, 0)?;
        let mut out = Vec::with_capacity(input.len());
        for_each_encoded(self.name(), input, Media::Audio, |row, bytes| {
            out.push(bytes.map(|b| duration(self.name(), row, b)).transpose()?);
            Ok(())
        })?;
        Ok(Arc::new(Float64Array::from(out)))
    }
}

/// `log_mel(audio|pcm, sample_rate, n_mels[, n_fft, hop_length, max_seconds][, dtype])`:
/// Whisper's log-mel features, `[n_mels, frames]` with `frames = max_seconds · sample_rate /
/// hop_length`, the clip zero-padded or cut to `max_seconds` (30), as
/// `transformers.WhisperFeatureExtractor` computes them; `n_fft` 400 and `hop_length` 160 by
/// default (25 ms windows every 10 ms at 16 kHz); `dtype` `'float32'` (default),
/// `'float16'` or `'bfloat16'`.
#[derive(Debug)]
pub struct LogMelOp;

/// `log_mel`'s parameters.
#[derive(Debug, Clone, Copy)]
struct MelParams {
    rate: u32,
    n_mels: usize,
    n_fft: usize,
    hop: usize,
    samples: usize,
    dtype: FloatType,
}

impl MelParams {
    fn of(params: &[Value]) -> Result<Self> {
        let op = "log_mel";
        let (params, dtype) = match params.split_last() {
            Some((last @ Value::Text(t), rest)) => (
                rest,
                FloatType::named(last).ok_or_else(|| {
                    bad_args(
                        op,
                        format!("dtype must be 'float32', 'float16' or 'bfloat16', got '{t}'"),
                    )
                })?,
            ),
            _ => (params, FloatType::F32),
        };
        expect_params(op, params, 2, 5)?;
        let rate = rate_param(op, params, 0)?;
        let n_mels = int_param(op, params, 1, "n_mels", 1..=512, None)? as usize;
        let n_fft = int_param(op, params, 2, "n_fft", 16..=16384, Some(400))? as usize;
        let hop = int_param(op, params, 3, "hop_length", 1..=n_fft as i64, Some(160))? as usize;
        let seconds = match params.get(4) {
            None => 30.0,
            Some(Value::Int(s)) => *s as f64,
            Some(Value::Float(s)) => *s,
            Some(other) => return Err(bad_args(op, format!("max_seconds must be a number, got {other}"))),
        };
        if !(seconds > 0.0 && seconds <= 600.0) {
            return Err(bad_args(
                op,
                format!("max_seconds must be in (0, 600], got {seconds}"),
            ));
        }
        let samples = (seconds * f64::from(rate)).round() as usize;
        if samples < n_fft {
            return Err(bad_args(
                op,
                format!("max_seconds holds {samples} samples, fewer than one window of n_fft = {n_fft}"),
            ));
        }
        Ok(Self {
            rate,
            n_mels,
            n_fft,
            hop,
            samples,
            dtype,
        })
    }

    fn frames(&self) -> usize {
        LogMel::frames_for(self.samples, self.hop)
    }
}

impl Op for LogMelOp {
    fn name(&self) -> &'static str {
        "log_mel"
    }

    fn signature(&self) -> &'static str {
        "log_mel(audio|pcm, sample_rate, n_mels[, n_fft, hop_length, max_seconds][, dtype])"
    }

    /// The features' bytes; from encoded audio, also the PCM each row decodes to first (up to
    /// `MAX_PCM_BYTES` (16 MiB)): a server's memory budget counts the decoder's, and its batches
    /// of clips stay small enough to come out every few seconds.
    fn max_output_bytes_per_row(&self, input: &Field, params: &[Value]) -> Result<Option<u64>> {
        let features = fixed_width(self.output_field(input, params, "output")?.data_type());
        Ok(match encoded_input(self.name(), input, Media::Audio) {
            Ok(()) => features.map(|f| f.max(MAX_PCM_BYTES)),
            Err(_) => features,
        })
    }

    fn output_field(&self, input: &Field, params: &[Value], output: &str) -> Result<Field> {
        let p = MelParams::of(params)?;
        let nullable = match encoded_input(self.name(), input, Media::Audio) {
            Ok(()) => encoded_nullable(input),
            Err(_) => {
                let pcm = PcmInput::of(self.name(), input)?;
                check_pcm(self.name(), pcm, p.rate, 1)?;
                input.is_nullable()
            }
        };
        let item = Arc::new(Field::new("item", p.dtype.arrow(), false));
        let field = Field::new(
            output,
            DataType::FixedSizeList(item, (p.n_mels * p.frames()) as i32),
            nullable,
        )
        .with_metadata(
            [(
                SHAPE_METADATA_KEY.to_string(),
                format!("{},{}", p.n_mels, p.frames()),
            )]
            .into(),
        );
        Ok(p.dtype.tag(field))
    }

    fn apply_field(&self, input: &ArrayRef, field: &Field, params: &[Value], _seed: u64) -> Result<ArrayRef> {
        let p = MelParams::of(params)?;
        let mel = LogMel::new(p.rate, p.n_mels, p.n_fft, p.hop, p.samples);
        let size = p.n_mels * p.frames();
        let mut values: Vec<f32> = Vec::with_capacity(input.len() * size);
        let mut valid = Vec::with_capacity(input.len());
        let mut push = |pcm: Option<&[f32]>| match pcm {
            Some(pcm) => {
                mel.compute(pcm, &mut values);
                valid.push(true);
            }
            None => {
                values.resize(values.len() + size, 0.0);
                valid.push(false);
            }
        };
        if encoded_input(self.name(), field, Media::Audio).is_ok() {
            let mut resamplers = Resamplers::default();
            for_each_encoded(self.name(), input, Media::Audio, |row, bytes| {
                match bytes {
                    Some(b) => push(Some(
                        &decode_to(self.name(), row, b, p.rate, 1, &mut resamplers)?.planes[0],
                    )),
                    None => push(None),
                }
                Ok(())
            })?;
        } else {
            check_pcm(self.name(), PcmInput::of(self.name(), field)?, p.rate, 1)?;
            for row in mono_rows(self.name(), input)? {
                push(row);
            }
        }
        let nulls = valid.contains(&false).then(|| NullBuffer::from(valid));
        float_tensor(self.name(), values, size, p.dtype, nulls)
    }
}

/// A PCM input must be at the rate an op is told, with the channels it takes.
fn check_pcm(op: &'static str, pcm: PcmInput, rate: u32, channels: usize) -> Result<()> {
    if pcm.channels != channels {
        return Err(bad_args(
            op,
            format!(
                "takes mono PCM, got {} channels: decode with channels = 1",
                pcm.channels
            ),
        ));
    }
    match pcm.rate {
        Some(r) if r != rate => Err(bad_args(
            op,
            format!("the PCM is at {r} Hz, not the {rate} Hz asked: decode at {rate} Hz"),
        )),
        _ => Ok(()),
    }
}

/// `values` (`size` per row) as a `FixedSizeList` of `dtype`.
fn float_tensor(
    op: &'static str,
    values: Vec<f32>,
    size: usize,
    dtype: FloatType,
    nulls: Option<NullBuffer>,
) -> Result<ArrayRef> {
    let values: ArrayRef = match dtype {
        FloatType::F32 => Arc::new(Float32Array::from(values)),
        FloatType::F16 => Arc::new(Float16Array::from_iter_values(
            values.into_iter().map(f16::from_f32),
        )),
        FloatType::Bf16 => Arc::new(UInt16Array::from_iter_values(
            values.into_iter().map(|v| bf16::from_f32(v).to_bits()),
        )),
    };
    let item = Arc::new(Field::new("item", dtype.arrow(), false));
    FixedSizeListArray::try_new(item, size as i32, values, nulls)
        .map(|a| Arc::new(a) as ArrayRef)
        .map_err(arrow_err(op))
}

/// `random_audio_crop(pcm, seconds)`: per row, a window of `seconds` at a uniformly random
/// start (the same for every channel), zero-padded at the end when the clip is shorter:
/// `[samples]` or `[channels, samples]` tensors. Trainer only.
#[derive(Debug)]
pub struct RandomAudioCrop;

impl RandomAudioCrop {
    /// `(input channels, rate, window samples)`.
    fn params(field: &Field, params: &[Value]) -> Result<(usize, u32, usize)> {
        let op = "random_audio_crop";
        expect_params(op, params, 1, 1)?;
        let pcm = PcmInput::of(op, field)?;
        let rate = pcm.rate.ok_or_else(|| {
            bad_args(
                op,
                format!(
                    "needs PCM whose field carries its `{SAMPLE_RATE_METADATA_KEY}` (decode_audio's output)"
                ),
            )
        })?;
        let seconds = match params[0] {
            Value::Int(s) => s as f64,
            Value::Float(s) => s,
            ref other => return Err(bad_args(op, format!("seconds must be a number, got {other}"))),
        };
        let samples = (seconds * f64::from(rate)).round();
        if !(samples >= 1.0 && samples * 4.0 * pcm.channels as f64 <= MAX_PCM_BYTES as f64) {
            return Err(bad_args(
                op,
                format!(
                    "seconds must give 1 to {:.0} s of samples at {rate} Hz, got {seconds}",
                    max_seconds(rate, pcm.channels)
                ),
            ));
        }
        Ok((pcm.channels, rate, samples as usize))
    }
}

impl Op for RandomAudioCrop {
    fn name(&self) -> &'static str {
        "random_audio_crop"
    }

    fn is_deterministic(&self) -> bool {
        false
    }

    fn signature(&self) -> &'static str {
        "random_audio_crop(pcm, seconds)"
    }

    fn output_field(&self, input: &Field, params: &[Value], output: &str) -> Result<Field> {
        let (channels, rate, n) = Self::params(input, params)?;
        let item = Arc::new(Field::new("item", DataType::Float32, false));
        let shape = match channels {
            1 => n.to_string(),
            c => format!("{c},{n}"),
        };
        Ok(Field::new(
            output,
            DataType::FixedSizeList(item, (channels * n) as i32),
            input.is_nullable(),
        )
        .with_metadata(
            [
                (SHAPE_METADATA_KEY.to_string(), shape),
                (SAMPLE_RATE_METADATA_KEY.to_string(), rate.to_string()),
            ]
            .into(),
        ))
    }

    fn apply_field(&self, input: &ArrayRef, field: &Field, params: &[Value], seed: u64) -> Result<ArrayRef> {
        let (channels, _, n) = Self::params(field, params)?;
        let rows = pcm_rows(self.name(), input, channels)?;
        let mut values = vec![0f32; rows.len() * channels * n];
        let mut valid = Vec::with_capacity(rows.len());
        for (row, planes) in rows.iter().enumerate() {
            valid.push(planes.is_some());
            let Some(planes) = planes else { continue };
            let len = planes.iter().map(|p| p.len()).max().unwrap_or(0);
            let start = match len.checked_sub(n) {
                Some(room) if room > 0 => row_rng(seed, row).random_range(0..=room),
                _ => 0,
            };
            for (c, plane) in planes.iter().enumerate() {
                let out = &mut values[(row * channels + c) * n..(row * channels + c + 1) * n];
                let src = plane.get(start..).unwrap_or(&[]);
                let take = src.len().min(n);
                out[..take].copy_from_slice(&src[..take]);
            }
        }
        let nulls = valid.contains(&false).then(|| NullBuffer::from(valid));
        float_tensor(self.name(), values, channels * n, FloatType::F32, nulls)
    }
}

/// `spec_augment(mel, freq_masks, freq_width, time_masks, time_width)`: SpecAugment's
/// frequency and time masking of `[n_mels, frames]` features, as torchaudio's
/// `FrequencyMasking`/`TimeMasking` draw them: each mask's width uniform in
/// `[0, width)`, its start uniform in `[0, size − width)`, the masked values set to 0.
/// Per (seed, row). Trainer only.
#[derive(Debug)]
pub struct SpecAugment;

impl SpecAugment {
    /// `(n_mels, frames, [freq_masks, freq_width, time_masks, time_width])`.
    fn params(field: &Field, params: &[Value]) -> Result<(usize, usize, [usize; 4])> {
        let op = "spec_augment";
        expect_params(op, params, 4, 4)?;
        let bad = || {
            bad_args(
                op,
                format!(
                    "expects log-mel features (a FixedSizeList of floats with a `{SHAPE_METADATA_KEY}` of \
                     n_mels,frames, e.g. from log_mel), got {} `{}`",
                    field.data_type(),
                    field.name()
                ),
            )
        };
        let DataType::FixedSizeList(item, len) = field.data_type() else {
            return Err(bad());
        };
        if !matches!(
            item.data_type(),
            DataType::Float32 | DataType::Float16 | DataType::UInt16
        ) {
            return Err(bad());
        }
        let dims: Vec<usize> = field
            .metadata()
            .get(SHAPE_METADATA_KEY)
            .ok_or_else(bad)?
            .split(',')
            .map(|d| d.trim().parse().map_err(|_| bad()))
            .collect::<Result<_>>()?;
        let [mels, frames] = dims[..] else {
            return Err(bad());
        };
        if mels * frames != *len as usize {
            return Err(bad());
        }
        let count = |i, what| Ok(int_param(op, params, i, what, 0..=64, None)? as usize);
        let fm = count(0, "freq_masks")?;
        let fw = int_param(op, params, 1, "freq_width", 0..=mels as i64, None)? as usize;
        let tm = count(2, "time_masks")?;
        let tw = int_param(op, params, 3, "time_width", 0..=frames as i64, None)? as usize;
        Ok((mels, frames, [fm, fw, tm, tw]))
    }
}

/// One mask: its width drawn in `[0, width)`, its start in `[0, size − width)`, as torchaudio.
fn draw_mask(rng: &mut impl Rng, width: usize, size: usize) -> std::ops::Range<usize> {
    let w = (rng.random::<f64>() * width as f64) as usize;
    let start = (rng.random::<f64>() * (size - w) as f64) as usize;
    start..start + w
}

impl Op for SpecAugment {
    fn name(&self) -> &'static str {
        "spec_augment"
    }

    fn is_deterministic(&self) -> bool {
        false
    }

    fn signature(&self) -> &'static str {
        "spec_augment(mel, freq_masks, freq_width, time_masks, time_width)"
    }

    fn output_field(&self, input: &Field, params: &[Value], output: &str) -> Result<Field> {
        Self::params(input, params)?;
        Ok(input.clone().with_name(output))
    }

    fn apply_field(&self, input: &ArrayRef, field: &Field, params: &[Value], seed: u64) -> Result<ArrayRef> {
        let (mels, frames, [fm, fw, tm, tw]) = Self::params(field, params)?;
        let list = input.as_fixed_size_list();
        let size = mels * frames;
        let values = list.values().slice(list.offset() * size, list.len() * size);
        let masks = |row: usize| {
            let mut rng = row_rng(seed, row);
            let freq: Vec<_> = (0..fm).map(|_| draw_mask(&mut rng, fw, mels)).collect();
            let time: Vec<_> = (0..tm).map(|_| draw_mask(&mut rng, tw, frames)).collect();
            (freq, time)
        };
        macro_rules! masked {
            ($t:ty, $zero:expr) => {{
                let mut v = values.as_primitive::<$t>().values().to_vec();
                for row in 0..list.len() {
                    let (freq, time) = masks(row);
                    let x = &mut v[row * size..(row + 1) * size];
                    for m in freq {
                        x[m.start * frames..m.end * frames].fill($zero);
                    }
                    for t in time {
                        for m in 0..mels {
                            x[m * frames + t.start..m * frames + t.end].fill($zero);
                        }
                    }
                }
                v
            }};
        }
        let values: ArrayRef = match values.data_type() {
            DataType::Float32 => Arc::new(Float32Array::from(masked!(Float32Type, 0.0))),
            DataType::Float16 => Arc::new(Float16Array::from(masked!(Float16Type, f16::ZERO))),
            _ => Arc::new(UInt16Array::from(masked!(UInt16Type, bf16::ZERO.to_bits()))),
        };
        let item = Arc::new(Field::new("item", values.data_type().clone(), false));
        FixedSizeListArray::try_new(item, size as i32, values, list.nulls().cloned())
            .map(|a| Arc::new(a) as ArrayRef)
            .map_err(arrow_err(self.name()))
    }
}

#[cfg(test)]
mod tests {
    use std::f64::consts::PI;
    use std::sync::Arc;

    use arrow::array::{Array, ArrayRef, AsArray, BinaryArray};
    use arrow::datatypes::{DataType, Field, Float32Type};

    use super::*;
    use crate::audio::audio_seconds_from_ends;

    /// A canonical 16-bit PCM WAV file of `planes` at `rate` (the tests' own fixture; the
    /// oracle tests read files ffmpeg, sox and espeak-ng wrote).
    fn wav(rate: u32, planes: &[Vec<f64>]) -> Vec<u8> {
        let channels = planes.len() as u16;
        let frames = planes[0].len();
        let data_len = (frames * planes.len() * 2) as u32;
        let mut out = Vec::new();
        out.extend_from_slice(b"RIFF");
        out.extend_from_slice(&(36 + data_len).to_le_bytes());
        out.extend_from_slice(b"WAVEfmt ");
        out.extend_from_slice(&16u32.to_le_bytes());
        out.extend_from_slice(&1u16.to_le_bytes());
        out.extend_from_slice(&channels.to_le_bytes());
        out.extend_from_slice(&rate.to_le_bytes());
        out.extend_from_slice(&(rate * u32::from(channels) * 2).to_le_bytes());
        out.extend_from_slice(&(channels * 2).to_le_bytes());
        out.extend_from_slice(&16u16.to_le_bytes());
        out.extend_from_slice(b"data");
        out.extend_from_slice(&data_len.to_le_bytes());
        for i in 0..frames {
            for p in planes {
                out.extend_from_slice(&((p[i] * 32767.0).round() as i16).to_le_bytes());
            }
        }
        out
    }

    fn sine(rate: u32, hz: f64, seconds: f64, amp: f64) -> Vec<f64> {
        let n = (seconds * f64::from(rate)) as usize;
        (0..n)
            .map(|i| amp * (2.0 * PI * hz * i as f64 / f64::from(rate)).sin())
            .collect()
    }

    fn column(values: Vec<Option<Vec<u8>>>) -> ArrayRef {
        Arc::new(BinaryArray::from_iter(values))
    }

    fn binary_field() -> Field {
        Field::new("audio", DataType::Binary, true)
    }

    fn mono(out: &ArrayRef, row: usize) -> Vec<f32> {
        out.as_list::<i32>()
            .value(row)
            .as_primitive::<Float32Type>()
            .values()
            .to_vec()
    }

    #[test]
    fn decode_audio_downmixes_and_resamples_a_stereo_sine_band_limited() {
        let (l, r) = (sine(44_100, 440.0, 1.0, 0.5), sine(44_100, 440.0, 1.0, 0.3));
        let input = column(vec![Some(wav(44_100, &[l, r])), None]);
        let field = DecodeAudio
            .output_field(&binary_field(), &[Value::Int(16_000)], "pcm")
            .expect("field");
        assert_eq!(field.metadata()[SAMPLE_RATE_METADATA_KEY], "16000");
        let out = DecodeAudio.apply(&input, &[Value::Int(16_000)]).expect("decoded");
        assert!(out.is_null(1), "a null clip is a null row");
        let got = mono(&out, 0);
        assert_eq!(got.len(), 16_000, "one second at 16 kHz");
        // The mean of the channels, 0.4 · sin, at the new rate, away from the edges.
        let want = sine(16_000, 440.0, 1.0, 0.4);
        let (mut signal, mut error) = (0.0, 0.0);
        for i in 400..15_600 {
            signal += want[i] * want[i];
            error += (want[i] - f64::from(got[i])).powi(2);
        }
        let ser = 10.0 * (signal / error).log10();
        assert!(ser > 60.0, "signal-to-error {ser:.1} dB");
    }

    #[test]
    fn decode_audio_keeps_channels_when_asked_and_names_an_impossible_count() {
        let input = column(vec![Some(wav(
            16_000,
            &[sine(16_000, 100.0, 0.1, 0.5), vec![0.0; 1600]],
        ))]);
        let out = DecodeAudio
            .apply(&input, &[Value::Int(16_000), Value::Int(2)])
            .expect("stereo");
        let planes = out.as_fixed_size_list().value(0);
        let planes = planes.as_list::<i32>();
        assert_eq!(planes.len(), 2);
        assert!(
            planes
                .value(1)
                .as_primitive::<Float32Type>()
                .values()
                .iter()
                .all(|&v| v == 0.0)
        );
        let err = DecodeAudio
            .apply(&input, &[Value::Int(16_000), Value::Int(3)])
            .expect_err("3 of 2");
        assert!(
            err.to_string().contains("row 0") && err.to_string().contains("2 channels"),
            "{err}"
        );
    }

    #[test]
    fn an_impulse_stays_where_it_was_after_resampling() {
        let mut x = vec![0.0; 44_100];
        x[22_050] = 0.9;
        let out = DecodeAudio
            .apply(&column(vec![Some(wav(44_100, &[x]))]), &[Value::Int(16_000)])
            .expect("decoded");
        let got = mono(&out, 0);
        let peak = (0..got.len())
            .max_by(|&a, &b| got[a].abs().total_cmp(&got[b].abs()))
            .expect("samples");
        assert_eq!(peak, 8_000, "22050 / 44100 s is sample 8000 at 16 kHz");
    }

    #[test]
    fn damaged_audio_is_an_error_naming_its_row() {
        let good = wav(8_000, &[sine(8_000, 300.0, 0.5, 0.5)]);
        let mut truncated = good.clone();
        truncated.truncate(good.len() / 2);
        let cases: [(Vec<u8>, &str); 3] = [
            (truncated, "truncated"),
            (b"NOTAUDIO but some bytes to sniff".to_vec(), "first bytes"),
            (Vec::new(), "empty"),
        ];
        for (bad, says) in cases {
            let input = column(vec![Some(good.clone()), Some(bad)]);
            for op in [&DecodeAudio as &dyn Op, &LogMelOp] {
                let params = [Value::Int(16_000), Value::Int(80)];
                let params = if op.name() == "decode_audio" {
                    &params[..1]
                } else {
                    &params[..]
                };
                let err = op.apply(&input, params).expect_err("bad row");
                let msg = err.to_string();
                assert!(
                    msg.contains("row 1") && msg.contains(says),
                    "{}: {msg}",
                    op.name()
                );
            }
        }
        let err = AudioSeconds
            .apply(&column(vec![Some(b"RIFF\0\0\0\0WAVEjunk".to_vec())]), &[])
            .expect_err("no format chunk");
        assert!(err.to_string().contains("row 0"), "{err}");
    }

    #[test]
    fn audio_seconds_reads_the_header() {
        let input = column(vec![Some(wav(22_050, &[vec![0.1; 22_050 * 3 / 2]])), None]);
        let out = AudioSeconds.apply(&input, &[]).expect("durations");
        let out = out.as_primitive::<arrow::datatypes::Float64Type>();
        assert!((out.value(0) - 1.5).abs() < 1e-9, "{}", out.value(0));
        assert!(out.is_null(1));
    }

    #[test]
    fn durations_from_a_clips_ends_are_the_headers_or_none() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/audio");
        let mut read = 0;
        for entry in std::fs::read_dir(&dir).expect("ffmpeg's seed clips") {
            let path = entry.expect("entry").path();
            let bytes = std::fs::read(&path).expect("clip");
            let whole = crate::audio::duration("audio_seconds", 0, &bytes).expect("a valid clip");
            let len = bytes.len() as u64;
            for (head, tail) in [(64, 0), (256, 64), (1024, 1024), (4096, 512), (bytes.len(), 0)] {
                let head = &bytes[..head.min(bytes.len())];
                let tail = &bytes[bytes.len() - tail.min(bytes.len())..];
                let ends = audio_seconds_from_ends(head, tail, len);
                // Never a different number: the same or, where bytes in between are needed, none.
                assert!(
                    ends.is_none_or(|d| d == whole),
                    "{}: {ends:?} vs {whole}",
                    path.display()
                );
                read += usize::from(ends.is_some());
            }
            let name = path.to_string_lossy();
            if name.ends_with(".wav") {
                let ends = audio_seconds_from_ends(&bytes[..256], &[], len);
                assert_eq!(ends, Some(whole), "{name}: its header is in its first 256 bytes");
            }
            if name.ends_with(".flac") {
                // After ffmpeg's 8 KiB of padding comes the first frame, which the reader checks.
                let ends = audio_seconds_from_ends(&bytes[..256], &[], len);
                assert_eq!(ends, None, "{name}");
            }
            // The whole clip as its head is the clip.
            assert_eq!(audio_seconds_from_ends(&bytes, &[], len), Some(whole), "{name}");
        }
        assert!(read > 9, "{read}");
        // A clip whose middle is needed and missing is no duration, never a wrong one.
        let long = wav(16_000, &[vec![0.1; 16_000]]);
        assert_eq!(
            audio_seconds_from_ends(&long[..8], &long[long.len() - 8..], long.len() as u64),
            None
        );
        assert_eq!(audio_seconds_from_ends(&[], &[], 0), None);
    }

    #[test]
    fn log_mel_has_whispers_shape_and_types() {
        let field = LogMelOp
            .output_field(&binary_field(), &[Value::Int(16_000), Value::Int(80)], "mel")
            .expect("field");
        assert_eq!(field.metadata()[SHAPE_METADATA_KEY], "80,3000");
        let half = LogMelOp
            .output_field(
                &binary_field(),
                &[
                    Value::Int(16_000),
                    Value::Int(128),
                    Value::Int(400),
                    Value::Int(160),
                    Value::Int(10),
                    "float16".into(),
                ],
                "mel",
            )
            .expect("field");
        assert_eq!(half.metadata()[SHAPE_METADATA_KEY], "128,1000");
        assert!(
            matches!(half.data_type(), DataType::FixedSizeList(item, 128_000) if item.data_type() == &DataType::Float16)
        );
        let input = column(vec![Some(wav(16_000, &[sine(16_000, 1000.0, 2.0, 0.5)]))]);
        let out = LogMelOp
            .apply(&input, &[Value::Int(16_000), Value::Int(80)])
            .expect("features");
        let values = out.as_fixed_size_list().value(0);
        let values = values.as_primitive::<Float32Type>().values();
        let max = values.iter().copied().fold(f32::MIN, f32::max);
        let min = values.iter().copied().fold(f32::MAX, f32::min);
        // Whisper's scale: clamped 8 below the maximum, then (x + 4) / 4.
        assert!((max - min - 2.0).abs() < 1e-5, "{min}..{max}");
        // 1 kHz lands in one band; the padded tail sits at the floor.
        let band = (0..80)
            .max_by(|&a, &b| values[a * 3000 + 50].total_cmp(&values[b * 3000 + 50]))
            .expect("bands");
        assert!((20..40).contains(&band), "1 kHz in band {band}");
        assert_eq!(values[band * 3000 + 2999], min);
        let err = LogMelOp.output_field(
            &binary_field(),
            &[Value::Int(16_000), Value::Int(80), "int8".into()],
            "m",
        );
        assert!(err.expect_err("bad dtype").to_string().contains("dtype"));
    }

    #[test]
    fn log_mel_of_pcm_equals_log_mel_of_its_file() {
        let file = wav(16_000, &[sine(16_000, 440.0, 1.0, 0.5)]);
        let params = [
            Value::Int(16_000),
            Value::Int(80),
            Value::Int(400),
            Value::Int(160),
            Value::Int(2),
        ];
        let direct = LogMelOp
            .apply(&column(vec![Some(file.clone())]), &params)
            .expect("mel");
        let pcm = DecodeAudio
            .apply(&column(vec![Some(file)]), &[Value::Int(16_000)])
            .expect("pcm");
        let pcm_field = DecodeAudio
            .output_field(&binary_field(), &[Value::Int(16_000)], "pcm")
            .expect("field");
        let via = LogMelOp
            .apply_field(&pcm, &pcm_field, &params, 0)
            .expect("mel of pcm");
        assert_eq!(direct.as_ref(), via.as_ref());
        let at_8k = DecodeAudio
            .output_field(&binary_field(), &[Value::Int(8_000)], "pcm")
            .expect("field");
        let err = LogMelOp.output_field(&at_8k, &params, "m").expect_err("rate");
        assert!(err.to_string().contains("8000 Hz"), "{err}");
    }

    #[test]
    fn random_audio_crop_is_a_function_of_seed_and_row() {
        let ramp: Vec<f64> = (0..16_000).map(|i| i as f64 / 16_000.0).collect();
        let input = column(vec![
            Some(wav(16_000, &[ramp])),
            Some(wav(16_000, &[vec![0.5; 800]])),
        ]);
        let field = DecodeAudio
            .output_field(&binary_field(), &[Value::Int(16_000)], "pcm")
            .expect("field");
        let pcm = DecodeAudio.apply(&input, &[Value::Int(16_000)]).expect("pcm");
        let crop = |seed| {
            RandomAudioCrop
                .apply_field(&pcm, &field, &[Value::Float(0.25)], seed)
                .expect("crop")
        };
        let out_field = RandomAudioCrop
            .output_field(&field, &[Value::Float(0.25)], "c")
            .expect("field");
        assert_eq!(out_field.metadata()[SHAPE_METADATA_KEY], "4000");
        let (a, b, c) = (crop(1), crop(1), crop(2));
        assert_eq!(a.as_ref(), b.as_ref(), "same seed, same crops");
        assert_ne!(a.as_ref(), c.as_ref(), "another seed, other crops");
        let rows = a.as_fixed_size_list();
        let first = rows.value(0);
        let first = first.as_primitive::<Float32Type>().values();
        let whole = mono(&pcm, 0);
        let start = whole
            .iter()
            .position(|&v| v == first[0])
            .expect("a window of the clip");
        assert_eq!(&whole[start..start + 4000], first);
        let short = rows.value(1);
        let short = short.as_primitive::<Float32Type>().values();
        assert!(
            short[..800].iter().all(|&v| (v - 0.5).abs() < 1e-3) && short[800..].iter().all(|&v| v == 0.0)
        );
        assert!(!RandomAudioCrop.is_deterministic() && !SpecAugment.is_deterministic());
    }

    #[test]
    fn spec_augment_masks_bands_and_frames_within_their_widths() {
        let input = column(vec![Some(wav(16_000, &[sine(16_000, 500.0, 1.0, 0.5)])); 3]);
        let params = [
            Value::Int(16_000),
            Value::Int(80),
            Value::Int(400),
            Value::Int(160),
            Value::Int(1),
        ];
        let field = LogMelOp
            .output_field(&binary_field(), &params, "mel")
            .expect("field");
        let mel = LogMelOp.apply(&input, &params).expect("mel");
        let masks = [Value::Int(2), Value::Int(10), Value::Int(2), Value::Int(20)];
        let out = SpecAugment.apply_field(&mel, &field, &masks, 7).expect("masked");
        assert_eq!(
            out.as_ref(),
            SpecAugment
                .apply_field(&mel, &field, &masks, 7)
                .expect("again")
                .as_ref()
        );
        let (before, after) = (mel.as_fixed_size_list(), out.as_fixed_size_list());
        let mut rows_masked = 0;
        for row in 0..3 {
            let b = before.value(row);
            let a = after.value(row);
            let (b, a) = (
                b.as_primitive::<Float32Type>().values(),
                a.as_primitive::<Float32Type>().values(),
            );
            let changed: Vec<usize> = (0..b.len()).filter(|&i| a[i] != b[i]).collect();
            assert!(changed.iter().all(|&i| a[i] == 0.0), "masked values are 0");
            // At most 2 bands of < 10 and 2 spans of < 20 frames.
            assert!(
                changed.len() <= 2 * 9 * 100 + 2 * 19 * 80,
                "{} values",
                changed.len()
            );
            rows_masked += usize::from(!changed.is_empty());
        }
        assert!(rows_masked > 0);
        let none = SpecAugment
            .apply_field(
                &mel,
                &field,
                &[Value::Int(0), Value::Int(0), Value::Int(0), Value::Int(0)],
                7,
            )
            .expect("no masks");
        assert_eq!(none.as_ref(), mel.as_ref());
    }
}
