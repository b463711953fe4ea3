use std::io::Cursor;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BinaryArray, Int32Array, Int64Array, StringArray};
use arrow::datatypes::{DataType, Field, UInt8Type};

use super::*;

fn jpeg(w: u32, h: u32) -> Vec<u8> {
    let img = image::RgbImage::from_fn(w, h, |x, y| {
        image::Rgb([(x * 255 / w) as u8, (y * 255 / h) as u8, 128])
    });
    let mut out = Cursor::new(Vec::new());
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, 90)
        .encode_image(&img)
        .expect("encode");
    out.into_inner()
}

fn images() -> ArrayRef {
    let (a, b) = (jpeg(300, 200), jpeg(30, 50));
    Arc::new(BinaryArray::from(vec![
        Some(a.as_slice()),
        None,
        Some(b.as_slice()),
    ]))
}

#[test]
fn decode_resize_gives_fixed_size_pixels() {
    let op = lookup("decode_resize").expect("op");
    let params = [Value::Int(32), Value::Int(16)];
    let field = op
        .output_field(&Field::new("image", DataType::Binary, true), &params, "pixels")
        .expect("field");
    assert_eq!(
        field.metadata().get(SHAPE_METADATA_KEY).map(String::as_str),
        Some("16,32,3")
    );
    let out = op.apply(&images(), &params).expect("apply");
    assert_eq!(out.data_type(), field.data_type());
    let list = out.as_fixed_size_list();
    assert_eq!(list.value_length(), 32 * 16 * 3);
    assert!(list.is_null(1) && list.is_valid(0) && list.is_valid(2));
    // The gradient survives: red grows along x.
    let row = list.value(0);
    let px = row.as_primitive::<UInt8Type>();
    assert!(
        px.value(3 * 31) > px.value(0) + 100,
        "{} vs {}",
        px.value(3 * 31),
        px.value(0)
    );
}

#[test]
fn thumbnail_bounds_the_longer_side_and_reduces_bytes() {
    let op = lookup("thumbnail").expect("op");
    let input = images();
    let out = op.apply(&input, &[Value::Int(64)]).expect("apply");
    let out = out.as_binary::<i32>();
    let first = image::load_from_memory(out.value(0)).expect("decodes");
    assert_eq!((first.width(), first.height()), (64, 43));
    // Smaller images are not enlarged.
    let third = image::load_from_memory(out.value(2)).expect("decodes");
    assert_eq!((third.width(), third.height()), (30, 50));
    assert!(out.is_null(1));
    assert!(out.value(0).len() < input.as_binary::<i32>().value(0).len());
}

#[test]
fn undecodable_images_name_the_row() {
    let op = lookup("thumbnail").expect("op");
    let good = jpeg(10, 10);
    let input: ArrayRef = Arc::new(BinaryArray::from(vec![good.as_slice(), b"not an image"]));
    let err = op.apply(&input, &[Value::Int(8)]).expect_err("bad row");
    assert!(matches!(err, OpError::BadValue { row: 1, .. }), "{err}");
    assert!(err.to_string().contains("row 1"), "{err}");
}

#[test]
fn bad_parameters_are_rejected_before_running() {
    let image = Field::new("image", DataType::Binary, false);
    let op = lookup("decode_resize").expect("op");
    assert!(
        op.output_field(&image, &[Value::Int(0), Value::Int(4)], "x")
            .is_err()
    );
    assert!(op.output_field(&image, &[Value::Int(4)], "x").is_err());
    assert!(
        op.output_field(&image, &[Value::Text("4".into()), Value::Int(4)], "x")
            .is_err()
    );
    let text = Field::new("s", DataType::Utf8, false);
    assert!(
        op.output_field(&text, &[Value::Int(4), Value::Int(4)], "x")
            .is_err(),
        "not binary"
    );
    assert!(
        lookup("hash_bucket")
            .expect("op")
            .output_field(&text, &[Value::Int(0)], "x")
            .is_err()
    );
    assert!(lookup("nope").is_none());
}

#[test]
fn hash_bucket_is_stable() {
    let op = lookup("hash_bucket").expect("op");
    let strings: ArrayRef = Arc::new(StringArray::from(vec!["a", "abc", "12"]));
    let out = op.apply(&strings, &[Value::Int(1_000_000)]).expect("apply");
    let out = out.as_any().downcast_ref::<Int32Array>().expect("int32");
    // Golden values: XXH3-64 of the UTF-8 bytes, modulo n. Changing them re-buckets every
    // model's features, so they are pinned.
    let golden: Vec<i32> = ["a", "abc", "12"]
        .iter()
        .map(|s| (xxhash_rust::xxh3::xxh3_64(s.as_bytes()) % 1_000_000) as i32)
        .collect();
    assert_eq!(out.values().to_vec(), golden);
    assert_eq!(xxhash_rust::xxh3::xxh3_64(b"a"), 0xe6c632b61e964e1f);
    // Integers hash as their decimal text.
    let ints: ArrayRef = Arc::new(Int64Array::from(vec![12]));
    let out_int = op.apply(&ints, &[Value::Int(1_000_000)]).expect("apply");
    assert_eq!(
        out_int
            .as_any()
            .downcast_ref::<Int32Array>()
            .expect("int32")
            .value(0),
        golden[2]
    );
}

#[test]
fn cast_to_refuses_lossy_overflow() {
    let op = lookup("cast_to").expect("op");
    let big: ArrayRef = Arc::new(Int64Array::from(vec![1, i64::MAX]));
    assert!(op.apply(&big, &[Value::Text("int32".into())]).is_err());
    let small: ArrayRef = Arc::new(Int64Array::from(vec![1, -2]));
    let out = op.apply(&small, &[Value::Text("int32".into())]).expect("fits");
    assert_eq!(out.data_type(), &DataType::Int32);
    assert!(op.apply(&small, &[Value::Text("complex".into())]).is_err());
}

/// Token lists (`List<UInt32>`, as `tokenize` gives them) and padded tokens
/// (`FixedSizeList<UInt32>`) cast to int64 keep their shape and values.
#[test]
fn cast_to_casts_the_values_of_token_lists() {
    use arrow::array::{FixedSizeListArray, ListArray, UInt32Array};
    use arrow::datatypes::{Int64Type, UInt32Type};
    let op = lookup("cast_to").expect("op");
    let tokens: ArrayRef = Arc::new(ListArray::from_iter_primitive::<UInt32Type, _, _>(vec![
        Some(vec![Some(101), Some(7592), Some(102)]),
        None,
        Some(vec![]),
    ]));
    let field = Field::new("t", tokens.data_type().clone(), true);
    let out_field = op
        .output_field(&field, &[Value::Text("int64".into())], "t")
        .expect("field");
    let out = op.apply(&tokens, &[Value::Text("int64".into())]).expect("cast");
    assert_eq!(out.data_type(), out_field.data_type());
    let list = out.as_list::<i32>();
    assert_eq!(
        list.value(0).as_primitive::<Int64Type>().values().as_ref(),
        &[101, 7592, 102]
    );
    assert!(list.is_null(1) && list.value(2).is_empty());
    let item = Arc::new(Field::new("item", DataType::UInt32, false));
    let padded: ArrayRef = Arc::new(
        FixedSizeListArray::try_new(item, 2, Arc::new(UInt32Array::from(vec![1, 2, 3, 0])), None)
            .expect("fixed"),
    );
    let out = op.apply(&padded, &[Value::Text("int64".into())]).expect("cast");
    let fixed = out.as_fixed_size_list();
    assert_eq!(fixed.value_length(), 2);
    assert_eq!(
        fixed.values().as_primitive::<Int64Type>().values().as_ref(),
        &[1, 2, 3, 0]
    );
    // A value that does not fit fails the call.
    let big: ArrayRef = Arc::new(ListArray::from_iter_primitive::<UInt32Type, _, _>(vec![Some(
        vec![Some(u32::MAX)],
    )]));
    assert!(op.apply(&big, &[Value::Text("int16".into())]).is_err());
}

/// A `rows × (h×w×3)` tensor column whose pixel (x, y) of row r is `[x, y, r]`.
fn coordinates(rows: usize, h: usize, w: usize) -> (ArrayRef, Field) {
    let mut values = Vec::with_capacity(rows * h * w * 3);
    for r in 0..rows {
        for y in 0..h {
            for x in 0..w {
                values.extend_from_slice(&[x as u8, y as u8, r as u8]);
            }
        }
    }
    let item = Arc::new(Field::new("item", DataType::UInt8, false));
    let array = arrow::array::FixedSizeListArray::try_new(
        Arc::clone(&item),
        (h * w * 3) as i32,
        Arc::new(arrow::array::UInt8Array::from(values)),
        None,
    )
    .expect("tensor");
    let field = Field::new("px", DataType::FixedSizeList(item, (h * w * 3) as i32), true)
        .with_metadata([(SHAPE_METADATA_KEY.to_string(), format!("{h},{w},3"))].into());
    (Arc::new(array), field)
}

fn row_pixels(a: &ArrayRef, row: usize) -> Vec<u8> {
    a.as_fixed_size_list()
        .value(row)
        .as_primitive::<arrow::datatypes::UInt8Type>()
        .values()
        .to_vec()
}

#[test]
fn center_crop_takes_the_middle() {
    let (px, field) = coordinates(2, 10, 20);
    let op = lookup("center_crop").expect("op");
    let params = [Value::Int(4), Value::Int(2)];
    let out_field = op.output_field(&field, &params, "c").expect("field");
    assert_eq!(out_field.metadata()[SHAPE_METADATA_KEY], "2,4,3");
    let out = op.apply_field(&px, &field, &params, 0).expect("apply");
    let row = row_pixels(&out, 1);
    // Top-left of the window is (8, 4) of the 20×10 image.
    assert_eq!(&row[..3], &[8, 4, 1]);
    assert_eq!(&row[row.len() - 3..], &[11, 5, 1]);
    assert!(
        op.output_field(&field, &[Value::Int(21), Value::Int(2)], "c")
            .is_err(),
        "wider than the image"
    );
}

#[test]
fn random_crops_stay_inside_and_vary() {
    let (px, field) = coordinates(200, 16, 16);
    let op = lookup("random_crop").expect("op");
    assert!(!op.is_deterministic());
    let params = [Value::Int(8), Value::Int(8)];
    let out = op.apply_field(&px, &field, &params, 7).expect("apply");
    let mut origins = std::collections::BTreeSet::new();
    for r in 0..200 {
        let row = row_pixels(&out, r);
        let (x0, y0) = (row[0] as usize, row[1] as usize);
        assert!(x0 + 8 <= 16 && y0 + 8 <= 16, "window inside the image");
        // The window is contiguous: pixel (dx, dy) of the crop is (x0+dx, y0+dy).
        for (i, px) in row.chunks_exact(3).enumerate() {
            assert_eq!(
                (px[0] as usize, px[1] as usize, px[2] as usize),
                (x0 + i % 8, y0 + i / 8, r)
            );
        }
        origins.insert((x0, y0));
    }
    assert!(origins.len() > 40, "positions are spread: {}", origins.len());
    // A function of the seed.
    let again = op.apply_field(&px, &field, &params, 7).expect("apply");
    assert_eq!(row_pixels(&again, 3), row_pixels(&out, 3));
}

#[test]
fn random_flip_rate_matches_p() {
    let (px, field) = coordinates(4000, 2, 4);
    let op = lookup("random_flip").expect("op");
    for p in [0.0, 0.3, 0.5, 1.0] {
        let out = op
            .apply_field(&px, &field, &[Value::Float(p)], 11)
            .expect("apply");
        let flipped = (0..4000).filter(|&r| row_pixels(&out, r)[0] == 3).count();
        let rate = flipped as f64 / 4000.0;
        // 4 standard deviations of a binomial proportion.
        let tolerance = 4.0 * (p * (1.0 - p) / 4000.0).sqrt() + 1e-9;
        assert!((rate - p).abs() <= tolerance, "p={p}: rate {rate}");
        // A flip mirrors each row of pixels exactly.
        for r in (0..4000).filter(|&r| row_pixels(&out, r)[0] == 3).take(3) {
            let row = row_pixels(&out, r);
            let xs: Vec<u8> = row.chunks_exact(3).map(|c| c[0]).collect();
            assert_eq!(xs, vec![3, 2, 1, 0, 3, 2, 1, 0]);
        }
    }
    assert!(op.output_field(&field, &[Value::Float(1.5)], "f").is_err());
}

/// Every channel width (the constant-width kernels for 1, 3 and 4 bytes, the general one
/// for 2 and 5) mirrors each pixel whole, every byte in its place.
#[test]
fn random_flip_mirrors_pixels_whole_at_every_channel_width() {
    let (h, w, rows) = (3, 7, 6);
    for c in 1..=5usize {
        let size = h * w * c;
        let values: Vec<u8> = (0..rows * size).map(|i| (i * 31 % 251) as u8).collect();
        let item = Arc::new(Field::new("item", DataType::UInt8, false));
        let px: ArrayRef = Arc::new(
            arrow::array::FixedSizeListArray::try_new(
                Arc::clone(&item),
                size as i32,
                Arc::new(arrow::array::UInt8Array::from(values.clone())),
                None,
            )
            .expect("tensor"),
        );
        let field = Field::new("px", DataType::FixedSizeList(item, size as i32), true)
            .with_metadata([(SHAPE_METADATA_KEY.to_string(), format!("{h},{w},{c}"))].into());
        let out = lookup("random_flip")
            .expect("op")
            .apply_field(&px, &field, &[Value::Float(1.0)], 3)
            .expect("apply");
        for r in 0..rows {
            let src = &values[r * size..(r + 1) * size];
            let expected: Vec<u8> = src
                .chunks_exact(w * c)
                .flat_map(|line| line.chunks_exact(c).rev().flatten().copied().collect::<Vec<u8>>())
                .collect();
            assert_eq!(row_pixels(&out, r), expected, "{c} channels, row {r}");
        }
    }
}

#[test]
fn grayscale_and_normalize() {
    let (px, field) = coordinates(1, 2, 2);
    let gray = lookup("grayscale").expect("op");
    let out = gray.apply_field(&px, &field, &[], 0).expect("gray");
    // Pixel (1, 1) of row 0 is [1, 1, 0]: luma 0.886 → 1.
    assert_eq!(row_pixels(&out, 0), vec![0, 0, 1, 1]);
    let norm = lookup("normalize").expect("op");
    let params = [Value::Float(0.5), Value::Float(0.25)];
    let out_field = norm.output_field(&field, &params, "n").expect("field");
    assert_eq!(
        out_field.data_type(),
        &DataType::FixedSizeList(Arc::new(Field::new("item", DataType::Float32, false)), 12)
    );
    let out = norm.apply_field(&px, &field, &params, 0).expect("norm");
    let values = out.as_fixed_size_list().value(0);
    let values = values.as_primitive::<arrow::datatypes::Float32Type>();
    assert!((values.value(0) - (-2.0)).abs() < 1e-6);
    assert!(
        norm.output_field(&field, &[Value::Float(0.5), Value::Float(0.0)], "n")
            .is_err()
    );
}

#[test]
fn normalize_takes_a_mean_and_std_per_channel_and_puts_channels_first() {
    // Pixel (x, y) of row r is [x, y, r]: channel k of pixel i at i·3 + k (HWC) or
    // k·h·w + i (CHW).
    let (px, field) = coordinates(2, 2, 3);
    let norm = lookup("normalize").expect("op");
    let (mean, std) = ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]);
    let want = |k: usize, v: u8| (f32::from(v) / 255.0 - mean[k] as f32) / std[k] as f32;
    for params in [
        vec![
            Value::List(mean.to_vec()),
            Value::List(std.to_vec()),
            Value::Text("chw".into()),
        ],
        // SQL and the wire carry a list as its text.
        vec![
            Value::Text("[0.485, 0.456, 0.406]".into()),
            Value::Text("0.229,0.224,0.225".into()),
            Value::Text("CHW".into()),
        ],
    ] {
        let out_field = norm.output_field(&field, &params, "x").expect("field");
        assert_eq!(out_field.metadata()[SHAPE_METADATA_KEY], "3,2,3");
        let out = norm.apply_field(&px, &field, &params, 0).expect("normalize");
        let row = out.as_fixed_size_list().value(1);
        let got = row.as_primitive::<arrow::datatypes::Float32Type>().values();
        for y in 0..2 {
            for x in 0..3 {
                let i = y * 3 + x;
                for (k, v) in [x as u8, y as u8, 1].into_iter().enumerate() {
                    assert!(
                        (got[k * 6 + i] - want(k, v)).abs() < 1e-5,
                        "({x}, {y}) channel {k}"
                    );
                }
            }
        }
    }
    // Channels last by default, one number for every channel as before.
    let out = norm
        .apply_field(&px, &field, &[Value::List(mean.to_vec()), Value::Float(0.5)], 0)
        .expect("hwc");
    let row = out.as_fixed_size_list().value(0);
    let got = row.as_primitive::<arrow::datatypes::Float32Type>().values();
    assert!(
        (got[3] - (1.0 / 255.0 - 0.485) / 0.5).abs() < 1e-5,
        "pixel (1, 0), red"
    );
    assert!((got[4] - (0.0 - 0.456) / 0.5).abs() < 1e-5, "pixel (1, 0), green");
    for (params, named) in [
        (
            vec![Value::List(vec![0.5, 0.5]), Value::Float(0.5)],
            "mean must be a number or a list of 3",
        ),
        (
            vec![Value::Float(0.5), Value::Text("[1, x, 2]".into())],
            "std must be",
        ),
        (
            vec![Value::Float(0.5), Value::List(vec![1.0, 0.0, 1.0])],
            "std must be > 0",
        ),
        (
            vec![Value::Float(0.5), Value::Float(0.5), Value::Text("nhwc".into())],
            "a layout ('hwc' or 'chw') and a dtype",
        ),
        (
            vec![
                Value::Float(0.5),
                Value::Float(0.5),
                Value::Text("chw".into()),
                Value::Text("hwc".into()),
            ],
            "each at most once",
        ),
    ] {
        let e = norm
            .output_field(&field, &params, "x")
            .expect_err(named)
            .to_string();
        assert!(e.contains(named), "{e}");
    }
    // to_chw moves the u8 channels first.
    let chw = lookup("to_chw").expect("op");
    assert_eq!(
        chw.output_field(&field, &[], "x").expect("field").metadata()[SHAPE_METADATA_KEY],
        "3,2,3"
    );
    let out = chw.apply_field(&px, &field, &[], 0).expect("to_chw");
    assert_eq!(
        row_pixels(&out, 1),
        vec![0, 1, 2, 0, 1, 2, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1]
    );
}

#[test]
fn decode_center_crop_is_a_shorter_side_resize_then_the_middle() {
    // A PNG (decoded in full): the fused op equals decode_resize to torchvision's resized size
    // and then the centered window.
    let img = image::RgbImage::from_fn(90, 60, |x, y| {
        image::Rgb([(x * 2) as u8, (y * 3) as u8, ((x + y) % 256) as u8])
    });
    let mut png = Cursor::new(Vec::new());
    img.write_to(&mut png, image::ImageFormat::Png).expect("png");
    let input: ArrayRef = Arc::new(BinaryArray::from(vec![Some(png.get_ref().as_slice()), None]));
    let op = lookup("decode_center_crop").expect("op");
    let params = [Value::Int(40), Value::Int(36), Value::Int(32)];
    let field = op
        .output_field(&Field::new("image", DataType::Binary, true), &params, "px")
        .expect("field");
    assert_eq!(field.metadata()[SHAPE_METADATA_KEY], "36,32,3");
    let got = op.apply(&input, &params).expect("apply");
    assert!(got.as_fixed_size_list().is_null(1));
    // Shorter side 60 → 40: 90 × 60 becomes ⌊40·90/60⌋ = 60 × 40; the window's corner at
    // round((60 − 32)/2) = 14, round((40 − 36)/2) = 2.
    let resized = lookup("decode_resize")
        .expect("op")
        .apply(&input, &[Value::Int(60), Value::Int(40)])
        .expect("resize");
    let (_, resized_field) = coordinates(1, 40, 60);
    let cropped = lookup("center_crop")
        .expect("op")
        .apply_field(&resized, &resized_field, &[Value::Int(32), Value::Int(36)], 0)
        .expect("crop");
    assert_eq!(row_pixels(&got, 0), row_pixels(&cropped, 0));
    let e = op
        .output_field(
            &Field::new("image", DataType::Binary, true),
            &[Value::Int(40), Value::Int(48), Value::Int(32)],
            "px",
        )
        .expect_err("crop over the resize")
        .to_string();
    assert!(e.contains("height must be in 1..=40"), "{e}");
}

#[test]
fn resized_crop_boxes_follow_torchvisions_rule() {
    use rand::SeedableRng;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    // Where every draw fits (areas up to half a square image), the boxes' area fractions are
    // uniform in the scale and their aspect ratios log-uniform in the ratio, as torchvision
    // draws them: over 10,000 draws each decile sits within 2% of its place.
    let (side, scale, ratio) = (400u32, (0.08, 0.5), (3.0 / 4.0, 4.0 / 3.0));
    let mut areas = Vec::new();
    let mut logs = Vec::new();
    for _ in 0..10_000 {
        let (top, left, h, w) = tensor_ops::resized_crop_box(&mut rng, (side, side), scale, ratio);
        assert!(top + h <= side && left + w <= side && h > 0 && w > 0);
        areas.push(f64::from(h * w) / f64::from(side * side));
        logs.push((f64::from(w) / f64::from(h)).ln());
    }
    let decile = |xs: &mut Vec<f64>, q: usize| {
        xs.sort_by(f64::total_cmp);
        xs[xs.len() * q / 10]
    };
    for q in 1..10 {
        let (lo, hi) = (scale.0, scale.1);
        let want = lo + (hi - lo) * q as f64 / 10.0;
        let got = decile(&mut areas, q);
        assert!(
            (got - want).abs() < 0.02 * (hi - lo) + 0.005,
            "area decile {q}: {got} vs {want}"
        );
        let (lo, hi) = (ratio.0.ln(), ratio.1.ln());
        let want = lo + (hi - lo) * q as f64 / 10.0;
        let got = decile(&mut logs, q);
        assert!(
            (got - want).abs() < 0.02 * (hi - lo) + 0.02,
            "log-ratio decile {q}: {got} vs {want}"
        );
    }
    // The default scale on a wide image: every box inside, its area within the scale.
    for _ in 0..10_000 {
        let (top, left, h, w) = tensor_ops::resized_crop_box(&mut rng, (200, 300), (0.08, 1.0), ratio);
        assert!(top + h <= 200 && left + w <= 300);
        let area = f64::from(h * w) / 60_000.0;
        assert!((0.07..=1.0).contains(&area), "{area}");
    }
    // Extreme aspect ratios: no draw fits, so the central fallback, cut to the nearest ratio.
    assert_eq!(
        tensor_ops::resized_crop_box(&mut rng, (10, 1000), (0.08, 1.0), ratio),
        (0, 493, 10, 13)
    );
    assert_eq!(
        tensor_ops::resized_crop_box(&mut rng, (1000, 10), (0.08, 1.0), ratio),
        (493, 0, 13, 10)
    );
}

#[test]
fn random_resized_crops_vary_by_row_and_take_pixels_or_images() {
    let op = lookup("random_resized_crop").expect("op");
    let (px, field) = coordinates(64, 40, 60);
    let params = [Value::Int(16), Value::Int(24)];
    let out_field = op.output_field(&field, &params, "x").expect("field");
    assert_eq!(out_field.metadata()[SHAPE_METADATA_KEY], "16,24,3");
    let a = op.apply_field(&px, &field, &params, 1).expect("crop");
    let b = op.apply_field(&px, &field, &params, 1).expect("again");
    let c = op.apply_field(&px, &field, &params, 2).expect("other seed");
    assert_eq!(row_pixels(&a, 3), row_pixels(&b, 3), "a function of (seed, row)");
    assert_ne!(row_pixels(&a, 3), row_pixels(&a, 4), "rows draw apart");
    assert_ne!(row_pixels(&a, 3), row_pixels(&c, 3), "seeds draw apart");
    // Encoded images too, nulls kept.
    let out = op.apply(&images(), &params).expect("images");
    assert_eq!(out.as_fixed_size_list().value_length(), 16 * 24 * 3);
    assert!(out.as_fixed_size_list().is_null(1));
    assert!(!op.is_deterministic());
    for bad in [
        vec![Value::Int(16)],
        vec![Value::Int(16), Value::Int(16), Value::Float(0.5)],
        vec![
            Value::Int(16),
            Value::Int(16),
            Value::Float(0.5),
            Value::Float(0.2),
        ],
        vec![
            Value::Int(16),
            Value::Int(16),
            Value::Float(0.1),
            Value::Float(1.0),
            Value::Float(2.0),
            Value::Float(1.0),
        ],
    ] {
        assert!(op.output_field(&field, &bad, "x").is_err(), "{bad:?}");
    }
}

#[test]
fn color_jitter_varies_per_row_within_its_strength() {
    // Mid-range values (100..156): jitter of strength 0.4 never clamps, so each row's mean
    // is scaled by its brightness factor alone (contrast keeps the mean).
    let (h, w, rows) = (8usize, 8usize, 300usize);
    let values: Vec<u8> = (0..rows * h * w * 3)
        .map(|i| 100 + ((i * 7 + i / 192) % 56) as u8)
        .collect();
    let item = Arc::new(Field::new("item", DataType::UInt8, false));
    let px: ArrayRef = Arc::new(
        arrow::array::FixedSizeListArray::try_new(
            Arc::clone(&item),
            (h * w * 3) as i32,
            Arc::new(arrow::array::UInt8Array::from(values)),
            None,
        )
        .expect("tensor"),
    );
    let field = Field::new("px", DataType::FixedSizeList(item, (h * w * 3) as i32), true)
        .with_metadata([(SHAPE_METADATA_KEY.to_string(), format!("{h},{w},3"))].into());
    let op = lookup("color_jitter").expect("op");
    assert!(!op.is_deterministic());
    // Strength 0 is the identity.
    let same = op
        .apply_field(&px, &field, &[Value::Float(0.0)], 5)
        .expect("apply");
    assert_eq!(row_pixels(&same, 9), row_pixels(&px, 9));
    let out = op
        .apply_field(&px, &field, &[Value::Float(0.4)], 5)
        .expect("apply");
    let mean = |v: &[u8]| v.iter().map(|&x| f64::from(x)).sum::<f64>() / v.len() as f64;
    let mut changed = 0;
    let (mut low, mut high) = (f64::MAX, f64::MIN);
    for r in 0..rows {
        let (a, b) = (row_pixels(&px, r), row_pixels(&out, r));
        let ratio = mean(&b) / mean(&a);
        assert!((0.59..=1.41).contains(&ratio), "row {r}: {ratio}");
        (low, high) = (low.min(ratio), high.max(ratio));
        changed += usize::from(a != b);
    }
    assert!(changed > 290, "{changed}");
    assert!(low < 0.7 && high > 1.3, "factors span the range: {low}..{high}");
    let again = op
        .apply_field(&px, &field, &[Value::Float(0.4)], 5)
        .expect("apply");
    assert_eq!(row_pixels(&again, 17), row_pixels(&out, 17));
}

#[test]
fn random_mask_rate_matches_p() {
    use arrow::array::ListArray;
    use arrow::datatypes::UInt32Type;
    let rows: Vec<Option<Vec<Option<u32>>>> = (0..500)
        .map(|r| {
            if r % 50 == 0 {
                None
            } else {
                Some((0..40).map(|t| Some(t + 1)).collect())
            }
        })
        .collect();
    let tokens: ArrayRef = Arc::new(ListArray::from_iter_primitive::<UInt32Type, _, _>(rows));
    let field = Field::new("tokens", tokens.data_type().clone(), true);
    let op = lookup("random_mask").expect("op");
    let params = [Value::Float(0.15), Value::Int(0)];
    op.output_field(&field, &params, "m").expect("field");
    let out = op.apply_field(&tokens, &field, &params, 3).expect("apply");
    assert_eq!(out.data_type(), tokens.data_type());
    let (list, input) = (out.as_list::<i32>(), tokens.as_list::<i32>());
    let (mut masked, mut total) = (0usize, 0usize);
    for r in 0..500 {
        assert_eq!(list.is_null(r), input.is_null(r));
        if list.is_null(r) {
            continue;
        }
        let (o, i) = (list.value(r), input.value(r));
        let (o, i) = (o.as_primitive::<UInt32Type>(), i.as_primitive::<UInt32Type>());
        for t in 0..i.len() {
            total += 1;
            if o.value(t) == 0 {
                masked += 1;
            } else {
                assert_eq!(o.value(t), i.value(t), "unmasked tokens are untouched");
            }
        }
    }
    let rate = masked as f64 / total as f64;
    let tolerance = 4.0 * (0.15f64 * 0.85 / total as f64).sqrt();
    assert!((rate - 0.15).abs() < tolerance, "{rate}");
    assert!(
        op.output_field(&Field::new("s", DataType::Utf8, true), &params, "m")
            .is_err()
    );
}

#[test]
fn tokenize_and_pad_tokens() {
    use arrow::array::{FixedSizeListArray, StringArray};
    // A 64-id vocabulary: 16-bit ids.
    use arrow::datatypes::UInt16Type;
    let corpus = ["the data pipeline reads the data", "data to the trainer"];
    let json = crate::train_tokenizer(corpus.iter().cycle().take(50), 64).expect("train");
    let mut tokenizers = crate::Tokenizers::new(Some("text".into()));
    tokenizers.insert(
        "text",
        Arc::new(crate::load_tokenizer(json.as_bytes()).expect("load")),
    );
    let ctx = crate::Context {
        seed: 0,
        resources: &tokenizers,
    };
    let text: ArrayRef = Arc::new(StringArray::from(vec![Some(corpus[0]), None, Some("")]));
    let field = Field::new("t", DataType::Utf8, true);
    let op = lookup("tokenize").expect("tokenize");
    let tokens = op
        .apply_in(&text, &field, &[Value::Int(4)], &ctx)
        .expect("tokenize");
    let list = tokens.as_list::<i32>();
    assert_eq!(list.value(0).len(), 4, "six words, truncated to 4");
    assert!(list.is_null(1));
    assert_eq!(list.value(2).len(), 0);
    // Without resources, the error says what is missing.
    let err = op.apply(&text, &[Value::Int(4)]).expect_err("no tokenizer");
    assert!(err.to_string().contains("no tokenizer"), "{err}");

    let pad = lookup("pad_tokens").expect("pad_tokens");
    let tokens_field = op
        .output_field_in(&field, &[Value::Int(4)], "tokens", &tokenizers)
        .expect("field");
    assert_eq!(
        tokens.data_type(),
        tokens_field.data_type(),
        "16-bit ids, planned and made"
    );
    // Without the tokenizer at hand, the plan can only say 32-bit.
    let wide = op
        .output_field(&field, &[Value::Int(4)], "tokens")
        .expect("field");
    assert_ne!(wide.data_type(), tokens_field.data_type());
    let padded = pad
        .apply_field(&tokens, &tokens_field, &[Value::Int(6), Value::Int(9)], 0)
        .expect("pad");
    let padded = padded
        .as_any()
        .downcast_ref::<FixedSizeListArray>()
        .expect("fixed");
    let values = padded.values().as_primitive::<UInt16Type>().values();
    assert_eq!(values.len(), 18);
    assert_eq!(
        &values[..4],
        list.value(0).as_primitive::<UInt16Type>().values().as_ref()
    );
    assert_eq!(
        &values[4..],
        &[9; 14],
        "padding after the tokens; null and empty rows are all padding"
    );
    let out = pad
        .output_field(&tokens_field, &[Value::Int(6)], "p")
        .expect("field");
    assert_eq!(
        out.metadata().get(crate::SHAPE_METADATA_KEY).map(String::as_str),
        Some("6")
    );
}

#[test]
fn calls_replace_or_append_columns_and_name_what_is_wrong() {
    use crate::{Call, Calls, NoResources, OpError, apply_calls};
    use arrow::record_batch::RecordBatch;
    let schema = Arc::new(arrow::datatypes::Schema::new(vec![Field::new(
        "c",
        DataType::Utf8,
        true,
    )]));
    let batch = RecordBatch::try_new(
        Arc::clone(&schema),
        vec![Arc::new(StringArray::from(vec![Some("a"), None, Some("b")]))],
    )
    .unwrap();
    let ctx = Context {
        seed: 0,
        resources: &NoResources,
    };
    let calls = [
        Call::new("hash_bucket", "c", vec![Value::Int(7)], "h"),
        Call::new("cast_to", "h", vec![Value::Text("float32".into())], "h"),
    ];
    let out = apply_calls(batch.clone(), &calls, &ctx).unwrap();
    assert_eq!(out.num_columns(), 2, "the first appends, the second replaces");
    assert_eq!(out.schema().field(1).data_type(), &DataType::Float32);
    assert!(out.column(1).is_null(1), "nulls stay nulls");
    let bound = Calls::bind(&calls, Arc::clone(&schema), &NoResources).unwrap();
    assert_eq!(bound.schema(), out.schema());

    let unknown = Calls::bind(
        &[Call::new("nope", "c", vec![], "c")],
        Arc::clone(&schema),
        &NoResources,
    )
    .unwrap_err();
    assert!(
        matches!(unknown, OpError::UnknownOp(ref n) if n == "nope"),
        "{unknown}"
    );
    let missing = Calls::bind(
        &[Call::new("hash_bucket", "x", vec![Value::Int(7)], "h")],
        schema,
        &NoResources,
    )
    .unwrap_err();
    assert!(missing.to_string().contains("no input column `x`"), "{missing}");
    // Text parameters print as SQL literals, quotes escaped; floats keep their point.
    let call = Call::new("f", "c", vec![Value::Text("it's".into()), Value::Float(1.0)], "o");
    assert_eq!(call.to_string(), "f(c, 'it''s', 1.0) AS o");
}

/// A photo-like JPEG: smooth shading, hard edges and sensor-like noise (seeded), so the
/// comparison sees every kind of detail a scaled IDCT drops.
fn photo_jpeg(w: u32, h: u32, gray: bool) -> Vec<u8> {
    let mut state = 0x9E37_79B9_7F4A_7C15u64 ^ u64::from(w * 31 + h);
    let mut noise = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % 24) as i32 - 12
    };
    let img = image::RgbImage::from_fn(w, h, |x, y| {
        let shade = (x * 180 / w + y * 60 / h) as i32;
        let edge = if (x / 37 + y / 23) % 2 == 0 { 50 } else { 0 };
        let mut v = |base: i32| (base + edge + noise()).clamp(0, 255) as u8;
        let r = v(shade);
        if gray {
            image::Rgb([r, r, r])
        } else {
            image::Rgb([r, v(255 - shade), v(shade / 2 + 60)])
        }
    });
    let mut out = Cursor::new(Vec::new());
    if gray {
        image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, 90)
            .encode_image(&image::DynamicImage::ImageRgb8(img).into_luma8())
            .expect("encode");
    } else {
        image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, 90)
            .encode_image(&img)
            .expect("encode");
    }
    out.into_inner()
}

/// Mean absolute difference and PSNR (dB) of two pixel buffers.
fn distance(a: &[u8], b: &[u8]) -> (f64, f64) {
    assert_eq!(a.len(), b.len());
    let (mut abs, mut sq) = (0f64, 0f64);
    for (x, y) in a.iter().zip(b) {
        let d = f64::from(*x) - f64::from(*y);
        abs += d.abs();
        sq += d * d;
    }
    let n = a.len() as f64;
    let mse = (sq / n).max(1e-9);
    (abs / n, 10.0 * (255.0 * 255.0 / mse).log10())
}

/// The stated tolerance of a scaled decode against a full decode + the same resize: mean
/// absolute difference ≤ 5 levels of 255 and PSNR ≥ 30 dB. On this data the distance is
/// well within it where the scaled image is resized further, and nearer the bound where it
/// is within ~1.2× of the output (the noise aliases differently through the two low-pass
/// filters); a failure prints both figures. On the images benchmark's JPEGs (~300×300 →
/// 64×64): see `benches/RESULTS.md`, "Op kernels vs. their obvious baselines".
#[test]
fn a_scaled_jpeg_decode_stays_within_tolerance_of_a_full_one() {
    let op = lookup("decode_resize").expect("op");
    let mut resizer = fast_image_resize::Resizer::new();
    for (w, h, gray, tw, th) in [
        (296, 296, false, 64, 64),
        (210, 314, false, 48, 64),
        (296, 296, true, 64, 64),
        (640, 480, false, 64, 48),
        (300, 200, false, 32, 24),
    ] {
        let bytes = photo_jpeg(w, h, gray);
        let (img, ..) = image_ops::decode_scaled_jpeg(&bytes, &|_, _| (tw, th))
            .unwrap_or_else(|| panic!("{w}x{h} → {tw}x{th} decodes at reduced scale"));
        assert!(img.width() < w / 2 && img.width() >= tw && img.height() >= th);
        let input: ArrayRef = Arc::new(BinaryArray::from(vec![Some(bytes.as_slice())]));
        let out = op
            .apply(&input, &[Value::Int(i64::from(tw)), Value::Int(i64::from(th))])
            .expect("apply");
        let list = out.as_fixed_size_list();
        let row = list.value(0);
        let ours = row.as_primitive::<UInt8Type>().values();
        let full = image_ops::decode("test", 0, &bytes).expect("full decode");
        let reference = image_ops::resize("test", &mut resizer, &full, tw, th).expect("resize");
        let (mean, psnr) = distance(ours, &reference);
        assert!(
            mean <= 5.0 && psnr >= 30.0,
            "{w}x{h}{} → {tw}x{th}: mean |Δ| {mean:.2}, PSNR {psnr:.1} dB",
            if gray { " gray" } else { "" }
        );
    }
}

#[test]
fn only_quarter_and_eighth_scales_that_cover_the_output_are_used() {
    let bytes = photo_jpeg(296, 296, false);
    let scaled =
        |tw, th| image_ops::decode_scaled_jpeg(&bytes, &|_, _| (tw, th)).map(|(i, ..)| i.dimensions());
    assert_eq!(scaled(37, 37), Some((37, 37)), "1/8");
    assert_eq!(
        scaled(38, 30),
        Some((74, 74)),
        "1/8 is one pixel short in width: 1/4"
    );
    assert_eq!(scaled(74, 74), Some((74, 74)), "1/4");
    assert_eq!(scaled(75, 64), None, "would need 1/2: decoded in full");
    assert_eq!(scaled(296, 296), None);
    // Not a JPEG, or a truncated one: the full decode (and its error) instead.
    let png = {
        let mut out = Cursor::new(Vec::new());
        image::RgbImage::new(64, 64)
            .write_to(&mut out, image::ImageFormat::Png)
            .map(|_| out.into_inner())
    };
    if let Ok(png) = png {
        assert!(image_ops::decode_scaled_jpeg(&png, &|_, _| (8, 8)).is_none());
    }
    assert!(image_ops::decode_scaled_jpeg(&bytes[..bytes.len() / 3], &|_, _| (8, 8)).is_none());
}

/// An input may name a struct's field (`image.bytes`, `image['bytes']`): the field, with the
/// struct's nulls, is what the op reads.
#[test]
fn inputs_name_struct_fields_with_the_structs_nulls() {
    use arrow::array::{Array, BinaryArray, StringArray, StructArray};
    use arrow::buffer::NullBuffer;
    use arrow::datatypes::{Fields, Schema};

    let fields = Fields::from(vec![
        Field::new("bytes", DataType::Binary, true),
        Field::new("path", DataType::Utf8, true),
    ]);
    let image = StructArray::new(
        fields.clone(),
        vec![
            Arc::new(BinaryArray::from(vec![Some(&b"a"[..]), Some(b"b"), Some(b"c")])) as ArrayRef,
            Arc::new(StringArray::from(vec!["x", "y", "z"])),
        ],
        Some(NullBuffer::from(vec![true, false, true])),
    );
    let schema = Arc::new(Schema::new(vec![Field::new(
        "image",
        DataType::Struct(fields),
        true,
    )]));
    let batch =
        arrow::record_batch::RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(image)]).expect("batch");
    for spelling in ["image.bytes", "image['bytes']"] {
        let (path, field) = crate::resolve_input(&schema, spelling).expect(spelling);
        assert_eq!(path, vec![0, 0]);
        assert_eq!(field.data_type(), &DataType::Binary);
        let bytes = crate::input_array(&batch, &path).expect("array");
        assert_eq!(bytes.null_count(), 1, "the null struct's field is null");
        assert!(bytes.is_null(1) && bytes.is_valid(2));
    }
    assert!(crate::resolve_input(&schema, "image.nope").is_none());
    assert!(crate::resolve_input(&schema, "image.bytes.more").is_none());
    assert_eq!(crate::input_column("image['bytes']"), "image");
}

#[test]
fn normalize_gives_half_precision_values_rounded_from_float32() {
    let (px, field) = coordinates(4, 3, 2);
    let norm = lookup("normalize").expect("op");
    let imagenet = || {
        vec![
            Value::List(vec![0.485, 0.456, 0.406]),
            Value::List(vec![0.229, 0.224, 0.225]),
        ]
    };
    let full = norm.apply_field(&px, &field, &imagenet(), 0).expect("f32");
    let full = full
        .as_fixed_size_list()
        .values()
        .as_primitive::<arrow::datatypes::Float32Type>();
    // The dtype may come before or after the layout; float16 is Arrow's own type.
    for params in [
        [imagenet(), vec!["float16".into()]].concat(),
        [imagenet(), vec!["hwc".into(), "FLOAT16".into()]].concat(),
    ] {
        let out_field = norm.output_field(&field, &params, "x").expect("field");
        let DataType::FixedSizeList(item, _) = out_field.data_type() else {
            panic!("{out_field:?}")
        };
        assert_eq!(item.data_type(), &DataType::Float16);
        assert!(!out_field.metadata().contains_key(DTYPE_METADATA_KEY));
        let out = norm.apply_field(&px, &field, &params, 0).expect("f16");
        assert_eq!(out.data_type(), out_field.data_type());
        let half = out
            .as_fixed_size_list()
            .values()
            .as_primitive::<arrow::datatypes::Float16Type>();
        assert_eq!(half.len(), full.len());
        for (h, f) in half.values().iter().zip(full.values()) {
            assert_eq!(*h, half::f16::from_f32(*f));
        }
    }
    // bfloat16 travels as its u16 bits, the field tagged; channels first as asked.
    let params = [imagenet(), vec!["bfloat16".into(), "chw".into()]].concat();
    let out_field = norm.output_field(&field, &params, "x").expect("field");
    assert_eq!(out_field.metadata()[DTYPE_METADATA_KEY], "bfloat16");
    assert_eq!(out_field.metadata()[SHAPE_METADATA_KEY], "3,3,2");
    let out = norm.apply_field(&px, &field, &params, 0).expect("bf16");
    assert_eq!(out.data_type(), out_field.data_type());
    let chw = norm
        .apply_field(&px, &field, &[imagenet(), vec!["chw".into()]].concat(), 0)
        .expect("chw");
    let chw = chw
        .as_fixed_size_list()
        .values()
        .as_primitive::<arrow::datatypes::Float32Type>();
    let bits = out
        .as_fixed_size_list()
        .values()
        .as_primitive::<arrow::datatypes::UInt16Type>();
    for (b, f) in bits.values().iter().zip(chw.values()) {
        let back = half::bf16::from_bits(*b).to_f32();
        assert!((back - f).abs() <= f.abs() / 128.0, "{back} from {f}");
    }
}

/// A clip tensor `[T, H, W, 3]` whose frame `t` is frame 0 plus `40·t`: the same picture
/// brighter each frame.
fn clip_tensor(frames: usize, (h, w): (usize, usize), rows: usize) -> (ArrayRef, Field) {
    let frame: Vec<u8> = (0..h * w * 3).map(|i| (i * 7 % 40) as u8).collect();
    let values: Vec<u8> = (0..rows)
        .flat_map(|_| (0..frames).flat_map(|t| frame.iter().map(move |&v| v + 40 * t as u8)))
        .collect();
    let size = (frames * h * w * 3) as i32;
    let item = Arc::new(Field::new("item", DataType::UInt8, false));
    let array = arrow::array::FixedSizeListArray::try_new(
        Arc::clone(&item),
        size,
        Arc::new(arrow::array::UInt8Array::from(values)),
        None,
    )
    .expect("clip");
    let field = Field::new("clip", DataType::FixedSizeList(item, size), true)
        .with_metadata([(SHAPE_METADATA_KEY.to_string(), format!("{frames},{h},{w},3"))].into());
    (Arc::new(array), field)
}

/// Every frame of a row gets the same crop window and flip: frame `t` of the output is
/// frame 0's plus `40·t`, for every op, seed and row; deterministic ops keep the frames and
/// normalize/to_chw put channels first per frame (`[T, C, H, W]`).
#[test]
fn random_image_ops_draw_once_per_clip() {
    let (input, field) = clip_tensor(4, (6, 8), 5);
    let calls: [(&str, Vec<Value>); 5] = [
        ("random_crop", vec![Value::Int(5), Value::Int(3)]),
        ("random_resized_crop", vec![Value::Int(4), Value::Int(4)]),
        ("random_flip", vec![Value::Float(0.5)]),
        ("center_crop", vec![Value::Int(4), Value::Int(4)]),
        ("to_chw", vec![]),
    ];
    for (name, params) in calls {
        let op = lookup(name).expect("op");
        let out_field = op.output_field(&field, &params, "x").expect("field");
        let shape: Vec<usize> = out_field.metadata()[SHAPE_METADATA_KEY]
            .split(',')
            .map(|d| d.parse().expect("dim"))
            .collect();
        assert_eq!((shape.len(), shape[0]), (4, 4), "{name}: {shape:?}");
        let frame = shape[1..].iter().product::<usize>();
        for seed in 0..4 {
            let out = op.apply_field(&input, &field, &params, seed).expect("apply");
            let out = out.as_fixed_size_list();
            for row in 0..5 {
                let v = out.value(row);
                let v = v.as_primitive::<UInt8Type>().values();
                for t in 1..4 {
                    for i in 0..frame {
                        // Resizing blends neighbours: a brighter picture stays 40·t brighter
                        // up to rounding.
                        let d = i32::from(v[t * frame + i]) - i32::from(v[i]) - 40 * t as i32;
                        assert!(d.abs() <= 1, "{name} seed {seed} row {row} frame {t}: {d}");
                    }
                }
            }
        }
    }
    let normalize = lookup("normalize").expect("op");
    let params = [Value::Float(0.5), Value::Float(0.25), Value::Text("chw".into())];
    let out_field = normalize.output_field(&field, &params, "x").expect("field");
    assert_eq!(out_field.metadata()[SHAPE_METADATA_KEY], "4,3,6,8");
    let out = normalize
        .apply_field(&input, &field, &params, 0)
        .expect("normalize");
    let chw = lookup("to_chw")
        .expect("op")
        .apply_field(&input, &field, &[], 0)
        .expect("chw");
    let (out, chw) = (out.as_fixed_size_list(), chw.as_fixed_size_list());
    let (out, chw) = (out.value(4), chw.value(4));
    for (x, &p) in out
        .as_primitive::<arrow::datatypes::Float32Type>()
        .values()
        .iter()
        .zip(chw.as_primitive::<UInt8Type>().values())
    {
        assert!((x - (f32::from(p) / 255.0 - 0.5) / 0.25).abs() < 1e-5);
    }
}

#[test]
fn random_clip_takes_strided_frames_from_a_drawn_start() {
    let (input, field) = clip_tensor(6, (1, 1), 3);
    let op = lookup("random_clip").expect("op");
    assert!(!op.is_deterministic());
    let params = [Value::Int(2), Value::Int(3)];
    assert_eq!(
        op.output_field(&field, &params, "c").expect("field").metadata()[SHAPE_METADATA_KEY],
        "2,1,1,3"
    );
    let mut starts = std::collections::BTreeSet::new();
    for seed in 0..32 {
        let out = op.apply_field(&input, &field, &params, seed).expect("clip");
        let out = out.as_fixed_size_list();
        for row in 0..3 {
            let v = out.value(row);
            let v = v.as_primitive::<UInt8Type>().values();
            // Frame t's first value is 40·t: a span of 4 frames starts at 0, 1 or 2.
            let (a, b) = (usize::from(v[0] / 40), usize::from(v[3] / 40));
            assert!(a <= 2 && b == a + 3, "seed {seed} row {row}: {a}, {b}");
            starts.insert(a);
        }
    }
    assert_eq!(starts.len(), 3, "{starts:?}");
    // A clip shorter than the span: from its first frame, the last repeated.
    let long = [Value::Int(3), Value::Int(4)];
    let out = op.apply_field(&input, &field, &long, 7).expect("clip");
    let v = out.as_fixed_size_list().value(0);
    let firsts: Vec<u8> = v
        .as_primitive::<UInt8Type>()
        .values()
        .chunks(3)
        .map(|f| f[0] / 40)
        .collect();
    assert_eq!(firsts, [0, 4, 5]);
    // Refused in SQL's sense: random ops never run at the server (their planner test
    // covers every random op); bad arguments are named.
    let err = op
        .output_field(&field, &[Value::Int(0), Value::Int(1)], "c")
        .expect_err("0 frames");
    assert!(err.to_string().contains("num_frames"), "{err}");
}

/// A shape from a file's metadata with an empty side, or whose product wraps, is refused
/// when typing, not a panic (or a wrapped allocation) when applying.
#[test]
fn empty_or_overflowing_tensor_shapes_are_refused() {
    let item = Arc::new(Field::new("item", DataType::UInt8, false));
    let field = |len: i32, shape: &str| {
        Field::new("x", DataType::FixedSizeList(Arc::clone(&item), len), true)
            .with_metadata([(SHAPE_METADATA_KEY.to_string(), shape.to_string())].into())
    };
    // 2^62 · 4 wraps to 0 in 64 bits.
    let wrapping = format!("{},2,2,1", 1usize << 62);
    for (len, shape) in [
        (0, "0,4,3"),
        (0, "2,0,5,3"),
        (0, wrapping.as_str()),
        (12, "2,2,3,-1"),
    ] {
        for name in ["grayscale", "to_chw", "random_flip", "random_clip"] {
            let op = lookup(name).expect("op");
            let params: Vec<Value> = match name {
                "random_flip" => vec![Value::Float(0.5)],
                "random_clip" => vec![Value::Int(1), Value::Int(1)],
                _ => vec![],
            };
            assert!(
                op.output_field(&field(len, shape), &params, "y").is_err(),
                "{name} took shape {shape}"
            );
        }
    }
    // An output over what one value holds is refused too: 11 frames at 8192².
    let clip = field(11 * 2 * 2 * 3, "11,2,2,3");
    let err = lookup("random_resized_crop")
        .expect("op")
        .output_field(&clip, &[Value::Int(8192), Value::Int(8192)], "y")
        .expect_err("over 2 GiB");
    assert!(err.to_string().contains("2 GiB"), "{err}");
}
