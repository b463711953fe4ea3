//! Op kernels against the obvious baselines, per byte of input.
//!
//! * resize 256×256 RGB → 64×64: `image`'s `resize` (triangle filter) vs `fast_image_resize`
//!   (bilinear convolution, SIMD), the kernel `decode_resize` uses;
//! * decode + resize of JPEGs: `pushdown_ops::decode_resize` vs `image` decode + `image`
//!   resize, and vs a full-scale decode + the same resize (what the scaled IDCT saves), at
//!   sizes that decode in full, at 1/4 and at 1/8 scale;
//! * decode + resize of the same photos as JPEG, PNG and WebP: each format's rate per core;
//! * hash buckets of strings: XXH3 (`hash_bucket`) vs the standard library's SipHash;
//! * tokenize + truncate to 256 of the text dataset's documents with its own trained BPE:
//!   `Tokenizer::encode` (the usual call, with offsets) vs the `tokenize` op (`encode_fast`).

use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
use std::hint::black_box;
use std::io::Cursor;
use std::sync::Arc;

use arrow::array::{ArrayRef, BinaryArray, StringArray};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use fast_image_resize::images::{Image, ImageRef};
use fast_image_resize::{FilterType, PixelType, ResizeAlg, ResizeOptions, Resizer};
use pushdown_ops::{Value, lookup};

fn photo(w: u32, h: u32, seed: u32) -> image::RgbImage {
    image::RgbImage::from_fn(w, h, |x, y| {
        let n = (x.wrapping_mul(73) ^ y.wrapping_mul(151) ^ seed.wrapping_mul(2654435761)) % 17;
        image::Rgb([(x * 255 / w) as u8, (y * 255 / h) as u8, (n * 8) as u8])
    })
}

fn jpeg(img: &image::RgbImage) -> Vec<u8> {
    let mut out = Cursor::new(Vec::new());
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, 85)
        .encode_image(img)
        .expect("encode");
    out.into_inner()
}

fn resize(c: &mut Criterion) {
    let src = photo(256, 256, 1);
    let mut group = c.benchmark_group("resize_256_to_64");
    group.throughput(Throughput::Bytes(src.as_raw().len() as u64));
    group.bench_function("image::imageops::resize (baseline)", |b| {
        b.iter(|| image::imageops::resize(black_box(&src), 64, 64, image::imageops::FilterType::Triangle))
    });
    let mut resizer = Resizer::new();
    let options = ResizeOptions::new().resize_alg(ResizeAlg::Convolution(FilterType::Bilinear));
    group.bench_function("fast_image_resize (ours)", |b| {
        b.iter(|| {
            let view = ImageRef::new(256, 256, src.as_raw(), PixelType::U8x3).expect("view");
            let mut dst = Image::new(64, 64, PixelType::U8x3);
            resizer.resize(&view, &mut dst, &options).expect("resize");
            black_box(dst)
        })
    });
    group.finish();
}

fn decode_resize(c: &mut Criterion) {
    // 256×224 → 64×64: no DCT scale covers the output (1/4 is 64×56), a full decode.
    // 300×300 → 64×64 and → 32×32: decoded at 1/4 and 1/8 scale.
    for (w, h, t) in [(256, 224, 64), (300, 300, 64), (300, 300, 32)] {
        decode_resize_group(c, w, h, t);
    }
}

fn decode_resize_group(c: &mut Criterion, w: u32, h: u32, t: u32) {
    let jpegs: Vec<Vec<u8>> = (0..32).map(|i| jpeg(&photo(w, h, i))).collect();
    let bytes: u64 = jpegs.iter().map(|j| j.len() as u64).sum();
    let column: ArrayRef = Arc::new(BinaryArray::from_iter_values(jpegs.iter()));
    let mut group = c.benchmark_group(format!("decode_resize_32_jpegs_{w}x{h}_to_{t}"));
    group.throughput(Throughput::Bytes(bytes));
    group.sample_size(20);
    group.bench_function("image decode + image resize (baseline)", |b| {
        b.iter(|| {
            for j in &jpegs {
                let img = image::load_from_memory(j).expect("decode").to_rgb8();
                black_box(image::imageops::resize(
                    &img,
                    t,
                    t,
                    image::imageops::FilterType::Triangle,
                ));
            }
        })
    });
    let options = ResizeOptions::new().resize_alg(ResizeAlg::Convolution(FilterType::Bilinear));
    group.bench_function(
        "full-scale decode + fast_image_resize (the kernel before scaled IDCT)",
        |b| {
            let mut resizer = Resizer::new();
            b.iter(|| {
                for j in &jpegs {
                    let img = image::load_from_memory(j).expect("decode").into_rgb8();
                    let view = ImageRef::new(img.width(), img.height(), img.as_raw(), PixelType::U8x3)
                        .expect("view");
                    let mut dst = Image::new(t, t, PixelType::U8x3);
                    resizer.resize(&view, &mut dst, &options).expect("resize");
                    black_box(dst);
                }
            })
        },
    );
    let op = lookup("decode_resize").expect("op");
    let params = [Value::Int(i64::from(t)), Value::Int(i64::from(t))];
    group.bench_function("pushdown_ops::decode_resize (ours)", |b| {
        b.iter(|| black_box(op.apply(&column, &params).expect("apply")))
    });
    group.finish();
}

/// The same photos as JPEG, PNG and WebP (lossless: the `image` crate's encoder), each
/// decoded and resized to 64×64 by `decode_resize`: the decode rate per core of each format,
/// for the planner's cost model (which profiles the dataset's own images; this says what to
/// expect).
fn decode_formats(c: &mut Criterion) {
    fn encoded(img: &image::RgbImage, format: image::ImageFormat) -> Vec<u8> {
        if format == image::ImageFormat::Jpeg {
            return jpeg(img);
        }
        let mut out = Cursor::new(Vec::new());
        img.write_to(&mut out, format).expect("encode");
        out.into_inner()
    }
    let mut group = c.benchmark_group("decode_resize_32_images_300x300_to_64_by_format");
    group.sample_size(20);
    group.throughput(Throughput::Elements(32));
    let op = lookup("decode_resize").expect("op");
    let params = [Value::Int(64), Value::Int(64)];
    for (name, format) in [
        ("JPEG q85", image::ImageFormat::Jpeg),
        ("PNG", image::ImageFormat::Png),
        ("WebP lossless", image::ImageFormat::WebP),
    ] {
        let images: Vec<Vec<u8>> = (0..32).map(|i| encoded(&photo(300, 300, i), format)).collect();
        let column: ArrayRef = Arc::new(BinaryArray::from_iter_values(images.iter()));
        group.bench_function(name, |b| {
            b.iter(|| black_box(op.apply(&column, &params).expect("apply")))
        });
    }
    group.finish();
}

fn hash_bucket(c: &mut Criterion) {
    let values: Vec<String> = (0..8192u32)
        .map(|i| format!("{:08x}", i.wrapping_mul(2654435761)))
        .collect();
    let bytes: u64 = values.iter().map(|v| v.len() as u64).sum();
    let column: ArrayRef = Arc::new(StringArray::from_iter_values(values.iter()));
    let mut group = c.benchmark_group("hash_bucket_8192_strings");
    group.throughput(Throughput::Bytes(bytes));
    let sip = BuildHasherDefault::<DefaultHasher>::default();
    group.bench_function("SipHash, std (baseline)", |b| {
        b.iter(|| {
            values
                .iter()
                .map(|v| (sip.hash_one(v) % 1000) as i32)
                .sum::<i32>()
        })
    });
    let op = lookup("hash_bucket").expect("op");
    group.bench_function("hash_bucket: XXH3 over an Arrow column (ours)", |b| {
        b.iter(|| black_box(op.apply(&column, &[Value::Int(1000)]).expect("apply")))
    });
    group.finish();
}

fn tokenize(c: &mut Criterion) {
    use arrow::array::AsArray;
    use pushdown_datasets::{Kind, batch};
    let docs = batch(Kind::Text, &Kind::Text.schema(), 42, 0..256, 256).expect("text");
    let bodies = docs
        .column_by_name("body")
        .expect("body")
        .as_string::<i32>()
        .clone();
    let json = pushdown_ops::train_tokenizer(bodies.iter().flatten(), 4096).expect("train");
    let tokenizer = Arc::new(pushdown_ops::load_tokenizer(json.as_bytes()).expect("load"));
    let bytes: u64 = bodies.iter().flatten().map(|b| b.len() as u64).sum();
    let mut group = c.benchmark_group("tokenize_256_documents_to_256");
    group.throughput(Throughput::Bytes(bytes));
    group.sample_size(20);
    group.bench_function("Tokenizer::encode + truncate (baseline)", |b| {
        b.iter(|| {
            for body in bodies.iter().flatten() {
                let encoding = tokenizer.encode(body, false).expect("encode");
                black_box(&encoding.get_ids()[..encoding.len().min(256)]);
            }
        })
    });
    let mut resources = pushdown_ops::Tokenizers::new(Some("text".into()));
    resources.insert("text", Arc::clone(&tokenizer));
    let ctx = pushdown_ops::Context {
        seed: 0,
        resources: &resources,
    };
    let column: ArrayRef = Arc::new(bodies.clone());
    let field = arrow::datatypes::Field::new("body", arrow::datatypes::DataType::Utf8, true);
    let op = lookup("tokenize").expect("op");
    group.bench_function("pushdown_ops::tokenize (ours)", |b| {
        b.iter(|| {
            black_box(
                op.apply_in(&column, &field, &[Value::Int(256)], &ctx)
                    .expect("apply"),
            )
        })
    });
    group.finish();
}

criterion_group!(
    benches,
    resize,
    decode_resize,
    decode_formats,
    hash_bucket,
    tokenize
);
criterion_main!(benches);
