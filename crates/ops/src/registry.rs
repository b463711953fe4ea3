//! The registered ops, by name.

use crate::image_ops::{DecodeResize, Thumbnail};
use crate::op::Op;
use crate::tabular::{Cast, HashBucket};
use crate::tensor_ops::{CenterCrop, ColorJitter, Grayscale, Normalize, RandomCrop, RandomFlip, RandomMask};
use crate::text::{PadTokens, Tokenize};

static OPS: [&dyn Op; 13] = [
    &DecodeResize,
    &Thumbnail,
    &HashBucket,
    &Cast,
    &CenterCrop,
    &Grayscale,
    &Normalize,
    &RandomCrop,
    &RandomFlip,
    &ColorJitter,
    &Tokenize,
    &PadTokens,
    &RandomMask,
];

/// Every registered op.
pub fn registry() -> &'static [&'static dyn Op] {
    &OPS
}

/// The op called `name`.
pub fn lookup(name: &str) -> Option<&'static dyn Op> {
    OPS.iter().copied().find(|op| op.name() == name)
}
