//! Video ops: `decode_frames`, `video_info` and `video_seconds`, over encoded clips (binary
//! or the Hub's `struct<bytes, path>`). They need FFmpeg's libraries (the `video` feature);
//! a build without them keeps the ops' names and refuses every call by name, saying so, so
//! a server without FFmpeg is never planned to run them.

use std::sync::Arc;

use arrow::array::ArrayRef;
use arrow::datatypes::{DataType, Field, Fields};

use crate::media::{Media, encoded_input, encoded_nullable};
use crate::op::{Op, OpError, Result, SHAPE_METADATA_KEY, Value, expect_params, int_param};

/// The largest side `decode_frames` makes.
const MAX_SIDE: i64 = 4096;
/// The most frames `decode_frames` takes from one clip.
const MAX_FRAMES: i64 = 1024;
/// Bytes counted for a decoder decoding one clip (its reference frames and a frame converted
/// to RGB: a few 1080p frames), in a server's memory budget: a row of `decode_frames` counts
/// as at least this, so batches of clips stay small. (16 MiB is also a server's default cap
/// per row, so the declaration alone refuses nothing.)
const DECODER_BYTES: u64 = 16 << 20;

/// Whether this build decodes video.
pub const VIDEO: bool = cfg!(feature = "video");

fn unavailable(op: &'static str) -> OpError {
    OpError::BadArguments {
        op,
        reason: "this build has no video support: FFmpeg's libraries were not built in (the \
                 `video` feature of pushdown-ops; scripts/setup-media.sh installs them)"
            .into(),
    }
}

fn checked_input(op: &'static str, input: &Field) -> Result<()> {
    if !VIDEO {
        return Err(unavailable(op));
    }
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
        Ok(Some((n as u64 * u64::from(h * w) * 3).max(DECODER_BYTES)))
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

/// The fields of `video_info`'s struct.
fn info_fields() -> Fields {
    Fields::from(vec![
        Field::new("seconds", DataType::Float64, false),
        Field::new("fps", DataType::Float64, false),
        Field::new("width", DataType::Int32, false),
        Field::new("height", DataType::Int32, false),
        Field::new("codec", DataType::Utf8, false),
        Field::new("frames", DataType::Int64, false),
    ])
}

/// `video_info(video)`: the clip's stream metadata read from its container, as a struct
/// (`seconds`, `fps`, `width`, `height`, `codec`, `frames`: 0 where the container does not
/// say), for filters at the server (`WHERE video_info(video)['height'] >= 720`).
#[derive(Debug)]
pub struct VideoInfoOp;

impl Op for VideoInfoOp {
    fn name(&self) -> &'static str {
        "video_info"
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
        ArrayRef, FixedSizeListArray, Float64Builder, Int32Builder, Int64Builder, StringBuilder, StructArray,
        UInt8Array,
    };
    use arrow::buffer::NullBuffer;
    use arrow::datatypes::{DataType, Field, Fields};
    use fast_image_resize::Resizer;

    use crate::media::{Media, for_each_encoded};
    use crate::op::{OpError, Result};
    use crate::video::{frames, info, seconds};

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
                Some(bytes) => values.extend(frames(op, row, bytes, n, (h, w), &mut resizer)?),
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

    pub(super) fn video_info(op: &'static str, input: &ArrayRef, fields: Fields) -> Result<ArrayRef> {
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
    use arrow::datatypes::Fields;

    use super::unavailable;
    use crate::op::Result;

    pub(super) fn decode_frames(op: &'static str, _: &ArrayRef, _: usize, _: (u32, u32)) -> Result<ArrayRef> {
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
