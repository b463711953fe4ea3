//! A video clip's duration from its first and last bytes, for the server's duration index
//! (as [`crate::audio_seconds_from_ends`] for audio): a scan filtered on `video_seconds`
//! learns which clips to skip without fetching them.
//!
//! FFmpeg reads the duration, from a sparse copy of the clip (its ends in place, zeros
//! between). Only where the container's metadata lies wholly within the ends, so that what
//! FFmpeg reads of it is what the whole clip holds; that is checked first by walking the
//! container's top-level structure (sizes and identifiers, no values):
//!
//! * MP4/MOV (an `ftyp` box first): the `moov` box lies within the head (`+faststart`) or
//!   the tail (FFmpeg's default, written after the media data);
//! * Matroska/WebM (an EBML header first): the segment's `Info` (with the duration) and
//!   `Tracks` lie within the head, before its first `Cluster`; a clip written to a pipe
//!   states no duration, and FFmpeg then gives none here (the whole clip must be read).
//!
//! Anything else (other containers, metadata in the middle, a head or tail cut short) is
//! `None`: the index then reads the whole clip, or leaves its row to the filter.

use std::ops::Range;

/// The duration `video_seconds` gives for a clip of `len` bytes, from its first bytes `head`
/// and last bytes `tail` alone; `None` where its container's metadata is not all within them
/// (see the module's documentation), the container states no duration, or this build has
/// no video support.
pub fn video_seconds_from_ends(head: &[u8], tail: &[u8], len: u64) -> Option<f64> {
    let tail = &tail[tail
        .len()
        .saturating_sub(usize::try_from(len).unwrap_or(usize::MAX))..];
    if head.is_empty() || head.len() as u64 > len {
        return None;
    }
    if head.len() as u64 == len {
        return whole(head);
    }
    let ends = Ends { head, tail, len };
    if !(ends.moov_within() || ends.matroska_header_within()) {
        return None;
    }
    sparse(&ends)
}

#[cfg(feature = "video")]
fn whole(clip: &[u8]) -> Option<f64> {
    crate::video::seconds("video_seconds", 0, clip).ok()
}

#[cfg(feature = "video")]
fn sparse(ends: &Ends) -> Option<f64> {
    crate::video::seconds_of_sparse(ends.head, ends.tail, ends.len)
}

#[cfg(not(feature = "video"))]
fn whole(_: &[u8]) -> Option<f64> {
    None
}

#[cfg(not(feature = "video"))]
fn sparse(_: &Ends) -> Option<f64> {
    None
}

/// A clip's first and last bytes.
struct Ends<'a> {
    head: &'a [u8],
    tail: &'a [u8],
    len: u64,
}

/// Matroska's element identifiers (with their length markers, as written).
const EBML: u32 = 0x1A45_DFA3;
const SEGMENT: u32 = 0x1853_8067;
const INFO: u32 = 0x1549_A966;
const TRACKS: u32 = 0x1654_AE6B;
const CLUSTER: u32 = 0x1F43_B675;

impl Ends<'_> {
    /// The bytes at `range`, when they lie within the head or within the tail.
    fn at(&self, range: Range<u64>) -> Option<&[u8]> {
        if range.start > range.end || range.end > self.len {
            return None;
        }
        let tail_start = self.len - self.tail.len() as u64;
        if range.end <= self.head.len() as u64 {
            self.head.get(range.start as usize..range.end as usize)
        } else if range.start >= tail_start {
            self.tail
                .get((range.start - tail_start) as usize..(range.end - tail_start) as usize)
        } else {
            None
        }
    }

    /// Whether the clip is MP4/MOV with its `moov` box within the head or the tail.
    fn moov_within(&self) -> bool {
        if self.head.get(4..8) != Some(b"ftyp") {
            return false;
        }
        let mut offset = 0u64;
        while offset < self.len {
            let Some(header) = self.at(offset..offset + 8) else {
                return false;
            };
            let size = u32::from_be_bytes([header[0], header[1], header[2], header[3]]);
            let size = match size {
                0 => self.len - offset,
                1 => match self.at(offset + 8..offset + 16) {
                    Some(b) => u64::from_be_bytes(b.try_into().unwrap_or_default()),
                    None => return false,
                },
                s => u64::from(s),
            };
            let Some(end) = offset.checked_add(size).filter(|&e| size >= 8 && e <= self.len) else {
                return false;
            };
            if &header[4..8] == b"moov" {
                return self.at(offset..end).is_some();
            }
            offset = end;
        }
        false
    }

    /// Whether the clip is Matroska/WebM with its segment's `Info` and `Tracks` within the
    /// head, before the first cluster.
    fn matroska_header_within(&self) -> bool {
        let Some((EBML, header)) = element(self.head, 0) else {
            return false;
        };
        let Some((SEGMENT, segment)) = element(self.head, header.end) else {
            return false;
        };
        let mut at = segment.start;
        let (mut info, mut tracks) = (false, false);
        while let Some((id, body)) = element(self.head, at) {
            match id {
                CLUSTER => break,
                INFO | TRACKS if body.end > self.head.len() => return false,
                INFO => info = true,
                TRACKS => tracks = true,
                _ => {}
            }
            if info && tracks {
                return true;
            }
            at = body.end;
        }
        false
    }
}

/// The Matroska element at `at` in `bytes`: its identifier and its body's range (which may
/// run past `bytes`); `None` when its header is not all there or its size is unknown.
fn element(bytes: &[u8], at: usize) -> Option<(u32, Range<usize>)> {
    let (id, id_len) = vint(bytes, at, true)?;
    let (size, size_len) = vint(bytes, at + id_len, false)?;
    let start = at + id_len + size_len;
    let unknown = size == (1u64 << (7 * size_len)) - 1;
    if id_len > 4 || unknown {
        return None;
    }
    let end = usize::try_from(size).ok()?.checked_add(start)?;
    Some((u32::try_from(id).ok()?, start..end))
}

/// EBML's variable-length integer at `at`: its value (with the length marker kept, for an
/// identifier) and its length in bytes.
fn vint(bytes: &[u8], at: usize, marker: bool) -> Option<(u64, usize)> {
    let first = *bytes.get(at)?;
    let len = first.leading_zeros() as usize + 1;
    if len > 8 {
        return None;
    }
    let raw = bytes.get(at..at + len)?;
    let mut value = u64::from(if marker {
        first
    } else {
        first & 0xFFu8.checked_shr(len as u32).unwrap_or(0)
    });
    for b in &raw[1..] {
        value = value << 8 | u64::from(*b);
    }
    Some((value, len))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An MP4 of `len` bytes: `ftyp`, then `moov` of `moov` bytes first (`faststart`) or
    /// after the `mdat`.
    fn mp4(len: usize, moov: usize, faststart: bool) -> Vec<u8> {
        let boxed = |kind: &[u8; 4], size: usize| {
            let mut b = vec![0u8; size];
            b[..4].copy_from_slice(&(size as u32).to_be_bytes());
            b[4..8].copy_from_slice(kind);
            b
        };
        let ftyp = boxed(b"ftyp", 24);
        let mdat = boxed(b"mdat", len - 24 - moov);
        let moov = boxed(b"moov", moov);
        let order = if faststart {
            [ftyp, moov, mdat]
        } else {
            [ftyp, mdat, moov]
        };
        order.concat()
    }

    fn ends(clip: &[u8], n: usize) -> Ends<'_> {
        Ends {
            head: &clip[..n.min(clip.len())],
            tail: &clip[clip.len().saturating_sub(n)..],
            len: clip.len() as u64,
        }
    }

    #[test]
    fn mp4_metadata_is_found_in_either_end_or_not_at_all() {
        assert!(ends(&mp4(1 << 20, 4000, false), 16 << 10).moov_within());
        assert!(ends(&mp4(1 << 20, 4000, true), 16 << 10).moov_within());
        // A `moov` longer than the tail (a long clip's tables) needs the middle.
        assert!(!ends(&mp4(1 << 20, 40_000, false), 16 << 10).moov_within());
        assert!(!ends(&mp4(1 << 20, 40_000, true), 16 << 10).moov_within());
        // A box claiming more than the file, or a walk into the unread middle, is no answer.
        let mut lying = mp4(1 << 20, 4000, false);
        lying[24..28].copy_from_slice(&(2u32 << 20).to_be_bytes());
        assert!(!ends(&lying, 16 << 10).moov_within());
        let mut gap = mp4(1 << 20, 4000, false);
        gap[24..28].copy_from_slice(&(1u32 << 19).to_be_bytes());
        assert!(!ends(&gap, 16 << 10).moov_within());
    }

    /// An EBML element: identifier (as written), a one- or eight-byte size, body.
    fn ebml(id: u32, body: &[u8], long_size: bool) -> Vec<u8> {
        let mut out: Vec<u8> = id.to_be_bytes().iter().copied().skip_while(|b| *b == 0).collect();
        if long_size {
            out.push(0x01);
            out.extend_from_slice(&(body.len() as u64).to_be_bytes()[1..]);
        } else {
            out.push(0x80 | body.len() as u8);
        }
        out.extend_from_slice(body);
        out
    }

    fn matroska(children: &[Vec<u8>]) -> Vec<u8> {
        let mut clip = ebml(EBML, &[0x42, 0x86, 0x81, 0x01], false);
        clip.extend(ebml(SEGMENT, &children.concat(), true));
        clip
    }

    #[test]
    fn matroska_needs_info_and_tracks_before_the_first_cluster_in_the_head() {
        let seek_head = ebml(0x114D_9B74, &[0; 40], false);
        let info = ebml(INFO, &[0; 30], false);
        let tracks = ebml(TRACKS, &[0; 60], false);
        let cluster = ebml(CLUSTER, &vec![0; 1 << 20], true);
        let good = matroska(&[seek_head.clone(), info.clone(), tracks.clone(), cluster.clone()]);
        assert!(ends(&good, 4096).matroska_header_within());
        assert!(!ends(&good, 100).matroska_header_within(), "tracks past the head");
        let late = matroska(&[seek_head, info, cluster.clone(), tracks]);
        assert!(!ends(&late, 4096).matroska_header_within());
        assert!(!ends(&cluster, 4096).matroska_header_within(), "no EBML header");
        assert!(!ends(&mp4(1 << 20, 4000, false), 4096).matroska_header_within());
    }

    #[test]
    fn other_bytes_and_cut_ends_are_no_answer() {
        assert_eq!(video_seconds_from_ends(&[], &[], 0), None);
        assert_eq!(
            video_seconds_from_ends(b"RIFF\0\0\0\0WAVE", &[0; 16], 1 << 20),
            None
        );
        let clip = mp4(1 << 20, 4000, false);
        assert_eq!(
            video_seconds_from_ends(&clip[..4096], &clip[clip.len() - 100..], 1 << 20),
            None
        );
    }
}
