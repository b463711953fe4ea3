//! Video ops: `decode_frames`, `video_frames`, `video_info` and `video_seconds`, over encoded
//! clips (binary or the Hub's `struct<bytes, path>`). They need FFmpeg's libraries (the
//! `video` feature); a build without them keeps the ops' names and refuses every call by
//! name, saying so, so a server without FFmpeg is never planned to run them. And
//! `random_clip`, the trainer's choice of consecutive frames among those, which needs no
//! FFmpeg.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, FixedSizeListArray, UInt8Array};
use arrow::datatypes::{DataType, Field, Fields, UInt8Type};
use rand::Rng;

use crate::media::{DECODER_BYTES, Media, encoded_input, encoded_nullable};
use crate::op::{Op, OpError, Result, SHAPE_METADATA_KEY, Value, expect_params, int_param};
use crate::tensor_ops::{frames_of, row_rng, shape_of, tensor_len};

/// The largest side `decode_frames` makes.
const MAX_SIDE: i64 = 4096;
/// The most frames `decode_frames` takes from one clip.
const MAX_FRAMES: i64 = 1024;

/// Whether this build decodes video.
pub const VIDEO: bool = cfg!(feature = "video");

#[cfg(not(feature = "video"))]
fn unavailable(op: &'static str) -> OpError {
    OpError::BadArguments {
        op,
        reason: "this build has no video support: FFmpeg's libraries were not built in (the \
                 `video` feature of pushdown-ops; scripts/setup-media.sh installs them)"
            .into(),
    }
}

/// The input's type check. Typing needs no FFmpeg: a trainer built without it still plans
/// (and validates) a pipeline whose video ops its servers run; applying one refuses, and a
/// server without FFmpeg refuses them at planning (`Op::runs_here`).
fn checked_input(op: &'static str, input: &Field) -> Result<()> {
    encoded_input(op, input, Media::Video)
}

/// `decode_frames(video, num_frames, height, width)`: the frames shown at the centres of
/// `num_frames` equal segments of the clip (chosen by presentation timestamp, decoded from
/// the keyframe before each), each resized with its aspect kept to just cover
/// `height × width` and center-cropped: `[T, H, W, 3]` `uint8`.
#[derive(Debug)]
pub struct DecodeFrames;

impl DecodeFrames {
    fn params(params: &[Value]) -> Result<(usize, u32, u32)> {
        let op = "decode_frames";
        expect_params(op, params, 3, 3)?;
        let n = int_param(op, params, 0, "num_frames", 1..=MAX_FRAMES, None)?;
        let h = int_param(op, params, 1, "height", 1..=MAX_SIDE, None)?;
        let w = int_param(op, params, 2, "width", 1..=MAX_SIDE, None)?;
        // One value of an Arrow fixed-size list holds at most i32::MAX items.
        if n * h * w * 3 > i64::from(i32::MAX) {
            return Err(OpError::BadArguments {
                op,
                reason: format!("{n} frames of {h}×{w} are over the 2 GiB one value may hold"),
            });
        }
        Ok((n as usize, h as u32, w as u32))
    }
}

impl Op for DecodeFrames {
    fn name(&self) -> &'static str {
        "decode_frames"
    }

    fn runs_here(&self) -> bool {
        VIDEO
    }

    fn signature(&self) -> &'static str {
        "decode_frames(video, num_frames, height, width)"
    }

    fn output_field(&self, input: &Field, params: &[Value], output: &str) -> Result<Field> {
        checked_input(self.name(), input)?;
        let (n, h, w) = Self::params(params)?;
        let item = Arc::new(Field::new("item", DataType::UInt8, false));
        Ok(Field::new(
            output,
            DataType::FixedSizeList(item, (n * (h * w * 3) as usize) as i32),
            encoded_nullable(input),
        )
        .with_metadata([(SHAPE_METADATA_KEY.to_string(), format!("{n},{h},{w},3"))].into()))
    }

    fn max_output_bytes_per_row(&self, input: &Field, params: &[Value]) -> Result<Option<u64>> {
        self.output_field(input, params, "output")?;
        let (n, h, w) = Self::params(params)?;
        Ok(Some(n as u64 * u64::from(h * w) * 3))
    }

    fn working_bytes(&self, input: &Field, params: &[Value]) -> Result<u64> {
        self.output_field(input, params, "output")?;
        Ok(DECODER_BYTES)
    }

    fn apply_field(
        &self,
        input: &ArrayRef,
        _field: &Field,
        params: &[Value],
        _seed: u64,
    ) -> Result<ArrayRef> {
        let (n, h, w) = Self::params(params)?;
        kernels::decode_frames(self.name(), input, n, (h, w))
    }
}

/// `video_frames(video, fps, height, width[, max_frames])`: a frame every `1/fps` seconds
/// from the clip's start (the frame shown then), at most `max_frames` of them (default 64:
/// 9.6 MB a row at 224², within a server's default 16 MiB per row), each resized and cropped
/// as `decode_frames`' are: a list of `[H, W, 3]` frames per clip, as many as the clip
/// lasts, for `random_clip` in the trainer to choose among.
#[derive(Debug)]
pub struct VideoFrames;

/// `video_frames`' parameters: `(fps, max_frames, height, width)`.
type RateParams = (f64, usize, u32, u32);

impl VideoFrames {
    fn params(params: &[Value]) -> Result<RateParams> {
        let op = "video_frames";
        expect_params(op, params, 3, 4)?;
        let fps = match params[0] {
            Value::Float(f) => f,
            Value::Int(f) => f as f64,
            ref other => {
                return Err(OpError::BadArguments {
                    op,
                    reason: format!("fps must be a number, got {other}"),
                });
            }
        };
        if !(fps > 0.0 && fps <= 1000.0) {
            return Err(OpError::BadArguments {
                op,
                reason: format!("fps must be in (0, 1000], got {fps}"),
            });
        }
        let h = int_param(op, params, 1, "height", 1..=MAX_SIDE, None)?;
        let w = int_param(op, params, 2, "width", 1..=MAX_SIDE, None)?;
        let max = int_param(op, params, 3, "max_frames", 1..=MAX_FRAMES, Some(64))?;
        if max * h * w * 3 > i64::from(i32::MAX) {
            return Err(OpError::BadArguments {
                op,
                reason: format!("{max} frames of {h}×{w} are over the 2 GiB one value may hold"),
            });
        }
        Ok((fps, max as usize, h as u32, w as u32))
    }
}

/// A frame's field: `[H, W, 3]` `uint8`.
fn frame_field(h: u32, w: u32) -> Field {
    let item = Arc::new(Field::new("item", DataType::UInt8, false));
    Field::new("frame", DataType::FixedSizeList(item, (h * w * 3) as i32), false)
        .with_metadata([(SHAPE_METADATA_KEY.to_string(), format!("{h},{w},3"))].into())
}

impl Op for VideoFrames {
    fn name(&self) -> &'static str {
        "video_frames"
    }

    fn runs_here(&self) -> bool {
        VIDEO
    }

    fn signature(&self) -> &'static str {
        "video_frames(video, fps, height, width[, max_frames])"
    }

    fn output_field(&self, input: &Field, params: &[Value], output: &str) -> Result<Field> {
        checked_input(self.name(), input)?;
        let (_, _, h, w) = Self::params(params)?;
        Ok(Field::new(
            output,
            DataType::List(Arc::new(frame_field(h, w))),
            encoded_nullable(input),
        ))
    }

    fn max_output_bytes_per_row(&self, input: &Field, params: &[Value]) -> Result<Option<u64>> {
        self.output_field(input, params, "output")?;
        let (_, max, h, w) = Self::params(params)?;
        Ok(Some(max as u64 * u64::from(h * w) * 3))
    }

    fn working_bytes(&self, input: &Field, params: &[Value]) -> Result<u64> {
        self.output_field(input, params, "output")?;
        Ok(DECODER_BYTES)
    }

    fn apply_field(
        &self,
        input: &ArrayRef,
        _field: &Field,
        params: &[Value],
        _seed: u64,
    ) -> Result<ArrayRef> {
        let (fps, max, h, w) = Self::params(params)?;
        kernels::video_frames(self.name(), input, (fps, max), frame_field(h, w), (h, w))
    }
}

/// `random_clip(frames, num_frames, stride)`: `num_frames` frames `stride` apart from a
/// start drawn uniformly per row (seeded by (seed, row)) among a clip's frames
/// (`video_frames`' list, or a `[T, H, W, C]` tensor): `[num_frames, H, W, C]`. A clip too
/// short for the span repeats its last frame (start 0). Random: trainer only.
#[derive(Debug)]
pub struct RandomClip;

impl RandomClip {
    fn params(params: &[Value]) -> Result<(usize, usize)> {
        let op = "random_clip";
        expect_params(op, params, 2, 2)?;
        let n = int_param(op, params, 0, "num_frames", 1..=MAX_FRAMES, None)?;
        let stride = int_param(op, params, 1, "stride", 1..=MAX_FRAMES, None)?;
        Ok((n as usize, stride as usize))
    }

    /// The frame shape of the input: a list of frames (each `H,W,C`), or a clip tensor.
    fn frame_shape(input: &Field) -> Result<(usize, usize, usize)> {
        match input.data_type() {
            DataType::List(frame) if frames_of("random_clip", frame)? == 1 => shape_of("random_clip", frame),
            DataType::List(_) => Err(OpError::BadArguments {
                op: "random_clip",
                reason: "expects a list of frames (each `H,W,C`), not a list of clips".into(),
            }),
            _ => shape_of("random_clip", input),
        }
    }
}

impl Op for RandomClip {
    fn name(&self) -> &'static str {
        "random_clip"
    }

    fn is_deterministic(&self) -> bool {
        false
    }

    fn signature(&self) -> &'static str {
        "random_clip(frames, num_frames, stride)"
    }

    fn output_field(&self, input: &Field, params: &[Value], output: &str) -> Result<Field> {
        let (n, _) = Self::params(params)?;
        let (h, w, c) = Self::frame_shape(input)?;
        let len = tensor_len(self.name(), &[n, h, w, c])?;
        let item = Arc::new(Field::new("item", DataType::UInt8, false));
        Ok(
            Field::new(output, DataType::FixedSizeList(item, len), input.is_nullable())
                .with_metadata([(SHAPE_METADATA_KEY.to_string(), format!("{n},{h},{w},{c}"))].into()),
        )
    }

    fn apply_field(&self, input: &ArrayRef, field: &Field, params: &[Value], seed: u64) -> Result<ArrayRef> {
        let op = self.name();
        let (n, stride) = Self::params(params)?;
        let (h, w, c) = Self::frame_shape(field)?;
        let frame = h * w * c;
        // Each row's frames: where they start in `values`, and how many.
        let (values, spans, nulls): (&UInt8Array, Vec<(usize, usize)>, _) = match field.data_type() {
            DataType::List(_) => {
                let list = input.as_list::<i32>();
                let frames = list.values().as_fixed_size_list();
                let spans = list.offsets().windows(2).map(|o| {
                    let (a, b) = (o[0] as usize, o[1] as usize);
                    ((frames.offset() + a) * frame, b - a)
                });
                (
                    frames.values().as_primitive::<UInt8Type>(),
                    spans.collect(),
                    list.nulls().cloned(),
                )
            }
            _ => {
                let t = frames_of(op, field)?;
                let list = input.as_fixed_size_list();
                let spans = (0..list.len()).map(|row| ((list.offset() + row) * t * frame, t));
                (
                    list.values().as_primitive::<UInt8Type>(),
                    spans.collect(),
                    list.nulls().cloned(),
                )
            }
        };
        let mut out = vec![0u8; spans.len() * n * frame];
        for (row, &(start, count)) in spans.iter().enumerate() {
            if nulls.as_ref().is_some_and(|nulls| nulls.is_null(row)) {
                continue;
            }
            if count == 0 {
                return Err(OpError::BadValue {
                    op,
                    row,
                    reason: "the clip has no frames to choose from".into(),
                });
            }
            let span = (n - 1) * stride + 1;
            let first = match count.checked_sub(span) {
                Some(room) => row_rng(seed, row).random_range(0..=room),
                None => 0,
            };
            for (k, to) in out[row * n * frame..(row + 1) * n * frame]
                .chunks_exact_mut(frame)
                .enumerate()
            {
                let at = start + (first + k * stride).min(count - 1) * frame;
                to.copy_from_slice(&values.values()[at..at + frame]);
            }
        }
        let item = Arc::new(Field::new("item", DataType::UInt8, false));
        FixedSizeListArray::try_new(item, (n * frame) as i32, Arc::new(UInt8Array::from(out)), nulls)
            .map(|a| Arc::new(a) as ArrayRef)
            .map_err(|cause| OpError::Arrow { op, cause })
    }
}

/// The fields of `video_info`'s struct.
fn info_fields() -> Fields {
    Fields::from(vec![
        Field::new("seconds", DataType::Float64, false),
        Field::new("fps", DataType::Float64, false),
        Field::new("width", DataType::Int32, false),
        Field::new("height", DataType::Int32, false),
        Field::new("codec", DataType::Utf8, false),
        Field::new("frames", DataType::Int64, false),
        Field::new("rotation", DataType::Int32, false),
    ])
}

/// `video_info(video)`: the clip's stream metadata read from its container, as a struct
/// (`seconds`, `fps`, `width`, `height` as coded, `codec`, `frames`: 0 where the container
/// does not say, and `rotation`: degrees clockwise players turn the frames, which
/// `decode_frames` and `video_frames` do too), for filters at the server
/// (`WHERE video_info(video)['height'] >= 720`).
#[derive(Debug)]
pub struct VideoInfoOp;

impl Op for VideoInfoOp {
    fn name(&self) -> &'static str {
        "video_info"
    }

    fn runs_here(&self) -> bool {
        VIDEO
    }

    fn signature(&self) -> &'static str {
        "video_info(video)"
    }

    fn output_field(&self, input: &Field, params: &[Value], output: &str) -> Result<Field> {
        checked_input(self.name(), input)?;
        expect_params(self.name(), params, 0, 0)?;
        Ok(Field::new(
            output,
            DataType::Struct(info_fields()),
            encoded_nullable(input),
        ))
    }

    fn apply_field(
        &self,
        input: &ArrayRef,
        _field: &Field,
        params: &[Value],
        _seed: u64,
    ) -> Result<ArrayRef> {
        expect_params(self.name(), params, 0, 0)?;
        kernels::video_info(self.name(), input, info_fields())
    }
}

/// `video_seconds(video)`: the clip's duration in seconds from its container, `Float64`.
#[derive(Debug)]
pub struct VideoSeconds;

impl Op for VideoSeconds {
    fn name(&self) -> &'static str {
        "video_seconds"
    }

    fn runs_here(&self) -> bool {
        VIDEO
    }

    fn signature(&self) -> &'static str {
        "video_seconds(video)"
    }

    fn output_field(&self, input: &Field, params: &[Value], output: &str) -> Result<Field> {
        checked_input(self.name(), input)?;
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
        kernels::video_seconds(self.name(), input)
    }
}

#[cfg(feature = "video")]
mod kernels {
    use std::sync::Arc;

    use arrow::array::{
        ArrayRef, FixedSizeListArray, Float64Builder, Int32Builder, Int64Builder, ListArray, StringBuilder,
        StructArray, UInt8Array,
    };
    use arrow::buffer::{NullBuffer, OffsetBuffer};
    use arrow::datatypes::{DataType, Field, Fields};
    use fast_image_resize::Resizer;

    use crate::media::{Media, for_each_encoded};
    use crate::op::{OpError, Result};
    use crate::video::{Sampling, frames, info, seconds};

    pub(super) fn decode_frames(
        op: &'static str,
        input: &ArrayRef,
        n: usize,
        (h, w): (u32, u32),
    ) -> Result<ArrayRef> {
        let size = n * (h * w * 3) as usize;
        let mut values = Vec::new();
        let mut valid = Vec::with_capacity(input.len());
        let mut resizer = Resizer::new();
        for_each_encoded(op, input, Media::Video, |row, bytes| {
            valid.push(bytes.is_some());
            match bytes {
                Some(bytes) => {
                    let (pixels, _) = frames(op, row, bytes, Sampling::Uniform(n), (h, w), &mut resizer)?;
                    values.extend(pixels);
                }
                None => values.resize(values.len() + size, 0),
            }
            Ok(())
        })?;
        let item = Arc::new(Field::new("item", DataType::UInt8, false));
        let nulls = valid.contains(&false).then(|| NullBuffer::from(valid));
        FixedSizeListArray::try_new(item, size as i32, Arc::new(UInt8Array::from(values)), nulls)
            .map(|a| Arc::new(a) as ArrayRef)
            .map_err(|cause| OpError::Arrow { op, cause })
    }

    pub(super) fn video_frames(
        op: &'static str,
        input: &ArrayRef,
        (fps, max): (f64, usize),
        frame: Field,
        (h, w): (u32, u32),
    ) -> Result<ArrayRef> {
        let mut values = Vec::new();
        let mut lengths = Vec::with_capacity(input.len());
        let mut valid = Vec::with_capacity(input.len());
        let mut resizer = Resizer::new();
        for_each_encoded(op, input, Media::Video, |row, bytes| {
            valid.push(bytes.is_some());
            let count = match bytes {
                Some(bytes) => {
                    let (pixels, count) =
                        frames(op, row, bytes, Sampling::Rate { fps, max }, (h, w), &mut resizer)?;
                    values.extend(pixels);
                    count
                }
                None => 0,
            };
            lengths.push(count);
            Ok(())
        })?;
        let arrow = |cause| OpError::Arrow { op, cause };
        let item = Arc::new(Field::new("item", DataType::UInt8, false));
        let frames =
            FixedSizeListArray::try_new(item, (h * w * 3) as i32, Arc::new(UInt8Array::from(values)), None)
                .map_err(arrow)?;
        let nulls = valid.contains(&false).then(|| NullBuffer::from(valid));
        ListArray::try_new(
            Arc::new(frame),
            OffsetBuffer::from_lengths(lengths),
            Arc::new(frames),
            nulls,
        )
        .map(|a| Arc::new(a) as ArrayRef)
        .map_err(arrow)
    }

    pub(super) fn video_info(op: &'static str, input: &ArrayRef, fields: Fields) -> Result<ArrayRef> {
        let mut rotation = Int32Builder::new();
        let (mut seconds, mut fps) = (Float64Builder::new(), Float64Builder::new());
        let (mut width, mut height) = (Int32Builder::new(), Int32Builder::new());
        let (mut codec, mut count) = (StringBuilder::new(), Int64Builder::new());
        let mut valid = Vec::with_capacity(input.len());
        for_each_encoded(op, input, Media::Video, |row, bytes| {
            valid.push(bytes.is_some());
            let i = match bytes {
                Some(bytes) => Some(info(op, row, bytes)?),
                None => None,
            };
            seconds.append_value(i.as_ref().map_or(0.0, |i| i.seconds));
            fps.append_value(i.as_ref().map_or(0.0, |i| i.fps));
            width.append_value(i.as_ref().map_or(0, |i| i.width as i32));
            height.append_value(i.as_ref().map_or(0, |i| i.height as i32));
            codec.append_value(i.as_ref().map_or("", |i| i.codec));
            count.append_value(i.as_ref().map_or(0, |i| i.frames.max(0)));
            rotation.append_value(i.as_ref().map_or(0, |i| i.rotation as i32));
            Ok(())
        })?;
        let nulls = valid.contains(&false).then(|| NullBuffer::from(valid));
        let columns: Vec<ArrayRef> = vec![
            Arc::new(seconds.finish()),
            Arc::new(fps.finish()),
            Arc::new(width.finish()),
            Arc::new(height.finish()),
            Arc::new(codec.finish()),
            Arc::new(count.finish()),
            Arc::new(rotation.finish()),
        ];
        StructArray::try_new(fields, columns, nulls)
            .map(|a| Arc::new(a) as ArrayRef)
            .map_err(|cause| OpError::Arrow { op, cause })
    }

    pub(super) fn video_seconds(op: &'static str, input: &ArrayRef) -> Result<ArrayRef> {
        let mut out = Float64Builder::new();
        for_each_encoded(op, input, Media::Video, |row, bytes| {
            match bytes {
                Some(bytes) => out.append_value(seconds(op, row, bytes)?),
                None => out.append_null(),
            }
            Ok(())
        })?;
        Ok(Arc::new(out.finish()))
    }
}

#[cfg(not(feature = "video"))]
mod kernels {
    use arrow::array::ArrayRef;
    use arrow::datatypes::{Field, Fields};

    use super::unavailable;
    use crate::op::Result;

    pub(super) fn decode_frames(op: &'static str, _: &ArrayRef, _: usize, _: (u32, u32)) -> Result<ArrayRef> {
        Err(unavailable(op))
    }

    pub(super) fn video_frames(
        op: &'static str,
        _: &ArrayRef,
        _: (f64, usize),
        _: Field,
        _: (u32, u32),
    ) -> Result<ArrayRef> {
        Err(unavailable(op))
    }

    pub(super) fn video_info(op: &'static str, _: &ArrayRef, _: Fields) -> Result<ArrayRef> {
        Err(unavailable(op))
    }

    pub(super) fn video_seconds(op: &'static str, _: &ArrayRef) -> Result<ArrayRef> {
        Err(unavailable(op))
    }
}

#[cfg(all(test, feature = "video"))]
mod tests {
    use std::io::Write;
    use std::process::{Command, Stdio};

    use arrow::array::{Array, AsArray, BinaryArray};
    use arrow::datatypes::{Float64Type, Int32Type, Int64Type};

    use super::*;

    /// A clip ffmpeg encodes from `frames` flat grey frames (frame `k` at level `20·k`) of
    /// 64×48 at 10 fps, with `codec` into a file of `format` (a file: its header states the
    /// duration), or into a pipe (`pipe`: it does not).
    fn encoded(frames: usize, codec: &[&str], format: &str, pipe: bool) -> Vec<u8> {
        let dir = tempfile::tempdir().expect("scratch");
        let path = dir.path().join("clip");
        let target = if pipe {
            "-".to_owned()
        } else {
            path.to_string_lossy().into_owned()
        };
        let mut ffmpeg = Command::new("ffmpeg")
            .args([
                "-v", "error", "-f", "rawvideo", "-pix_fmt", "rgb24", "-s", "64x48", "-r", "10", "-i", "-",
            ])
            .args(codec)
            .args(["-pix_fmt", "yuv420p", "-f", format, &target])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("ffmpeg (scripts/setup-media.sh installs it)");
        let mut stdin = ffmpeg.stdin.take().expect("stdin");
        let raw: Vec<u8> = (0..frames)
            .flat_map(|k| std::iter::repeat_n((20 * k).min(255) as u8, 64 * 48 * 3))
            .collect();
        let writer = std::thread::spawn(move || stdin.write_all(&raw));
        let out = ffmpeg.wait_with_output().expect("ffmpeg runs");
        writer.join().expect("writer").expect("frames written");
        assert!(out.status.success(), "ffmpeg {codec:?} {format}");
        if pipe {
            out.stdout
        } else {
            std::fs::read(&path).expect("the clip")
        }
    }

    fn clip(frames: usize, codec: &[&str], format: &str) -> Vec<u8> {
        encoded(frames, codec, format, false)
    }

    fn column(clips: Vec<Option<Vec<u8>>>) -> ArrayRef {
        Arc::new(BinaryArray::from_iter(clips))
    }

    fn mp4() -> Vec<u8> {
        clip(10, &["-c:v", "libx264"], "mp4")
    }

    #[test]
    fn frames_are_the_ones_shown_at_the_segments_centres() {
        for (codec, format, pipe) in [
            (&["-c:v", "libx264"][..], "mp4", false),
            (
                &["-c:v", "libx264", "-movflags", "frag_keyframe+empty_moov"][..],
                "mp4",
                true,
            ),
            (
                &["-c:v", "libx265", "-x265-params", "log-level=none"][..],
                "matroska",
                false,
            ),
            (&["-c:v", "libvpx-vp9"][..], "webm", false),
            // Streamed WebM states no duration: the packets' timestamps give it.
            (&["-c:v", "libvpx-vp9"][..], "webm", true),
            (&["-c:v", "libaom-av1", "-cpu-used", "8"][..], "matroska", false),
        ] {
            let input = column(vec![Some(encoded(10, codec, format, pipe)), None]);
            let params = [Value::Int(5), Value::Int(24), Value::Int(24)];
            let field = DecodeFrames
                .output_field(&Field::new("v", DataType::Binary, true), &params, "f")
                .expect("field");
            assert_eq!(field.metadata()[SHAPE_METADATA_KEY], "5,24,24,3");
            let out = DecodeFrames.apply(&input, &params).expect("frames");
            let out = out.as_fixed_size_list();
            assert!(out.is_null(1));
            let pixels = out.value(0);
            let pixels = pixels.as_primitive::<arrow::datatypes::UInt8Type>().values();
            // 1 s in 5 segments: centres at 0.1, 0.3, …, 0.9 s, shown by frames 1, 3, …, 9.
            for (i, want) in [20u8, 60, 100, 140, 180].into_iter().enumerate() {
                let frame = &pixels[i * 24 * 24 * 3..(i + 1) * 24 * 24 * 3];
                let mean = frame.iter().map(|&p| f64::from(p)).sum::<f64>() / frame.len() as f64;
                assert!(
                    (mean - f64::from(want)).abs() < 4.0,
                    "{format} {codec:?} frame {i}: {mean} for {want}"
                );
            }
        }
    }

    #[test]
    fn video_frames_are_one_a_step_and_random_clip_chooses_among_them() {
        // 1 s at 10 fps at 4 fps: frames shown at 0, 0.25, 0.5 and 0.75 s (0, 2, 5, 7).
        let input = column(vec![
            Some(mp4()),
            None,
            Some(clip(3, &["-c:v", "libx264"], "mp4")),
        ]);
        let params = [Value::Int(4), Value::Int(8), Value::Int(8)];
        let field = VideoFrames
            .output_field(&Field::new("v", DataType::Binary, true), &params, "f")
            .expect("field");
        let out = VideoFrames.apply(&input, &params).expect("frames");
        let list = out.as_list::<i32>();
        assert!(list.is_null(1));
        let means: Vec<Vec<f64>> = [0, 2]
            .iter()
            .map(|&row| {
                let frames = list.value(row);
                let frames = frames.as_fixed_size_list();
                (0..frames.len())
                    .map(|i| {
                        let f = frames.value(i);
                        let f = f.as_primitive::<arrow::datatypes::UInt8Type>().values();
                        f.iter().map(|&p| f64::from(p)).sum::<f64>() / f.len() as f64
                    })
                    .collect()
            })
            .collect();
        let near = |got: &[f64], want: &[f64]| {
            got.len() == want.len() && got.iter().zip(want).all(|(g, w)| (g - w).abs() < 4.0)
        };
        assert!(near(&means[0], &[0.0, 40.0, 100.0, 140.0]), "{means:?}");
        // 0.3 s: 0 and 0.25 s.
        assert!(near(&means[1], &[0.0, 40.0]), "{means:?}");
        // Two of a row's frames, 2 apart: (0, 5) or (2, 7) of the first; the short clip
        // repeats its last frame.
        let clip_params = [Value::Int(2), Value::Int(2)];
        let clip_field = RandomClip
            .output_field(&field, &clip_params, "c")
            .expect("clip field");
        assert_eq!(clip_field.metadata()[SHAPE_METADATA_KEY], "2,8,8,3");
        let mut starts = std::collections::BTreeSet::new();
        for seed in 0..16 {
            let clips = RandomClip
                .apply_field(&out, &field, &clip_params, seed)
                .expect("clips");
            let clips = clips.as_fixed_size_list();
            assert!(clips.is_null(1));
            let mean = |row: usize, k: usize| {
                let v = clips.value(row);
                let v = &v.as_primitive::<arrow::datatypes::UInt8Type>().values()[k * 192..(k + 1) * 192];
                v.iter().map(|&p| f64::from(p)).sum::<f64>() / 192.0
            };
            let pair = [mean(0, 0), mean(0, 1)];
            assert!(
                near(&pair, &[0.0, 100.0]) || near(&pair, &[40.0, 140.0]),
                "{pair:?}"
            );
            starts.insert(pair[0] as u32);
            assert!(near(&[mean(2, 0), mean(2, 1)], &[0.0, 40.0]));
        }
        assert_eq!(starts.len(), 2, "both starts are drawn: {starts:?}");
    }

    /// FFmpeg 5.1's own `ffmpeg -i` shows a clip stream-copied with `rotate=90` turned a
    /// quarter counter-clockwise (its top-left corner at the bottom left): so do the ops.
    #[test]
    fn frames_are_turned_as_the_display_matrix_says() {
        let dir = tempfile::tempdir().expect("scratch");
        let (plain, tagged) = (dir.path().join("plain.mp4"), dir.path().join("tagged.mp4"));
        let run = |args: &[&str]| {
            let ok = Command::new("ffmpeg")
                .args(["-v", "error", "-y"])
                .args(args)
                .status();
            assert!(ok.expect("ffmpeg").success(), "{args:?}");
        };
        run(&[
            "-f",
            "lavfi",
            "-i",
            "color=c=black:s=64x48:d=1,drawbox=x=0:y=0:w=16:h=16:color=red:t=fill",
            "-c:v",
            "libx264",
            "-pix_fmt",
            "yuv444p",
            &plain.to_string_lossy(),
        ]);
        run(&[
            "-i",
            &plain.to_string_lossy(),
            "-c",
            "copy",
            "-metadata:s:v",
            "rotate=90",
            &tagged.to_string_lossy(),
        ]);
        let input = column(vec![Some(std::fs::read(&tagged).expect("clip"))]);
        let info = VideoInfoOp.apply(&input, &[]).expect("info");
        assert_eq!(
            info.as_struct().column(6).as_primitive::<Int32Type>().value(0),
            270
        );
        // Upright it is 48 wide and 64 high: decoded at that size, nothing is cropped.
        let out = DecodeFrames
            .apply(&input, &[Value::Int(1), Value::Int(64), Value::Int(48)])
            .expect("frames");
        let out = out.as_fixed_size_list().value(0);
        let px = out.as_primitive::<arrow::datatypes::UInt8Type>().values();
        let red = |y: usize, x: usize| px[(y * 48 + x) * 3] > 128;
        assert!(red(56, 8) && !red(8, 8) && !red(8, 40) && !red(56, 40));
    }

    #[test]
    fn frames_too_large_for_one_value_are_refused() {
        let field = Field::new("v", DataType::Binary, true);
        let params = [Value::Int(1024), Value::Int(4096), Value::Int(4096)];
        let err = DecodeFrames
            .output_field(&field, &params, "f")
            .expect_err("51 GB a row");
        assert!(err.to_string().contains("over the 2 GiB"), "{err}");
    }

    #[test]
    fn info_is_read_from_the_container() {
        let input = column(vec![Some(mp4()), None]);
        let out = VideoInfoOp.apply(&input, &[]).expect("info");
        let info = out.as_struct();
        assert!(info.is_null(1));
        let seconds = info.column(0).as_primitive::<Float64Type>().value(0);
        assert!((seconds - 1.0).abs() < 0.01, "{seconds}");
        assert_eq!(info.column(1).as_primitive::<Float64Type>().value(0), 10.0);
        assert_eq!(info.column(2).as_primitive::<Int32Type>().value(0), 64);
        assert_eq!(info.column(3).as_primitive::<Int32Type>().value(0), 48);
        assert_eq!(info.column(4).as_string::<i32>().value(0), "h264");
        assert!(info.column(5).as_primitive::<Int64Type>().value(0) >= 0);
        let seconds = VideoSeconds.apply(&input, &[]).expect("seconds");
        assert!((seconds.as_primitive::<Float64Type>().value(0) - 1.0).abs() < 0.01);
    }

    #[test]
    fn damaged_clips_are_errors_naming_their_row() {
        let good = clip(10, &["-c:v", "libx264"], "matroska");
        let mut truncated = good.clone();
        truncated.truncate(good.len() / 2);
        let audio_only = {
            let out = Command::new("ffmpeg")
                .args([
                    "-v",
                    "error",
                    "-f",
                    "lavfi",
                    "-i",
                    "sine=duration=1",
                    "-f",
                    "ogg",
                    "-",
                ])
                .output()
                .expect("ffmpeg");
            out.stdout
        };
        for (bad, says) in [
            (b"not a video at all".to_vec(), "first bytes"),
            (Vec::new(), "empty"),
            (audio_only, "no video stream"),
            (truncated, "truncated"),
        ] {
            let input = column(vec![Some(good.clone()), Some(bad)]);
            let err = DecodeFrames
                .apply(&input, &[Value::Int(4), Value::Int(8), Value::Int(8)])
                .expect_err(says)
                .to_string();
            assert!(err.contains("row 1") && err.contains(says), "{says}: {err}");
        }
    }
}
