//! Image ops over encoded images (binary, or the Hub's `struct<bytes, path>`) in the formats
//! datasets store (JPEG, PNG, WebP, GIF, BMP, TIFF): decode + resize to pixels, and re-encoded
//! thumbnails. Decoding uses the `image` crate (zune-jpeg inside), resizing
//! `fast_image_resize` (SIMD convolution, bilinear with antialiasing). A JPEG whose output
//! is at most a quarter of its size on both sides is decoded at reduced scale in the DCT
//! domain (jpeg-decoder's 1/4 and 1/8 IDCT, as libjpeg-turbo's `scale_denom`) and resized
//! the rest of the way: faster than a full decode for 64×64 pixels from ~300×300 JPEGs (see
//! `benches/RESULTS.md`, "Op kernels vs. their obvious baselines"), within a stated
//! tolerance of the full-scale result (`tests.rs`).

use std::io::Cursor;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, BinaryBuilder, FixedSizeListArray, UInt8Array};
use arrow::buffer::NullBuffer;
use arrow::datatypes::{DataType, Field};
use fast_image_resize::images::{Image, ImageRef};
use fast_image_resize::{FilterType, PixelType, ResizeAlg, ResizeOptions, Resizer};
use image::metadata::Orientation;
use image::{DynamicImage, ImageDecoder, RgbImage};

use crate::media::{Media, encoded_input, encoded_nullable, for_each_encoded};
use crate::op::{Op, OpError, Result, SHAPE_METADATA_KEY, Value, expect_params, int_param};

const MAX_SIDE: i64 = 8192;

/// Largest pixel buffer a scaled JPEG decode may allocate (the full decode's limit is the
/// `image` crate's default, 512 MiB).
const MAX_SCALED_DECODE_BYTES: usize = 512 << 20;

/// Decodes `bytes` for an output of `target(width, height)` pixels (a function of the
/// image's size): at 1/8 or 1/4 scale when that still covers the output on both sides and
/// the image is a JPEG, else in full. Returns the pixels and the output size.
fn decode_for(
    op: &'static str,
    row: usize,
    bytes: &[u8],
    target: impl Fn(u32, u32) -> (u32, u32),
) -> Result<(RgbImage, u32, u32)> {
    if let Some(scaled) = decode_scaled_jpeg(bytes, &target) {
        return Ok(scaled);
    }
    let img = decode(op, row, bytes)?;
    let (w, h) = target(img.width(), img.height());
    Ok((img, w, h))
}

/// A JPEG decoded at the smallest DCT scale (1/8, then 1/4) whose size covers the output on
/// both sides. `None` (the caller decodes in full, and reports any error) for anything else:
/// not a JPEG, no such scale, pixels other than RGB or gray, or a decoding error. Half scale
/// is not used: it measured slower than zune-jpeg's full decode.
pub(crate) fn decode_scaled_jpeg(
    bytes: &[u8],
    target: &impl Fn(u32, u32) -> (u32, u32),
) -> Option<(RgbImage, u32, u32)> {
    if !bytes.starts_with(&[0xFF, 0xD8]) {
        return None;
    }
    let mut decoder = jpeg_decoder::Decoder::new(bytes);
    decoder.set_max_decoding_buffer_size(MAX_SCALED_DECODE_BYTES);
    decoder.read_info().ok()?;
    let info = decoder.info()?;
    let (w, h) = (u32::from(info.width), u32::from(info.height));
    let orientation = decoder
        .exif_data()
        .and_then(Orientation::from_exif_chunk)
        .unwrap_or(Orientation::NoTransforms);
    // The output is of the image as shown (turned by its EXIF orientation); the scale is of
    // the image as stored.
    let turned = turns(orientation);
    let (tw, th) = if turned { target(h, w) } else { target(w, h) };
    let (need_w, need_h) = if turned { (th, tw) } else { (tw, th) };
    let denom = [8u32, 4]
        .into_iter()
        .find(|d| w.div_ceil(*d) >= need_w && h.div_ceil(*d) >= need_h)?;
    let (sw, sh) = (w.div_ceil(denom), h.div_ceil(denom));
    let scaled = decoder
        .scale(u16::try_from(sw).ok()?, u16::try_from(sh).ok()?)
        .ok()?;
    if scaled != (sw as u16, sh as u16) {
        return None;
    }
    let pixels = decoder.decode().ok()?;
    let rgb = match decoder.info()?.pixel_format {
        jpeg_decoder::PixelFormat::RGB24 => pixels,
        jpeg_decoder::PixelFormat::L8 => pixels.iter().flat_map(|&l| [l, l, l]).collect(),
        _ => return None,
    };
    let img = RgbImage::from_raw(sw, sh, rgb)?;
    Some((oriented(img, orientation), tw, th))
}

/// Whether `orientation` swaps width and height.
fn turns(orientation: Orientation) -> bool {
    matches!(
        orientation,
        Orientation::Rotate90
            | Orientation::Rotate270
            | Orientation::Rotate90FlipH
            | Orientation::Rotate270FlipH
    )
}

/// `img` as it is meant to be shown.
fn oriented(img: RgbImage, orientation: Orientation) -> RgbImage {
    if orientation == Orientation::NoTransforms {
        return img;
    }
    let mut img = DynamicImage::ImageRgb8(img);
    img.apply_orientation(orientation);
    img.into_rgb8()
}

/// Decodes any format a dataset stores (JPEG, PNG, WebP, GIF's first frame, BMP, TIFF) to RGB
/// as PIL's `convert("RGB")` makes it (alpha dropped, palettes and gray expanded, 16 bits
/// scaled to 8), turned by its EXIF orientation, within the `image` crate's memory limit.
pub(crate) fn decode(op: &'static str, row: usize, bytes: &[u8]) -> Result<RgbImage> {
    let bad = |reason: String| OpError::BadValue { op, row, reason };
    let reader = image::ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| bad(format!("cannot decode image: {e}")))?;
    let Some(format) = reader.format() else {
        return Err(bad(format!(
            "cannot decode image: not a format decoded here (JPEG, PNG, WebP, GIF, BMP, TIFF); \
             its first bytes are {:02x?}",
            &bytes[..bytes.len().min(8)]
        )));
    };
    let failed = |e: image::ImageError| bad(format!("cannot decode {format:?} image: {e}"));
    let mut decoder = reader.into_decoder().map_err(failed)?;
    let orientation = decoder.orientation().unwrap_or(Orientation::NoTransforms);
    let mut img = DynamicImage::from_decoder(decoder).map_err(failed)?;
    img.apply_orientation(orientation);
    Ok(img.into_rgb8())
}

pub(crate) fn resize(
    op: &'static str,
    resizer: &mut Resizer,
    img: &RgbImage,
    w: u32,
    h: u32,
) -> Result<Vec<u8>> {
    if img.width() == w && img.height() == h {
        return Ok(img.as_raw().clone());
    }
    let failed = |e: String| OpError::BadArguments { op, reason: e };
    let src = ImageRef::new(img.width(), img.height(), img.as_raw(), PixelType::U8x3)
        .map_err(|e| failed(e.to_string()))?;
    let mut dst = Image::new(w, h, PixelType::U8x3);
    let options = ResizeOptions::new().resize_alg(ResizeAlg::Convolution(FilterType::Bilinear));
    resizer
        .resize(&src, &mut dst, &options)
        .map_err(|e| failed(e.to_string()))?;
    Ok(dst.into_vec())
}

/// The field of `height × width` RGB pixels (HWC), `FixedSizeList<UInt8>` with its shape.
pub(crate) fn pixels_field(output: &str, (h, w): (u32, u32), nullable: bool) -> Field {
    let item = Arc::new(Field::new("item", DataType::UInt8, false));
    Field::new(
        output,
        DataType::FixedSizeList(item, (w * h * 3) as i32),
        nullable,
    )
    .with_metadata([(SHAPE_METADATA_KEY.to_string(), format!("{h},{w},3"))].into())
}

/// An image column as `height × width` RGB pixels: `pixels(row, bytes, out)` appends each
/// image's `h·w·3` bytes to `out`; null images are null rows.
pub(crate) fn images_to_pixels(
    op: &'static str,
    input: &ArrayRef,
    (h, w): (u32, u32),
    mut pixels: impl FnMut(usize, &[u8], &mut Vec<u8>) -> Result<()>,
) -> Result<ArrayRef> {
    let size = (w * h * 3) as usize;
    let mut values = Vec::with_capacity(input.len() * size);
    let mut valid = Vec::with_capacity(input.len());
    for_each_encoded(op, input, Media::Image, |row, bytes| {
        valid.push(bytes.is_some());
        match bytes {
            Some(bytes) => pixels(row, bytes, &mut values),
            None => {
                values.resize(values.len() + size, 0);
                Ok(())
            }
        }
    })?;
    let item = Arc::new(Field::new("item", DataType::UInt8, false));
    let nulls = valid.contains(&false).then(|| NullBuffer::from(valid));
    FixedSizeListArray::try_new(item, size as i32, Arc::new(UInt8Array::from(values)), nulls)
        .map(|a| Arc::new(a) as ArrayRef)
        .map_err(|source| OpError::Arrow { op, cause: source })
}

/// `decode_resize(image, width, height)`: decode, resize to exactly `width × height`, emit
/// `height·width·3` bytes of RGB pixels (HWC) as a `FixedSizeList<UInt8>`.
#[derive(Debug)]
pub struct DecodeResize;

impl DecodeResize {
    fn size(params: &[Value]) -> Result<(u32, u32)> {
        expect_params("decode_resize", params, 2, 2)?;
        let w = int_param("decode_resize", params, 0, "width", 1..=MAX_SIDE, None)?;
        let h = int_param("decode_resize", params, 1, "height", 1..=MAX_SIDE, None)?;
        Ok((w as u32, h as u32))
    }
}

impl Op for DecodeResize {
    fn name(&self) -> &'static str {
        "decode_resize"
    }

    fn signature(&self) -> &'static str {
        "decode_resize(image, width, height)"
    }

    fn output_field(&self, input: &Field, params: &[Value], output: &str) -> Result<Field> {
        encoded_input(self.name(), input, Media::Image)?;
        let (w, h) = Self::size(params)?;
        Ok(pixels_field(output, (h, w), encoded_nullable(input)))
    }

    fn apply_field(
        &self,
        input: &ArrayRef,
        _field: &Field,
        params: &[Value],
        _seed: u64,
    ) -> Result<ArrayRef> {
        let (w, h) = Self::size(params)?;
        let mut resizer = Resizer::new();
        images_to_pixels(self.name(), input, (h, w), |row, bytes, out| {
            let (img, w, h) = decode_for(self.name(), row, bytes, |_, _| (w, h))?;
            out.extend_from_slice(&resize(self.name(), &mut resizer, &img, w, h)?);
            Ok(())
        })
    }
}

/// `decode_center_crop(image, resize, height, width)`: torchvision's eval transform in one
/// pass: decode, resize so the shorter side is `resize` pixels (aspect kept, the longer side
/// `⌊resize · long / short⌋`, antialiased bilinear as PIL's), then the centered `height ×
/// width` window (its corner at `round((side − crop) / 2)`, ties to even, as torchvision's
/// `CenterCrop`). `Resize(256)` + `CenterCrop(224)` is `decode_center_crop(image, 256, 224,
/// 224)`. Emits `height·width·3` bytes of RGB pixels (HWC) as a `FixedSizeList<UInt8>`: a
/// fixed shape, whatever the images' aspect ratios.
#[derive(Debug)]
pub struct DecodeCenterCrop;

impl DecodeCenterCrop {
    fn params(params: &[Value]) -> Result<(u32, u32, u32)> {
        let op = "decode_center_crop";
        expect_params(op, params, 3, 3)?;
        let resize = int_param(op, params, 0, "resize", 1..=MAX_SIDE, None)?;
        let h = int_param(op, params, 1, "height", 1..=resize, None)?;
        let w = int_param(op, params, 2, "width", 1..=resize, None)?;
        Ok((resize as u32, h as u32, w as u32))
    }

    /// The image's size once its shorter side is `resize`, as torchvision computes it.
    fn resized(resize: u32, w: u32, h: u32) -> (u32, u32) {
        let long =
            |short: u32, long: u32| ((u64::from(resize) * u64::from(long)) / u64::from(short.max(1))) as u32;
        if w <= h {
            (resize, long(w, h).max(1))
        } else {
            (long(h, w).max(1), resize)
        }
    }
}

impl Op for DecodeCenterCrop {
    fn name(&self) -> &'static str {
        "decode_center_crop"
    }

    fn signature(&self) -> &'static str {
        "decode_center_crop(image, resize, height, width)"
    }

    fn output_field(&self, input: &Field, params: &[Value], output: &str) -> Result<Field> {
        encoded_input(self.name(), input, Media::Image)?;
        let (_, h, w) = Self::params(params)?;
        Ok(pixels_field(output, (h, w), encoded_nullable(input)))
    }

    fn apply_field(
        &self,
        input: &ArrayRef,
        _field: &Field,
        params: &[Value],
        _seed: u64,
    ) -> Result<ArrayRef> {
        let (side, ch, cw) = Self::params(params)?;
        let mut resizer = Resizer::new();
        images_to_pixels(self.name(), input, (ch, cw), |row, bytes, out| {
            let (img, w, h) = decode_for(self.name(), row, bytes, |w, h| Self::resized(side, w, h))?;
            let pixels = resize(self.name(), &mut resizer, &img, w, h)?;
            // torchvision: int(round((side - crop) / 2.0)), Python's round (ties to even).
            let corner = |side: u32, crop: u32| (f64::from(side - crop) / 2.0).round_ties_even() as usize;
            let at = out.len();
            out.resize(at + (ch * cw * 3) as usize, 0);
            crop(
                &pixels,
                (h as usize, w as usize, 3),
                (corner(h, ch), corner(w, cw)),
                (ch as usize, cw as usize),
                &mut out[at..],
            );
            Ok(())
        })
    }
}

/// `thumbnail(image, max_side[, quality])`: decode, shrink so the longer side is at most
/// `max_side` (aspect kept; never enlarged), re-encode as JPEG at `quality` (default 85).
#[derive(Debug)]
pub struct Thumbnail;

impl Thumbnail {
    fn params(params: &[Value]) -> Result<(u32, u8)> {
        expect_params("thumbnail", params, 1, 2)?;
        let side = int_param("thumbnail", params, 0, "max_side", 1..=MAX_SIDE, None)?;
        let quality = int_param("thumbnail", params, 1, "quality", 1..=100, Some(85))?;
        Ok((side as u32, quality as u8))
    }
}

impl Op for Thumbnail {
    fn name(&self) -> &'static str {
        "thumbnail"
    }

    fn signature(&self) -> &'static str {
        "thumbnail(image, max_side[, quality])"
    }

    fn output_field(&self, input: &Field, params: &[Value], output: &str) -> Result<Field> {
        encoded_input(self.name(), input, Media::Image)?;
        Self::params(params)?;
        Ok(Field::new(output, DataType::Binary, encoded_nullable(input)))
    }

    /// A JPEG of at most `max_side`² pixels: bounded by its raw RGB size plus headers
    /// (JPEG at quality 100 on noise stays below that).
    fn max_output_bytes_per_row(&self, input: &Field, params: &[Value]) -> Result<Option<u64>> {
        encoded_input(self.name(), input, Media::Image)?;
        let (side, _) = Self::params(params)?;
        Ok(Some(u64::from(side) * u64::from(side) * 3 + 4096))
    }

    fn apply_field(
        &self,
        input: &ArrayRef,
        _field: &Field,
        params: &[Value],
        _seed: u64,
    ) -> Result<ArrayRef> {
        let (side, quality) = Self::params(params)?;
        let mut out = BinaryBuilder::with_capacity(input.len(), input.len() * 2048);
        let mut resizer = Resizer::new();
        let mut buf = Vec::new();
        for_each_encoded(self.name(), input, Media::Image, |row, bytes| {
            let Some(bytes) = bytes else {
                out.append_null();
                return Ok(());
            };
            let (img, tw, th) = decode_for(self.name(), row, bytes, |w, h| {
                let scale = (side as f64 / w.max(h) as f64).min(1.0);
                (
                    ((w as f64 * scale).round() as u32).max(1),
                    ((h as f64 * scale).round() as u32).max(1),
                )
            })?;
            let pixels = resize(self.name(), &mut resizer, &img, tw, th)?;
            buf.clear();
            image::codecs::jpeg::JpegEncoder::new_with_quality(Cursor::new(&mut buf), quality)
                .encode(&pixels, tw, th, image::ExtendedColorType::Rgb8)
                .map_err(|e| OpError::BadValue {
                    op: "thumbnail",
                    row,
                    reason: format!("encoding: {e}"),
                })?;
            out.append_value(&buf);
            Ok(())
        })?;
        Ok(Arc::new(out.finish()))
    }
}

/// Copies the `(ch, cw)` window at `(top, left)` of an HWC `src` of row width `w` into `out`.
pub(crate) fn crop(
    src: &[u8],
    (_, w, c): (usize, usize, usize),
    (top, left): (usize, usize),
    (ch, cw): (usize, usize),
    out: &mut [u8],
) {
    for y in 0..ch {
        let from = ((top + y) * w + left) * c;
        out[y * cw * c..(y + 1) * cw * c].copy_from_slice(&src[from..from + cw * c]);
    }
}
