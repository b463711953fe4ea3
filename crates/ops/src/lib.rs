//! Op kernels over Arrow arrays, placement-agnostic.
//!
//! The same kernel runs as a DataFusion scalar UDF in a server (`SELECT thumbnail(image, 64)
//! FROM images`) or directly on record batches in a client, so the planner is free to move
//! it. Every op declares what the planner needs to place it: whether it is deterministic, the
//! parameters it takes after its input column, and the field it produces.
//!
//! ```text
//!  input column ──▶ Op::apply(input, params) ──▶ output column
//!       │                                             │
//!   server: ScalarUDF (pushdown-server::udf)     client, profile: Calls (apply_calls)
//! ```
//!
//! | op | params | output | kind |
//! |---|---|---|---|
//! | `decode_resize(img, w, h)` | width, height | `FixedSizeList<u8>` HWC pixels (stretched) | deterministic |
//! | `decode_center_crop(img, resize, h, w)` | shorter side, crop height, width | pixels `h×w×3`: torchvision's `Resize` + `CenterCrop` | deterministic |
//! | `thumbnail(img, max_side[, quality])` | max side, JPEG quality (85) | JPEG bytes | deterministic, reducing |
//! | `hash_bucket(value, n)` | buckets | `Int32` in `0..n` | deterministic, reducing |
//! | `cast_to(value, type)` | `'float32'`, `'int32'`, … | that type | deterministic |
//! | `center_crop(pixels, w, h)` | width, height | pixels `h×w×c` | deterministic |
//! | `grayscale(pixels)` | | pixels `h×w×1` (BT.601 luma) | deterministic |
//! | `normalize(pixels, mean, std[, layout][, dtype])` | mean, std (numbers or per-channel lists), `'hwc'`/`'chw'`, `'float32'`/`'float16'`/`'bfloat16'` | float tensor `(x/255 − mean[c])/std[c]` | deterministic, expanding |
//! | `to_chw(pixels)` | | pixels `c×h×w` | deterministic |
//! | `random_crop(pixels, w, h)` | width, height | pixels `h×w×c` | random: trainer only |
//! | `random_resized_crop(px\|img, h, w[, scale…, ratio…])` | size, scale (0.08, 1), ratio (3/4, 4/3) | pixels `h×w×3`: torchvision's `RandomResizedCrop` | random: trainer only |
//! | `random_flip(pixels, p)` | probability | pixels, mirrored with probability `p` | random: trainer only |
//! | `color_jitter(pixels, s)` | strength | pixels, brightness and contrast ×U[1−s, 1+s] | random: trainer only |
//! | `tokenize(text, max_len[, tokenizer])` | max tokens, tokenizer name (default: the dataset's) | token ids, truncated: `List<UInt16>` when the vocabulary fits 16 bits, else `List<UInt32>` | deterministic, reducing |
//! | `pad_tokens(tokens, len[, pad_id])` | length, pad id (0) | `FixedSizeList<UInt32, len>` | deterministic |
//! | `random_mask(tokens, p, id)` | probability, mask id | token lists, each id masked with probability `p` | random: trainer only |
//! | `decode_audio(audio, sample_rate[, channels])` | rate, channels (1: the mean) | `float32` PCM in [-1, 1]: `List` `[samples]`, or `[channels, samples]` | deterministic |
//! | `log_mel(audio\|pcm, sample_rate, n_mels[, n_fft, hop_length, max_seconds][, dtype])` | rate, mel bands, window (400), hop (160), seconds (30), `'float32'`/`'float16'`/`'bfloat16'` | Whisper's log-mel `[n_mels, frames]` | deterministic |
//! | `audio_seconds(audio)` | | `Float64` duration from the container's header | deterministic, reducing |
//! | `random_audio_crop(pcm, seconds)` | seconds | `[samples]` (or `[channels, samples]`) at a random start, zero-padded | random: trainer only |
//! | `spec_augment(mel, freq_masks, freq_width, time_masks, time_width)` | counts and widest masks | features with SpecAugment's masks at 0 | random: trainer only |
//! | `decode_frames(video, num_frames, height, width)` | frames, size | `[T, H, W, 3]` `uint8`: the frames shown at the centres of `T` equal segments, resized to cover and center-cropped | deterministic, reducing (feature `video`) |
//! | `video_frames(video, fps, height, width[, max_frames])` | rate, size, cap (64) | list of `[H, W, 3]` `uint8` frames, one every `1/fps` s, sized as `decode_frames`' | deterministic, reducing (feature `video`) |
//! | `video_info(video)` | | struct of `seconds`, `fps`, `width`, `height`, `codec`, `frames`, `rotation` from the container | deterministic, reducing (feature `video`) |
//! | `video_seconds(video)` | | `Float64` duration from the container | deterministic, reducing (feature `video`) |
//! | `random_clip(frames, num_frames, stride)` | length, stride | `[T, H, W, C]`: consecutive frames `stride` apart from a random start | random, trainer only |
//!
//! Nulls map to nulls. A value an op cannot process (an undecodable image) fails the call
//! with an error naming the row: silently dropping or zero-filling training data is worse
//! than stopping.
//!
//! ```
//! use std::sync::Arc;
//! use arrow::array::{Array, ArrayRef, Int32Array, StringArray};
//! use pushdown_ops::{Value, lookup};
//! let op = lookup("hash_bucket").unwrap();
//! let input: ArrayRef = Arc::new(StringArray::from(vec![Some("a"), None, Some("a")]));
//! let out = op.apply(&input, &[Value::Int(10)]).unwrap();
//! let out = out.as_any().downcast_ref::<Int32Array>().unwrap();
//! assert_eq!(out.value(0), out.value(2));
//! assert!(out.is_null(1));
//! assert!((0..10).contains(&out.value(0)));
//! ```
//!
//! The layers, the top first; a module imports only its own layer and those below it
//! (`scripts/check-layers.py` reads this table and enforces it):
//!
//! | layer | modules |
//! |---|---|
//! | the batch executor: looks ops up in the registry | `call` |
//! | the registry: names the kernels | `registry` |
//! | audio ops (they draw with the tensor kernels' row generator and dtypes); video ops | `audio_ops`, `video_ops` |
//! | tensor kernels (they decode and crop with the image kernels' helpers) | `tensor_ops` |
//! | kernels (video: with the `video` feature, FFmpeg's libraries) | `image_ops`, `tabular`, `text`, `audio`, `mel`, `media`, `video`, `video_ends` |
//! | the contract | `op` |
//! | shared resources (tokenizers) | `resources` |
//!
//! This root only documents and re-exports.

mod audio;
mod audio_ops;
mod call;
mod image_ops;
mod media;
mod mel;
mod op;
mod registry;
mod resources;
mod tabular;
mod tensor_ops;
mod text;
#[cfg(feature = "video")]
mod video;
mod video_ends;
mod video_ops;

pub use audio::audio_seconds_from_ends;
pub use audio_ops::{
    AudioSeconds, DecodeAudio, LogMelOp, RandomAudioCrop, SAMPLE_RATE_METADATA_KEY, SpecAugment,
};
pub use call::{
    Call, CallRun, Calls, apply_calls, call_seed, input_array, input_column, input_path, mix, resolve_input,
};
pub use image_ops::{DecodeCenterCrop, DecodeResize, Thumbnail};
pub use op::{Context, DTYPE_METADATA_KEY, Op, OpError, Result, SHAPE_METADATA_KEY, Value, fixed_width};
pub use registry::{lookup, registry};
pub use resources::{Need, NoResources, Resources};
pub use tabular::{Cast, HashBucket};
pub use tensor_ops::{
    CenterCrop, ColorJitter, Grayscale, Normalize, RandomCrop, RandomFlip, RandomMask, RandomResizedCrop,
    ResizedCrop, ToChw, resized_crop_box, shape_of,
};
pub use text::{
    PadTokens, SPECIAL_TOKENS, TOKENIZER_FILE, TOKENIZER_ID_PREFIX, Tokenize, Tokenizers, load_tokenizer,
    tokenizer_id, train_tokenizer,
};
/// The tokenizer type of the `tokenizers` crate, as ops use it.
pub use tokenizers::Tokenizer as TokenizerModel;
pub use video_ends::video_seconds_from_ends;
pub use video_ops::{DecodeFrames, RandomClip, VIDEO, VideoFrames, VideoInfoOp, VideoSeconds};

#[cfg(test)]
mod tests;
