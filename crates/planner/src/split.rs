//! The split itself: validate a pipeline against its schema, hoist filters, prune
//! columns and push the longest deterministic row-wise prefix into the [`Fragment`].

use std::collections::BTreeSet;
use std::fmt;

use arrow::datatypes::{Field, Schema};
use pushdown_protocol::Fragment;

use crate::error::PlanError;
use crate::pipeline::{Pipeline, Step};

/// Which side of the network a step runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Side {
    Server,
    Client,
}

impl fmt::Display for Side {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Side::Server => "server",
            Side::Client => "client",
        })
    }
}

/// One decision of the planner, with the reason that justified it.
#[derive(Debug, Clone, PartialEq)]
pub struct Placement {
    /// The step as written in the pipeline (after hoisting).
    pub step: String,
    pub side: Side,
    pub reason: String,
}

/// The split of a pipeline.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// What the server runs.
    pub fragment: Fragment,
    /// What the client runs on the fragment's output, in order.
    pub client_steps: Vec<Step>,
    pub placements: Vec<Placement>,
    /// Dataset columns no step reads, never fetched.
    pub pruned_columns: Vec<String>,
}

impl Plan {
    /// A human-readable account of every decision.
    pub fn explain(&self) -> String {
        use fmt::Write;
        let mut out = String::new();
        let _ = writeln!(out, "dataset: {}", self.fragment.dataset);
        let width = self.placements.iter().map(|p| p.step.len()).max().unwrap_or(0);
        for p in &self.placements {
            let _ = writeln!(out, "  {:<6}  {:<width$}  {}", p.side, p.step, p.reason);
        }
        let _ = writeln!(
            out,
            "server fragment: columns [{}], predicate {}",
            self.fragment.columns.join(", "),
            self.fragment.predicate.as_deref().unwrap_or("none")
        );
        if !self.pruned_columns.is_empty() {
            let _ = writeln!(
                out,
                "pruned columns (never read): {}",
                self.pruned_columns.join(", ")
            );
        }
        out
    }
}

/// Splits `pipeline` over a dataset whose schema is `schema`, pushing every legal op (the
/// static placement; [`crate::plan_with_profile`] chooses by measured cost).
pub fn plan(pipeline: &Pipeline, schema: &Schema) -> Result<Plan, PlanError> {
    plan_limited(pipeline, schema, usize::MAX)
}

/// [`plan`], with at most `max_server_ops` map steps pushed to the server.
pub fn plan_limited(pipeline: &Pipeline, schema: &Schema, max_server_ops: usize) -> Result<Plan, PlanError> {
    let steps = pipeline.steps();
    validate(steps, schema)?;
    let (steps, hoisted) = hoist(steps);

    let split = server_prefix_len(&steps, max_server_ops);
    let (server, client) = steps.split_at(split);
    // Did the op budget (not a rule) end the server prefix?
    let cost_cut = client
        .first()
        .is_some_and(|s| matches!(s, Step::Map(_)) && s.is_deterministic())
        && server.iter().filter(|s| matches!(s, Step::Map(_))).count() == max_server_ops;
    if let Some((index, step)) = client
        .iter()
        .enumerate()
        .find(|(_, s)| matches!(s, Step::Filter { .. }))
    {
        return Err(PlanError::Unsupported {
            index: split + index,
            step: step.to_string(),
            reason:
                "a filter must run on the server: before `batch`, and on source columns (not an op's output)"
                    .into(),
        });
    }

    // Columns after the server prefix, then pruned to what the client side needs.
    let mut columns: Vec<String> = schema.fields().iter().map(|f| f.name().clone()).collect();
    let mut predicates = Vec::new();
    let mut ops = Vec::new();
    for step in server {
        match step {
            Step::Select { columns: c } => columns = c.clone(),
            Step::Filter { expr } => predicates.push(format!("({expr})")),
            Step::Map(m) => {
                let output = m.output().to_owned();
                if !columns.contains(&output) {
                    columns.push(output);
                }
                ops.push(m.call());
            }
            Step::Shuffle { .. } | Step::Batch { .. } | Step::Pack(_) | Step::BucketBy(_) => {}
        }
    }
    let needed = client_needs(client, &columns);
    columns.retain(|c| needed.contains(c));
    let server_reads: Vec<String> = server.iter().flat_map(Step::reads).collect();
    let read: BTreeSet<&str> = columns.iter().chain(&server_reads).map(String::as_str).collect();
    let pruned_columns = schema
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .filter(|c| !read.contains(c.as_str()))
        .collect();

    let placements = place_steps(&steps, split, cost_cut, &hoisted);

    Ok(Plan {
        fragment: Fragment {
            dataset: pipeline.dataset.clone(),
            columns,
            predicate: (!predicates.is_empty()).then(|| predicates.join(" AND ")),
            ops,
        },
        client_steps: client.to_vec(),
        placements,
        pruned_columns,
    })
}

/// Where the server prefix of `steps` ends: the first step that is not deterministic and
/// row-wise, that filters on an op's output, or that is a map past the `max_server_ops` budget.
fn server_prefix_len(steps: &[Step], max_server_ops: usize) -> usize {
    // The longest deterministic row-wise prefix goes to the server. A fragment filters
    // before it maps, so the prefix also ends at a filter on a column a server op wrote.
    let mut written: BTreeSet<String> = BTreeSet::new();
    let mut maps = 0;
    steps
        .iter()
        .position(|s| {
            let reads_op_output =
                matches!(s, Step::Filter { .. }) && s.reads().iter().any(|c| written.contains(c));
            written.extend(s.writes());
            let over_budget = matches!(s, Step::Map(_)) && {
                maps += 1;
                maps > max_server_ops
            };
            !(s.is_deterministic() && s.is_row_wise()) || reads_op_output || over_budget
        })
        .unwrap_or(steps.len())
}

/// The side of every step (the first `split` run on the server) and the reason for it;
/// `cost_cut`: the op budget ended the server prefix.
fn place_steps(steps: &[Step], split: usize, cost_cut: bool, hoisted: &[Option<String>]) -> Vec<Placement> {
    steps
        .iter()
        .enumerate()
        .map(|(i, step)| {
            let side = if i < split { Side::Server } else { Side::Client };
            let mut reason = match (side, step) {
                (Side::Server, Step::Select { .. }) => {
                    "projection pushed into the Parquet reader".to_string()
                }
                (Side::Server, Step::Map(_)) => {
                    "deterministic op at the source: its output crosses the network, not its input"
                        .to_string()
                }
                (Side::Server, Step::Filter { .. }) => {
                    "filter at the source: row groups pruned by statistics, rows dropped before the network"
                        .to_string()
                }
                (Side::Client, s) if !s.is_deterministic() => "random: must run in the trainer".to_string(),
                (Side::Client, s) if !s.is_row_wise() => "order-dependent: runs in the trainer".to_string(),
                (Side::Client, Step::Map(_)) if i == split && cost_cut => {
                    "kept in the trainer: pushing it would lower the estimated throughput".to_string()
                }
                (Side::Client, _)
                    if cost_cut
                        && steps[split..i]
                            .iter()
                            .all(|s| s.is_deterministic() && s.is_row_wise()) =>
                {
                    "after an op kept in the trainer: the server runs only the prefix before it".to_string()
                }
                (Side::Client, _) => "after the first random or order-dependent step".to_string(),
                (Side::Server, _) => "deterministic row-wise prefix".to_string(),
            };
            if let Some(past) = hoisted.get(i).and_then(Option::as_ref) {
                reason.push_str(&format!(" (hoisted before {past})"));
            }
            Placement {
                step: step.to_string(),
                side,
                reason,
            }
        })
        .collect()
}

/// Checks every column reference, op and parameter against what is available at that step.
fn validate(steps: &[Step], schema: &Schema) -> Result<(), PlanError> {
    let mut available: Vec<Field> = schema.fields().iter().map(|f| f.as_ref().clone()).collect();
    let names = |fields: &[Field]| {
        fields
            .iter()
            .map(|f| f.name().as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    for (index, step) in steps.iter().enumerate() {
        let unsupported = |reason: String| PlanError::Unsupported {
            index,
            step: step.to_string(),
            reason,
        };
        let reads = step.reads_checked().map_err(|reason| PlanError::BadExpression {
            index,
            step: step.to_string(),
            reason,
        })?;
        if let Some(column) = reads.iter().find(|c| !available.iter().any(|f| f.name() == *c)) {
            return Err(PlanError::UnknownColumn {
                index,
                step: step.to_string(),
                column: column.clone(),
                available: names(&available),
            });
        }
        match step {
            Step::Select { columns } => {
                available = columns
                    .iter()
                    .filter_map(|c| available.iter().find(|f| f.name() == c).cloned())
                    .collect();
            }
            Step::Map(m) => {
                let op = m.op().ok_or_else(|| {
                    let known: Vec<&str> = pushdown_ops::registry().iter().map(|op| op.name()).collect();
                    unsupported(format!("unknown op `{}`; ops: {}", m.call, known.join(", ")))
                })?;
                let schema = arrow::datatypes::Schema::new(available.clone());
                let (_, input_field) = pushdown_ops::resolve_input(&schema, &m.input)
                    .ok_or_else(|| unsupported(format!("unknown column `{}`", m.input)))?;
                let field = op
                    .output_field(&input_field, &m.params, m.output())
                    .map_err(|e| unsupported(e.to_string()))?;
                match available.iter_mut().find(|f| f.name() == m.output()) {
                    Some(existing) => *existing = field,
                    None => available.push(field),
                }
            }
            Step::Batch { size: 0, .. } => return Err(unsupported("batch size must be at least 1".into())),
            Step::Pack(_) | Step::BucketBy(_) => regroup_last(&steps[index..]).map_err(unsupported)?,
            Step::Filter { .. } | Step::Shuffle { .. } | Step::Batch { .. } => {}
        }
    }
    Ok(())
}

/// A `pack` or `bucket_by` step (`steps[0]`) regroups the rows the steps before it give:
/// only a batch step may follow it. `Err` carries the reason.
fn regroup_last(steps: &[Step]) -> Result<(), String> {
    let step = &steps[0];
    match steps[1..].iter().find(|s| !matches!(s, Step::Batch { .. })) {
        Some(Step::Pack(_) | Step::BucketBy(_)) => {
            Err("a pipeline packs or buckets its rows once: one pack or bucket_by step".into())
        }
        Some(after) => Err(format!(
            "`{step}` regroups the rows the steps before it give: only a batch step may come \
             after it, not `{after}`"
        )),
        None => Ok(()),
    }
}

/// Moves filters and selects as early as their inputs allow, past permutations and row-wise
/// steps (never past a batch). A filter crosses a step that writes nothing it reads; a select
/// crosses a step that writes nothing and reads only columns the select keeps. Returns the
/// new order and, per position, the step it was hoisted past first (for `explain`).
fn hoist(steps: &[Step]) -> (Vec<Step>, Vec<Option<String>>) {
    let mut out: Vec<Step> = Vec::with_capacity(steps.len());
    let mut notes: Vec<Option<String>> = Vec::with_capacity(steps.len());
    for step in steps {
        let mut at = out.len();
        let crosses = |prev: &Step| -> bool {
            if !prev.commutes_with_filters() {
                return false;
            }
            match step {
                Step::Filter { .. } => {
                    let reads = step.reads();
                    !prev.writes().iter().any(|w| reads.contains(w))
                }
                Step::Select { columns } => {
                    prev.writes().is_empty() && prev.reads().iter().all(|r| columns.contains(r))
                }
                Step::Shuffle { .. }
                | Step::Batch { .. }
                | Step::Map(_)
                | Step::Pack(_)
                | Step::BucketBy(_) => false,
            }
        };
        while at > 0 && crosses(&out[at - 1]) {
            at -= 1;
        }
        // Stay after the selects and filters crossed for nothing (they run server-side
        // anyway): the user's order among them is kept.
        while at < out.len() && matches!(out[at], Step::Select { .. } | Step::Filter { .. }) {
            at += 1;
        }
        let note = (at < out.len()).then(|| out[at].to_string());
        out.insert(at, step.clone());
        notes.insert(at, note);
    }
    (out, notes)
}

/// Columns the client steps need from the server's output.
fn client_needs(client: &[Step], available: &[String]) -> BTreeSet<String> {
    let mut needed: BTreeSet<String> = available.iter().cloned().collect();
    for step in client.iter().rev() {
        match step {
            Step::Select { columns } => needed = columns.iter().cloned().collect(),
            other => needed.extend(other.reads()),
        }
    }
    needed
}
