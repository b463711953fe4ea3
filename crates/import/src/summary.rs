//! What an import did: rows and files written, bytes read, and every input it could not
//! import, by reason, each named (the first [`NAMED`] of a reason by path) and counted.

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;

/// How many inputs of one reason the summary names; the count covers the rest.
pub const NAMED: usize = 20;

/// Why an input was not imported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// A file or tar member the format's own reader refuses (not an image, not audio, a
    /// truncated tar, invalid UTF-8 text, a `.cls` that is not an integer, invalid JSON).
    Corrupt,
    /// A file the import could not read (permissions, I/O errors).
    Unreadable,
    /// A sample with no label: a file outside every class folder, or a media file that no
    /// metadata row names.
    MissingLabel,
    /// A metadata row whose `file_name` names no file.
    MissingFile,
    /// A file whose extension the kind does not import (torchvision's `ImageFolder` skips
    /// them without a word; here they are counted).
    OtherFile,
}

impl Reason {
    /// The reason in words, as the summary prints it.
    pub fn describe(self) -> &'static str {
        match self {
            Reason::Corrupt => "corrupt (the format's reader refuses it)",
            Reason::Unreadable => "unreadable",
            Reason::MissingLabel => "no label (outside the class folders, or no metadata row)",
            Reason::MissingFile => "metadata row naming no file",
            Reason::OtherFile => "not a file of this kind (extension)",
        }
    }
}

/// The inputs skipped for one reason.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Skipped {
    /// How many.
    pub count: u64,
    /// The first [`NAMED`], each with what was wrong.
    pub named: Vec<String>,
}

/// The outcome of one import.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Summary {
    /// The kind imported (`imagefolder`, `webdataset`, `audiofolder`, `jsonl`).
    pub kind: String,
    /// Rows written.
    pub rows: u64,
    /// The dataset's files, relative to its folder, in order.
    pub files: Vec<String>,
    /// Bytes of input read.
    pub bytes_read: u64,
    /// Bytes of Parquet written.
    pub bytes_written: u64,
    /// Inputs not imported, by reason.
    pub skipped: BTreeMap<Reason, Skipped>,
    /// Wall-clock seconds.
    pub seconds: f64,
}

impl Summary {
    /// An empty summary for `kind`.
    pub fn new(kind: &str) -> Self {
        Summary {
            kind: kind.to_owned(),
            ..Summary::default()
        }
    }

    /// Counts `input` as skipped for `reason`, `detail` saying what was wrong.
    pub fn skip(&mut self, reason: Reason, input: &str, detail: &str) {
        let entry = self.skipped.entry(reason).or_default();
        entry.count += 1;
        if entry.named.len() < NAMED {
            entry.named.push(if detail.is_empty() {
                input.to_owned()
            } else {
                format!("{input}: {detail}")
            });
        }
    }

    /// Inputs skipped, all reasons together.
    pub fn skipped_total(&self) -> u64 {
        self.skipped.values().map(|s| s.count).sum()
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "imported {} rows ({}) into {} file(s), {:.1} MB read, {:.1} MB written, in {:.1} s ({:.0} rows/s)",
            self.rows,
            self.kind,
            self.files.len(),
            self.bytes_read as f64 / 1e6,
            self.bytes_written as f64 / 1e6,
            self.seconds,
            self.rows as f64 / self.seconds.max(1e-9),
        )?;
        for file in &self.files {
            writeln!(f, "  {file}")?;
        }
        if self.skipped.is_empty() {
            return writeln!(f, "skipped: none");
        }
        writeln!(f, "skipped {} input(s):", self.skipped_total())?;
        for (reason, skipped) in &self.skipped {
            writeln!(f, "  {}: {}", reason.describe(), skipped.count)?;
            for name in &skipped.named {
                writeln!(f, "    {name}")?;
            }
            if skipped.count > skipped.named.len() as u64 {
                writeln!(
                    f,
                    "    ... and {} more",
                    skipped.count - skipped.named.len() as u64
                )?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_first_of_each_reason_and_counts_all() {
        let mut s = Summary::new("imagefolder");
        for i in 0..(NAMED + 5) {
            s.skip(Reason::Corrupt, &format!("cat/{i}.jpg"), "not an image");
        }
        s.skip(Reason::MissingLabel, "stray.jpg", "");
        assert_eq!(s.skipped_total(), NAMED as u64 + 6);
        assert_eq!(s.skipped[&Reason::Corrupt].named.len(), NAMED);
        assert_eq!(s.skipped[&Reason::Corrupt].named[0], "cat/0.jpg: not an image");
        let text = s.to_string();
        assert!(text.contains("... and 5 more"), "{text}");
        assert!(text.contains("stray.jpg"), "{text}");
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json["skipped"]["missing_label"]["count"], 1);
    }
}
