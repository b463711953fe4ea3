//! One import: the kind, its inputs, the dataset folder, and the summary it returns.

use std::path::PathBuf;
use std::str::FromStr;
use std::time::Instant;

use anyhow::Result;
use indicatif::{ProgressBar, ProgressStyle};

use crate::media_folder::{self, Media};
use crate::place::{self, Output};
use crate::summary::Summary;
use crate::{jsonl, webdataset};

/// What the inputs are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A folder of class sub-folders of images (torchvision's `ImageFolder`), or of images
    /// with a `metadata.csv`/`metadata.jsonl`.
    ImageFolder,
    /// WebDataset tar shards.
    WebDataset,
    /// A folder of audio files with a `metadata.csv`/`metadata.jsonl`, or in class sub-folders
    /// (`datasets`' `audiofolder`).
    AudioFolder,
    /// JSON Lines files.
    Jsonl,
}

impl Kind {
    /// The kind's name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Kind::ImageFolder => "imagefolder",
            Kind::WebDataset => "webdataset",
            Kind::AudioFolder => "audiofolder",
            Kind::Jsonl => "jsonl",
        }
    }

    /// Every kind.
    pub const ALL: [Kind; 4] = [
        Kind::ImageFolder,
        Kind::WebDataset,
        Kind::AudioFolder,
        Kind::Jsonl,
    ];
}

impl FromStr for Kind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Kind::ALL.into_iter().find(|k| k.name() == s).ok_or_else(|| {
            let names: Vec<&str> = Kind::ALL.iter().map(|k| k.name()).collect();
            format!("unknown kind `{s}`: one of {}", names.join(", "))
        })
    }
}

/// What to import, and where.
#[derive(Debug, Clone)]
pub struct ImportOptions {
    /// What the inputs are.
    pub kind: Kind,
    /// A folder (`imagefolder`, `audiofolder`: exactly one), or files (shards, JSONL files)
    /// and folders of them; local paths or object-store URLs (`s3://bucket/prefix`).
    pub inputs: Vec<PathBuf>,
    /// The dataset's folder (its name is the dataset's name on the server): a local path or
    /// an object-store URL.
    pub out: PathBuf,
    /// The split the rows are (`train`, `validation`, `test`): the files' names say it.
    pub split: String,
    /// A progress bar on stderr.
    pub progress: bool,
}

impl ImportOptions {
    /// Imports `inputs` of `kind` into `out` as the `train` split, without a progress bar.
    pub fn new(kind: Kind, inputs: Vec<PathBuf>, out: PathBuf) -> Self {
        ImportOptions {
            kind,
            inputs,
            out,
            split: "train".into(),
            progress: false,
        }
    }
}

/// Runs the import; inputs it cannot import are counted in the summary, not fatal. Fails only
/// where nothing sensible can be written (no inputs, an output folder it cannot create, a
/// store that cannot be reached). Inputs and the output may be object-store URLs
/// ([`crate::place`]); called from inside a tokio runtime, the import runs on a thread of its
/// own (its store requests block on a runtime of theirs).
pub fn import(options: &ImportOptions) -> Result<Summary> {
    if tokio::runtime::Handle::try_current().is_ok() {
        return std::thread::scope(|s| {
            s.spawn(|| import_here(options))
                .join()
                .unwrap_or_else(|_| Err(anyhow::anyhow!("the import panicked")))
        });
    }
    import_here(options)
}

fn import_here(options: &ImportOptions) -> Result<Summary> {
    let start = Instant::now();
    let mut summary = Summary::new(options.kind.name());
    let bar = if options.progress {
        let bar = ProgressBar::new(0);
        bar.set_style(
            ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} ({per_sec}, {eta} left)")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        bar.set_message(format!("importing {}", options.kind.name()));
        bar
    } else {
        ProgressBar::hidden()
    };
    let folder = || -> Result<&PathBuf> {
        match options.inputs.as_slice() {
            [one] => Ok(one),
            _ => anyhow::bail!("{}: give exactly one folder", options.kind.name()),
        }
    };
    let out = Output::open(&options.out)?;
    let (out, split) = (&out, options.split.as_str());
    match options.kind {
        Kind::ImageFolder => media_folder::import(folder()?, Media::Image, out, split, &mut summary, &bar)?,
        Kind::AudioFolder => media_folder::import(folder()?, Media::Audio, out, split, &mut summary, &bar)?,
        Kind::WebDataset => {
            let shards = place::inputs(&options.inputs, &|name| name.ends_with(".tar"))?;
            webdataset::import(&shards, out, split, &mut summary, &bar)?
        }
        Kind::Jsonl => {
            let files = place::inputs(&options.inputs, &|name| {
                name.ends_with(".jsonl") || name.ends_with(".ndjson")
            })?;
            jsonl::import(&files, out, split, &mut summary, &bar)?
        }
    }
    bar.finish_and_clear();
    summary.seconds = start.elapsed().as_secs_f64();
    Ok(summary)
}
