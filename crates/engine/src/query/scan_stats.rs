//! A stream's scan statistics, read from DataFusion's own metrics of its plan.

use std::sync::Arc;

use datafusion::datasource::physical_plan::parquet::ParquetFileMetrics;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, MetricValue};
use pushdown_protocol::StreamStats;

/// The names DataFusion registers the Parquet scan's metrics under, read from its own typed
/// `ParquetFileMetrics` rather than written here: a field that is renamed or removed fails
/// to compile, and a metric registered under a new name is still found.
#[derive(Debug)]
pub(super) struct ScanMetricNames {
    pub(super) bytes_scanned: String,
    pub(super) rows_pruned_by_filter: String,
    pub(super) row_groups_pruned: Vec<String>,
}

/// Found by probing: each metric of a fresh `ParquetFileMetrics` gets a distinct value, and
/// the metrics set tells the name that value was registered under.
static SCAN_METRIC_NAMES: std::sync::LazyLock<ScanMetricNames> = std::sync::LazyLock::new(|| {
    let set = ExecutionPlanMetricsSet::new();
    let probe = ParquetFileMetrics::new(0, "probe", &set);
    probe.bytes_scanned.add(1);
    probe.pushdown_rows_pruned.add(2);
    probe.row_groups_pruned_statistics.add_pruned(3);
    probe.row_groups_pruned_bloom_filter.add_pruned(4);
    probe.limit_pruned_row_groups.add_pruned(5);
    let mut names = ScanMetricNames {
        bytes_scanned: String::new(),
        rows_pruned_by_filter: String::new(),
        row_groups_pruned: Vec::new(),
    };
    for metric in set.clone_inner().iter() {
        match metric.value() {
            MetricValue::Count { name, count } => match count.value() {
                1 => names.bytes_scanned = name.to_string(),
                2 => names.rows_pruned_by_filter = name.to_string(),
                _ => {}
            },
            MetricValue::PruningMetrics {
                name,
                pruning_metrics,
            } if (3..=5).contains(&pruning_metrics.pruned()) => {
                names.row_groups_pruned.push(name.to_string())
            }
            _ => {}
        }
    }
    names
});

/// What the plan's scans did, from DataFusion's execution metrics.
pub fn scan_stats(plan: &Arc<dyn ExecutionPlan>) -> StreamStats {
    let names = &*SCAN_METRIC_NAMES;
    let mut stats = StreamStats::default();
    let mut stack = vec![Arc::clone(plan)];
    while let Some(node) = stack.pop() {
        stack.extend(node.children().into_iter().cloned());
        if node
            .downcast_ref::<datafusion::datasource::source::DataSourceExec>()
            .is_none()
        {
            continue;
        }
        let Some(metrics) = node.metrics() else { continue };
        for metric in metrics.iter() {
            match metric.value() {
                MetricValue::Count { name, count } => {
                    if name.as_ref() == names.bytes_scanned {
                        stats.bytes_scanned += count.value() as u64;
                    } else if name.as_ref() == names.rows_pruned_by_filter {
                        // Rows the late-materialized filter dropped were decoded too.
                        stats.rows_scanned += count.value() as u64;
                    }
                }
                MetricValue::OutputRows(count) => stats.rows_scanned += count.value() as u64,
                MetricValue::PruningMetrics {
                    name,
                    pruning_metrics,
                } if names.row_groups_pruned.iter().any(|n| n == name.as_ref()) => {
                    stats.row_groups_pruned += pruning_metrics.pruned() as u64;
                }
                _ => {}
            }
        }
    }
    stats
}

#[cfg(test)]
mod metric_tests {
    /// An upgrade of DataFusion that renames or drops a scan metric must fail here, not zero
    /// the servers' accounting silently.
    #[test]
    fn the_scan_metrics_are_found_in_datafusions_own_metrics() {
        let names = &*super::SCAN_METRIC_NAMES;
        assert!(!names.bytes_scanned.is_empty(), "{names:?}");
        assert!(!names.rows_pruned_by_filter.is_empty(), "{names:?}");
        assert_eq!(names.row_groups_pruned.len(), 3, "{names:?}");
    }
}
