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

use std::ops::Range;
use std::sync::Arc;

use arrow::datatypes::{Schema, SchemaRef};
use async_trait::async_trait;
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::config::TableParquetOptions;
use datafusion::datasource::TableType;
use datafusion::datasource::file_format::FileFormat;
use datafusion::datasource::file_format::parquet::ParquetFormat;
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::physical_plan::parquet::ParquetAccessPlan;
use datafusion::datasource::physical_plan::{FileGroup, FileScanConfigBuilder, ParquetSource};
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::empty::EmptyExec;

use crate::catalog::DataFile;

/// Files of one dataset, each with an optional row-group range.
#[derive(Debug)]
pub struct ShardTable {
    schema: SchemaRef,
    store_url: ObjectStoreUrl,
    files: Vec<(DataFile, Option<Range<u32>>)>,
    options: TableParquetOptions,
}

impl ShardTable {
    pub fn new(
        schema: SchemaRef,
        store_url: ObjectStoreUrl,
        files: Vec<(DataFile, Option<Range<u32>>)>,
        options: TableParquetOptions,
    ) -> Self {
        Self {
            schema,
            store_url,
            files,
            options,
        }
    }

    fn partitioned_files(&self) -> Vec<PartitionedFile> {
        self.files
            .iter()
            .map(|(file, row_groups)| {
                let pf = PartitionedFile::new_from_meta(file.meta.clone());
                match row_groups {
                    None => pf,
                    Some(range) => {
                        let mut access = ParquetAccessPlan::new_none(file.num_row_groups());
                        for i in range.start as usize..(range.end as usize).min(file.num_row_groups()) {
                            access.scan(i);
                        }
                        pf.with_extension(access)
                    }
                }
            })
            .collect()
    }
}

#[async_trait]
impl TableProvider for ShardTable {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
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
        let files = self.partitioned_files();
        if files.is_empty() {
            let schema = match projection {
                Some(p) => Arc::new(self.schema.project(p)?),
                None => Arc::clone(&self.schema),
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
        if reads_floats(&self.schema, columns.map(|c| c.name.as_str())) {
            options.global.pruning = false;
            options.global.enable_page_index = false;
            options.global.bloom_filter_on_read = false;
        }
        let source = ParquetSource::new(Arc::clone(&self.schema)).with_table_parquet_options(options.clone());
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

/// Whether any of `columns` is floating-point (or holds floats, in a list or struct): its
/// statistics cannot rule NaN rows out (see the module docs).
pub(crate) fn reads_floats<'a>(schema: &Schema, columns: impl IntoIterator<Item = &'a str>) -> bool {
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
