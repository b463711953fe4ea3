//! Video kernels over encoded files, by FFmpeg's libraries (the system's libav*, through
//! `ffmpeg-next`): the container's stream metadata, and frames chosen by presentation
//! timestamp, decoded from the nearest preceding keyframe.
//!
//! A clip is handed to FFmpeg as an unnamed temporary file (`/proc/self/fd/N`): its demuxers
//! seek in it as in any file, and no custom I/O callback (unsafe code) is needed.

use std::io::Write;
use std::os::fd::AsRawFd;
use std::sync::Once;

use fast_image_resize::Resizer;
use ffmpeg::format::Pixel;
use ffmpeg::software::scaling::{Context as Scaler, Flags};
use ffmpeg::util::frame::video::Video as Frame;
use ffmpeg_next as ffmpeg;
use image::RgbImage;

use crate::image_ops::{crop, resize};
use crate::media::DECODER_BYTES;
use crate::media::first_bytes;
use crate::op::{OpError, Result};

/// The frames a decoder may hold at once: H.264's and HEVC's largest picture buffer (16),
/// the frame being decoded and the one shown. Their bytes must fit in [`DECODER_BYTES`].
const POOL_FRAMES: u64 = 18;
/// A target further than this ahead of the last decoded frame is reached by seeking to the
/// keyframe before it, not by decoding the frames in between.
const SEEK_AHEAD_SECONDS: f64 = 2.0;
/// Microseconds: FFmpeg's `AV_TIME_BASE`.
const TIME_BASE: f64 = 1e6;

fn bad(op: &'static str, row: usize, reason: String) -> OpError {
    OpError::BadValue { op, row, reason }
}

fn init() {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        // Initialisation only registers codecs; a failure shows as the first open's error.
        let _ = ffmpeg::init();
        // Damaged input is each row's error, not lines on the server's stderr.
        ffmpeg::util::log::set_level(ffmpeg::util::log::Level::Fatal);
    });
}

/// A clip's stream metadata, from its container (no frame decoded).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct VideoInfo {
    pub seconds: f64,
    pub fps: f64,
    pub width: u32,
    pub height: u32,
    pub codec: &'static str,
    pub frames: i64,
    /// Degrees clockwise the frames are turned to be shown (0, 90, 180 or 270): the
    /// container's display matrix, as players apply it.
    pub rotation: u32,
}

/// A clip opened, with its video stream's index and what decoding it needs.
struct Opened {
    input: ffmpeg::format::context::Input,
    stream: usize,
    time_base: f64,
    /// The stream's first timestamp and length, in its time base.
    start: i64,
    duration: i64,
    parameters: ffmpeg::codec::Parameters,
    fps: f64,
    frames: i64,
    /// Degrees clockwise to show the frames upright ([`VideoInfo::rotation`]).
    rotation: u32,
    /// The file FFmpeg reads: open as long as the clip is.
    _file: std::fs::File,
}

fn open(op: &'static str, row: usize, bytes: &[u8]) -> Result<Opened> {
    init();
    if bytes.is_empty() {
        return Err(bad(op, row, "the video value is empty (zero bytes)".into()));
    }
    let io = |e: std::io::Error| bad(op, row, format!("cannot stage the clip for FFmpeg: {e}"));
    let mut file = tempfile::tempfile().map_err(io)?;
    file.write_all(bytes).map_err(io)?;
    open_staged(op, row, file, bytes, Unstated::Demux)
}

/// What [`open_staged`] does with a stream whose container states no duration.
#[derive(Clone, Copy, PartialEq)]
enum Unstated {
    /// Demux the packets for their last timestamp.
    Demux,
    /// Leave the duration 0 (the file is not all there).
    Zero,
}

/// Opens the clip staged in `file` (`bytes`: its first bytes, for errors).
fn open_staged(
    op: &'static str,
    row: usize,
    file: std::fs::File,
    bytes: &[u8],
    unstated: Unstated,
) -> Result<Opened> {
    let path = format!("/proc/self/fd/{}", file.as_raw_fd());
    let mut input = ffmpeg::format::input(&path).map_err(|e| {
        bad(
            op,
            row,
            format!(
                "cannot read the video: {e} (not a container FFmpeg reads, or damaged); its first bytes are {}",
                first_bytes(bytes)
            ),
        )
    })?;
    let stream = input
        .streams()
        .best(ffmpeg::media::Type::Video)
        .ok_or_else(|| bad(op, row, "the file holds no video stream".into()))?;
    let time_base = f64::from(stream.time_base());
    let start = match stream.start_time() {
        ffmpeg::ffi::AV_NOPTS_VALUE => 0,
        t => t,
    };
    let stated = match stream.duration() {
        d if d > 0 => d,
        _ if input.duration() > 0 && time_base > 0.0 => {
            (input.duration() as f64 / TIME_BASE / time_base).round() as i64
        }
        _ => 0,
    };
    let rate = |r: ffmpeg::Rational| (r.denominator() != 0).then(|| f64::from(r)).filter(|f| *f > 0.0);
    let fps = rate(stream.avg_frame_rate())
        .or_else(|| rate(stream.rate()))
        .unwrap_or(0.0);
    let (index, parameters, frames) = (stream.index(), stream.parameters(), stream.frames());
    let rotation = stream
        .side_data()
        .find(|d| d.kind() == ffmpeg::codec::packet::side_data::Type::DisplayMatrix)
        .map_or(0, |d| clockwise_degrees(d.data()));
    let duration = if stated > 0 {
        stated
    } else if unstated == Unstated::Zero {
        0
    } else {
        // A stream written to a pipe (Matroska, WebM) states no duration: the packets'
        // timestamps give it, read without decoding; then the clip is opened afresh.
        let end = packets_end(&mut input, index);
        input = ffmpeg::format::input(&path)
            .map_err(|e| bad(op, row, format!("cannot read the video again: {e}")))?;
        end.map_or(0, |end| end.saturating_sub(start))
    };
    Ok(Opened {
        stream: index,
        time_base,
        start,
        duration,
        parameters,
        fps,
        frames,
        rotation,
        input,
        _file: file,
    })
}

/// The clockwise turn (0, 90, 180 or 270 degrees) a display matrix (nine native-endian
/// `i32`s, 16.16 fixed point but the last column) applies, as FFmpeg's players read it:
/// `-av_display_rotation_get`, rounded to the nearest right angle. A matrix that is not a
/// rotation (degenerate, mirroring, or cut short) turns nothing.
fn clockwise_degrees(matrix: &[u8]) -> u32 {
    let at = |i: usize| {
        matrix
            .get(4 * i..4 * i + 4)
            .and_then(|b| b.try_into().ok())
            .map_or(0.0, |b| f64::from(i32::from_ne_bytes(b)) / 65536.0)
    };
    let (a, b, c, d) = (at(0), at(1), at(3), at(4));
    let (scale_x, scale_y) = (a.hypot(c), b.hypot(d));
    // A mirroring matrix (negative determinant) is left as coded: FFmpeg's players flip
    // such frames rather than turn them, and no flip is applied here.
    if scale_x == 0.0 || scale_y == 0.0 || a * d - b * c < 0.0 {
        return 0;
    }
    let degrees = (b / scale_y).atan2(a / scale_x).to_degrees();
    ((degrees / 90.0).round() as i64).rem_euclid(4) as u32 * 90
}

/// Where the stream's last packet ends (its timestamp plus its duration), from demuxing.
fn packets_end(input: &mut ffmpeg::format::context::Input, stream: usize) -> Option<i64> {
    let mut end = None;
    let mut packet = ffmpeg::Packet::empty();
    while packet.read(input).is_ok() {
        if packet.stream() == stream
            && let Some(pts) = packet.pts()
        {
            end = end.max(Some(pts.saturating_add(packet.duration().max(0))));
        }
    }
    end
}

fn decoder(op: &'static str, row: usize, opened: &Opened) -> Result<ffmpeg::decoder::Video> {
    ffmpeg::codec::context::Context::from_parameters(opened.parameters.clone())
        .and_then(|c| c.decoder().video())
        .map_err(|e| bad(op, row, format!("no decoder for the video stream: {e}")))
}

/// The clip's duration in seconds, from its container alone.
pub(crate) fn seconds(op: &'static str, row: usize, bytes: &[u8]) -> Result<f64> {
    let opened = open(op, row, bytes)?;
    Ok(opened.duration as f64 * opened.time_base)
}

/// The duration of a clip of `len` bytes of which only `head` and `tail` are known, read by
/// FFmpeg from a sparse copy (zeros between): for metadata known to lie within the ends
/// ([`crate::video_ends`]). `None` where the container states no duration.
pub(crate) fn seconds_of_sparse(head: &[u8], tail: &[u8], len: u64) -> Option<f64> {
    use std::io::{Seek, SeekFrom};
    init();
    let mut file = tempfile::tempfile().ok()?;
    file.set_len(len).ok()?;
    file.write_all(head).ok()?;
    file.seek(SeekFrom::Start(len.checked_sub(tail.len() as u64)?))
        .ok()?;
    file.write_all(tail).ok()?;
    let opened = open_staged("video_seconds", 0, file, head, Unstated::Zero).ok()?;
    (opened.duration > 0).then_some(opened.duration as f64 * opened.time_base)
}

/// The clip's metadata.
pub(crate) fn info(op: &'static str, row: usize, bytes: &[u8]) -> Result<VideoInfo> {
    let opened = open(op, row, bytes)?;
    let decoder = decoder(op, row, &opened)?;
    Ok(VideoInfo {
        seconds: opened.duration as f64 * opened.time_base,
        fps: opened.fps,
        width: decoder.width(),
        height: decoder.height(),
        codec: decoder.id().name(),
        frames: opened.frames,
        rotation: opened.rotation,
    })
}

/// The presentation timestamps (in the stream's time base) of `n` frames evenly spread over
/// a clip: the centres of `n` equal segments from `start` over `duration`.
fn targets(start: i64, duration: i64, n: usize) -> Vec<i64> {
    (0..n as i128)
        .map(|i| (start as i128 + (2 * i + 1) * duration as i128 / (2 * n as i128)) as i64)
        .collect()
}

/// The presentation timestamps of frames at `fps` from the clip's start (`start + k/fps`
/// seconds), before its end: at most `max`.
fn rate_targets(start: i64, duration: i64, time_base: f64, fps: f64, max: usize) -> Vec<i64> {
    let step = 1.0 / (fps * time_base);
    (0..max)
        .map(|k| start.saturating_add((k as f64 * step).round() as i64))
        .take_while(|&t| t < start.saturating_add(duration))
        .collect()
}

/// Which frames of a clip to take.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Sampling {
    /// `n` frames, at the centres of `n` equal segments of the clip.
    Uniform(usize),
    /// A frame every `1/fps` seconds from the start, at most `max` of them.
    Rate { fps: f64, max: usize },
}

/// The clip's frames as `sampling` chooses them, each the frame shown at its target time (the
/// last with a presentation timestamp at or before it), turned upright as the container says
/// to show it, resized with the aspect kept to just cover `h × w` and center-cropped: `h·w·3`
/// bytes of RGB a frame, and how many frames.
pub(crate) fn frames(
    op: &'static str,
    row: usize,
    bytes: &[u8],
    sampling: Sampling,
    (h, w): (u32, u32),
    resizer: &mut Resizer,
) -> Result<(Vec<u8>, usize)> {
    picked(op, row, bytes, sampling, (h, w), resizer).map(|(pixels, n, _)| (pixels, n))
}

/// [`frames`], and how many frames were decoded to find them.
fn picked(
    op: &'static str,
    row: usize,
    bytes: &[u8],
    sampling: Sampling,
    (h, w): (u32, u32),
    resizer: &mut Resizer,
) -> Result<(Vec<u8>, usize, usize)> {
    let mut opened = open(op, row, bytes)?;
    if opened.duration <= 0 {
        return Err(bad(op, row, "the video states no duration".into()));
    }
    let mut decoder = decoder(op, row, &opened)?;
    // The smallest frames of that size (8-bit 4:2:0) first; the decoded frame's own planes
    // when it comes.
    let size = (decoder.width(), decoder.height());
    fits_pool(op, row, u64::from(size.0) * u64::from(size.1) * 3 / 2, size)?;
    let targets = match sampling {
        Sampling::Uniform(n) => targets(opened.start, opened.duration, n),
        Sampling::Rate { fps, max } => {
            rate_targets(opened.start, opened.duration, opened.time_base, fps, max)
        }
    };
    let n = targets.len();
    let mut picker = Picker {
        op,
        row,
        targets: &targets,
        next: 0,
        shown: None,
        out: Vec::with_capacity(n * (h * w * 3) as usize),
        decoded: 0,
        size: (h, w),
        rotation: opened.rotation,
        resizer,
    };
    let seek_ahead = (SEEK_AHEAD_SECONDS / opened.time_base) as i64;
    let mut last = i64::MIN;
    let mut packet = ffmpeg::Packet::empty();
    while picker.next < n {
        let target = targets[picker.next];
        let reached = if last == i64::MIN { opened.start } else { last };
        if target.saturating_sub(reached) > seek_ahead {
            let at = (target as f64 * opened.time_base * TIME_BASE) as i64;
            if opened.input.seek(at, ..at.saturating_add(1)).is_ok() {
                decoder.flush();
                // Frames before the target are decoded again from the keyframe; the one
                // shown at the target is among them.
                picker.shown = None;
                last = target;
            }
        }
        match packet.read(&mut opened.input) {
            Ok(()) if packet.stream() != opened.stream => continue,
            Ok(()) => {
                // A damaged packet is skipped as players skip it; a clip that yields no
                // frame for its targets is the row's error below.
                if decoder.send_packet(&packet).is_ok() {
                    picker.drain(&mut decoder, &mut last)?;
                }
            }
            Err(ffmpeg::Error::Eof) => break,
            Err(e) => return Err(bad(op, row, format!("cannot read the video's packets: {e}"))),
        }
    }
    let _ = decoder.send_eof();
    picker.drain(&mut decoder, &mut last)?;
    picker.finish(opened.time_base, opened.fps)
}

/// Whether a decoder holding [`POOL_FRAMES`] frames of `frame_bytes` each stays within
/// [`DECODER_BYTES`]; else the row's error.
fn fits_pool(op: &'static str, row: usize, frame_bytes: u64, (w, h): (u32, u32)) -> Result<()> {
    let pool = frame_bytes.saturating_mul(POOL_FRAMES);
    if pool <= DECODER_BYTES {
        return Ok(());
    }
    Err(bad(
        op,
        row,
        format!(
            "decoding its {w}×{h} frames may hold {} MiB ({POOL_FRAMES} frames of {:.1} MiB), over \
             the {} MiB a video decoder may hold per stream (at most 1080p at 8 bits, 4:2:0)",
            pool >> 20,
            frame_bytes as f64 / f64::from(1 << 20),
            DECODER_BYTES >> 20
        ),
    ))
}

/// Chooses, among decoded frames in presentation order, the one shown at each target.
struct Picker<'a> {
    op: &'static str,
    row: usize,
    targets: &'a [i64],
    next: usize,
    /// The last frame decoded (its timestamp and its pixels once converted).
    shown: Option<(i64, Frame, Option<Vec<u8>>)>,
    out: Vec<u8>,
    /// Frames decoded so far.
    decoded: usize,
    size: (u32, u32),
    /// Degrees clockwise to turn each frame.
    rotation: u32,
    resizer: &'a mut Resizer,
}

impl Picker<'_> {
    fn drain(&mut self, decoder: &mut ffmpeg::decoder::Video, last: &mut i64) -> Result<()> {
        let mut frame = Frame::empty();
        while decoder.receive_frame(&mut frame).is_ok() {
            self.decoded += 1;
            if self.decoded == 1 {
                let bytes = (0..frame.planes()).map(|i| frame.data(i).len() as u64).sum();
                fits_pool(self.op, self.row, bytes, (frame.width(), frame.height()))?;
            }
            let Some(pts) = frame.timestamp().or_else(|| frame.pts()) else {
                continue;
            };
            *last = (*last).max(pts);
            // Targets before this frame are shown by the one before it (or by this one,
            // where the clip starts after them).
            while self.next < self.targets.len() && pts > self.targets[self.next] {
                if self.shown.is_none() {
                    self.shown = Some((pts, frame.clone(), None));
                }
                self.emit()?;
            }
            if self.next == self.targets.len() {
                return Ok(());
            }
            self.shown = Some((pts, frame.clone(), None));
        }
        Ok(())
    }

    /// The shown frame as the next target's pixels.
    fn emit(&mut self) -> Result<()> {
        let (op, row, size) = (self.op, self.row, self.size);
        let Some((_, frame, pixels)) = &mut self.shown else {
            return Err(bad(op, row, "no frame decoded before the target time".into()));
        };
        if pixels.is_none() {
            *pixels = Some(cover_crop(op, row, frame, self.rotation, size, self.resizer)?);
        }
        self.out.extend_from_slice(pixels.as_deref().unwrap_or_default());
        self.next += 1;
        Ok(())
    }

    /// Targets past the last frame are shown by it, unless the clip ends well before them
    /// (truncated: its header promised more).
    fn finish(mut self, time_base: f64, fps: f64) -> Result<(Vec<u8>, usize, usize)> {
        let (op, row) = (self.op, self.row);
        let Some((pts, ..)) = &self.shown else {
            return Err(bad(
                op,
                row,
                "no frame could be decoded (damaged or truncated)".into(),
            ));
        };
        let slack = if fps > 0.0 { 3.0 / fps } else { 0.5 };
        if let Some(&target) = self.targets.get(self.next) {
            let behind = target.saturating_sub(*pts) as f64 * time_base;
            if behind > slack.max(0.25) {
                return Err(bad(
                    op,
                    row,
                    format!(
                        "the video stops at {:.2} s, before {:.2} s its header promises (truncated?)",
                        *pts as f64 * time_base,
                        target as f64 * time_base
                    ),
                ));
            }
        }
        while self.next < self.targets.len() {
            self.emit()?;
        }
        Ok((self.out, self.targets.len(), self.decoded))
    }
}

/// The frame as RGB, turned `rotation` degrees clockwise, resized (bilinear, as the image
/// ops) with its aspect kept to just cover `h × w`, then center-cropped to it.
fn cover_crop(
    op: &'static str,
    row: usize,
    frame: &Frame,
    rotation: u32,
    (h, w): (u32, u32),
    resizer: &mut Resizer,
) -> Result<Vec<u8>> {
    let (fw, fh) = (frame.width(), frame.height());
    let failed = |e: ffmpeg::Error| bad(op, row, format!("cannot convert the frame to RGB: {e}"));
    let mut scaler =
        Scaler::get(frame.format(), fw, fh, Pixel::RGB24, fw, fh, Flags::BILINEAR).map_err(failed)?;
    let mut rgb = Frame::empty();
    scaler.run(frame, &mut rgb).map_err(failed)?;
    let stride = rgb.stride(0);
    let data = rgb.data(0);
    let row_bytes = fw as usize * 3;
    let mut packed = Vec::with_capacity(row_bytes * fh as usize);
    for y in 0..fh as usize {
        packed.extend_from_slice(&data[y * stride..y * stride + row_bytes]);
    }
    let img =
        RgbImage::from_raw(fw, fh, packed).ok_or_else(|| bad(op, row, "a frame of no pixels".into()))?;
    let img = match rotation {
        90 => image::imageops::rotate90(&img),
        180 => image::imageops::rotate180(&img),
        270 => image::imageops::rotate270(&img),
        _ => img,
    };
    let (fw, fh) = img.dimensions();
    let scale = (f64::from(h) / f64::from(fh)).max(f64::from(w) / f64::from(fw));
    let rw = ((f64::from(fw) * scale).round() as u32).max(w);
    let rh = ((f64::from(fh) * scale).round() as u32).max(h);
    let pixels = resize(op, resizer, &img, rw, rh)?;
    let corner = |side: u32, crop: u32| (f64::from(side - crop) / 2.0).round_ties_even() as usize;
    let mut out = vec![0; (h * w * 3) as usize];
    crop(
        &pixels,
        (rh as usize, rw as usize, 3),
        (corner(rh, h), corner(rw, w)),
        (h as usize, w as usize),
        &mut out,
    );
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minute at 10 fps, a keyframe each second, frame `k` at grey level `4·⌊k/10⌋`: four
    /// frames of it are found by seeking, decoding a few seconds around each, not 600
    /// frames.
    #[test]
    fn far_targets_are_reached_by_seeking() {
        use std::io::Write;
        use std::process::{Command, Stdio};
        let dir = tempfile::tempdir().expect("scratch");
        let path = dir.path().join("long.mp4");
        let mut ffmpeg = Command::new("ffmpeg")
            .args([
                "-v", "error", "-f", "rawvideo", "-pix_fmt", "rgb24", "-s", "64x48", "-r", "10", "-i", "-",
            ])
            .args(["-c:v", "libx264", "-g", "10", "-pix_fmt", "yuv420p"])
            .arg(&path)
            .stdin(Stdio::piped())
            .spawn()
            .expect("ffmpeg (scripts/setup-media.sh installs it)");
        let mut stdin = ffmpeg.stdin.take().expect("stdin");
        for k in 0..600 {
            stdin
                .write_all(&vec![(4 * (k / 10)) as u8; 64 * 48 * 3])
                .expect("frame");
        }
        drop(stdin);
        assert!(ffmpeg.wait().expect("ffmpeg").success());
        let clip = std::fs::read(&path).expect("clip");
        let (pixels, _, decoded) = picked(
            "decode_frames",
            0,
            &clip,
            Sampling::Uniform(4),
            (8, 8),
            &mut Resizer::new(),
        )
        .expect("frames");
        // Centres at 7.5, 22.5, 37.5 and 52.5 s: seconds 7, 22, 37 and 52.
        for (i, second) in [7u8, 22, 37, 52].into_iter().enumerate() {
            let frame = &pixels[i * 192..(i + 1) * 192];
            let mean = frame.iter().map(|&p| f64::from(p)).sum::<f64>() / 192.0;
            assert!((mean - f64::from(4 * second)).abs() < 3.0, "frame {i}: {mean}");
        }
        assert!(decoded < 100, "{decoded} of 600 frames decoded");
    }

    /// `ffmpeg` encodes 4 s of its test pattern at 320×240 with `args`, to `name` (a file,
    /// or `-` for a pipe, then read as a Matroska stream).
    fn encoded(name: &str, args: &[&str]) -> Vec<u8> {
        let clip = encoded_from("testsrc2=size=320x240:rate=25:duration=4", name, args);
        assert!(clip.len() > 64 << 10, "{name}: {} bytes", clip.len());
        clip
    }

    /// `ffmpeg` encoding the lavfi `source` with `args` to `name` (`-`: Matroska to a pipe).
    fn encoded_from(source: &str, name: &str, args: &[&str]) -> Vec<u8> {
        use std::process::Command;
        let dir = tempfile::tempdir().expect("scratch");
        let mut ffmpeg = Command::new("ffmpeg");
        ffmpeg
            .args(["-v", "error", "-f", "lavfi", "-i", source])
            .args(args);
        if name == "-" {
            ffmpeg
                .args(["-f", "matroska", "-"])
                .output()
                .expect("ffmpeg")
                .stdout
        } else {
            let path = dir.path().join(name);
            assert!(
                ffmpeg
                    .arg(&path)
                    .status()
                    .expect("ffmpeg (scripts/setup-media.sh installs it)")
                    .success()
            );
            std::fs::read(&path).expect("clip")
        }
    }

    /// The index's durations from clips' ends are the whole clips' (from FFmpeg's muxers:
    /// `moov` at the end and at the start, Matroska and WebM); where the metadata is not in
    /// the ends (a pipe-written Matroska with no duration, ends too short), there is none.
    #[test]
    fn durations_from_the_ends_are_the_whole_clips() {
        let h264 = ["-c:v", "libx264", "-preset", "ultrafast", "-pix_fmt", "yuv420p"];
        let vp9 = [
            "-c:v",
            "libvpx-vp9",
            "-deadline",
            "realtime",
            "-cpu-used",
            "8",
            "-b:v",
            "400k",
        ];
        let faststart = [&h264[..], &["-movflags", "+faststart"]].concat();
        let cases: [(&str, &[&str], bool); 5] = [
            ("tail.mp4", &h264, true),
            ("head.mp4", &faststart, true),
            ("clip.mkv", &h264, true),
            ("clip.webm", &vp9, true),
            ("-", &h264, false),
        ];
        let ends = 16 << 10;
        for (name, args, found) in cases {
            let clip = encoded(name, args);
            let whole = seconds("video_seconds", 0, &clip).expect("whole clip");
            let len = clip.len() as u64;
            let got = crate::video_seconds_from_ends(&clip[..ends], &clip[clip.len() - ends..], len);
            if found {
                assert_eq!(got, Some(whole), "{name}");
            } else {
                assert_eq!(
                    got, None,
                    "{name} states no duration ({whole} s from its packets)"
                );
            }
            assert_eq!(
                crate::video_seconds_from_ends(&clip, &[], len),
                Some(whole),
                "{name}"
            );
            let short = crate::video_seconds_from_ends(&clip[..64], &clip[clip.len() - 64..], len);
            assert_eq!(short, None, "{name}: the metadata is longer than 64 bytes");
        }
    }

    /// A 4K clip's decoder would hold more frames than a stream may: the row's error, found
    /// before any frame is decoded; 1080p fits.
    #[test]
    fn clips_whose_decoder_outgrows_its_pool_are_refused_by_row() {
        let args = ["-c:v", "libx264", "-preset", "ultrafast", "-pix_fmt", "yuv420p"];
        let huge = encoded_from("testsrc2=size=3840x2160:rate=5:duration=0.4", "clip.mp4", &args);
        let err = frames(
            "decode_frames",
            7,
            &huge,
            Sampling::Uniform(2),
            (8, 8),
            &mut Resizer::new(),
        )
        .expect_err("4K refused");
        let text = err.to_string();
        assert!(
            text.contains("row 7") && text.contains("3840×2160") && text.contains("64 MiB"),
            "{text}"
        );
        let hd = encoded_from("testsrc2=size=1920x1080:rate=5:duration=0.4", "clip.mp4", &args);
        let (_, n) = frames(
            "decode_frames",
            0,
            &hd,
            Sampling::Uniform(2),
            (8, 8),
            &mut Resizer::new(),
        )
        .expect("1080p");
        assert_eq!(n, 2);
    }

    #[test]
    fn targets_are_the_centres_of_equal_segments() {
        assert_eq!(targets(0, 100, 4), [12, 37, 62, 87]);
        assert_eq!(targets(1000, 10, 1), [1005]);
    }

    #[test]
    fn rate_targets_step_from_the_start_until_the_end_or_the_cap() {
        // 2.5 s in a 1/1000 time base at 2 fps: 0, 0.5, …, 2.0 s.
        assert_eq!(
            rate_targets(100, 2500, 1e-3, 2.0, 100),
            [100, 600, 1100, 1600, 2100]
        );
        assert_eq!(rate_targets(0, 2500, 1e-3, 2.0, 3), [0, 500, 1000]);
        // 30000/1001 fps in a 1/30000 time base: every 1001 ticks.
        assert_eq!(
            rate_targets(0, 3003, 1.0 / 30000.0, 30000.0 / 1001.0, 10),
            [0, 1001, 2002]
        );
    }

    /// A display matrix whose `av_display_rotation_get` (PyAV's `frame.rotation`) is `ccw`
    /// degrees counter-clockwise: a clockwise turn of `-ccw`. FFmpeg 5.1's `ffmpeg -i` turns
    /// a clip tagged `rotate=90` (`m[1] = -1.0, m[3] = 1.0`, get = 90) counter-clockwise.
    #[test]
    fn display_matrices_give_the_clockwise_turn() {
        let matrix = |ccw: f64| {
            let (s, c) = ccw.to_radians().sin_cos();
            let fixed = |x: f64| ((x * 65536.0).round() as i32).to_ne_bytes();
            let mut m = Vec::new();
            for v in [
                fixed(c),
                fixed(-s),
                [0; 4],
                fixed(s),
                fixed(c),
                [0; 4],
                [0; 4],
                [0; 4],
                (1i32 << 30).to_ne_bytes(),
            ] {
                m.extend_from_slice(&v);
            }
            m
        };
        assert_eq!(clockwise_degrees(&matrix(0.0)), 0);
        assert_eq!(clockwise_degrees(&matrix(-90.0)), 90);
        assert_eq!(clockwise_degrees(&matrix(90.0)), 270);
        assert_eq!(clockwise_degrees(&matrix(180.0)), 180);
        assert_eq!(clockwise_degrees(&[0; 36]), 0);
        // A mirror (m[0] = -1, m[4] = 1) is not a half turn.
        let mut mirror = matrix(0.0);
        mirror[..4].copy_from_slice(&(-65536i32).to_ne_bytes());
        assert_eq!(clockwise_degrees(&mirror), 0);
        assert_eq!(clockwise_degrees(&[1, 2]), 0);
    }
}
