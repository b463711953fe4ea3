//! Folders of media files: torchvision's `ImageFolder` rule for classes and order, and the
//! checks that tell a media file from a corrupt one.
//!
//! torchvision (`datasets/folder.py`): the classes are the folder's sub-folders (every one,
//! hidden included), sorted by name, labelled `0..n` in that order (`class_to_idx`); a class's
//! files are found by `os.walk` (following links), its folders sorted by path and each folder's
//! files sorted by name, kept where the name, lower-cased, ends with an allowed extension.
//! Files directly in the folder belong to no class. Here every file the rule leaves out is
//! counted ([`crate::summary::Reason`]), never dropped unsaid.

use std::io::Cursor;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::place::Folder;

/// torchvision's `IMG_EXTENSIONS`.
pub const IMAGE_EXTENSIONS: &[&str] = &[
    ".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp",
];
/// `datasets`' `AudioFolder` extensions (those libsndfile reads, MP3 and Opus).
pub const AUDIO_EXTENSIONS: &[&str] = &[
    ".aiff", ".au", ".avr", ".caf", ".flac", ".htk", ".svx", ".mat4", ".mat5", ".mpc2k", ".ogg", ".paf",
    ".pvf", ".raw", ".rf64", ".sd2", ".sds", ".ircam", ".voc", ".w64", ".wav", ".nist", ".wavex", ".wve",
    ".xi", ".mp3", ".opus",
];

/// One file a folder holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The path relative to the folder, `/`-separated (what the dataset's `path` says).
    pub relative: String,
    /// The class's index, where the file is in a class folder.
    pub label: Option<usize>,
}

/// A folder's files, as torchvision's rule orders them.
#[derive(Debug, Default)]
pub struct Listing {
    /// Sub-folders that could not be listed (`os.walk` passes over them), with why.
    pub unreadable: Vec<(String, String)>,
    /// The class names, sorted: label `i` is `classes[i]`.
    pub classes: Vec<String>,
    /// The files with an allowed extension: each class's in order, then (unlabelled) those
    /// directly in the folder.
    pub files: Vec<Entry>,
    /// Files with another extension.
    pub others: Vec<String>,
}

/// A class's files: each folder under it (`class/sub/...`) with its files' names.
type Tree = Vec<(String, Vec<String>)>;
/// A folder's classes (sorted, each with its tree) and the files directly in it.
type Classes = (Vec<(String, Tree)>, Vec<String>);

/// Lists `folder` by torchvision's rule, keeping files whose lower-cased name ends with one
/// of `extensions`. Under an object-store prefix, a class is the first part of the keys that
/// have more than one (a store has no empty folders and no links).
pub fn list(folder: &Folder, extensions: &[&str]) -> Result<Listing> {
    let mut listing = Listing::default();
    let (classes, mut top_files) = match folder {
        Folder::Local(dir) => local_tree(dir, &mut listing.unreadable)?,
        Folder::Objects(store, prefix) => object_tree(store.list(prefix)?),
    };
    for (label, (class, mut folders)) in classes.into_iter().enumerate() {
        listing.classes.push(class);
        folders.sort();
        for (folder, mut names) in folders {
            names.sort();
            for name in names {
                let relative = format!("{folder}/{name}");
                if allowed(&name, extensions) {
                    listing.files.push(Entry {
                        relative,
                        label: Some(label),
                    });
                } else {
                    listing.others.push(relative);
                }
            }
        }
    }
    top_files.sort();
    for name in top_files {
        if allowed(&name, extensions) {
            listing.files.push(Entry {
                relative: name,
                label: None,
            });
        } else if !name.starts_with("metadata.") {
            listing.others.push(name);
        }
    }
    Ok(listing)
}

/// A local folder's classes (sorted, each with its tree) and the files directly in it.
fn local_tree(dir: &Path, unreadable: &mut Vec<(String, String)>) -> Result<Classes> {
    let (mut classes, top_files) =
        folders_and_files(dir).with_context(|| format!("listing {}", dir.display()))?;
    classes.sort();
    let trees = classes
        .into_iter()
        .map(|class| {
            let mut folders = Vec::new();
            let mut seen = std::collections::HashSet::new();
            walk(&dir.join(&class), &class, &mut folders, &mut seen, unreadable);
            (class, folders)
        })
        .collect();
    Ok((trees, top_files))
}

/// The same from an object store's keys (relative to the folder, sorted).
fn object_tree(keys: Vec<String>) -> Classes {
    let mut classes: std::collections::BTreeMap<String, std::collections::BTreeMap<String, Vec<String>>> =
        Default::default();
    let mut top_files = Vec::new();
    for key in keys {
        match (key.split_once('/'), key.rsplit_once('/')) {
            (Some((class, _)), Some((folder, name))) => classes
                .entry(class.to_owned())
                .or_default()
                .entry(folder.to_owned())
                .or_default()
                .push(name.to_owned()),
            _ => top_files.push(key),
        }
    }
    let trees = classes
        .into_iter()
        .map(|(class, folders)| (class, folders.into_iter().collect()))
        .collect();
    (trees, top_files)
}

/// `os.walk(path, followlinks=True)`: each folder (as `relative`) with its files' names. A
/// folder that cannot be listed is noted in `unreadable` and passed over, as `os.walk` does;
/// a link back to a folder already walked (`seen`, by canonical path) is not followed again.
fn walk(
    path: &Path,
    relative: &str,
    out: &mut Vec<(String, Vec<String>)>,
    seen: &mut std::collections::HashSet<PathBuf>,
    unreadable: &mut Vec<(String, String)>,
) {
    if let Ok(canonical) = std::fs::canonicalize(path)
        && !seen.insert(canonical)
    {
        return;
    }
    let (subfolders, files) = match folders_and_files(path) {
        Ok(split) => split,
        Err(e) => {
            unreadable.push((relative.to_owned(), e.to_string()));
            return;
        }
    };
    out.push((relative.to_owned(), files));
    for name in subfolders {
        walk(
            &path.join(&name),
            &format!("{relative}/{name}"),
            out,
            seen,
            unreadable,
        );
    }
}

/// The names in `dir`: its folders, then its files. `os.scandir(...).is_dir()` follows
/// links, as `metadata` does.
fn folders_and_files(dir: &Path) -> std::io::Result<(Vec<String>, Vec<String>)> {
    let (mut folders, mut files) = (Vec::new(), Vec::new());
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if std::fs::metadata(entry.path()).is_ok_and(|m| m.is_dir()) {
            folders.push(name);
        } else {
            files.push(name);
        }
    }
    Ok((folders, files))
}

/// torchvision's `has_file_allowed_extension`.
pub fn allowed(name: &str, extensions: &[&str]) -> bool {
    let lower = name.to_lowercase();
    extensions.iter().any(|e| lower.ends_with(e))
}

/// Why `bytes` (a file named with extension `ext`, lower-case, no dot) is not an image: its
/// header must read as an image's. PPM and PGM (torchvision's, not the server's decoder's)
/// pass unchecked.
pub fn image_problem(bytes: &[u8], ext: &str) -> Option<String> {
    if matches!(ext, "ppm" | "pgm") {
        return None;
    }
    contained(|| {
        let reader = match image::ImageReader::new(Cursor::new(bytes)).with_guessed_format() {
            Ok(r) => r,
            Err(e) => return Some(e.to_string()),
        };
        if reader.format().is_none() {
            return Some("not an image format the server decodes".into());
        }
        reader.into_dimensions().err().map(|e| e.to_string())
    })
}

/// `check`, with a panic of the decoder it calls reported as the input's problem.
fn contained(check: impl FnOnce() -> Option<String>) -> Option<String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(check))
        .unwrap_or_else(|_| Some("the decoder panicked on it".into()))
}

/// Why `bytes` (with extension `ext`, lower-case, no dot) is not audio, for the containers
/// the server decodes (WAV, FLAC, MP3, Ogg); others pass unchecked.
pub fn audio_problem(bytes: &[u8], ext: &str) -> Option<String> {
    use symphonia::core::formats::FormatOptions;
    use symphonia::core::io::MediaSourceStream;
    use symphonia::core::meta::MetadataOptions;
    use symphonia::core::probe::Hint;
    if !matches!(ext, "wav" | "flac" | "mp3" | "ogg") {
        return None;
    }
    contained(|| {
        let source = MediaSourceStream::new(Box::new(Cursor::new(bytes.to_vec())), Default::default());
        let mut hint = Hint::new();
        hint.with_extension(ext);
        let probe = symphonia::default::get_probe();
        match probe.format(
            &hint,
            source,
            &FormatOptions::default(),
            &MetadataOptions::default(),
        ) {
            Ok(probed) if probed.format.default_track().is_some() => None,
            Ok(_) => Some("no audio track".into()),
            Err(e) => Some(e.to_string()),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::place::{Store, child};
    use object_store::memory::InMemory;
    use object_store::path::Path as Key;
    use std::sync::Arc;

    #[test]
    fn lists_classes_and_files_in_torchvisions_order() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        for f in [
            "dog/b.JPG",
            "dog/a.png",
            "dog/z/deep.jpg",
            "cat/x.jpeg",
            "cat/notes.txt",
            "stray.jpg",
        ] {
            let path = p.join(f);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, b"x").unwrap();
        }
        std::fs::create_dir_all(p.join(".hidden")).unwrap();
        let l = list(&Folder::Local(p.to_owned()), IMAGE_EXTENSIONS).unwrap();
        assert_eq!(l.classes, vec![".hidden", "cat", "dog"]);
        let files: Vec<(&str, Option<usize>)> =
            l.files.iter().map(|e| (e.relative.as_str(), e.label)).collect();
        assert_eq!(
            files,
            vec![
                ("cat/x.jpeg", Some(1)),
                ("dog/a.png", Some(2)),
                ("dog/b.JPG", Some(2)),
                ("dog/z/deep.jpg", Some(2)),
                ("stray.jpg", None),
            ]
        );
        assert_eq!(l.others, vec!["cat/notes.txt"]);

        // The same tree under a store's prefix (no empty folder there: no `.hidden` class),
        // beside a sibling prefix that must not leak in.
        let store = Store::from_store(Arc::new(InMemory::new()), "memory://");
        let prefix = Key::from("sets/pets");
        for f in [
            "dog/b.JPG",
            "dog/a.png",
            "dog/z/deep.jpg",
            "cat/x.jpeg",
            "cat/notes.txt",
            "stray.jpg",
        ] {
            store.put(&child(&prefix, f), f.as_bytes()).unwrap();
        }
        store.put(&Key::from("sets/pets2/fish/f.jpg"), b"x").unwrap();
        let o = list(
            &Folder::Objects(Arc::clone(&store), prefix.clone()),
            IMAGE_EXTENSIONS,
        )
        .unwrap();
        assert_eq!(o.classes, vec!["cat", "dog"]);
        let shifted: Vec<(&str, Option<usize>)> = files.iter().map(|&(f, l)| (f, l.map(|l| l - 1))).collect();
        let got: Vec<(&str, Option<usize>)> =
            o.files.iter().map(|e| (e.relative.as_str(), e.label)).collect();
        assert_eq!(got, shifted);
        assert_eq!(o.others, l.others);
        let folder = Folder::Objects(store, prefix);
        let read = folder.read_many(&["dog/z/deep.jpg", "cat/gone.jpg"]);
        assert_eq!(read[0].as_ref().unwrap(), b"dog/z/deep.jpg");
        assert!(read[1].is_err());
        assert_eq!(folder.read_optional("metadata.csv").unwrap(), None);
    }

    #[test]
    fn tells_media_from_garbage() {
        assert!(image_problem(b"not an image at all", "jpg").is_some());
        assert_eq!(image_problem(b"P6 unchecked", "ppm"), None);
        let mut png = Vec::new();
        image::RgbImage::new(2, 2)
            .write_to(&mut Cursor::new(&mut png), image::ImageFormat::Png)
            .unwrap();
        assert_eq!(image_problem(&png, "png"), None);
        assert!(audio_problem(b"RIFF garbage", "wav").is_some());
        assert_eq!(audio_problem(b"anything", "aiff"), None);
    }
}
