//! The registered ops, by name.

use crate::audio_ops::{AudioSeconds, DecodeAudio, LogMelOp, RandomAudioCrop, SpecAugment};
use crate::image_ops::{DecodeCenterCrop, DecodeResize, Thumbnail};
use crate::op::Op;
use crate::tabular::{Cast, HashBucket};
use crate::tensor_ops::{
    CenterCrop, ColorJitter, Grayscale, Normalize, RandomCrop, RandomFlip, RandomMask, RandomResizedCrop,
    ToChw,
};
use crate::text::{PadTokens, Tokenize};
use crate::video_ops::{DecodeFrames, RandomClip, VideoFrames, VideoInfoOp, VideoSeconds};

static OPS: [&dyn Op; 26] = [
    &DecodeResize,
    &DecodeCenterCrop,
    &Thumbnail,
    &HashBucket,
    &Cast,
    &CenterCrop,
    &Grayscale,
    &Normalize,
    &ToChw,
    &RandomCrop,
    &RandomResizedCrop,
    &RandomFlip,
    &ColorJitter,
    &Tokenize,
    &PadTokens,
    &RandomMask,
    &DecodeAudio,
    &LogMelOp,
    &AudioSeconds,
    &RandomAudioCrop,
    &SpecAugment,
    &DecodeFrames,
    &VideoFrames,
    &VideoInfoOp,
    &VideoSeconds,
    &RandomClip,
];

/// Every registered op.
pub fn registry() -> &'static [&'static dyn Op] {
    &OPS
}

/// The op called `name`.
pub fn lookup(name: &str) -> Option<&'static dyn Op> {
    OPS.iter().copied().find(|op| op.name() == name)
}
