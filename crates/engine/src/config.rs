//! A node's limits and sizes: what the engine and the Flight front end read, all in one
//! place so that `pushdown serve`'s flags map to fields one to one.

use std::time::Duration;

use crate::cache::CacheConfig;

/// Limits and sizes of a server. Every field has a deliberate default.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Rows per record batch produced by scans.
    pub batch_size: usize,
    /// A shard grows by whole row groups until its projected bytes reach this.
    pub shard_target_bytes: u64,
    /// … or its rows reach this.
    pub shard_max_rows: u64,
    /// DoGet streams running at once; more wait up to `queue_timeout`, then get
    /// `ResourceExhausted`.
    pub max_concurrent_streams: usize,
    pub queue_timeout: Duration,
    /// Longest a DoGet stream may run.
    pub request_timeout: Duration,
    /// Memory pool of the query engine, shared by all requests.
    pub memory_limit: usize,
    /// Threads of the CPU runtime (decode, filter, ops, encode); also the partitions of
    /// queries that are not row-wise.
    pub cpu_threads: usize,
    /// Streams that run their fragment ops here at once before a stream whose client allows
    /// it (`Deferral::IfBusy`) is answered un-reduced, its ops left to the client. `None`:
    /// `cpu_threads` (each reducing stream has a core); `Some(0)`: every such stream is
    /// left to its client.
    pub reducing_streams: Option<usize>,
    /// How many nice steps (Linux) the CPU runtime's threads run below the server's others:
    /// when both want the cores, the streams whose ops are left to their clients go first.
    /// Such a stream costs the server a few percent of what reducing it would, and frees a
    /// trainer's core; behind shards being reduced it idles that core (simulated with eight
    /// trainers on one server core: well short of the best static placement at the same
    /// priority, close to it at 5 steps; `crates/client/src/control/tests.rs`, and
    /// `benches/RESULTS.md`, "One server core shared by 3 trainers"). The CPU stays busy
    /// either way: priority only orders who waits. 0: the same priority.
    pub reducing_nice: u8,
    /// Row-group ranges read at once by the streams running now, shared among them: a
    /// store with long round trips (S3: tens of ms per request) is read at its bandwidth
    /// only with several requests in flight, however few cores decode. A stream reads
    /// `max(cpu_threads, store_reads_in_flight) / running streams` ranges at once (at least
    /// one), emitted in order. See [`crate::store::reads_in_flight_for`].
    pub store_reads_in_flight: usize,
    /// The catalog is listed again when older than this.
    pub catalog_refresh: Duration,
    /// Target size of one Flight message.
    pub max_flight_data_bytes: usize,
    /// gRPC message size limit, both directions.
    pub max_message_bytes: usize,
    /// Location put in endpoints (`grpc://host:port`); none means "this server".
    pub advertise: Option<String>,
    /// The codec of streams for clients that cannot choose one (SQL text or a path as the
    /// descriptor: pyarrow, ADBC, any Flight client). None: uncompressed for peers on this
    /// host, [`pushdown_protocol::Compression::Adaptive`] for the rest. Set it where the peer address misleads
    /// (behind a local proxy every peer is on loopback).
    pub plain_client_codec: Option<pushdown_protocol::Compression>,
    /// Whether a stream that opens with no other running also opens, and starts decoding,
    /// the endpoint planned after it (a reader taking endpoints in order finds it ready).
    pub read_ahead: bool,
    /// An op call whose output may exceed this many bytes per row is refused at planning
    /// (`decode_resize(image, 8192, 8192)`: 192 MiB a row).
    pub max_op_row_bytes: u64,
    /// Batches are cut so that one batch of the largest op output stays under this.
    pub max_op_batch_bytes: u64,
    /// Longest SQL text (or fragment predicate) accepted, in bytes.
    pub max_sql_bytes: usize,
    /// The most memory one query may hold, out of `memory_limit` (every query has a pool
    /// of its own over the server's).
    pub max_query_memory: usize,
    /// The fragment cache: budgets, disk directory, modes by dataset.
    pub cache: CacheConfig,
    /// The scaling signal's window: clients' reports and the server's CPU use over this
    /// long answer "how many servers would remove the stall".
    pub scaling_window: Duration,
    /// A folder of tokenizers by name (`NAME.json`), for calls that name one no dataset is
    /// called (`tokenize(body, 512, 'llama3')`).
    pub tokenizers: Option<std::path::PathBuf>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            batch_size: 8192,
            shard_target_bytes: 64 << 20,
            shard_max_rows: 1 << 20,
            max_concurrent_streams: 64,
            queue_timeout: Duration::from_secs(30),
            request_timeout: Duration::from_secs(3600),
            memory_limit: 1 << 30,
            cpu_threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
            reducing_streams: None,
            reducing_nice: 5,
            store_reads_in_flight: 1,
            catalog_refresh: Duration::from_secs(5),
            max_flight_data_bytes: 2 << 20,
            max_message_bytes: 64 << 20,
            advertise: None,
            plain_client_codec: None,
            read_ahead: true,
            max_op_row_bytes: 16 << 20,
            max_op_batch_bytes: 256 << 20,
            max_sql_bytes: 64 << 10,
            max_query_memory: 512 << 20,
            cache: CacheConfig::default(),
            scaling_window: Duration::from_secs(10),
            tokenizers: None,
        }
    }
}
