//! Image ops over encoded images (`Binary`): decode + resize to pixels, and re-encoded
//! thumbnails. Decoding uses the `image` crate (zune-jpeg inside), resizing
//! `fast_image_resize` (SIMD convolution, bilinear with antialiasing).

use std::io::Cursor;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BinaryBuilder, FixedSizeListArray, UInt8Array};
use arrow::buffer::NullBuffer;
use arrow::datatypes::{DataType, Field};
use fast_image_resize::images::{Image, ImageRef};
use fast_image_resize::{FilterType, PixelType, ResizeAlg, ResizeOptions, Resizer};
use image::RgbImage;

use crate::{Op, OpError, Result, Value, expect_params, int_param};

/// Field metadata carrying the `height,width,channels` of pixel tensors, so later ops (and
/// tensor conversion) know the shape of a flat `FixedSizeList<u8>`.
pub const SHAPE_METADATA_KEY: &str = "pushdown.shape";

const MAX_SIDE: i64 = 8192;

fn binary_input(op: &'static str, input: &Field) -> Result<()> {
    match input.data_type() {
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView => Ok(()),
        other => Err(OpError::BadArguments {
            op,
            reason: format!("expects encoded images (binary), got {other}"),
        }),
    }
}

/// The rows of a binary column as byte slices (any binary layout).
fn for_each_image(
    op: &'static str,
    input: &ArrayRef,
    mut f: impl FnMut(usize, Option<&[u8]>) -> Result<()>,
) -> Result<()> {
    match input.data_type() {
        DataType::Binary => input
            .as_binary::<i32>()
            .iter()
            .enumerate()
            .try_for_each(|(i, v)| f(i, v)),
        DataType::LargeBinary => input
            .as_binary::<i64>()
            .iter()
            .enumerate()
            .try_for_each(|(i, v)| f(i, v)),
        DataType::BinaryView => input
            .as_binary_view()
            .iter()
            .enumerate()
            .try_for_each(|(i, v)| f(i, v)),
        other => Err(OpError::BadArguments {
            op,
            reason: format!("expects encoded images (binary), got {other}"),
        }),
    }
}

fn decode(op: &'static str, row: usize, bytes: &[u8]) -> Result<RgbImage> {
    image::load_from_memory(bytes)
        .map(|img| img.to_rgb8())
        .map_err(|e| OpError::BadValue {
            op,
            row,
            reason: format!("cannot decode image: {e}"),
        })
}

fn resize(op: &'static str, resizer: &mut Resizer, img: &RgbImage, w: u32, h: u32) -> Result<Vec<u8>> {
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
        binary_input(self.name(), input)?;
        let (w, h) = Self::size(params)?;
        let item = Arc::new(Field::new("item", DataType::UInt8, false));
        Ok(Field::new(
            output,
            DataType::FixedSizeList(item, (w * h * 3) as i32),
            input.is_nullable(),
        )
        .with_metadata([(SHAPE_METADATA_KEY.to_string(), format!("{h},{w},3"))].into()))
    }

    fn apply_field(
        &self,
        input: &ArrayRef,
        _field: &Field,
        params: &[Value],
        _seed: u64,
    ) -> Result<ArrayRef> {
        let (w, h) = Self::size(params)?;
        let size = (w * h * 3) as usize;
        let mut values = Vec::with_capacity(input.len() * size);
        let mut resizer = Resizer::new();
        for_each_image(self.name(), input, |row, bytes| {
            match bytes {
                Some(bytes) => {
                    let img = decode(self.name(), row, bytes)?;
                    values.extend_from_slice(&resize(self.name(), &mut resizer, &img, w, h)?);
                }
                None => values.resize(values.len() + size, 0),
            }
            Ok(())
        })?;
        let item = Arc::new(Field::new("item", DataType::UInt8, false));
        let nulls: Option<NullBuffer> = input.logical_nulls();
        FixedSizeListArray::try_new(item, size as i32, Arc::new(UInt8Array::from(values)), nulls)
            .map(|a| Arc::new(a) as ArrayRef)
            .map_err(|source| OpError::Arrow {
                op: self.name(),
                source,
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
        binary_input(self.name(), input)?;
        Self::params(params)?;
        Ok(Field::new(output, DataType::Binary, input.is_nullable()))
    }

    /// A JPEG of at most `max_side`² pixels: bounded by its raw RGB size plus headers
    /// (JPEG at quality 100 on noise stays below that).
    fn max_output_bytes_per_row(&self, input: &Field, params: &[Value]) -> Result<Option<u64>> {
        binary_input(self.name(), input)?;
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
        for_each_image(self.name(), input, |row, bytes| {
            let Some(bytes) = bytes else {
                out.append_null();
                return Ok(());
            };
            let img = decode(self.name(), row, bytes)?;
            let (w, h) = (img.width(), img.height());
            let scale = (side as f64 / w.max(h) as f64).min(1.0);
            let (tw, th) = (
                ((w as f64 * scale).round() as u32).max(1),
                ((h as f64 * scale).round() as u32).max(1),
            );
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
