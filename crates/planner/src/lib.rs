//! Pipelines and the planner that splits them between the storage side and the trainer side.
//!
//! A trainer describes its input pipeline once, as a [`Pipeline`]: a dataset and an ordered
//! list of [`Step`]s. [`plan`] splits it:
//!
//! ```text
//!  Pipeline: select → filter → … → shuffle → batch
//!      │ plan(): prune unused columns, hoist filters,
//!      │         push the longest deterministic row-wise prefix
//!      ├──▶ Fragment  (server: projection, predicate, reducing ops)
//!      └──▶ client steps (trainer: shuffle, random ops, batch)
//! ```
//!
//! The rules are the legal moves of the design: a filter moves earlier past any row-wise step
//! that does not write a column it reads (a shuffle is a permutation, so filtering commutes
//! with it), and so does a select past steps that only read columns it keeps; only the longest prefix of deterministic, row-wise steps may run on the server,
//! so nothing random or order-dependent is ever done (or cached) away from the trainer.
//!
//! The planner is pure: no I/O, no async runtime, no query engine. It parses filter
//! expressions with `sqlparser` only to learn which columns they read.
//!
//! ```
//! use arrow::datatypes::{DataType, Field, Schema};
//! use pushdown_planner::{plan, Pipeline, Side, Step};
//! let schema = Schema::new(vec![
//!     Field::new("id", DataType::Int64, false),
//!     Field::new("image", DataType::Binary, false),
//!     Field::new("label", DataType::Int32, false),
//! ]);
//! let pipeline = Pipeline::new("images")
//!     .shuffle(1000)
//!     .filter("label < 100")
//!     .select(["image", "label"])
//!     .batch(256);
//! let plan = plan(&pipeline, &schema).unwrap();
//! assert_eq!(plan.fragment.columns, vec!["image", "label"]);
//! assert_eq!(plan.fragment.predicate.as_deref(), Some("(label < 100)"));
//! assert_eq!(plan.client_steps, vec![Step::Shuffle { buffer: 1000 }, Step::Batch { size: 256, drop_last: false }]);
//! assert!(plan.placements.iter().any(|p| p.side == Side::Server && p.step.starts_with("filter")));
//! ```
//!
//! The layers, the top first; a module imports only its own layer and those below it
//! (`scripts/check-layers.py` reads this table and enforces it):
//!
//! | layer | modules |
//! |---|---|
//! | costed placement | `cost` |
//! | the rules | `split` |
//! | the user's description | `pipeline` |
//! | errors, expressions | `error`, `expr` |
//!
//! This root only documents and re-exports.

mod cost;
mod error;
mod expr;
mod pipeline;
mod split;

pub use cost::{
    CostedPlan, Environment, Estimate, OpCost, parse_bandwidth, plan_with_profile, plan_with_profile_limited,
};
pub use error::PlanError;
pub use expr::columns_read;
pub use pipeline::{BucketStep, MapStep, PackStep, Pipeline, Step};
pub use split::{Placement, Plan, Side, plan, plan_limited};

#[cfg(test)]
mod tests;
