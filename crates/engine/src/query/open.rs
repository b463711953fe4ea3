//! Opening a ticket: its query framed over the ticket's shard (its row groups, or the rows
//! of a part), checked against the catalog again, into a physical plan with its partitions.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;

use datafusion::catalog::TableProvider;
use datafusion::common::TableReference;
use datafusion::execution::context::SessionContext;
use datafusion::prelude::DataFrame;
use pushdown_protocol::{FilterPushdown, Shard, ShardTicket, StreamStats};

use crate::allow::CheckedQuery;
use crate::auth::Grant;
use crate::catalog::{DataFile, Dataset, lookup};
use crate::error::{Result, ServerError};
use crate::table::{ShardTable, groups_holding};
use crate::udf::OpLimits;

use super::plan::{one_to_one, part_filter, row_wise_table};
use super::{Engine, Opened, checked_dataframe, ordered_stream, scan_stats};

impl Engine {
    /// `DoGet`: checks the ticket against the catalog and builds its physical plan. A shard
    /// is read as up to `parallelism` contiguous row-group ranges, decoded at once and
    /// emitted in order (see [`ordered_stream`]): one stream can use several cores.
    pub async fn open(&self, ticket: &ShardTicket, parallelism: usize, grant: &Grant) -> Result<Opened> {
        let checked = self.authorize(ticket, grant)?;
        self.open_checked(ticket, &checked, parallelism, grant).await
    }

    /// [`Self::open`] for a ticket whose query [`Self::authorize`] has checked (`checked`
    /// is its result for this very ticket): the query is not parsed again.
    pub async fn open_checked(
        &self,
        ticket: &ShardTicket,
        checked: &CheckedQuery,
        parallelism: usize,
        grant: &Grant,
    ) -> Result<Opened> {
        let framed = self.dataframe_for(ticket, checked, parallelism, grant).await?;
        let Framed {
            ctx,
            df,
            row_groups,
            limits,
            source,
            skipped,
            prescan,
        } = framed;
        // Batches small enough that one batch of the largest op output stays under the cap.
        let rows = limits.batch_rows(self.config.batch_size);
        let (mut state, logical) = df.into_parts();
        if rows < self.config.batch_size {
            let rows = datafusion::common::config::ConfigNonZeroUsize::try_new(rows)?;
            state.config_mut().options_mut().execution.batch_size = rows;
            ctx.state_ref()
                .write()
                .config_mut()
                .options_mut()
                .execution
                .batch_size = rows;
        }
        let optimized = state.optimize(&logical)?;
        // A whole query's partitions may depend on each other (a hash repartition feeds them
        // all): every one is drained at once, as DataFusion would.
        let parallelism = if source.is_some() { parallelism } else { usize::MAX };
        let cacheable = match source {
            Some(source) => {
                crate::cache::query_print(&optimized, &source.names)?.map(|print| crate::cache::Cacheable {
                    key: crate::cache::shard_key(print, &source.dataset, &source.file, &source.row_groups),
                    mode: self.cache_mode(&source.names),
                    names: source.names,
                })
            }
            None => None,
        };
        // After the cache key: the rewrite changes how, not what, the plan reads.
        let optimized = crate::table::strings_as_views_under_filters(optimized)?;
        let plan = state
            .query_planner()
            .create_physical_plan(&optimized, &state)
            .await?;
        Ok(Opened {
            plan,
            ctx,
            row_groups,
            parallelism,
            started: None,
            cacheable,
            skipped,
            prescan,
        })
    }

    /// The ticket's query (`checked` by [`Self::authorize`]) as a DataFrame over its shard (or
    /// the whole catalog).
    pub(super) async fn dataframe_for(
        &self,
        ticket: &ShardTicket,
        checked: &CheckedQuery,
        parallelism: usize,
        grant: &Grant,
    ) -> Result<Framed> {
        let datasets = self.catalog.datasets().await?;
        match &ticket.shard {
            Some(shard) => {
                self.shard_dataframe(ticket, checked, shard, parallelism, grant, &datasets)
                    .await
            }
            None => self.whole_dataframe(ticket, checked, grant, &datasets).await,
        }
    }

    /// [`Self::dataframe_for`] a ticket for `shard`: its query over a table of the shard's
    /// row groups, cut into partitions for `parallelism`. A ticket for a part of the shard's
    /// output (`skip_rows`, `take_rows`) whose query has no filter reads only that part: the
    /// query's row `i` is the shard's row `i`, so the part is a row selection of the scan
    /// (unless the fragment cache is `on` for the query's datasets).
    pub(super) async fn shard_dataframe(
        &self,
        ticket: &ShardTicket,
        checked: &CheckedQuery,
        shard: &Shard,
        parallelism: usize,
        grant: &Grant,
        datasets: &BTreeMap<String, Arc<Dataset>>,
    ) -> Result<Framed> {
        let (dataset, file) = self.current_shard_file(datasets, shard).await?;
        let frame = |rows: Option<Range<u64>>| ShardFrame {
            ticket,
            checked,
            shard,
            dataset: &dataset,
            file: &file,
            rows,
            parallelism,
        };
        let whole = self.frame_shard(frame(None), grant, datasets).await?;
        let partial = ticket.skip_rows > 0 || ticket.take_rows.is_some();
        // A dataset cached `on` computes its shards whole, so that the next request for any
        // part of it is a hit (see `TicketStream`).
        if !partial || self.cache_mode(checked.names()) == crate::CacheMode::On {
            return Ok(whole);
        }
        let first: u64 = (0..shard.row_groups.start as usize)
            .map(|i| file.row_group_rows(i))
            .sum();
        let len: u64 = shard
            .row_groups
            .clone()
            .map(|i| file.row_group_rows(i as usize))
            .sum();
        let (rows, prescan) = if one_to_one(whole.df.logical_plan()) {
            let from = ticket.skip_rows.min(len);
            let to = ticket.take_rows.map_or(len, |t| from.saturating_add(t).min(len));
            (from..to, None)
        } else {
            match self.filtered_part(&whole, ticket, len, parallelism).await? {
                Some((rows, prescan)) => (rows, Some(prescan)),
                None => return Ok(whole),
            }
        };
        let mut part = self
            .frame_shard(frame(Some(first + rows.start..first + rows.end)), grant, datasets)
            .await?;
        part.skipped = Some(ticket.skip_rows);
        part.prescan = prescan;
        Ok(part)
    }

    /// The shard's rows (counted from its start) holding the part of a filtered query's
    /// output that `ticket` asks for, found by evaluating the filter alone (only its columns
    /// are read) and stopping at the part's last row; and what that read. Its `rows_scanned`
    /// are the rows of storage the part accounts for: from the row after the previous part's
    /// last match to this part's end, so the parts of a shard count its rows once between
    /// them (each prescan reads from the shard's start, and the part's own plan reads a
    /// subset again). `None` when the query is not a filter over a one-to-one plan (its part
    /// is then cut from the whole output) or the shard holds fewer matching rows than the
    /// part skips.
    pub(super) async fn filtered_part(
        &self,
        whole: &Framed,
        ticket: &ShardTicket,
        len: u64,
        parallelism: usize,
    ) -> Result<Option<(Range<u64>, StreamStats)>> {
        let Some((predicate, input)) = part_filter(whole.df.logical_plan()) else {
            return Ok(None);
        };
        let keep = datafusion::logical_expr::LogicalPlanBuilder::from(input)
            .project(vec![predicate.alias("__pushdown_keep")])?
            .build()?;
        let state = whole.ctx.state();
        let plan = state.create_physical_plan(&keep).await?;
        let mut stream = ordered_stream(Arc::clone(&plan), whole.ctx.task_ctx(), parallelism)?;
        let (skip, take) = (ticket.skip_rows, ticket.take_rows.unwrap_or(u64::MAX));
        let (mut row, mut matched, mut start) = (0u64, 0u64, None);
        // Where the previous part ends: just after the match before this part's first.
        let (mut end, mut after_previous) = (None, 0u64);
        'batches: while let Some(batch) = futures::StreamExt::next(&mut stream).await {
            let batch = batch.map_err(|e| ServerError::from_scan(e, ticket.shard.as_ref()))?;
            let keep = arrow::array::AsArray::as_boolean(batch.column(0));
            for i in 0..keep.len() {
                // A null predicate drops the row, as the filter does.
                if arrow::array::Array::is_valid(keep, i) && keep.value(i) {
                    if matched + 1 == skip {
                        after_previous = row + i as u64 + 1;
                    }
                    if matched == skip {
                        start = Some(row + i as u64);
                    }
                    matched += 1;
                    if matched == skip.saturating_add(take) {
                        end = Some(row + i as u64 + 1);
                        break 'batches;
                    }
                }
            }
            row += keep.len() as u64;
        }
        drop(stream);
        let mut stats = scan_stats(&plan);
        let end = end.unwrap_or(len);
        stats.rows_scanned = end.saturating_sub(after_previous);
        Ok(start.map(|start| (start..end, stats)))
    }

    /// The query of `frame` over its shard's table (only its rows, when it names some).
    pub(super) async fn frame_shard(
        &self,
        frame: ShardFrame<'_>,
        grant: &Grant,
        datasets: &BTreeMap<String, Arc<Dataset>>,
    ) -> Result<Framed> {
        let ShardFrame {
            ticket,
            checked,
            shard,
            dataset,
            file,
            rows,
            parallelism,
        } = frame;
        let pushdown = ticket.request.filter_pushdown == FilterPushdown::On;
        // The row groups holding the rows read (all of the shard's, without a selection).
        let row_groups = match &rows {
            Some(rows) => groups_holding(file, shard.row_groups.clone(), rows),
            None => shard.row_groups.clone(),
        };
        let units = shard_partitions(file, &row_groups, parallelism);
        let parts = split_range(row_groups.clone(), units);
        let ctx = self.session(parts.len());
        let table = ShardTable::new(
            Arc::clone(&dataset.file_schema),
            dataset.partitions.clone(),
            self.store_url.clone(),
            parts.into_iter().map(|r| (file.clone(), Some(r))).collect(),
            self.parquet_options(pushdown),
        )
        .with_durations(Arc::clone(&self.durations));
        let table = match rows {
            Some(rows) => table.with_rows(rows),
            None => table,
        };
        let table: Arc<ShardTable> = Arc::new(table);
        // Under every name the query gives the shard's dataset (`MyPets` and `mypets`).
        for name in checked.names().iter().flat_map(|n| self.views.bases_of(n)) {
            if lookup(datasets, &name).is_ok_and(|d| d.name == dataset.name) {
                let reference = TableReference::bare(name.as_str());
                if !ctx.table_exist(reference.clone())? {
                    ctx.register_table(reference, Arc::clone(&table) as Arc<dyn TableProvider>)?;
                }
            }
        }
        let limits = self.op_limits(&ctx, ticket.request.tokenizer.as_deref());
        // Views over the shard's dataset read the shard table just registered.
        self.register_names(&ctx, datasets, grant, checked.names(), &limits, |d| {
            self.full_table(d, pushdown)
        })
        .await?;
        let df = checked_dataframe(&ctx, &ticket.request.query, checked).await?;
        let scanned = row_wise_table(df.logical_plan()).map(|t| lookup(datasets, &t));
        if !matches!(scanned, Some(Ok(d)) if d.name == dataset.name) {
            return Err(ServerError::BadRequest(
                "the ticket's query is not row-wise over its shard's dataset".into(),
            ));
        }
        Ok(Framed {
            ctx,
            df,
            row_groups: u64::from(row_groups.end - row_groups.start),
            limits,
            source: Some(ShardSource {
                names: checked.names().to_vec(),
                dataset: dataset.name.clone(),
                file: file.clone(),
                row_groups: shard.row_groups.clone(),
            }),
            skipped: None,
            prescan: None,
        })
    }

    /// The dataset and file `shard` reads, as they are now, checked against the shard: the
    /// file is still the version it names and holds its row groups.
    pub(super) async fn current_shard_file(
        &self,
        datasets: &BTreeMap<String, Arc<Dataset>>,
        shard: &Shard,
    ) -> Result<(Arc<Dataset>, DataFile)> {
        let listed = lookup(datasets, &shard.dataset)?;
        let unknown = || ServerError::UnknownShard {
            dataset: shard.dataset.clone(),
            file: shard.file.clone(),
        };
        let file = listed.file(&shard.file).ok_or_else(unknown)?;
        // The file as it is now: never new bytes read with an old footer.
        let (dataset, file) = self
            .catalog
            .current(&shard.dataset, file)
            .await?
            .ok_or_else(unknown)?;
        if file.version != shard.version {
            return Err(ServerError::FileChanged {
                dataset: shard.dataset.clone(),
                file: shard.file.clone(),
                planned: shard.version.clone(),
                now: file.version.clone(),
            });
        }
        if shard.row_groups.end as usize > file.num_row_groups() {
            return Err(ServerError::BadRequest(format!(
                "ticket names row groups {:?} of `{}`, which has {}",
                shard.row_groups,
                shard.file,
                file.num_row_groups()
            )));
        }
        Ok((dataset, file))
    }

    /// [`Self::dataframe_for`] a ticket with no shard: its query over the whole datasets it
    /// reads, as one stream.
    pub(super) async fn whole_dataframe(
        &self,
        ticket: &ShardTicket,
        checked: &CheckedQuery,
        grant: &Grant,
        datasets: &BTreeMap<String, Arc<Dataset>>,
    ) -> Result<Framed> {
        let pushdown = ticket.request.filter_pushdown == FilterPushdown::On;
        if ticket.skip_rows > 0 || ticket.take_rows.is_some() {
            return Err(ServerError::BadRequest(
                "a query that is not row-wise (an aggregate, join, sort or limit, or a \
                 volatile function) has no total order, so its stream cannot be resumed or \
                 cut: run it again from the start, whole"
                    .into(),
            ));
        }
        let ctx = self.session(self.config.cpu_threads);
        let limits = self.op_limits(&ctx, ticket.request.tokenizer.as_deref());
        let referenced = self
            .register_referenced(&ctx, datasets, grant, checked, &limits, |d| {
                self.full_table(d, pushdown)
            })
            .await?;
        let mut row_groups = 0;
        for dataset in &referenced {
            dataset.check_readable()?;
            row_groups += dataset
                .files
                .iter()
                .map(|f| f.num_row_groups() as u64)
                .sum::<u64>();
        }
        let df = checked_dataframe(&ctx, &ticket.request.query, checked).await?;
        Ok(Framed {
            ctx,
            df,
            row_groups,
            limits,
            source: None,
            skipped: None,
            prescan: None,
        })
    }
}

/// A ticket's query framed over its shard (or the whole catalog), checked.
pub(super) struct Framed {
    pub(super) ctx: SessionContext,
    pub(super) df: DataFrame,
    pub(super) row_groups: u64,
    pub(super) limits: OpLimits,
    pub(super) source: Option<ShardSource>,
    /// A part of the shard's output read as a row selection: the rows of the output the
    /// scan skipped (the stream's first row is the output's row `skipped`). `None`: the
    /// whole output is computed.
    pub(super) skipped: Option<u64>,
    /// What finding a filtered part's rows read (its filter's columns, before the part),
    /// with the rows of storage the part accounts for ([`Engine::filtered_part`]).
    pub(super) prescan: Option<StreamStats>,
}

/// What [`Engine::frame_shard`] frames: a ticket's checked query over its shard of `file`,
/// only the rows `rows` of the file when set.
pub(super) struct ShardFrame<'a> {
    pub(super) ticket: &'a ShardTicket,
    pub(super) checked: &'a CheckedQuery,
    pub(super) shard: &'a Shard,
    pub(super) dataset: &'a Dataset,
    pub(super) file: &'a DataFile,
    pub(super) rows: Option<Range<u64>>,
    pub(super) parallelism: usize,
}

/// What a shard's output is computed from, for its cache key.
pub(super) struct ShardSource {
    /// The names the query gives, granted (datasets and views).
    pub(super) names: Vec<String>,
    pub(super) dataset: String,
    /// The file as it is now.
    pub(super) file: crate::catalog::DataFile,
    pub(super) row_groups: std::ops::Range<u32>,
}

/// How many partitions `shard` of `file` is read in with `parallelism` cores (see
/// [`split_range`]).
pub(super) fn shard_partitions(file: &DataFile, row_groups: &Range<u32>, parallelism: usize) -> usize {
    // In parallel, partitions of about `UNIT_ROWS` rows (each has a fixed cost to
    // start), at least one per core: the stream's cores decode the next
    // partitions while one is sent (see `ordered_stream`).
    if parallelism > 1 {
        let rows: i64 = file.metadata.row_groups()[row_groups.start as usize..row_groups.end as usize]
            .iter()
            .map(|rg| rg.num_rows())
            .sum();
        // At least one per core, at most `MAX_PARTITIONS` (even past 64 cores).
        (rows.max(0) as u64 / UNIT_ROWS)
            .max(parallelism as u64)
            .min(MAX_PARTITIONS as u64) as usize
    } else {
        1
    }
}

/// The most partitions a shard is cut into: a shard's row groups past it share partitions.
pub(super) const MAX_PARTITIONS: usize = 64;

/// About the rows of a partition when a shard is decoded in parallel: smaller partitions
/// made the clicks filter slower (each pays its own start-up), larger ones made the lineitem
/// projection faster (measured with `bench_plain_client.py`, 2 threads; the figures are in
/// `benches/RESULTS.md`, "Scan: the server against DuckDB").
pub(super) const UNIT_ROWS: u64 = 65_536;

/// `range` cut into at most `parts` contiguous, non-empty ranges of near-equal length, in
/// order.
pub(super) fn split_range(range: Range<u32>, parts: usize) -> Vec<Range<u32>> {
    let len = range.end.saturating_sub(range.start);
    let parts = (parts.max(1) as u32).min(len.max(1));
    (0..parts)
        .map(|i| {
            let start = range.start + len * i / parts;
            let end = range.start + len * (i + 1) / parts;
            start..end
        })
        .filter(|r| !r.is_empty() || len == 0)
        .collect()
}

#[cfg(test)]
mod split_tests {
    use super::split_range;

    #[test]
    fn ranges_split_into_contiguous_near_equal_parts() {
        assert_eq!(split_range(0..8, 4), vec![0..2, 2..4, 4..6, 6..8]);
        assert_eq!(split_range(3..10, 3), vec![3..5, 5..7, 7..10]);
        assert_eq!(split_range(2..4, 8), vec![2..3, 3..4]);
        assert_eq!(split_range(5..6, 1), vec![5..6]);
        assert_eq!(split_range(0..5, 0), vec![0..5]);
    }
}
