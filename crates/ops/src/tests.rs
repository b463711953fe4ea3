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
