//! Finishing shards a server left un-reduced.
//!
//! A ticket may let the server leave a fragment's ops `from..` to the client (a split
//! placement, or a server whose cores are taken): the stream then carries the rows before
//! those ops and says so in its schema ([`DEFERRED_FROM_KEY`]). [`Completion`] runs the same
//! kernels here and selects the stream's planned columns, so what the consumer receives is
//! the batch the server would have sent, bit for bit.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use pushdown_ops::{Call, Calls, Context, Resources};
use pushdown_protocol::{DEFERRED_FROM_KEY, Deferral};

use crate::{ClientError, Result};

/// Where each shard's fragment ops run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ShardPlacement {
    /// The share of shards the server reduces (the rest are the client's: a split). Shards
    /// are assigned by their position in the query's endpoints, spread evenly, the same
    /// every epoch.
    pub server_fraction: f64,
    /// Adapted at run time: while this client has room (fewer un-reduced streams in flight
    /// than two per core) the server's shards are asked `IfBusy` (a server whose cores are taken
    /// leaves them here); while it has none, its own shards are asked `IfBusy` (a server
    /// with idle cores takes them back).
    pub adaptive: bool,
    /// The client's cores for running deferred ops.
    pub cores: usize,
}

impl ShardPlacement {
    /// Every shard reduced by the server, never deferred.
    pub const SERVER: Self = Self {
        server_fraction: 1.0,
        adaptive: false,
        cores: 1,
    };

    /// Whether shard `index` is the client's under the split.
    pub fn is_clients(&self, index: usize) -> bool {
        let client = (1.0 - self.server_fraction).clamp(0.0, 1.0);
        ((index + 1) as f64 * client).floor() > (index as f64 * client).floor()
    }
}

/// The ops a shard stream's fragment runs, and what is needed to run them here.
pub struct Completion {
    placement: ShardPlacement,
    /// Un-reduced streams being completed here now.
    active: std::sync::atomic::AtomicUsize,
    ops: Vec<Call>,
    /// The stream's planned schema: what a completed batch must be.
    schema: SchemaRef,
    resources: Arc<dyn Resources>,
    rows: AtomicU64,
    busy_ns: AtomicU64,
    streams: AtomicU64,
}

impl std::fmt::Debug for Completion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Completion")
            .field("ops", &self.ops.len())
            .field("rows", &self.rows.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// What a client did of its fragment's ops.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CompletionTotals {
    /// Rows whose deferred ops ran here.
    pub rows: u64,
    /// Shard streams that arrived un-reduced.
    pub streams: u64,
    /// CPU seconds spent running them.
    pub seconds: f64,
}

impl Completion {
    pub fn new(
        placement: ShardPlacement,
        ops: Vec<Call>,
        schema: SchemaRef,
        resources: Arc<dyn Resources>,
    ) -> Self {
        Self {
            placement,
            active: Default::default(),
            ops,
            schema,
            resources,
            rows: AtomicU64::new(0),
            busy_ns: AtomicU64::new(0),
            streams: AtomicU64::new(0),
        }
    }

    /// Where a received batch's ops were left off, if they were.
    pub fn deferred_from(batch: &RecordBatch) -> Result<Option<usize>> {
        match batch.schema_ref().metadata().get(DEFERRED_FROM_KEY) {
            None => Ok(None),
            Some(v) => v.parse().map(Some).map_err(|_| {
                ClientError::Invalid(format!("bad `{DEFERRED_FROM_KEY}` in a stream's schema: {v:?}"))
            }),
        }
    }

    /// What to ask of the server for shard `index`, and, when the shard may arrive
    /// un-reduced, a guard that counts it against this client's room until its stream shows
    /// it did not (or, when it did, until it ends).
    pub(crate) fn deferral_for(self: &Arc<Self>, index: usize) -> (Deferral, Option<Active>) {
        // Two streams per core: one being completed, one arriving behind it.
        let room = self.active.load(Ordering::Relaxed) < 2 * self.placement.cores.max(1);
        let clients = self.placement.is_clients(index);
        let deferral = match (self.ops.is_empty(), clients, self.placement.adaptive, room) {
            (true, ..) => Deferral::Never,
            // Adapted: the client's own shards go back to a server with idle cores while
            // this client is the busier end; the server's come here while it is.
            (_, true, true, false) | (_, false, true, true) => Deferral::IfBusy { from: 0 },
            (_, true, _, _) => Deferral::Always { from: 0 },
            (_, false, _, _) => Deferral::Never,
        };
        let guard = (deferral != Deferral::Never).then(|| {
            self.active.fetch_add(1, Ordering::Relaxed);
            Active(Arc::clone(self))
        });
        (deferral, guard)
    }

    /// A stream arrived un-reduced.
    pub(crate) fn stream_started(&self) {
        self.streams.fetch_add(1, Ordering::Relaxed);
    }

    /// Runs ops `from..` on `batch` and selects the planned columns.
    pub fn complete(&self, batch: RecordBatch, from: usize) -> Result<RecordBatch> {
        let start = Instant::now();
        let calls = self.ops.get(from..).ok_or_else(|| {
            ClientError::Invalid(format!(
                "a server left ops {from}.. to this client, but the fragment has {}",
                self.ops.len()
            ))
        })?;
        let rows = batch.num_rows() as u64;
        // The stream's schema metadata is the server's note, not part of the rows.
        let plain = Arc::new(batch.schema().as_ref().clone().with_metadata(Default::default()));
        let batch = RecordBatch::try_new_with_options(
            plain,
            batch.columns().to_vec(),
            &arrow::record_batch::RecordBatchOptions::new().with_row_count(Some(batch.num_rows())),
        )?;
        let bound = Calls::bind(calls, batch.schema())?;
        let out = bound.apply(
            batch,
            &Context {
                seed: 0,
                resources: self.resources.as_ref(),
            },
        )?;
        let columns = self
            .schema
            .fields()
            .iter()
            .map(|f| {
                out.column_by_name(f.name()).cloned().ok_or_else(|| {
                    ClientError::Invalid(format!(
                        "a deferred stream's rows lack column `{}` after its ops ran",
                        f.name()
                    ))
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let done = RecordBatch::try_new(Arc::clone(&self.schema), columns)?;
        self.rows.fetch_add(rows, Ordering::Relaxed);
        self.busy_ns
            .fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        Ok(done)
    }

    pub fn totals(&self) -> CompletionTotals {
        CompletionTotals {
            rows: self.rows.load(Ordering::Relaxed),
            streams: self.streams.load(Ordering::Relaxed),
            seconds: self.busy_ns.load(Ordering::Relaxed) as f64 / 1e9,
        }
    }
}

/// A stream that may arrive, or arrives, un-reduced (see [`Completion::deferral_for`]).
pub(crate) struct Active(Arc<Completion>);

impl Drop for Active {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::Relaxed);
    }
}
