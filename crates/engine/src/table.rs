//! A DataFusion table over chosen files and row-group ranges of a dataset.
//!
//! A shard's query runs against a [`ShardTable`] restricted to that shard's row groups
//! (a `ParquetAccessPlan` on the file); a query that is not row-wise runs against one over the
//! whole dataset. Either way the scan is DataFusion's Parquet reader with the server's
//! explicit [`TableParquetOptions`]: projection into the reader, row groups pruned by
//! statistics and bloom filters, pages by the page index, filters pushed into the decoder
//! when the request asks for it. Files are never split by byte range, so a shard's output
//! order is deterministic.
//!
//! **Floating-point filters are not pruned by statistics.** Parquet's min/max exclude NaN
//! (the spec says so), while DataFusion orders NaN above every number: `f > 0.25` holds for
//! a NaN row, yet a row group whose numbers stay below 0.25 is skipped, and its NaN rows are
//! silently lost (apache/datafusion#15812, open in 55.2). A scan whose filters read a float
//! column turns statistics, page-index and bloom-filter pruning off, so such a query gives
//! the same rows whatever the files' row groups. Filters over other types prune as before.
//!
//! **Strings a filter drops are read as views.** Under a filter, [`strings_as_views_under_filters`]
//! has the scan decode the projected `Utf8` and `Binary` columns the filter does not read as
//! Arrow views (no copy of the values out of the decompressed pages), filters, and casts the
//! survivors back above the filter: only the kept rows' values are copied. The query's output
//! types do not change. Measured (one thread, DataFusion 55's reader): faster on filters that
//! keep 25–41% of rows with string columns, slower on a plain projection, so scans without a
//! filter are left alone (see `benches/RESULTS.md`, "Scan: the server against DuckDB").

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use arrow::datatypes::{DataType, FieldRef, Schema, SchemaRef};
use async_trait::async_trait;
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::config::TableParquetOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{Column, ScalarValue};
use datafusion::datasource::TableType;
use datafusion::datasource::file_format::FileFormat;
use datafusion::datasource::file_format::parquet::ParquetFormat;
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::physical_plan::parquet::ParquetAccessPlan;
use datafusion::datasource::physical_plan::{FileGroup, FileScanConfigBuilder, ParquetSource};
use datafusion::datasource::table_schema::TableSchema;
use datafusion::datasource::{provider_as_source, source_as_provider};
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::logical_expr::{
    Expr, Filter, LogicalPlan, Projection, TableProviderFilterPushDown, TableScanBuilder, cast,
};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::empty::EmptyExec;
use parquet::arrow::arrow_reader::{RowSelection, RowSelector};

use crate::catalog::DataFile;
use crate::durations::{DurationIndex, duration_bounds};

/// Files of one dataset, each with an optional row-group range.
#[derive(Debug)]
pub struct ShardTable {
    /// The files' columns (merged), then the columns their paths give.
    schema: TableSchema,
    store_url: ObjectStoreUrl,
    files: Vec<(DataFile, Option<Range<u32>>)>,
    /// Rows of each file (counted from its first row) outside this range are never decoded:
    /// a Parquet row selection on the row groups it cuts, the others not read.
    rows: Option<Range<u64>>,
    options: TableParquetOptions,
    /// Clips' durations, to skip the rows a filter on `audio_seconds` drops.
    durations: Option<Arc<DurationIndex>>,
}

impl ShardTable {
    /// A table of `files` read as `file_schema` (each file's columns cast to it by name,
    /// missing ones null), with the columns `partitions` that the files' paths give
    /// ([`DataFile::partition`]).
    pub fn new(
        file_schema: SchemaRef,
        partitions: Vec<FieldRef>,
        store_url: ObjectStoreUrl,
        files: Vec<(DataFile, Option<Range<u32>>)>,
        options: TableParquetOptions,
    ) -> Self {
        Self {
            schema: TableSchema::builder(file_schema)
                .with_table_partition_cols(partitions)
                .build(),
            store_url,
            files,
            rows: None,
            options,
            durations: None,
        }
    }

    /// The same table skipping, under a filter on `audio_seconds(column)`, the rows whose
    /// clips `durations` shows to fall outside it ([`crate::durations`]).
    pub fn with_durations(mut self, durations: Arc<DurationIndex>) -> Self {
        self.durations = Some(durations);
        self
    }

    /// The same table reading only the rows `rows` of each file (counted from the file's
    /// first row; a shard table has one file): what a query with no filter needs for a part
    /// of a shard's output.
    pub fn with_rows(mut self, rows: Range<u64>) -> Self {
        self.rows = Some(rows);
        self
    }

    /// The same files with the file columns at `columns` (`Utf8` or `Binary`) read as Arrow
    /// views.
    fn with_views(&self, columns: &[usize]) -> Self {
        let file_schema = self.schema.file_schema();
        let fields: Vec<_> = file_schema
            .fields()
            .iter()
            .enumerate()
            .map(|(i, f)| match f.data_type() {
                DataType::Utf8 if columns.contains(&i) => {
                    Arc::new(f.as_ref().clone().with_data_type(DataType::Utf8View))
                }
                DataType::Binary if columns.contains(&i) => {
                    Arc::new(f.as_ref().clone().with_data_type(DataType::BinaryView))
                }
                _ => Arc::clone(f),
            })
            .collect();
        let table = Self::new(
            Arc::new(Schema::new_with_metadata(fields, file_schema.metadata().clone())),
            self.schema.table_partition_cols().iter().cloned().collect(),
            self.store_url.clone(),
            self.files.clone(),
            self.options.clone(),
        );
        Self {
            rows: self.rows.clone(),
            durations: self.durations.clone(),
            ..table
        }
    }

    /// The files whose path columns may pass `filters` (all of them when there are none),
    /// with their row-group access plans and path values; `keep`, per file, the rows of the
    /// row groups a filter on clips' durations cuts ([`Self::duration_masks`]).
    fn partitioned_files(
        &self,
        state: &dyn Session,
        filters: &[Expr],
        keep: &[HashMap<usize, Vec<bool>>],
    ) -> Vec<PartitionedFile> {
        let partitions = self.schema.table_partition_cols();
        let admitted = crate::layout::PartitionFilter::new(state, partitions, filters);
        self.files
            .iter()
            .zip(keep.iter().map(Some).chain(std::iter::repeat(None)))
            .filter(|((file, _), _)| admitted.admits(&file.partition))
            .map(|((file, row_groups), keep)| {
                let values = file
                    .partition
                    .iter()
                    .map(|v| ScalarValue::Utf8(v.clone()))
                    .collect();
                let pf = PartitionedFile::new_from_meta(file.meta.clone()).with_partition_values(values);
                let keep = keep.filter(|k| !k.is_empty());
                match (row_groups, &self.rows, keep) {
                    (None, None, None) => pf,
                    (row_groups, rows, keep) => {
                        let all = 0..file.num_row_groups() as u32;
                        pf.with_extension(access_plan(
                            file,
                            row_groups.clone().unwrap_or(all),
                            rows.as_ref(),
                            keep,
                        ))
                    }
                }
            })
            .collect()
    }

    /// Per file, the rows a filter on `audio_seconds` of a column certainly drops, from the
    /// clips' durations (empty without such a filter or an index).
    async fn duration_masks(&self, state: &dyn Session, filters: &[Expr]) -> Vec<HashMap<usize, Vec<bool>>> {
        let Some(index) = &self.durations else {
            return vec![];
        };
        let bounds = duration_bounds(filters);
        if bounds.is_empty() {
            return vec![];
        }
        let Ok(store) = state.runtime_env().object_store(&self.store_url) else {
            return vec![];
        };
        let mut masks = Vec::with_capacity(self.files.len());
        for (file, row_groups) in &self.files {
            let all = 0..file.num_row_groups() as u32;
            let row_groups = row_groups.clone().unwrap_or(all);
            // Only the row groups the rows asked for touch.
            let row_groups = match &self.rows {
                Some(rows) => groups_holding(file, row_groups, rows),
                None => row_groups,
            };
            masks.push(index.keep(&store, file, &bounds, row_groups).await);
        }
        masks
    }
}

/// The row groups of `row_groups` in `file` that hold any of `rows` (counted from the file's
/// first row), as a range (empty, at the range's start, when none do).
pub(crate) fn groups_holding(file: &DataFile, row_groups: Range<u32>, rows: &Range<u64>) -> Range<u32> {
    let mut first = 0u64;
    let (mut start, mut end) = (None, row_groups.start);
    for i in 0..row_groups.end {
        let len = file.row_group_rows(i as usize);
        let group = first..first + len;
        first += len;
        if i >= row_groups.start && group.start < rows.end && rows.start < group.end {
            start.get_or_insert(i);
            end = i + 1;
        }
    }
    match start {
        Some(start) => start..end,
        None => row_groups.start..row_groups.start,
    }
}

/// What of `file` to decode: the row groups in `row_groups`, and of them only the rows in
/// `rows` (counted from the file's first row; all when `None`) that `keep` keeps (per row
/// group, a mask over its rows; a row group it lacks keeps all). A row group with no row
/// left is not read; one cut is read as a row selection, which skips the pages the page
/// index shows to hold none of its rows.
fn access_plan(
    file: &DataFile,
    row_groups: Range<u32>,
    rows: Option<&Range<u64>>,
    keep: Option<&HashMap<usize, Vec<bool>>>,
) -> ParquetAccessPlan {
    let n = file.num_row_groups();
    let mut access = ParquetAccessPlan::new_none(n);
    let mut first = 0u64;
    for i in 0..n {
        let len = file.row_group_rows(i);
        let group = first..first + len;
        first += len;
        if !row_groups.contains(&(i as u32)) {
            continue;
        }
        let (from, to) = match rows {
            Some(rows) => (rows.start.max(group.start), rows.end.min(group.end)),
            None => (group.start, group.end),
        };
        if from >= to {
            continue;
        }
        let mask = keep.and_then(|k| k.get(&i)).filter(|m| m.len() as u64 == len);
        // Runs of rows read and skipped, over the row group's rows: the range's three, or
        // (a row group a duration filter cuts, one clip per row) a run per change of the mask.
        let selectors: Vec<RowSelector> = match mask {
            None => [
                RowSelector::skip((from - group.start) as usize),
                RowSelector::select((to - from) as usize),
                RowSelector::skip((group.end - to) as usize),
            ]
            .into_iter()
            .filter(|s| s.row_count > 0)
            .collect(),
            Some(mask) => {
                let mut runs: Vec<RowSelector> = Vec::new();
                for r in group.clone() {
                    let take = (from..to).contains(&r) && mask[(r - group.start) as usize];
                    match runs.last_mut() {
                        Some(last) if last.skip != take => last.row_count += 1,
                        _ => runs.push(if take {
                            RowSelector::select(1)
                        } else {
                            RowSelector::skip(1)
                        }),
                    }
                }
                runs
            }
        };
        if selectors.iter().all(|s| s.skip) {
            continue;
        }
        // A selection narrows a row group scanned (it leaves a skipped one skipped).
        access.scan(i);
        if selectors.len() > 1 {
            access.scan_selection(i, RowSelection::from(selectors));
        }
    }
    access
}

#[async_trait]
impl TableProvider for ShardTable {
    fn schema(&self) -> SchemaRef {
        Arc::clone(self.schema.table_schema())
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
        let keep = self.duration_masks(state, filters).await;
        let files = self.partitioned_files(state, filters, &keep);
        if files.is_empty() {
            let table = self.schema.table_schema();
            let schema = match projection {
                Some(p) => Arc::new(table.project(p)?),
                None => Arc::clone(table),
            };
            return Ok(Arc::new(EmptyExec::new(schema)));
        }
        // Whole files, in order, in at most `target_partitions` contiguous groups.
        let partitions = state.config().target_partitions().clamp(1, files.len());
        let per_group = files.len().div_ceil(partitions);
        let groups: Vec<FileGroup> = files
            .chunks(per_group)
            .map(|c| FileGroup::new(c.to_vec()))
            .collect();
        let mut options = self.options.clone();
        let columns = filters.iter().flat_map(|f| f.column_refs());
        if reads_floats(self.schema.table_schema(), columns.map(|c| c.name.as_str())) {
            options.global.pruning = false;
            options.global.enable_page_index = false;
            options.global.bloom_filter_on_read = false;
        }
        let source = ParquetSource::new(self.schema.clone()).with_table_parquet_options(options.clone());
        let config = FileScanConfigBuilder::new(self.store_url.clone(), Arc::new(source))
            .with_file_groups(groups)
            .with_projection_indices(projection.cloned())?
            .with_limit(limit)
            .build();
        // Through `ParquetFormat` so footers come from the runtime's metadata cache.
        ParquetFormat::default()
            .with_options(options)
            .create_physical_plan(state, config)
            .await
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> datafusion::error::Result<Vec<TableProviderFilterPushDown>> {
        // Inexact: the scan prunes with them (statistics, page index, bloom filters) and, when
        // filter pushdown is on, evaluates them in the decoder.
        Ok(vec![TableProviderFilterPushDown::Inexact; filters.len()])
    }
}

/// Rewrites each `Filter` directly over a scan of a [`ShardTable`]: the projected `Utf8` and
/// `Binary` columns that neither the filter nor the scan's pushed filters read are scanned as
/// views and cast back to their types above the filter (see the module docs). Everything
/// above sees the same columns, names and types.
pub fn strings_as_views_under_filters(plan: LogicalPlan) -> datafusion::error::Result<LogicalPlan> {
    plan.transform_up(|node| {
        let LogicalPlan::Filter(filter) = &node else {
            return Ok(Transformed::no(node));
        };
        let LogicalPlan::TableScan(scan) = filter.input.as_ref() else {
            return Ok(Transformed::no(node));
        };
        let Ok(provider) = source_as_provider(&scan.source) else {
            return Ok(Transformed::no(node));
        };
        let Some(table) = provider.downcast_ref::<ShardTable>() else {
            return Ok(Transformed::no(node));
        };
        let read: std::collections::HashSet<String> = std::iter::once(&filter.predicate)
            .chain(&scan.filters)
            .flat_map(|e| e.column_refs())
            .map(|c| c.name.clone())
            .collect();
        // Only the files' own columns: a path column is a literal, never read.
        let file_schema = table.schema.file_schema();
        let all: Vec<usize> = (0..file_schema.fields().len()).collect();
        let projected = scan.projection.clone().unwrap_or(all);
        let views: Vec<usize> = projected
            .iter()
            .copied()
            .filter(|&i| i < file_schema.fields().len())
            .filter(|&i| {
                let f = file_schema.field(i);
                // A field with metadata (an extension type) keeps it only if never cast.
                matches!(f.data_type(), DataType::Utf8 | DataType::Binary)
                    && !read.contains(f.name())
                    && f.metadata().is_empty()
            })
            .collect();
        if views.is_empty() {
            return Ok(Transformed::no(node));
        }
        let viewed = TableScanBuilder::new(
            scan.table_name.clone(),
            provider_as_source(Arc::new(table.with_views(&views))),
        )
        .with_projection(scan.projection.clone())
        .with_filters(scan.filters.clone())
        .with_fetch(scan.fetch)
        .build()?;
        // Each column back to the scan's own type where the viewed scan changed it.
        let back: Vec<Expr> = scan
            .projected_schema
            .iter()
            .zip(viewed.projected_schema.fields())
            .map(|((qualifier, field), as_read)| {
                let column = Expr::Column(Column::new(qualifier.cloned(), field.name()));
                if as_read.data_type() == field.data_type() {
                    column
                } else {
                    cast(column, field.data_type().clone()).alias_qualified(qualifier.cloned(), field.name())
                }
            })
            .collect();
        let filtered = Filter::try_new(filter.predicate.clone(), Arc::new(LogicalPlan::TableScan(viewed)))?;
        let projection = Projection::try_new(back, Arc::new(LogicalPlan::Filter(filtered)))?;
        Ok(Transformed::yes(LogicalPlan::Projection(projection)))
    })
    .map(|t| t.data)
}

/// Whether any of `columns` is floating-point (or holds floats, in a list or struct): its
/// statistics cannot rule NaN rows out (see the module docs).
pub fn reads_floats<'a>(schema: &Schema, columns: impl IntoIterator<Item = &'a str>) -> bool {
    fn floats(t: &arrow::datatypes::DataType) -> bool {
        use arrow::datatypes::DataType;
        match t {
            t if t.is_floating() => true,
            DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) => {
                floats(f.data_type())
            }
            DataType::Struct(fields) => fields.iter().any(|f| floats(f.data_type())),
            DataType::Dictionary(_, v) => floats(v),
            _ => false,
        }
    }
    columns
        .into_iter()
        .filter_map(|c| schema.field_with_name(c).ok())
        .any(|f| floats(f.data_type()))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::datatypes::{DataType, Field, Schema};
    use datafusion::common::config::TableParquetOptions;
    use datafusion::datasource::provider_as_source;
    use datafusion::execution::object_store::ObjectStoreUrl;
    use datafusion::logical_expr::{LogicalPlan, LogicalPlanBuilder, col, lit};

    use super::{ShardTable, strings_as_views_under_filters};

    fn scan() -> LogicalPlanBuilder {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("lang", DataType::Utf8, true),
            Field::new("body", DataType::Utf8, true),
            Field::new("image", DataType::Binary, false),
        ]));
        let url = ObjectStoreUrl::parse("file://").expect("url");
        let table = ShardTable::new(schema, vec![], url, vec![], TableParquetOptions::default());
        LogicalPlanBuilder::scan("t", provider_as_source(Arc::new(table)), None).expect("scan")
    }

    /// The scan under the plan's filter, and its column types.
    fn scanned_types(plan: &LogicalPlan) -> Vec<(String, DataType)> {
        let mut found = None;
        plan.apply(|node| {
            if let LogicalPlan::TableScan(s) = node {
                found = Some(
                    s.projected_schema
                        .fields()
                        .iter()
                        .map(|f| (f.name().clone(), f.data_type().clone()))
                        .collect(),
                );
            }
            Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
        })
        .expect("walk");
        found.expect("a scan")
    }

    use datafusion::common::tree_node::TreeNode;

    /// Under a filter, the strings and binaries it does not read are scanned as views and
    /// cast back above it: the plan's output schema (names, qualifiers, types) is unchanged.
    #[test]
    fn strings_the_filter_does_not_read_are_scanned_as_views() {
        let plan = scan()
            .filter(col("lang").eq(lit("en")).and(col("id").gt(lit(3i64))))
            .expect("filter")
            .project(vec![col("id"), col("body"), col("image"), col("lang")])
            .expect("project")
            .build()
            .expect("plan");
        let rewritten = strings_as_views_under_filters(plan.clone()).expect("rewrite");
        assert_eq!(rewritten.schema(), plan.schema(), "{rewritten}");
        assert_eq!(
            scanned_types(&rewritten),
            vec![
                ("id".to_owned(), DataType::Int64),
                ("lang".to_owned(), DataType::Utf8),
                ("body".to_owned(), DataType::Utf8View),
                ("image".to_owned(), DataType::BinaryView),
            ]
        );
        // The filter sits on the viewed scan, the casts above it.
        let LogicalPlan::Projection(top) = &rewritten else {
            panic!("{rewritten}")
        };
        let LogicalPlan::Projection(back) = top.input.as_ref() else {
            panic!("{rewritten}")
        };
        assert!(
            matches!(back.input.as_ref(), LogicalPlan::Filter(_)),
            "{rewritten}"
        );
    }

    /// Without a filter nothing is read as views: a plain projection would only pay for the
    /// cast.
    #[test]
    fn scans_without_a_filter_are_left_alone() {
        let plan = scan()
            .project(vec![col("id"), col("body")])
            .expect("project")
            .build()
            .expect("plan");
        let rewritten = strings_as_views_under_filters(plan.clone()).expect("rewrite");
        assert_eq!(rewritten, plan);
        assert!(
            scanned_types(&rewritten)
                .iter()
                .all(|(_, t)| !matches!(t, DataType::Utf8View | DataType::BinaryView))
        );
    }
}
