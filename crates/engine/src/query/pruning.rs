//! What a scan can skip: the row groups a filter's statistics rule out, and whether the
//! filter is pushed into the scan.

use std::sync::Arc;

use datafusion::common::DFSchema;
use datafusion::common::tree_node::TreeNode;
use datafusion::datasource::physical_plan::parquet::{
    ParquetAccessPlan, ParquetFileMetrics, RowGroupAccessPlanFilter,
};
use datafusion::execution::context::SessionContext;
use datafusion::logical_expr::utils::conjunction;
use datafusion::logical_expr::{Expr, LogicalPlan};
use datafusion::physical_optimizer::pruning::{PruningPredicate, PruningPredicateBuilder};
use datafusion::physical_plan::metrics::ExecutionPlanMetricsSet;
use pushdown_protocol::FilterPushdown;

use crate::catalog::{DataFile, Dataset};
use crate::error::Result;

/// What the optimizer pushed into the (first) table scan.
pub(super) struct ScanInfo {
    pub(super) table: datafusion::common::TableReference,
    pub(super) projection: Option<Vec<usize>>,
    pub(super) filters: Vec<Expr>,
    pub(super) filter_columns: Vec<usize>,
}

pub(super) fn scan_of(plan: &LogicalPlan) -> Option<ScanInfo> {
    let mut found = None;
    let _ = plan.apply(|node| {
        if let LogicalPlan::TableScan(s) = node {
            let schema = s.source.schema();
            let mut filter_columns: Vec<usize> = s
                .filters
                .iter()
                .flat_map(|f| f.column_refs())
                .filter_map(|c| schema.index_of(&c.name).ok())
                .collect();
            filter_columns.sort_unstable();
            filter_columns.dedup();
            found = Some(ScanInfo {
                table: s.table_name.clone(),
                projection: s.projection.clone(),
                filters: s.filters.clone(),
                filter_columns,
            });
            return Ok(datafusion::common::tree_node::TreeNodeRecursion::Stop);
        }
        Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
    });
    found
}

/// The scan's filters as a predicate over row-group statistics (`None`: nothing to prune by).
pub(super) fn pruning_predicate(
    ctx: &SessionContext,
    dataset: &Dataset,
    scan: &ScanInfo,
) -> Result<Option<Arc<PruningPredicate>>> {
    // Only what reads the files' own columns: a path column has no statistics.
    let file_schema = &dataset.file_schema;
    let on_files = scan
        .filters
        .iter()
        .flat_map(datafusion::logical_expr::utils::split_conjunction)
        .filter(|e| {
            e.column_refs()
                .iter()
                .all(|c| file_schema.index_of(&c.name).is_ok())
        })
        .cloned();
    let Some(filter) = conjunction(on_files) else {
        return Ok(None);
    };
    // NaN rows are invisible to float statistics (see `table`): no pruning by them.
    let names = scan
        .filter_columns
        .iter()
        .map(|&c| dataset.schema.field(c).name().as_str());
    if crate::table::reads_floats(&dataset.schema, names) {
        return Ok(None);
    }
    // Pruning only saves work: a filter that cannot be turned into one prunes nothing.
    let df_schema = DFSchema::try_from_qualified_schema(scan.table.clone(), file_schema)?;
    let physical = match ctx.create_physical_expr(filter, &df_schema) {
        Ok(p) => p,
        Err(e) => {
            tracing::debug!(error = %e, "no plan-time pruning for this filter");
            return Ok(None);
        }
    };
    // A filter the statistics cannot judge (e.g. over an op's output) prunes nothing.
    Ok(PruningPredicateBuilder::new()
        .with_file_schema(Arc::clone(file_schema))
        .build(physical))
}

/// Which of `file`'s row groups may hold rows passing `predicate`, judged by their min/max
/// and null-count statistics exactly as the scan itself judges them.
pub(super) fn matching_row_groups(
    dataset: &Dataset,
    file: &DataFile,
    predicate: Option<&PruningPredicate>,
) -> Vec<bool> {
    let n = file.num_row_groups();
    // A drifted file's statistics are in its own types: the scan judges them, per file.
    let Some(predicate) = predicate.filter(|_| !file.drifted) else {
        return vec![true; n];
    };
    let mut filter = RowGroupAccessPlanFilter::new(ParquetAccessPlan::new_all(n));
    let metrics = ExecutionPlanMetricsSet::new();
    filter.prune_by_statistics(
        &dataset.file_schema,
        file.metadata.file_metadata().schema_descr(),
        file.metadata.row_groups(),
        predicate,
        &ParquetFileMetrics::new(0, &file.path, &metrics),
    );
    let access = filter.build();
    (0..n).map(|rg| access.should_scan(rg)).collect()
}

/// Parquet leaf columns under the projected top-level fields (`None`: all).
pub(super) fn leaf_columns(dataset: &Dataset, projection: Option<&[usize]>) -> Option<Vec<usize>> {
    let projection = projection?;
    let descr = dataset.files.first()?.metadata.file_metadata().schema_descr_ptr();
    Some(
        (0..descr.num_columns())
            .filter(|&leaf| projection.contains(&descr.get_column_root_idx(leaf)))
            .collect(),
    )
}

/// The filter pushdown an `Auto` request gets: on where the scan of a row-wise query pays
/// off for late materialization (see [`auto_filter_pushdown`]), off otherwise.
pub(super) fn decide_filter_pushdown(
    row_wise: Option<&Arc<Dataset>>,
    scan: Option<&ScanInfo>,
) -> FilterPushdown {
    let on = match (row_wise, scan) {
        (Some(dataset), Some(s)) => auto_filter_pushdown(dataset, s.projection.as_deref(), &s.filter_columns),
        _ => false,
    };
    if on {
        FilterPushdown::On
    } else {
        FilterPushdown::Off
    }
}

/// Late materialization pays off when the filter is cheap to read and the rest of the
/// projection is far more expensive: decode the filter columns, then only the surviving rows
/// of the others. Judged from the dataset's column chunk sizes, against
/// [`LATE_MATERIALIZATION_MIN_RATIO`].
pub(super) fn auto_filter_pushdown(
    dataset: &Dataset,
    projection: Option<&[usize]>,
    filter_columns: &[usize],
) -> bool {
    if filter_columns.is_empty() {
        return false;
    }
    let all: Vec<usize> = (0..dataset.schema.fields().len()).collect();
    let projected = projection.unwrap_or(&all);
    let rest: Vec<usize> = projected
        .iter()
        .copied()
        .filter(|c| !filter_columns.contains(c))
        .collect();
    let bytes = |cols: &[usize]| -> u64 {
        let leaves = leaf_columns(dataset, Some(cols));
        dataset
            .files
            .iter()
            .flat_map(|f| (0..f.num_row_groups()).map(move |rg| (f, rg)))
            .map(|(f, rg)| f.row_group_bytes(rg, leaves.as_deref()))
            .sum()
    };
    bytes(&rest) >= LATE_MATERIALIZATION_MIN_RATIO * bytes(filter_columns).max(1)
}

/// How many times the filter columns' bytes the rest of a projection must weigh before the
/// filter runs inside the Parquet decoder. The decoder still decompresses every page of the
/// rest (apache/arrow-rs#7363) and pays per selected range (apache/arrow-rs#10852), so only
/// a much heavier rest wins. Measured (`harness scan`, plain client, 2 threads): images and
/// text, whose rest weighs hundreds of times the filter columns, gain; the clicks and
/// lineitem filters and Q6, a few to a few tens of times, ran the same or slower with it
/// (`benches/RESULTS.md`, "Scan: the server against DuckDB").
pub(super) const LATE_MATERIALIZATION_MIN_RATIO: u64 = 32;
