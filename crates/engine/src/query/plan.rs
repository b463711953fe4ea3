//! Planning a request: its shape (row-wise over one dataset, or whole) and, for a row-wise
//! one, the shards its scan is cut into, with the row groups pruning rules out.

use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use datafusion::common::tree_node::TreeNode;
use datafusion::logical_expr::{Expr, LogicalPlan};
use datafusion::physical_optimizer::pruning::PruningPredicate;
use pushdown_protocol::{FilterPushdown, Query, ScanRequest, Shard};

use crate::auth::Grant;
use crate::catalog::{Dataset, lookup};
use crate::error::Result;
use crate::layout::PartitionFilter;

use super::pruning::{decide_filter_pushdown, leaf_columns, matching_row_groups, pruning_predicate, scan_of};
use super::{Engine, Planned, Shape, checked_dataframe};

impl Engine {
    /// `GetFlightInfo`: the result schema, the shape, and the shards, for a caller holding
    /// `grant`.
    pub async fn plan(&self, request: &ScanRequest, grant: &Grant) -> Result<Planned> {
        let checked = self.check(&request.query, grant)?;
        let datasets = self.catalog.datasets().await?;
        let ctx = self.session(self.config.cpu_threads);
        let limits = self.op_limits(&ctx, request.tokenizer.as_deref());
        let referenced = self
            .register_names(&ctx, &datasets, grant, checked.names(), &limits, |d| {
                self.full_table(d, false)
            })
            .await?;
        // Unreadable files fail the request before anything else is said about it.
        for dataset in &referenced {
            dataset.check_readable()?;
        }
        let df = checked_dataframe(&ctx, &request.query, &checked).await?;
        let schema: SchemaRef = Arc::new(df.schema().as_arrow().clone());
        let logical = df.logical_plan().clone();
        let optimized = ctx.state().optimize(&logical)?;
        let scan = scan_of(&optimized);

        let mut request = request.clone();
        // The dataset a row-wise query is sharded over.
        let row_wise = row_wise_table(&logical)
            .map(|table| lookup(&datasets, &table))
            .transpose()?;

        let (projection, filter_columns) = match &scan {
            Some(s) => (s.projection.clone(), s.filter_columns.clone()),
            None => (None, vec![]),
        };
        let has_filter = !filter_columns.is_empty()
            || matches!(&request.query, Query::Fragment(f) if f.predicate.is_some());
        let scanned: Vec<Arc<Dataset>> = match &row_wise {
            Some(dataset) => vec![Arc::clone(dataset)],
            None => referenced.clone(),
        };
        if request.filter_pushdown == FilterPushdown::Auto {
            request.filter_pushdown = decide_filter_pushdown(row_wise.as_ref(), scan.as_ref());
        }

        // Row groups whose statistics rule the filter out get no shard: a selective query
        // over sorted data costs one request per matching range, not one per file.
        let pruning = match (&row_wise, &scan) {
            (Some(dataset), Some(s)) => pruning_predicate(&ctx, dataset, s)?,
            _ => None,
        };
        // Files whose path columns (`split`, hive keys) rule the filter out get no shard.
        let files = match (&row_wise, &scan) {
            (Some(dataset), Some(s)) => PartitionFilter::new(
                &ctx.state(),
                &arrow::datatypes::Fields::from(dataset.partitions.clone()),
                &s.filters,
            ),
            _ => PartitionFilter::default(),
        };
        let Cut {
            shards,
            rows_upper_bound,
            bytes_to_scan,
            row_groups_pruned,
        } = self.cut_shards(&scanned, projection.as_deref(), pruning.as_deref(), &files);
        // A whole query's estimates cover every dataset it scans; its one stream has no shard.
        let shape = match row_wise {
            Some(dataset) => Shape::RowWise { dataset, shards },
            None => Shape::Whole,
        };
        Ok(Planned {
            schema,
            shape,
            request,
            rows_upper_bound,
            bytes_to_scan,
            row_groups_pruned,
            has_filter,
            optimized,
            names: checked.names().to_vec(),
        })
    }

    /// Cuts the row groups of `scanned` that `pruning` leaves into shards: runs of
    /// consecutive matching row groups of one file, each closed at the server's shard size
    /// (rows or bytes of the `projection`'s column chunks).
    pub(super) fn cut_shards(
        &self,
        scanned: &[Arc<Dataset>],
        projection: Option<&[usize]>,
        pruning: Option<&PruningPredicate>,
        files: &PartitionFilter,
    ) -> Cut {
        let mut shards = Vec::new();
        let mut rows_upper_bound = 0;
        let mut bytes_to_scan = 0;
        let mut row_groups_pruned = 0;
        for dataset in scanned {
            let leaves = leaf_columns(dataset, projection);
            for file in &dataset.files {
                if !files.admits(&file.partition) {
                    row_groups_pruned += file.num_row_groups() as u64;
                    continue;
                }
                let matching = matching_row_groups(dataset, file, pruning);
                // The run of matching row groups being gathered: start, end, rows, bytes.
                let mut run: Option<(usize, usize, u64, u64)> = None;
                let mut close = |run: &mut Option<(usize, usize, u64, u64)>| {
                    if let Some((start, end, rows, bytes)) = run.take() {
                        rows_upper_bound += rows;
                        bytes_to_scan += bytes;
                        shards.push(Shard {
                            dataset: dataset.name.clone(),
                            file: file.path.clone(),
                            row_groups: start as u32..end as u32,
                            rows,
                            version: file.version.clone(),
                            bytes,
                        });
                    }
                };
                for (rg, matches) in matching.iter().enumerate() {
                    if !matches {
                        row_groups_pruned += 1;
                        close(&mut run);
                        continue;
                    }
                    let (_, end, rows, bytes) = run.get_or_insert((rg, rg, 0, 0));
                    *end = rg + 1;
                    *rows += file.row_group_rows(rg);
                    *bytes += file.row_group_bytes(rg, leaves.as_deref());
                    if *rows >= self.config.shard_max_rows || *bytes >= self.config.shard_target_bytes {
                        close(&mut run);
                    }
                }
                close(&mut run);
            }
        }
        Cut {
            shards,
            rows_upper_bound,
            bytes_to_scan,
            row_groups_pruned,
        }
    }
}

/// The shards a plan's scan is cut into, and what they add up to.
pub(super) struct Cut {
    pub(super) shards: Vec<Shard>,
    /// Rows before filtering, over the row groups the shards scan.
    pub(super) rows_upper_bound: u64,
    /// Compressed bytes of the projected column chunks the shards read.
    pub(super) bytes_to_scan: u64,
    /// Row groups no shard scans: their statistics rule the filter out.
    pub(super) row_groups_pruned: u64,
}

/// Whether `expr` maps each row on its own, the same way on every run: no subqueries,
/// aggregates or windows, and no volatile function (`random()`, `now()`): a query that draws
/// different rows per run cannot be sharded, counted or resumed.
pub(super) fn is_row_wise_expr(expr: &Expr) -> bool {
    !expr
        .exists(|e| {
            Ok(e.is_volatile_node()
                || matches!(
                    e,
                    Expr::ScalarSubquery(_)
                        | Expr::InSubquery(_)
                        | Expr::Exists(_)
                        | Expr::OuterReferenceColumn(..)
                        | Expr::AggregateFunction(_)
                        | Expr::WindowFunction(_)
                ))
        })
        .unwrap_or(true)
}

/// Whether the plan's row `i` is its table's row `i`: a row-wise plan with no filter (in
/// it, pushed into its scan, or in a view it reads) and no limit.
/// A row-wise plan's filter and the one-to-one plan it filters (consecutive filters joined
/// by `AND`), beneath projections: what [`Engine::filtered_part`] evaluates alone. `None`
/// for any other shape, and for a volatile filter (evaluated twice, it would differ).
pub(super) fn part_filter(plan: &LogicalPlan) -> Option<(Expr, Arc<LogicalPlan>)> {
    match plan {
        LogicalPlan::Projection(p) if p.expr.iter().all(is_row_wise_expr) => part_filter(&p.input),
        LogicalPlan::SubqueryAlias(a) => part_filter(&a.input),
        LogicalPlan::Filter(f) if is_row_wise_expr(&f.predicate) && !f.predicate.is_volatile() => {
            if one_to_one(&f.input) {
                return Some((f.predicate.clone(), Arc::clone(&f.input)));
            }
            match f.input.as_ref() {
                LogicalPlan::Filter(_) => {
                    part_filter(&f.input).map(|(inner, input)| (f.predicate.clone().and(inner), input))
                }
                _ => None,
            }
        }
        _ => None,
    }
}

pub(super) fn one_to_one(plan: &LogicalPlan) -> bool {
    match plan {
        LogicalPlan::Projection(p) => p.expr.iter().all(is_row_wise_expr) && one_to_one(&p.input),
        LogicalPlan::SubqueryAlias(a) => one_to_one(&a.input),
        LogicalPlan::TableScan(s) if s.fetch.is_none() && s.filters.is_empty() => {
            s.source.get_logical_plan().is_none_or(|view| one_to_one(&view))
        }
        _ => false,
    }
}

/// The one table a row-wise plan scans, or `None` when the plan is not row-wise.
pub(super) fn row_wise_table(plan: &LogicalPlan) -> Option<String> {
    match plan {
        LogicalPlan::Projection(p) if p.expr.iter().all(is_row_wise_expr) => row_wise_table(&p.input),
        LogicalPlan::Filter(f) if is_row_wise_expr(&f.predicate) => row_wise_table(&f.input),
        LogicalPlan::SubqueryAlias(a) => row_wise_table(&a.input),
        LogicalPlan::TableScan(s) if s.fetch.is_none() => match s.source.get_logical_plan() {
            // A view: row-wise when its own query is, over the dataset beneath it.
            Some(view) if s.filters.is_empty() => row_wise_table(&view),
            Some(_) => None,
            None => Some(s.table_name.table().to_owned()),
        },
        _ => None,
    }
}
