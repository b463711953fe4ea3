//! `pushdown import`: data that is not yet Parquet (torchvision's image folders, WebDataset
//! tar shards, `datasets`' audio folders, JSON Lines) written as a dataset the server serves
//! well, in one command.
//!
//! The dataset is the Hugging Face Hub's layout (`OUT/data/<split>-NNNNN-of-NNNNN.parquet`,
//! media as `struct<bytes, path>`, the features in the footer), so `datasets` reads it back
//! and the server's catalog takes `split` from the names; row groups are sized by bytes for
//! pruning, files by size for shards ([`writer`]). Every input that is not imported is named
//! and counted ([`summary`]); the same input writes the same files; an interrupted import
//! leaves nothing half-written in the dataset. Inputs and the dataset may be local or in an
//! object store (`s3://`, `gs://`, `az://`: [`place`]).
//!
//! | layer | modules |
//! |---|---|
//! | one import | [`run`] |
//! | the kinds | [`media_folder`], [`webdataset`], [`jsonl`] |
//! | folders of media | [`folder`] |
//! | writing, the summary | [`writer`], [`summary`] |
//! | local paths and object stores | [`place`] |

pub mod run;

pub mod media_folder;

pub mod webdataset;

pub mod jsonl;

pub mod folder;

pub mod writer;

pub mod summary;

pub mod place;

pub use run::{ImportOptions, Kind, import};
pub use summary::{Reason, Summary};
