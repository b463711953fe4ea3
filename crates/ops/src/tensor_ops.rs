//! Ops over pixel tensors (`FixedSizeList<UInt8>` rows with a `pushdown.shape` of
//! `height,width,channels`, as `decode_resize` produces, or `frames,height,width,channels`, a
//! clip as `decode_frames` produces): center crop, grayscale, normalize, and the random
//! augmentations that only ever run in the trainer.
//!
//! A clip is transformed frame by frame, and a random op draws once per row: every frame of a
//! clip gets the same crop window, flip and jitter (torchvision's video transforms do the
//! same), so motion stays coherent.

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, FixedSizeListArray, Float16Array, Float32Array, UInt8Array, UInt16Array,
};
use arrow::datatypes::{DataType, Field, UInt8Type};
use half::{bf16, f16};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::image_ops::crop;
use crate::op::{DTYPE_METADATA_KEY, SHAPE_METADATA_KEY};
use crate::op::{Op, OpError, Result, Value, expect_params, floats_param, int_param};

/// `(height, width, channels)` of a pixel-tensor field: of each frame, for a clip.
pub fn shape_of(op: &'static str, field: &Field) -> Result<(usize, usize, usize)> {
    dims_of(op, field).map(|(_, shape)| shape)
}

/// Frames in each row of a pixel-tensor field: `T` of a clip (`T,H,W,C`), 1 for an image.
pub fn frames_of(op: &'static str, field: &Field) -> Result<usize> {
    dims_of(op, field).map(|(frames, _)| frames)
}

fn dims_of(op: &'static str, field: &Field) -> Result<(usize, (usize, usize, usize))> {
    let bad = || OpError::BadArguments {
        op,
        reason: format!(
            "expects pixel tensors (FixedSizeList<UInt8> with `{SHAPE_METADATA_KEY}` metadata, e.g. from decode_resize or decode_frames), got {} `{}`",
            field.data_type(),
            field.name()
        ),
    };
    let DataType::FixedSizeList(item, len) = field.data_type() else {
        return Err(bad());
    };
    if item.data_type() != &DataType::UInt8 {
        return Err(bad());
    }
    let dims: Vec<usize> = field
        .metadata()
        .get(SHAPE_METADATA_KEY)
        .ok_or_else(bad)?
        .split(',')
        .map(|d| d.trim().parse().map_err(|_| bad()))
        .collect::<Result<_>>()?;
    // Every side at least 1 and the product the list's length, without overflow: a shape
    // from a file's metadata must not make a zero-sized frame or a wrapped size.
    let fits = tensor_len(op, &dims).is_ok_and(|n| n == *len);
    match dims[..] {
        [h, w, c] if fits => Ok((1, (h, w, c))),
        [t, h, w, c] if fits => Ok((t, (h, w, c))),
        _ => Err(bad()),
    }
}

/// The values in a tensor of `dims`: every side at least 1, the product at most `i32::MAX`
/// (what one Arrow fixed-size list value holds).
pub(crate) fn tensor_len(op: &'static str, dims: &[usize]) -> Result<i32> {
    dims.iter()
        .try_fold(1usize, |n, &d| (d > 0).then(|| n.checked_mul(d)).flatten())
        .and_then(|n| i32::try_from(n).ok())
        .ok_or_else(|| OpError::BadArguments {
            op,
            reason: format!(
                "a tensor of shape {dims:?} has an empty side or is over the 2 GiB one value may hold"
            ),
        })
}

/// A tensor field of `frames` frames of `(h, w, c)` each (`frames` 1: an image, `h,w,c`), for
/// `op`'s output.
fn tensor_field(
    op: &'static str,
    output: &str,
    item: DataType,
    frames: usize,
    (h, w, c): (usize, usize, usize),
    nullable: bool,
) -> Result<Field> {
    let len = tensor_len(op, &[frames, h, w, c])?;
    let item = Arc::new(Field::new("item", item, false));
    let shape = match frames {
        1 => format!("{h},{w},{c}"),
        t => format!("{t},{h},{w},{c}"),
    };
    Ok(Field::new(output, DataType::FixedSizeList(item, len), nullable)
        .with_metadata([(SHAPE_METADATA_KEY.to_string(), shape)].into()))
}

/// Applies `f(row, frame_in, frame_out)` to every frame of every row (`frames` per row, of
/// `out_len` values out each), building a u8 tensor column. A row's frames share its `row`,
/// so a random op's draw is the same for each.
fn map_u8(
    op: &'static str,
    input: &ArrayRef,
    frames: usize,
    out_len: usize,
    mut f: impl FnMut(usize, &[u8], &mut [u8]),
) -> Result<ArrayRef> {
    let list = input
        .as_fixed_size_list_opt()
        .ok_or_else(|| OpError::BadArguments {
            op,
            reason: format!("expects pixel tensors, got {}", input.data_type()),
        })?;
    let values = list
        .values()
        .as_primitive_opt::<UInt8Type>()
        .ok_or_else(|| OpError::BadArguments {
            op,
            reason: "expects u8 pixels".into(),
        })?;
    let size = list.value_length() as usize;
    let frame = size / frames.max(1);
    let row_out = out_len * frames;
    let mut out = vec![0u8; list.len() * row_out];
    for row in 0..list.len() {
        if list.is_valid(row) {
            let start = (list.offset() + row) * size;
            let src = &values.values()[start..start + size];
            let dst = &mut out[row * row_out..(row + 1) * row_out];
            for (from, to) in src.chunks_exact(frame).zip(dst.chunks_exact_mut(out_len)) {
                f(row, from, to);
            }
        }
    }
    let item = Arc::new(Field::new("item", DataType::UInt8, false));
    FixedSizeListArray::try_new(
        item,
        row_out as i32,
        Arc::new(UInt8Array::from(out)),
        list.nulls().cloned(),
    )
    .map(|a| Arc::new(a) as ArrayRef)
    .map_err(|source| OpError::Arrow { op, cause: source })
}

fn crop_size(op: &'static str, params: &[Value], (h, w, _): (usize, usize, usize)) -> Result<(usize, usize)> {
    expect_params(op, params, 2, 2)?;
    let cw = int_param(op, params, 0, "width", 1..=w as i64, None)? as usize;
    let ch = int_param(op, params, 1, "height", 1..=h as i64, None)? as usize;
    Ok((ch, cw))
}

/// `center_crop(pixels, width, height)`: the centered `width × height` window.
#[derive(Debug)]
pub struct CenterCrop;

impl Op for CenterCrop {
    fn name(&self) -> &'static str {
        "center_crop"
    }

    fn signature(&self) -> &'static str {
        "center_crop(pixels, width, height)"
    }

    fn output_field(&self, input: &Field, params: &[Value], output: &str) -> Result<Field> {
        let shape = shape_of(self.name(), input)?;
        let (ch, cw) = crop_size(self.name(), params, shape)?;
        tensor_field(
            self.name(),
            output,
            DataType::UInt8,
            frames_of(self.name(), input)?,
            (ch, cw, shape.2),
            input.is_nullable(),
        )
    }

    fn apply_field(&self, input: &ArrayRef, field: &Field, params: &[Value], _seed: u64) -> Result<ArrayRef> {
        let shape = shape_of(self.name(), field)?;
        let (ch, cw) = crop_size(self.name(), params, shape)?;
        let origin = ((shape.0 - ch) / 2, (shape.1 - cw) / 2);
        let frames = frames_of(self.name(), field)?;
        map_u8(self.name(), input, frames, ch * cw * shape.2, |_, src, out| {
            crop(src, shape, origin, (ch, cw), out)
        })
    }
}

/// `random_crop(pixels, width, height)`: a `width × height` window at a uniformly random
/// position, drawn per row. Client only.
#[derive(Debug)]
pub struct RandomCrop;

impl Op for RandomCrop {
    fn name(&self) -> &'static str {
        "random_crop"
    }

    fn is_deterministic(&self) -> bool {
        false
    }

    fn signature(&self) -> &'static str {
        "random_crop(pixels, width, height)"
    }

    fn output_field(&self, input: &Field, params: &[Value], output: &str) -> Result<Field> {
        CenterCrop.output_field(input, params, output)
    }

    fn apply_field(&self, input: &ArrayRef, field: &Field, params: &[Value], seed: u64) -> Result<ArrayRef> {
        let shape = shape_of(self.name(), field)?;
        let (ch, cw) = crop_size(self.name(), params, shape)?;
        let frames = frames_of(self.name(), field)?;
        map_u8(self.name(), input, frames, ch * cw * shape.2, |row, src, out| {
            let mut rng = row_rng(seed, row);
            let origin = (
                rng.random_range(0..=shape.0 - ch),
                rng.random_range(0..=shape.1 - cw),
            );
            crop(src, shape, origin, (ch, cw), out)
        })
    }
}

/// `random_resized_crop(input, height, width[, scale_min, scale_max[, ratio_min,
/// ratio_max]])`: torchvision's `RandomResizedCrop((height, width), scale, ratio)`, per row.
/// The box follows torchvision's rule ([`resized_crop_box`]): up to 10 draws of an area
/// fraction uniform in `[scale_min, scale_max]` (default `[0.08, 1]`) and a log-uniform
/// aspect ratio in `[ratio_min, ratio_max]` (default `[3/4, 4/3]`), the first box that fits
/// at a uniform position; else the central fallback. The box is then resized to `height ×
/// width` (antialiased bilinear, as PIL's). `input` is RGB pixels (`FixedSizeList<u8>`,
/// `h,w,3`) or encoded images (decoded here, whatever their size: a storage side that
/// reduces them first, `thumbnail(image, 320)`, keeps their aspect). Random: trainer only,
/// after the shuffle; row `i` draws from `(seed, i)`.
#[derive(Debug)]
pub struct RandomResizedCrop;

/// The parameters of a `random_resized_crop` call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ResizedCrop {
    pub height: u32,
    pub width: u32,
    pub scale: (f64, f64),
    pub ratio: (f64, f64),
}

impl ResizedCrop {
    fn params(params: &[Value]) -> Result<Self> {
        let op = "random_resized_crop";
        expect_params(op, params, 2, 6)?;
        let height = int_param(op, params, 0, "height", 1..=8192, None)? as u32;
        let width = int_param(op, params, 1, "width", 1..=8192, None)? as u32;
        let num = |i: usize, default: f64| match params.get(i) {
            None => Ok(default),
            Some(Value::Float(x)) => Ok(*x),
            Some(Value::Int(x)) => Ok(*x as f64),
            Some(other) => Err(OpError::BadArguments {
                op,
                reason: format!("parameter {} must be a number, got {other}", i + 1),
            }),
        };
        if params.len() == 3 || params.len() == 5 {
            return Err(OpError::BadArguments {
                op,
                reason: "scale and ratio each take two numbers, (min, max)".into(),
            });
        }
        let scale = (num(2, 0.08)?, num(3, 1.0)?);
        let ratio = (num(4, 3.0 / 4.0)?, num(5, 4.0 / 3.0)?);
        if !(scale.0 > 0.0 && scale.0 <= scale.1 && scale.1 <= 1.0) {
            return Err(OpError::BadArguments {
                op,
                reason: format!("scale must be 0 < min ≤ max ≤ 1, got {scale:?}"),
            });
        }
        if !(ratio.0 > 0.0 && ratio.0 <= ratio.1 && ratio.1.is_finite()) {
            return Err(OpError::BadArguments {
                op,
                reason: format!("ratio must be 0 < min ≤ max, got {ratio:?}"),
            });
        }
        Ok(Self {
            height,
            width,
            scale,
            ratio,
        })
    }
}

/// torchvision's `RandomResizedCrop.get_params` for an image of `height × width`: `(top, left,
/// h, w)`.
pub fn resized_crop_box(
    rng: &mut impl Rng,
    (height, width): (u32, u32),
    scale: (f64, f64),
    ratio: (f64, f64),
) -> (u32, u32, u32, u32) {
    let area = f64::from(height) * f64::from(width);
    let (log_lo, log_hi) = (ratio.0.ln(), ratio.1.ln());
    for _ in 0..10 {
        let target = area * rng.random_range(scale.0..=scale.1);
        let aspect = (if log_lo < log_hi {
            rng.random_range(log_lo..log_hi)
        } else {
            log_lo
        })
        .exp();
        // Python's round: ties to even.
        let w = (target * aspect).sqrt().round_ties_even();
        let h = (target / aspect).sqrt().round_ties_even();
        if w > 0.0 && h > 0.0 && w <= f64::from(width) && h <= f64::from(height) {
            let (w, h) = (w as u32, h as u32);
            let top = rng.random_range(0..=height - h);
            let left = rng.random_range(0..=width - w);
            return (top, left, h, w);
        }
    }
    // The central fallback: the whole image, cut to the ratio's nearest bound.
    let in_ratio = f64::from(width) / f64::from(height);
    let (h, w) = if in_ratio < ratio.0 {
        (
            ((f64::from(width) / ratio.0).round_ties_even() as u32).max(1),
            width,
        )
    } else if in_ratio > ratio.1 {
        (
            height,
            ((f64::from(height) * ratio.1).round_ties_even() as u32).max(1),
        )
    } else {
        (height, width)
    };
    (
        (height - h.min(height)) / 2,
        (width - w.min(width)) / 2,
        h.min(height),
        w.min(width),
    )
}

impl Op for RandomResizedCrop {
    fn name(&self) -> &'static str {
        "random_resized_crop"
    }

    fn is_deterministic(&self) -> bool {
        false
    }

    fn signature(&self) -> &'static str {
        "random_resized_crop(pixels|image, height, width[, scale_min, scale_max[, ratio_min, ratio_max]])"
    }

    fn output_field(&self, input: &Field, params: &[Value], output: &str) -> Result<Field> {
        let p = ResizedCrop::params(params)?;
        let (nullable, frames) =
            match crate::media::encoded_input(self.name(), input, crate::media::Media::Image) {
                Ok(()) => (crate::media::encoded_nullable(input), 1),
                Err(_) => {
                    let (_, _, c) = shape_of(self.name(), input)?;
                    if c != 3 {
                        return Err(OpError::BadArguments {
                            op: self.name(),
                            reason: format!("expects RGB pixels (3 channels), got {c}"),
                        });
                    }
                    (input.is_nullable(), frames_of(self.name(), input)?)
                }
            };
        tensor_field(
            self.name(),
            output,
            DataType::UInt8,
            frames,
            (p.height as usize, p.width as usize, 3),
            nullable,
        )
    }

    fn apply_field(&self, input: &ArrayRef, field: &Field, params: &[Value], seed: u64) -> Result<ArrayRef> {
        let p = ResizedCrop::params(params)?;
        let out_len = (p.height * p.width * 3) as usize;
        let mut resizer = fast_image_resize::Resizer::new();
        // Pixel rows are read in place, images decoded: either way only the drawn window is
        // copied out, then resized.
        let mut one = |row: usize, img: &[u8], (ih, iw): (u32, u32), out: &mut [u8]| -> Result<()> {
            let mut rng = row_rng(seed, row);
            let (top, left, h, w) = resized_crop_box(&mut rng, (ih, iw), p.scale, p.ratio);
            let mut window = vec![0u8; (h * w * 3) as usize];
            let at = (top as usize, left as usize);
            crop(
                img,
                (ih as usize, iw as usize, 3),
                at,
                (h as usize, w as usize),
                &mut window,
            );
            let window = image::RgbImage::from_raw(w, h, window).ok_or_else(|| OpError::BadArguments {
                op: "random_resized_crop",
                reason: "a crop window outside its image (a bug: please report it)".into(),
            })?;
            let pixels = crate::image_ops::resize(self.name(), &mut resizer, &window, p.width, p.height)?;
            out.copy_from_slice(&pixels);
            Ok(())
        };
        if crate::media::encoded_input(self.name(), field, crate::media::Media::Image).is_ok() {
            return crate::image_ops::images_to_pixels(
                self.name(),
                input,
                (p.height, p.width),
                |row, bytes, out| {
                    let img = crate::image_ops::decode(self.name(), row, bytes)?;
                    let at = out.len();
                    out.resize(at + out_len, 0);
                    one(row, img.as_raw(), (img.height(), img.width()), &mut out[at..])
                },
            );
        }
        let (h, w, c) = shape_of(self.name(), field)?;
        if c != 3 {
            return Err(OpError::BadArguments {
                op: "random_resized_crop",
                reason: format!("expects RGB pixels (3 channels), got {c}"),
            });
        }
        let mut failed = None;
        let frames = frames_of(self.name(), field)?;
        let out = map_u8(self.name(), input, frames, out_len, |row, src, out| {
            // The frame itself (h·w·3 values): read in place, not copied.
            let done = one(row, src, (h as u32, w as u32), out);
            if let Err(e) = done {
                failed.get_or_insert(e);
            }
        })?;
        match failed {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }
}

/// `random_flip(pixels, p)`: mirror left-right with probability `p`, drawn per row. Client
/// only.
#[derive(Debug)]
pub struct RandomFlip;

fn probability(op: &'static str, params: &[Value]) -> Result<f64> {
    expect_params(op, params, 1, 1)?;
    match params[0] {
        Value::Float(p) if (0.0..=1.0).contains(&p) => Ok(p),
        Value::Int(p @ 0..=1) => Ok(p as f64),
        ref other => Err(OpError::BadArguments {
            op,
            reason: format!("p must be a probability in [0, 1], got {other}"),
        }),
    }
}

impl Op for RandomFlip {
    fn name(&self) -> &'static str {
        "random_flip"
    }

    fn is_deterministic(&self) -> bool {
        false
    }

    fn signature(&self) -> &'static str {
        "random_flip(pixels, p)"
    }

    fn output_field(&self, input: &Field, params: &[Value], output: &str) -> Result<Field> {
        let shape = shape_of(self.name(), input)?;
        probability(self.name(), params)?;
        let frames = frames_of(self.name(), input)?;
        tensor_field(
            self.name(),
            output,
            DataType::UInt8,
            frames,
            shape,
            input.is_nullable(),
        )
    }

    fn apply_field(&self, input: &ArrayRef, field: &Field, params: &[Value], seed: u64) -> Result<ArrayRef> {
        let (h, w, c) = shape_of(self.name(), field)?;
        debug_assert!(h > 0 && w > 0 && c > 0);
        let p = probability(self.name(), params)?;
        let frames = frames_of(self.name(), field)?;
        map_u8(self.name(), input, frames, h * w * c, |row, src, out| {
            if row_rng(seed, row).random_bool(p) {
                // The pixel's width a constant where it is a common one: a copy of 3 bytes
                // is then 3 moves, not a call to memmove (a sixth of a loader's CPU).
                match c {
                    1 => mirror::<1>(src, out, w),
                    3 => mirror::<3>(src, out, w),
                    4 => mirror::<4>(src, out, w),
                    _ => {
                        for (from, to) in src.chunks_exact(w * c).zip(out.chunks_exact_mut(w * c)) {
                            for (s, o) in from.chunks_exact(c).zip(to.chunks_exact_mut(c).rev()) {
                                o.copy_from_slice(s);
                            }
                        }
                    }
                }
            } else {
                out.copy_from_slice(src);
            }
        })
    }
}

/// `src`'s rows of `w` pixels of `C` bytes, each mirrored left to right into `out`.
fn mirror<const C: usize>(src: &[u8], out: &mut [u8], w: usize) {
    for (from, to) in src.chunks_exact(w * C).zip(out.chunks_exact_mut(w * C)) {
        let (from, _) = from.as_chunks::<C>();
        let (to, _) = to.as_chunks_mut::<C>();
        for (s, o) in from.iter().zip(to.iter_mut().rev()) {
            *o = *s;
        }
    }
}

/// `grayscale(pixels)`: ITU-R BT.601 luma, one channel.
#[derive(Debug)]
pub struct Grayscale;

impl Op for Grayscale {
    fn name(&self) -> &'static str {
        "grayscale"
    }

    fn signature(&self) -> &'static str {
        "grayscale(pixels)"
    }

    fn output_field(&self, input: &Field, params: &[Value], output: &str) -> Result<Field> {
        expect_params(self.name(), params, 0, 0)?;
        let (h, w, c) = shape_of(self.name(), input)?;
        if c != 3 {
            return Err(OpError::BadArguments {
                op: self.name(),
                reason: format!("expects RGB pixels, got {c} channels"),
            });
        }
        tensor_field(
            self.name(),
            output,
            DataType::UInt8,
            frames_of(self.name(), input)?,
            (h, w, 1),
            input.is_nullable(),
        )
    }

    fn apply_field(&self, input: &ArrayRef, field: &Field, params: &[Value], _seed: u64) -> Result<ArrayRef> {
        self.output_field(field, params, "check")?;
        let (h, w, _) = shape_of(self.name(), field)?;
        let frames = frames_of(self.name(), field)?;
        map_u8(self.name(), input, frames, h * w, |_, src, out| {
            for (o, px) in out.iter_mut().zip(src.chunks_exact(3)) {
                let y = 0.299 * f32::from(px[0]) + 0.587 * f32::from(px[1]) + 0.114 * f32::from(px[2]);
                *o = y.round().clamp(0.0, 255.0) as u8;
            }
        })
    }
}

/// Where a tensor op puts the channels: last (`hwc`, as decoded) or first (`chw`, as
/// PyTorch models take images).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    Hwc,
    Chw,
}

impl Layout {
    fn named(value: &Value) -> Option<Self> {
        match value {
            Value::Text(t) if t.eq_ignore_ascii_case("hwc") => Some(Layout::Hwc),
            Value::Text(t) if t.eq_ignore_ascii_case("chw") => Some(Layout::Chw),
            _ => None,
        }
    }

    fn shape(self, (h, w, c): (usize, usize, usize)) -> (usize, usize, usize) {
        match self {
            Layout::Hwc => (h, w, c),
            Layout::Chw => (c, h, w),
        }
    }

    /// Where the value of pixel `i` (in HWC order) and channel `k` goes.
    fn place(self, (h, w, c): (usize, usize, usize), i: usize, k: usize) -> usize {
        match self {
            Layout::Hwc => i * c + k,
            Layout::Chw => k * h * w + i,
        }
    }
}

/// `normalize(pixels, mean, std[, layout][, dtype])`: `(x / 255 − mean[c]) / std[c]`, with
/// `mean` and `std` one number or one per channel (`[0.485, 0.456, 0.406]`, torchvision's
/// `Normalize` after `ToTensor`), channels last (`'hwc'`, the default) or first (`'chw'`,
/// what a model takes: the trainer neither permutes nor converts), as `'float32'` (the
/// default), `'float16'` or `'bfloat16'` (half the bytes, what a mixed-precision model takes).
#[derive(Debug)]
pub struct Normalize;

impl Normalize {
    fn params(params: &[Value], channels: usize) -> Result<(Vec<f32>, Vec<f32>, Layout, FloatType)> {
        expect_params("normalize", params, 2, 4)?;
        let mean = floats_param("normalize", params, 0, "mean", channels)?;
        let std = floats_param("normalize", params, 1, "std", channels)?;
        if std.iter().any(|s| *s <= 0.0) {
            return Err(OpError::BadArguments {
                op: "normalize",
                reason: format!("std must be > 0, got {std:?}"),
            });
        }
        // After `std`: a layout and a dtype, each optional, in either order.
        let (mut layout, mut dtype) = (None, None);
        for value in &params[2..] {
            match (Layout::named(value), FloatType::named(value)) {
                (Some(l), _) if layout.is_none() => layout = Some(l),
                (_, Some(d)) if dtype.is_none() => dtype = Some(d),
                _ => {
                    return Err(OpError::BadArguments {
                        op: "normalize",
                        reason: format!(
                            "after mean and std come a layout ('hwc' or 'chw') and a dtype ('float32', 'float16' or 'bfloat16'), each at most once; got {value}"
                        ),
                    });
                }
            }
        }
        Ok((
            mean,
            std,
            layout.unwrap_or(Layout::Hwc),
            dtype.unwrap_or(FloatType::F32),
        ))
    }
}

impl Op for Normalize {
    fn name(&self) -> &'static str {
        "normalize"
    }

    fn signature(&self) -> &'static str {
        "normalize(pixels, mean, std[, layout][, dtype])"
    }

    fn output_field(&self, input: &Field, params: &[Value], output: &str) -> Result<Field> {
        let shape = shape_of(self.name(), input)?;
        let (_, _, layout, dtype) = Self::params(params, shape.2)?;
        Ok(dtype.tag(tensor_field(
            self.name(),
            output,
            dtype.arrow(),
            frames_of(self.name(), input)?,
            layout.shape(shape),
            input.is_nullable(),
        )?))
    }

    fn apply_field(&self, input: &ArrayRef, field: &Field, params: &[Value], _seed: u64) -> Result<ArrayRef> {
        let shape = shape_of(self.name(), field)?;
        let (mean, std, layout, dtype) = Self::params(params, shape.2)?;
        // One multiply-add per value: x·scale[c] + shift[c].
        let scale: Vec<f32> = std.iter().map(|s| 1.0 / (255.0 * s)).collect();
        let shift: Vec<f32> = mean.iter().zip(&std).map(|(m, s)| -m / s).collect();
        let list = input.as_fixed_size_list();
        let values = list.values().as_primitive::<UInt8Type>();
        let size = list.value_length() as usize;
        let start = list.offset() * size;
        let src = &values.values()[start..start + list.len() * size];
        let affine = Affine {
            scale: &scale,
            shift: &shift,
            layout,
            frames: frames_of(self.name(), field)?,
            shape,
        };
        let values: ArrayRef = match dtype {
            FloatType::F32 => Arc::new(Float32Array::from(affine.apply(src, list.nulls(), |x| x))),
            FloatType::F16 => Arc::new(Float16Array::from(affine.apply(src, list.nulls(), f16::from_f32))),
            FloatType::Bf16 => Arc::new(UInt16Array::from(
                affine.apply(src, list.nulls(), |x| bf16::from_f32(x).to_bits()),
            )),
        };
        let item = Arc::new(Field::new("item", dtype.arrow(), false));
        FixedSizeListArray::try_new(item, size as i32, values, list.nulls().cloned())
            .map(|a| Arc::new(a) as ArrayRef)
            .map_err(|source| OpError::Arrow {
                op: "normalize",
                cause: source,
            })
    }
}

/// `normalize`'s per-channel `x·scale[c] + shift[c]`, written in `layout`.
struct Affine<'a> {
    scale: &'a [f32],
    shift: &'a [f32],
    layout: Layout,
    /// Frames per row, each of `shape`.
    frames: usize,
    shape: (usize, usize, usize),
}

impl Affine<'_> {
    /// Every row of `src` (`frames·h·w·c` values each; null rows left zero) as `T`, each frame
    /// in `layout`, `convert` inlined into the loop over values.
    fn apply<T: Copy + Default>(
        &self,
        src: &[u8],
        nulls: Option<&arrow::buffer::NullBuffer>,
        convert: impl Fn(f32) -> T,
    ) -> Vec<T> {
        let (h, w, c) = self.shape;
        let frame = (h * w * c).max(1);
        let size = frame * self.frames;
        let mut out = vec![T::default(); src.len()];
        for (row, (from, to)) in src.chunks_exact(size).zip(out.chunks_exact_mut(size)).enumerate() {
            if nulls.is_some_and(|n| n.is_null(row)) {
                continue;
            }
            for (from, to) in from.chunks_exact(frame).zip(to.chunks_exact_mut(frame)) {
                for (i, px) in from.chunks_exact(c).enumerate() {
                    for (k, &v) in px.iter().enumerate() {
                        to[self.layout.place(self.shape, i, k)] =
                            convert(f32::from(v) * self.scale[k] + self.shift[k]);
                    }
                }
            }
        }
        out
    }
}

/// The float type of a tensor an op makes: `float32`, or half the bytes as `float16` or
/// `bfloat16` (what mixed-precision models take). Arrow has no bfloat16: its values travel as
/// their `UInt16` bits, the field tagged `pushdown.dtype = bfloat16`, and clients give them
/// back as bfloat16 (`torch.bfloat16` in `pushdown.torch`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FloatType {
    F32,
    F16,
    Bf16,
}

impl FloatType {
    pub(crate) fn named(value: &Value) -> Option<Self> {
        let Value::Text(t) = value else { return None };
        match t.to_ascii_lowercase().as_str() {
            "float32" | "float" => Some(Self::F32),
            "float16" | "half" => Some(Self::F16),
            "bfloat16" => Some(Self::Bf16),
            _ => None,
        }
    }

    pub(crate) fn arrow(self) -> DataType {
        match self {
            Self::F32 => DataType::Float32,
            Self::F16 => DataType::Float16,
            Self::Bf16 => DataType::UInt16,
        }
    }

    pub(crate) fn tag(self, field: Field) -> Field {
        if self != Self::Bf16 {
            return field;
        }
        let mut metadata = field.metadata().clone();
        metadata.insert(DTYPE_METADATA_KEY.to_string(), "bfloat16".to_string());
        field.with_metadata(metadata)
    }
}

/// `to_chw(pixels)`: the same `u8` pixels, channels first (`c,h,w`): for a model that
/// normalizes on the accelerator.
#[derive(Debug)]
pub struct ToChw;

impl Op for ToChw {
    fn name(&self) -> &'static str {
        "to_chw"
    }

    fn signature(&self) -> &'static str {
        "to_chw(pixels)"
    }

    fn output_field(&self, input: &Field, params: &[Value], output: &str) -> Result<Field> {
        expect_params(self.name(), params, 0, 0)?;
        let shape = shape_of(self.name(), input)?;
        tensor_field(
            self.name(),
            output,
            DataType::UInt8,
            frames_of(self.name(), input)?,
            Layout::Chw.shape(shape),
            input.is_nullable(),
        )
    }

    fn apply_field(&self, input: &ArrayRef, field: &Field, params: &[Value], _seed: u64) -> Result<ArrayRef> {
        expect_params(self.name(), params, 0, 0)?;
        let shape = shape_of(self.name(), field)?;
        let c = shape.2;
        let frames = frames_of(self.name(), field)?;
        map_u8(
            self.name(),
            input,
            frames,
            shape.0 * shape.1 * c,
            |_, src, out| {
                for (i, px) in src.chunks_exact(c).enumerate() {
                    for (k, &v) in px.iter().enumerate() {
                        out[Layout::Chw.place(shape, i, k)] = v;
                    }
                }
            },
        )
    }
}

/// The generator of one row of a random op: a function of (seed, row) alone.
pub(crate) fn row_rng(seed: u64, row: usize) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(row as u64);
    rng
}

/// `color_jitter(pixels, strength)`: per row, brightness and contrast factors drawn
/// uniformly from `[1 − strength, 1 + strength]`; `x ↦ clamp(((x − m)·contrast + m)·brightness)`
/// with `m` the row's mean. Client only.
#[derive(Debug)]
pub struct ColorJitter;

fn strength(op: &'static str, params: &[Value]) -> Result<f32> {
    expect_params(op, params, 1, 1)?;
    match params[0] {
        Value::Float(s) if (0.0..=1.0).contains(&s) => Ok(s as f32),
        Value::Int(s @ 0..=1) => Ok(s as f32),
        ref other => Err(OpError::BadArguments {
            op,
            reason: format!("strength must be in [0, 1], got {other}"),
        }),
    }
}

impl Op for ColorJitter {
    fn name(&self) -> &'static str {
        "color_jitter"
    }

    fn is_deterministic(&self) -> bool {
        false
    }

    fn signature(&self) -> &'static str {
        "color_jitter(pixels, strength)"
    }

    fn output_field(&self, input: &Field, params: &[Value], output: &str) -> Result<Field> {
        let shape = shape_of(self.name(), input)?;
        strength(self.name(), params)?;
        let frames = frames_of(self.name(), input)?;
        tensor_field(
            self.name(),
            output,
            DataType::UInt8,
            frames,
            shape,
            input.is_nullable(),
        )
    }

    fn apply_field(&self, input: &ArrayRef, field: &Field, params: &[Value], seed: u64) -> Result<ArrayRef> {
        let (h, w, c) = shape_of(self.name(), field)?;
        let s = strength(self.name(), params)?;
        let frames = frames_of(self.name(), field)?;
        map_u8(self.name(), input, frames, h * w * c, |row, src, out| {
            let mut rng = row_rng(seed, row);
            let (brightness, contrast) = if s > 0.0 {
                (
                    rng.random_range(1.0 - s..=1.0 + s),
                    rng.random_range(1.0 - s..=1.0 + s),
                )
            } else {
                (1.0, 1.0)
            };
            let mean = src.iter().map(|&v| f32::from(v)).sum::<f32>() / src.len().max(1) as f32;
            for (o, &v) in out.iter_mut().zip(src) {
                *o = (((f32::from(v) - mean) * contrast + mean) * brightness)
                    .round()
                    .clamp(0.0, 255.0) as u8;
            }
        })
    }
}

/// `random_mask(tokens, p, mask_id)`: each element of a list of integer token ids is replaced
/// by `mask_id` with probability `p` (nulls stay null). Client only.
#[derive(Debug)]
pub struct RandomMask;

impl RandomMask {
    fn params(params: &[Value]) -> Result<(f64, i64)> {
        expect_params("random_mask", params, 2, 2)?;
        let p = probability("random_mask", &params[..1])?;
        let id = int_param("random_mask", params, 1, "mask_id", 0..=i64::from(u32::MAX), None)?;
        Ok((p, id))
    }
}

impl Op for RandomMask {
    fn name(&self) -> &'static str {
        "random_mask"
    }

    fn is_deterministic(&self) -> bool {
        false
    }

    fn signature(&self) -> &'static str {
        "random_mask(tokens, p, mask_id)"
    }

    fn output_field(&self, input: &Field, params: &[Value], output: &str) -> Result<Field> {
        Self::params(params)?;
        match input.data_type() {
            DataType::List(item) | DataType::LargeList(item) | DataType::FixedSizeList(item, _)
                if item.data_type().is_integer() =>
            {
                Ok(Field::new(output, input.data_type().clone(), input.is_nullable())
                    .with_metadata(input.metadata().clone()))
            }
            other => Err(OpError::BadArguments {
                op: self.name(),
                reason: format!("expects lists of integer token ids, got {other}"),
            }),
        }
    }

    fn apply_field(&self, input: &ArrayRef, field: &Field, params: &[Value], seed: u64) -> Result<ArrayRef> {
        self.output_field(field, params, "check")?;
        let (p, mask_id) = Self::params(params)?;
        let arrow_err = |source| OpError::Arrow {
            op: "random_mask",
            cause: source,
        };
        // Work on the flat values as i64, then cast back: one code path for every integer type.
        let (offsets, values): (Vec<usize>, ArrayRef) = match input.data_type() {
            DataType::List(_) => {
                let l = input.as_list::<i32>();
                (
                    l.value_offsets().iter().map(|&o| o as usize).collect(),
                    Arc::clone(l.values()),
                )
            }
            DataType::LargeList(_) => {
                let l = input.as_list::<i64>();
                (
                    l.value_offsets().iter().map(|&o| o as usize).collect(),
                    Arc::clone(l.values()),
                )
            }
            _ => {
                let l = input.as_fixed_size_list();
                let n = l.value_length() as usize;
                (
                    (0..=l.len()).map(|i| (l.offset() + i) * n).collect(),
                    Arc::clone(l.values()),
                )
            }
        };
        let item_type = values.data_type().clone();
        let wide = arrow::compute::cast(&values, &DataType::Int64).map_err(arrow_err)?;
        let mut flat: Vec<Option<i64>> = wide
            .as_primitive::<arrow::datatypes::Int64Type>()
            .iter()
            .collect();
        for row in 0..offsets.len().saturating_sub(1) {
            let mut rng = row_rng(seed, row);
            for v in flat[offsets[row]..offsets[row + 1]].iter_mut() {
                if v.is_some() && rng.random_bool(p) {
                    *v = Some(mask_id);
                }
            }
        }
        let masked: ArrayRef = Arc::new(arrow::array::Int64Array::from(flat));
        let options = arrow::compute::CastOptions {
            safe: false,
            ..Default::default()
        };
        let masked = arrow::compute::cast_with_options(&masked, &item_type, &options).map_err(arrow_err)?;
        let data = input
            .to_data()
            .into_builder()
            .child_data(vec![masked.to_data()])
            .build()
            .map_err(arrow_err)?;
        Ok(arrow::array::make_array(data))
    }
}
