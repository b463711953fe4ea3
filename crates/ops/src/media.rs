//! Encoded media columns (images, audio, video): binary in any Arrow layout, or the Hugging Face
//! `datasets` struct (`struct<bytes: binary, path: string>`, its `Image` and `Audio`
//! features), whose `bytes` are the file. Bytes are read from the Parquet file, never from
//! the paths it names.

use arrow::array::{Array, ArrayRef, AsArray};
use arrow::datatypes::{DataType, Field};

use crate::op::{OpError, Result};

/// The most bytes a decoder's frames may take while it decodes a clip (its references, the
/// frame it decodes and the one shown): counted once per run in a server's memory budget
/// ([`crate::Op::working_bytes`]). A clip needing more (over 1080p at 8 bits, 4:2:0) is its row's
/// error.
pub(crate) const DECODER_BYTES: u64 = 64 << 20;

/// What an encoded column holds, for the words of its errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Media {
    Image,
    Audio,
    Video,
}

impl Media {
    fn plural(self) -> &'static str {
        match self {
            Media::Image => "images",
            Media::Audio => "audio",
            Media::Video => "videos",
        }
    }

    fn singular(self) -> &'static str {
        match self {
            Media::Image => "image",
            Media::Audio => "audio",
            Media::Video => "video",
        }
    }
}

/// Checks that `input` holds encoded media: binary, or the Hub's struct whose `bytes` are
/// the file.
pub(crate) fn encoded_input(op: &'static str, input: &Field, media: Media) -> Result<()> {
    match input.data_type() {
        t if is_binary(t) => Ok(()),
        DataType::Struct(fields)
            if fields
                .iter()
                .any(|f| f.name() == "bytes" && is_binary(f.data_type())) =>
        {
            Ok(())
        }
        other => Err(OpError::BadArguments {
            op,
            reason: format!(
                "expects encoded {} (binary, or the Hub's struct<bytes: binary, path: string>), got {other}",
                media.plural()
            ),
        }),
    }
}

fn is_binary(t: &DataType) -> bool {
    matches!(t, DataType::Binary | DataType::LargeBinary | DataType::BinaryView)
}

/// Whether an encoded column of `input` may have null rows (a struct's, or its `bytes`).
pub(crate) fn encoded_nullable(input: &Field) -> bool {
    match input.data_type() {
        DataType::Struct(fields) => {
            input.is_nullable() || fields.iter().any(|f| f.name() == "bytes" && f.is_nullable())
        }
        _ => input.is_nullable(),
    }
}

/// The rows of an encoded column as byte slices (any binary layout, or the Hub's struct).
/// A struct row whose `bytes` are null but whose `path` is set is refused: media are read
/// from the Parquet file, never from paths it names.
pub(crate) fn for_each_encoded(
    op: &'static str,
    input: &ArrayRef,
    media: Media,
    mut f: impl FnMut(usize, Option<&[u8]>) -> Result<()>,
) -> Result<()> {
    match input.data_type() {
        DataType::Struct(_) => for_each_struct(op, input.as_struct(), media, &mut f),
        _ => for_each_binary(op, input, media, &mut f),
    }
}

/// What is done with each row of an encoded column: its index and its bytes (`None`: null).
type EachValue<'a> = dyn FnMut(usize, Option<&[u8]>) -> Result<()> + 'a;

/// The rows of a binary column (any layout) as byte slices.
fn for_each_binary(op: &'static str, input: &ArrayRef, media: Media, f: &mut EachValue<'_>) -> Result<()> {
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
            reason: format!("expects encoded {} (binary), got {other}", media.plural()),
        }),
    }
}

/// [`for_each_encoded`] over the Hub's `struct<bytes, path>`.
fn for_each_struct(
    op: &'static str,
    values: &arrow::array::StructArray,
    media: Media,
    f: &mut EachValue<'_>,
) -> Result<()> {
    let bytes = values
        .column_by_name("bytes")
        .ok_or_else(|| OpError::BadArguments {
            op,
            reason: format!("an {} struct needs a `bytes` field", media.singular()),
        })?;
    let paths = values
        .column_by_name("path")
        .and_then(|p| arrow::compute::cast(p, &DataType::Utf8).ok());
    let nulls = values.logical_nulls();
    for_each_binary(op, bytes, media, &mut |row, value| {
        if nulls.as_ref().is_some_and(|n| n.is_null(row)) {
            return f(row, None);
        }
        let path = paths
            .as_ref()
            .map(|p| p.as_string::<i32>())
            .filter(|p| p.is_valid(row))
            .map(|p| p.value(row));
        match (value, path) {
            (Some(v), _) => f(row, Some(v)),
            (None, None) => f(row, None),
            (None, Some(path)) => Err(OpError::BadValue {
                op,
                row,
                reason: format!(
                    "the {what}'s bytes are null and its path is `{path}`: {plural} stored by path \
                     are not read; embed the bytes in the Parquet file (datasets embeds them \
                     when it writes Parquet with `embed_external_files`)",
                    what = media.singular(),
                    plural = media.plural(),
                ),
            }),
        }
    })
}

/// The first bytes of a value, for errors that must say what was there.
pub(crate) fn first_bytes(bytes: &[u8]) -> String {
    format!("{:02x?}", &bytes[..bytes.len().min(8)])
}
