//! Wire messages of pushdown and their conversions to domain types.
//!
//! This is the only crate that knows the protobuf encoding. `proto/pushdown/v1/pushdown.proto`
//! is the source of truth; [`proto`] is generated from it by `scripts/regen-proto.sh` and
//! checked in (no `protoc` needed to build). Everything else in the workspace speaks the
//! domain types below, which are validated on the way in: a wire message that is missing a
//! required field or carries an out-of-range value becomes a [`ProtocolError`], never a
//! half-filled struct.
//!
//! ```text
//!  GetFlightInfo(Cmd = ScanRequest | SQL text) ──▶ FlightInfo { endpoint per Shard }
//!  DoGet(Ticket = ShardTicket { request, shard, skip_rows, take_rows }) ──▶ Arrow IPC stream
//! ```
//!
//! ```
//! use pushdown_protocol::{Compression, Fragment, Query, ScanRequest};
//! let request = ScanRequest::new(Query::Fragment(Fragment {
//!     dataset: "images".into(),
//!     columns: vec!["label".into()],
//!     predicate: Some("label < 10".into()),
//!     ops: vec![],
//! }));
//! let bytes = request.encode();
//! let back = ScanRequest::decode_command(&bytes).unwrap();
//! assert_eq!(back, request);
//! assert_eq!(back.compression, Compression::Zstd);
//! // A plain SQL text is a command too.
//! let sql = ScanRequest::decode_command(b"SELECT label FROM images").unwrap();
//! assert_eq!(sql.query, Query::Sql("SELECT label FROM images".into()));
//! ```

use std::ops::Range;

use bytes::Bytes;
use prost::Message;

/// The generated prost messages of `pushdown.v1`.
pub mod proto {
    include!("generated/pushdown.v1.rs");
}

/// Version of the ticket layout this build mints and accepts.
pub const TICKET_VERSION: u32 = 2;

/// A wire message that does not describe a valid request.
#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    #[error("malformed {message}: {cause}")]
    Decode {
        message: &'static str,
        cause: prost::DecodeError,
    },
    #[error("{message} is missing required field `{field}`")]
    Missing {
        message: &'static str,
        field: &'static str,
    },
    #[error("{message}.{field}: {reason}")]
    Invalid {
        message: &'static str,
        field: &'static str,
        reason: String,
    },
    #[error("ticket version {found} is not supported (this server speaks version {TICKET_VERSION})")]
    TicketVersion { found: u32 },
    #[error("command is neither a pushdown.v1.ScanRequest nor UTF-8 SQL text")]
    UnrecognizedCommand,
}

type Result<T, E = ProtocolError> = std::result::Result<T, E>;

/// Turns an absent optional sub-message into [`ProtocolError::Missing`].
trait Required<T> {
    fn required(self, message: &'static str, field: &'static str) -> Result<T>;
}

impl<T> Required<T> for Option<T> {
    fn required(self, message: &'static str, field: &'static str) -> Result<T> {
        self.ok_or(ProtocolError::Missing { message, field })
    }
}

/// What a client asks of the server: a query and how to stream its answer.
#[derive(Debug, Clone, PartialEq)]
pub struct ScanRequest {
    pub query: Query,
    pub compression: Compression,
    /// End every stream with a metadata-only message carrying [`StreamStats`].
    pub stats: bool,
    pub filter_pushdown: FilterPushdown,
    /// Which of a fragment's ops the server may leave to the client.
    pub deferral: Deferral,
    /// The tokenizer of op calls that name none (a given tokenizer's `sha256:` id, or a
    /// server's tokenizer by name); none: the dataset read's.
    pub tokenizer: Option<String>,
}

/// Which ops of a fragment the server may leave to the client: ops `from..` then run on the
/// client, over the rows the server streams un-reduced ([`Fragment::deferred`]), and the
/// stream's schema says so ([`DEFERRED_FROM_KEY`]). Only the place an op runs changes: the
/// rows, their order and their values do not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Deferral {
    /// The server runs every op.
    #[default]
    Never,
    /// The server defers when its cores are taken by other reducing streams.
    IfBusy { from: u32 },
    /// The server defers: the shard is the client's (a split placement).
    Always { from: u32 },
}

/// Schema metadata of a stream whose fragment ops from this index on were left to the client.
pub const DEFERRED_FROM_KEY: &str = "pushdown.deferred_from";

/// gRPC metadata of a `DoGet`: the reader it is for (a decimal `u64` each of a client's
/// loaders draws at random). Streams naming one reader are one client's on the server
/// (`StreamStats::reduced_alone`); a stream that names none is its connection's.
pub const READER_HEADER: &str = "pushdown-reader";

/// gRPC metadata every pushdown client sends: its version ([`VERSION`]). A server refuses a
/// client whose version is not [`compatible`] with its own, naming both; a request without
/// it (a plain Flight client: pyarrow, ADBC) is served.
pub const VERSION_HEADER: &str = "pushdown-version";

/// This build's version, as clients send it and servers compare it.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The compatibility rule: a client and a server work together when their versions share
/// the major version and, before 1.0, the minor version too (`0.1.x` with `0.1.y`; `1.x`
/// with `1.y`). Fields are only ever added to the protocol within such a range; anything
/// else (a renamed field, another ticket version) takes the next one. `Err` says why not.
pub fn compatible(client: &str, server: &str) -> std::result::Result<(), String> {
    let parse = |v: &str| -> Option<(u64, u64)> {
        let mut parts = v.trim().split(['.', '-', '+']);
        Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
    };
    let (Some(c), Some(s)) = (parse(client), parse(server)) else {
        return Err(format!(
            "the client's version `{client}` is not a version this server ({server}) can compare"
        ));
    };
    let line = |(major, minor): (u64, u64)| {
        if major == 0 {
            format!("0.{minor}")
        } else {
            major.to_string()
        }
    };
    if line(c) == line(s) {
        return Ok(());
    }
    Err(format!(
        "a pushdown {client} client does not work with this {server} server: client and server \
         work together within one major version (before 1.0, one minor version); use a {}.x client",
        line(s)
    ))
}

#[derive(Debug, Clone, PartialEq)]
pub enum Query {
    Fragment(Fragment),
    Sql(String),
}

/// The storage-side part of a pipeline: dataset, projection, predicate, row-wise ops.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Fragment {
    pub dataset: String,
    /// Result columns in order; empty means every column of the dataset.
    pub columns: Vec<String>,
    /// A SQL boolean expression over the dataset's columns.
    pub predicate: Option<String>,
    pub ops: Vec<OpCall>,
}

/// An op call of a fragment: [`pushdown_ops::Call`], the type every side shares. On the
/// wire its arguments are a list whose first is the input column and the rest literals.
pub use pushdown_ops::{Call as OpCall, Value};

mod codec;
pub use codec::{CodecInputs, Compression, LinkKnown, Profiled, choose_codec};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FilterPushdown {
    #[default]
    Auto,
    On,
    Off,
}

/// One file of a dataset and a range of its row groups: the unit a server streams.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shard {
    pub dataset: String,
    /// Path relative to the dataset root, as the catalog lists it.
    pub file: String,
    pub row_groups: Range<u32>,
    /// Rows in the row-group range, before filtering.
    pub rows: u64,
    /// The file's version when the shard was planned (see [`FileVersion`]).
    pub version: FileVersion,
    /// Compressed bytes of the projected column chunks in the row-group range.
    pub bytes: u64,
}

impl Shard {
    /// `dataset/file[a..b]`, as errors name a shard.
    pub fn label(&self) -> String {
        format!(
            "{}/{}[row groups {}..{}]",
            self.dataset, self.file, self.row_groups.start, self.row_groups.end
        )
    }
}

/// Which version of a file a shard was planned on: its size and a hash of its footer (the
/// layout and statistics of every column chunk). Copies of one file on several servers have
/// one version, whatever their modification times; a file rewritten in place has another.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileVersion {
    pub size: u64,
    pub hash: String,
}

impl std::fmt::Display for FileVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} bytes, footer {}", self.size, self.hash)
    }
}

/// The decoded Flight ticket: which request, which shard, where to resume.
#[derive(Debug, Clone, PartialEq)]
pub struct ShardTicket {
    pub request: ScanRequest,
    /// `None`: the whole query as one stream (not row-wise).
    pub shard: Option<Shard>,
    /// Output rows of this shard already delivered (or another reader's), to be skipped.
    pub skip_rows: u64,
    /// Output rows to send after those skipped; `None`: to the shard's end.
    pub take_rows: Option<u64>,
}

/// What one DoGet stream cost the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StreamStats {
    pub rows_scanned: u64,
    pub rows_sent: u64,
    pub bytes_scanned: u64,
    pub bytes_sent: u64,
    pub row_groups: u64,
    pub row_groups_pruned: u64,
    pub elapsed_ns: u64,
    /// Rows the stream's query produced, skipped ones included (the shard's whole output).
    pub rows_output: u64,
    /// 1 when the server ran the stream on its reducing cores with no other client's stream
    /// there from its start to its end; summed, the streams that ran so.
    pub reduced_alone: u64,
}

impl std::ops::AddAssign for StreamStats {
    fn add_assign(&mut self, o: Self) {
        self.rows_scanned += o.rows_scanned;
        self.rows_sent += o.rows_sent;
        self.bytes_scanned += o.bytes_scanned;
        self.bytes_sent += o.bytes_sent;
        self.row_groups += o.row_groups;
        self.row_groups_pruned += o.row_groups_pruned;
        self.elapsed_ns += o.elapsed_ns;
        self.rows_output += o.rows_output;
        self.reduced_alone += o.reduced_alone;
    }
}

/// What the server expects a planned query to cost (the app_metadata of its FlightInfo).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PlanEstimate {
    /// Rows in the row groups the endpoints will scan, before filtering.
    pub rows_upper_bound: u64,
    /// Compressed bytes of the projected column chunks those row groups hold.
    pub bytes_to_scan: u64,
    /// One endpoint per shard, or one stream for the whole query.
    pub row_wise: bool,
    /// Row groups ruled out at planning by their statistics: no endpoint scans them.
    pub row_groups_pruned: u64,
}

impl PlanEstimate {
    pub fn encode(&self) -> Bytes {
        proto::PlanEstimate {
            rows_upper_bound: self.rows_upper_bound,
            bytes_to_scan: self.bytes_to_scan,
            row_wise: self.row_wise,
            row_groups_pruned: self.row_groups_pruned,
        }
        .encode_to_vec()
        .into()
    }

    pub fn decode(bytes: &[u8]) -> Result<Self> {
        let m = proto::PlanEstimate::decode(bytes).map_err(|source| ProtocolError::Decode {
            message: "PlanEstimate",
            cause: source,
        })?;
        Ok(Self {
            rows_upper_bound: m.rows_upper_bound,
            bytes_to_scan: m.bytes_to_scan,
            row_wise: m.row_wise,
            row_groups_pruned: m.row_groups_pruned,
        })
    }
}

/// A fragment run on a sample, measured step by step (the `profile` action's answer).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Profile {
    /// Rows the scan was timed on, before the predicate (the sample grows until it takes
    /// about 20 ms); ops are timed on the first few hundred rows that pass the predicate.
    pub rows_sampled: u64,
    /// Fraction of sampled rows that pass the predicate.
    pub selectivity: f64,
    /// Decode and filter time per sampled row.
    pub scan_ns_per_row: f64,
    /// Arrow bytes per passing row of each source column the fragment reads.
    pub column_bytes_per_row: std::collections::BTreeMap<String, f64>,
    pub ops: Vec<OpProfile>,
    /// Threads the server runs queries on.
    pub server_cores: u32,
    /// What the stream codecs do to each source column (empty: not measured).
    pub column_codecs: std::collections::BTreeMap<String, Codecs>,
    /// Fraction of the dataset's rows in the row groups statistics leave to scan for the
    /// predicate: what a scan reads per dataset row (`None`: not measured, all taken as read).
    pub scanned_fraction: Option<f64>,
    /// Shards (endpoints) the server plans for the fragment: a split placement deals whole
    /// shards to each side (`None`: not measured, by an older server).
    pub shards: Option<u32>,
}

/// One op of a profiled fragment, per passing row.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct OpProfile {
    pub op: String,
    pub input: String,
    pub output: String,
    pub bytes_in_per_row: f64,
    pub bytes_out_per_row: f64,
    pub ns_per_row: f64,
    /// What the stream codecs do to the op's output (`None`: not measured).
    pub output_codecs: Option<Codecs>,
}

/// A column's sample through each stream codec, as Arrow IPC compresses it.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Codecs {
    pub lz4: CodecCost,
    pub zstd: CodecCost,
}

impl Codecs {
    /// The measurement for `codec`; `None` for no compression (free, ratio 1).
    pub fn get(&self, codec: Compression) -> Option<CodecCost> {
        match codec {
            Compression::Lz4 => Some(self.lz4),
            Compression::Zstd => Some(self.zstd),
            Compression::None | Compression::Adaptive => None,
        }
    }
}

/// What a codec does to a column: compressed bytes over Arrow bytes, and CPU per Arrow
/// byte to compress (the server) and to decompress (the client).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct CodecCost {
    pub ratio: f64,
    pub compress_ns_per_byte: f64,
    pub decompress_ns_per_byte: f64,
}

fn codecs_to_proto(c: &Codecs) -> proto::Codecs {
    let cost = |c: &CodecCost| proto::CodecCost {
        ratio: c.ratio,
        compress_ns_per_byte: c.compress_ns_per_byte,
        decompress_ns_per_byte: c.decompress_ns_per_byte,
    };
    proto::Codecs {
        lz4: Some(cost(&c.lz4)),
        zstd: Some(cost(&c.zstd)),
    }
}

fn codecs_from_proto(c: proto::Codecs) -> Codecs {
    let cost = |c: Option<proto::CodecCost>| {
        c.map(|c| CodecCost {
            ratio: c.ratio,
            compress_ns_per_byte: c.compress_ns_per_byte,
            decompress_ns_per_byte: c.decompress_ns_per_byte,
        })
        .unwrap_or_default()
    };
    Codecs {
        lz4: cost(c.lz4),
        zstd: cost(c.zstd),
    }
}

impl Profile {
    pub fn encode(&self) -> Bytes {
        proto::Profile {
            rows_sampled: self.rows_sampled,
            selectivity: self.selectivity,
            scan_ns_per_row: self.scan_ns_per_row,
            column_bytes_per_row: self.column_bytes_per_row.clone().into_iter().collect(),
            ops: self
                .ops
                .iter()
                .map(|o| proto::OpProfile {
                    op: o.op.clone(),
                    input: o.input.clone(),
                    output: o.output.clone(),
                    bytes_in_per_row: o.bytes_in_per_row,
                    bytes_out_per_row: o.bytes_out_per_row,
                    ns_per_row: o.ns_per_row,
                    output_codecs: o.output_codecs.as_ref().map(codecs_to_proto),
                })
                .collect(),
            server_cores: self.server_cores,
            column_codecs: self
                .column_codecs
                .iter()
                .map(|(k, v)| (k.clone(), codecs_to_proto(v)))
                .collect(),
            scanned_fraction: self.scanned_fraction,
            shards: self.shards,
        }
        .encode_to_vec()
        .into()
    }

    pub fn decode(bytes: &[u8]) -> Result<Self> {
        let m = proto::Profile::decode(bytes).map_err(|source| ProtocolError::Decode {
            message: "Profile",
            cause: source,
        })?;
        Ok(Self {
            rows_sampled: m.rows_sampled,
            selectivity: m.selectivity,
            scan_ns_per_row: m.scan_ns_per_row,
            column_bytes_per_row: m.column_bytes_per_row.into_iter().collect(),
            ops: m
                .ops
                .into_iter()
                .map(|o| OpProfile {
                    op: o.op,
                    input: o.input,
                    output: o.output,
                    bytes_in_per_row: o.bytes_in_per_row,
                    bytes_out_per_row: o.bytes_out_per_row,
                    ns_per_row: o.ns_per_row,
                    output_codecs: o.output_codecs.map(codecs_from_proto),
                })
                .collect(),
            server_cores: m.server_cores,
            column_codecs: m
                .column_codecs
                .into_iter()
                .map(|(k, v)| (k, codecs_from_proto(v)))
                .collect(),
            // A fraction outside (0, 1] is not one: taken as not measured.
            scanned_fraction: m.scanned_fraction.filter(|f| *f > 0.0 && *f <= 1.0),
            shards: m.shards.filter(|n| *n > 0),
        })
    }
}

/// The Flight actions a pushdown server answers (`DoAction` type); the one list both sides
/// use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ActionKind {
    Health,
    Explain,
    Profile,
    Count,
    Tokenizer,
    GiveTokenizer,
    HasTokenizer,
    Refresh,
    Report,
    Scaling,
    Ops,
}

impl ActionKind {
    pub const ALL: [Self; 11] = [
        Self::Health,
        Self::Explain,
        Self::Profile,
        Self::Count,
        Self::Tokenizer,
        Self::GiveTokenizer,
        Self::HasTokenizer,
        Self::Refresh,
        Self::Report,
        Self::Scaling,
        Self::Ops,
    ];

    /// The `DoAction` type string.
    pub fn name(self) -> &'static str {
        match self {
            Self::Health => "health",
            Self::Explain => "explain",
            Self::Profile => "profile",
            Self::Count => "count",
            Self::Tokenizer => "tokenizer",
            Self::GiveTokenizer => "give_tokenizer",
            Self::HasTokenizer => "has_tokenizer",
            Self::Refresh => "refresh",
            Self::Report => "report",
            Self::Scaling => "scaling",
            Self::Ops => "ops",
        }
    }

    /// What the body is and what the result is (`ListActions`).
    pub fn description(self) -> &'static str {
        match self {
            Self::Health => "Returns `ok` when the server is serving",
            Self::Explain => {
                "Body: a command (ScanRequest or SQL). Returns the shape, shards, estimates and optimized plan"
            }
            Self::Profile => {
                "Body: a ScanRequest with a fragment. Runs it on a sample; returns a pushdown.v1.Profile \
                 (selectivity, scan ns/row, bytes per column, per op bytes in/out and ns/row)"
            }
            Self::Count => {
                "Body: a ticket. Returns a pushdown.v1.CountReply: how many rows its DoGet would stream, \
                 reading only the filter's columns"
            }
            Self::Tokenizer => {
                "Body: a dataset name. Returns the dataset's tokenizer.json, for client-side `tokenize`"
            }
            Self::GiveTokenizer => {
                "Body: a tokenizer.json. Keeps it (parsed; refused with the parser's reason) and returns \
                 its id, `sha256:` and the hex SHA-256 of the bytes, which a ScanRequest's `tokenizer` \
                 or a call's tokenizer argument names"
            }
            Self::HasTokenizer => {
                "Body: a tokenizer's id (`sha256:…`). Returns `yes` when this server keeps it, else `no`"
            }
            Self::Refresh => {
                "No body. Lists the data root now (files added, removed or rewritten) instead of at the \
                 next polling interval; returns one pushdown.v1.DatasetVersion per dataset, in \
                 ListFlights order"
            }
            Self::Report => {
                "Body: a pushdown.v1.ClientReport (a loader's wait and rows since its last report). \
                 Returns nothing; feeds the scaling signal"
            }
            Self::Scaling => {
                "No body. Returns a pushdown.v1.ScalingSignal: this server's busy fraction, the \
                 reporting clients' wait, and how many servers would remove their stall"
            }
            Self::Ops => {
                "No body. Returns the names of the ops this server runs, one per line (a build \
                 without FFmpeg lists no video op): a planner keeps the others in the trainer"
            }
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.name() == name)
    }
}

impl std::fmt::Display for ActionKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The `app_metadata` of a `ListFlights` answer: a dataset's version.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DatasetVersion {
    pub dataset: String,
    /// A hash of every file's path and version: changes when a file is added, removed or
    /// rewritten.
    pub version: String,
    pub files: u64,
    pub broken_files: u64,
}

impl DatasetVersion {
    pub fn encode(&self) -> Bytes {
        proto::DatasetVersion {
            dataset: self.dataset.clone(),
            version: self.version.clone(),
            files: self.files,
            broken_files: self.broken_files,
        }
        .encode_to_vec()
        .into()
    }

    pub fn decode(bytes: &[u8]) -> Result<Self> {
        let m = proto::DatasetVersion::decode(bytes).map_err(|source| ProtocolError::Decode {
            message: "DatasetVersion",
            cause: source,
        })?;
        Ok(Self {
            dataset: m.dataset,
            version: m.version,
            files: m.files,
            broken_files: m.broken_files,
        })
    }
}

pub use proto::{ClientReport, ScalingSignal};

impl ClientReport {
    pub fn to_bytes(&self) -> Bytes {
        self.encode_to_vec().into()
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let report = Self::decode(bytes).map_err(|source| ProtocolError::Decode {
            message: "ClientReport",
            cause: source,
        })?;
        for (field, x) in [
            ("elapsed_seconds", report.elapsed_seconds),
            ("wait_seconds", report.wait_seconds),
        ] {
            if !(x.is_finite() && x >= 0.0) {
                return Err(ProtocolError::Invalid {
                    message: "ClientReport",
                    field,
                    reason: format!("{x} is not a finite, non-negative number of seconds"),
                });
            }
        }
        Ok(report)
    }
}

impl ScalingSignal {
    pub fn to_bytes(&self) -> Bytes {
        self.encode_to_vec().into()
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        Self::decode(bytes).map_err(|source| ProtocolError::Decode {
            message: "ScalingSignal",
            cause: source,
        })
    }
}

/// The answer to the `count` action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CountReply {
    pub rows: u64,
}

impl CountReply {
    pub fn encode(&self) -> Bytes {
        proto::CountReply { rows: self.rows }.encode_to_vec().into()
    }

    pub fn decode(bytes: &[u8]) -> Result<Self> {
        let m = proto::CountReply::decode(bytes).map_err(|source| ProtocolError::Decode {
            message: "CountReply",
            cause: source,
        })?;
        Ok(Self { rows: m.rows })
    }
}

impl Fragment {
    /// The fragment the server runs when ops `from..` are left to the client: those ops
    /// dropped, and each column they would have written replaced by the columns they read
    /// (as they were before the first dropped op), so the client can run them on the rows.
    /// Running ops `from..` on this fragment's rows, then selecting [`Self::columns`], gives
    /// this fragment's rows. With no columns named (every column), only the ops are dropped.
    pub fn deferred(&self, from: usize) -> Fragment {
        let from = from.min(self.ops.len());
        let (kept, dropped) = self.ops.split_at(from);
        let columns = if self.columns.is_empty() {
            Vec::new()
        } else {
            // Walking the dropped ops backwards: what each needs replaces what it writes.
            let mut needed: Vec<String> = self.columns.clone();
            for call in dropped.iter().rev() {
                if let Some(at) = needed.iter().position(|c| *c == call.output) {
                    needed.remove(at);
                    if !needed.contains(&call.input) {
                        needed.insert(at, call.input.clone());
                    }
                }
            }
            needed
        };
        Fragment {
            dataset: self.dataset.clone(),
            columns,
            predicate: self.predicate.clone(),
            ops: kept.to_vec(),
        }
    }
}

impl ScanRequest {
    /// A request with default streaming options (zstd, no trailing stats, automatic filter
    /// pushdown).
    pub fn new(query: Query) -> Self {
        Self {
            query,
            compression: Compression::default(),
            stats: false,
            filter_pushdown: FilterPushdown::default(),
            deferral: Deferral::Never,
            tokenizer: None,
        }
    }

    pub fn encode(&self) -> Bytes {
        to_proto::scan_request(self).encode_to_vec().into()
    }

    /// Decodes a `GetFlightInfo` command: a serialized `ScanRequest`, or else UTF-8 SQL text.
    ///
    /// The protobuf reading is tried first and accepted only when it names a query; SQL text
    /// practically never decodes as a message with a query (it would need a valid nested
    /// message of exactly the right length), and when it does not, it is taken as SQL.
    pub fn decode_command(bytes: &[u8]) -> Result<Self> {
        Self::decode_command_origin(bytes).map(|(request, _)| request)
    }

    /// [`Self::decode_command`], and whether the command was plain SQL text (a client that
    /// could not say how it wants the stream compressed) rather than a `ScanRequest`.
    pub fn decode_command_origin(bytes: &[u8]) -> Result<(Self, bool)> {
        if let Ok(message) = proto::ScanRequest::decode(bytes)
            && message.query.is_some()
            && let Ok(request) = from_proto::scan_request(message)
        {
            return Ok((request, false));
        }
        match std::str::from_utf8(bytes) {
            Ok(text) if !text.trim().is_empty() => Ok((Self::new(Query::Sql(text.to_owned())), true)),
            _ => Err(ProtocolError::UnrecognizedCommand),
        }
    }
}

impl ShardTicket {
    pub fn encode(&self) -> Bytes {
        to_proto::shard_ticket(self).encode_to_vec().into()
    }

    pub fn decode(bytes: &[u8]) -> Result<Self> {
        let message = proto::ShardTicket::decode(bytes).map_err(|source| ProtocolError::Decode {
            message: "ShardTicket",
            cause: source,
        })?;
        from_proto::shard_ticket(message)
    }
}

impl StreamStats {
    pub fn encode(&self) -> Bytes {
        to_proto::stream_stats(self).encode_to_vec().into()
    }

    pub fn decode(bytes: &[u8]) -> Result<Self> {
        let m = proto::StreamStats::decode(bytes).map_err(|source| ProtocolError::Decode {
            message: "StreamStats",
            cause: source,
        })?;
        Ok(from_proto::stream_stats(m))
    }
}

mod to_proto {
    use super::*;

    pub(crate) fn scan_request(r: &ScanRequest) -> proto::ScanRequest {
        proto::ScanRequest {
            query: Some(match &r.query {
                Query::Fragment(f) => proto::scan_request::Query::Fragment(fragment(f)),
                Query::Sql(sql) => proto::scan_request::Query::Sql(sql.clone()),
            }),
            compression: match r.compression {
                Compression::None => proto::Compression::None,
                Compression::Zstd => proto::Compression::Zstd,
                Compression::Lz4 => proto::Compression::Lz4,
                Compression::Adaptive => proto::Compression::Adaptive,
            } as i32,
            stats: r.stats,
            filter_pushdown: match r.filter_pushdown {
                FilterPushdown::Auto => proto::FilterPushdown::Auto,
                FilterPushdown::On => proto::FilterPushdown::On,
                FilterPushdown::Off => proto::FilterPushdown::Off,
            } as i32,
            deferral: match r.deferral {
                Deferral::Never => None,
                Deferral::IfBusy { from } => Some(proto::Deferral {
                    when: proto::deferral::When::IfBusy as i32,
                    from,
                }),
                Deferral::Always { from } => Some(proto::Deferral {
                    when: proto::deferral::When::Always as i32,
                    from,
                }),
            },
            tokenizer: r.tokenizer.clone().unwrap_or_default(),
        }
    }

    fn fragment(f: &Fragment) -> proto::Fragment {
        proto::Fragment {
            dataset: f.dataset.clone(),
            columns: f.columns.clone(),
            predicate: f.predicate.clone().unwrap_or_default(),
            ops: f
                .ops
                .iter()
                .map(|call| proto::OpCall {
                    op: call.op.clone(),
                    args: std::iter::once(proto::arg::Value::Column(call.input.clone()))
                        .chain(call.params.iter().map(|v| match v {
                            Value::Int(i) => proto::arg::Value::Int(*i),
                            Value::Float(f) => proto::arg::Value::Float(*f),
                            Value::Text(t) => proto::arg::Value::Text(t.clone()),
                            Value::List(_) => proto::arg::Value::Text(v.text()),
                        }))
                        .map(|value| proto::Arg { value: Some(value) })
                        .collect(),
                    output: call.output.clone(),
                })
                .collect(),
        }
    }

    pub(crate) fn shard_ticket(t: &ShardTicket) -> proto::ShardTicket {
        proto::ShardTicket {
            version: TICKET_VERSION,
            request: Some(scan_request(&t.request)),
            shard: t.shard.as_ref().map(|s| proto::Shard {
                dataset: s.dataset.clone(),
                file: s.file.clone(),
                row_group_start: s.row_groups.start,
                row_group_end: s.row_groups.end,
                rows: s.rows,
                file_size: s.version.size,
                file_version: s.version.hash.clone(),
                bytes: s.bytes,
            }),
            skip_rows: t.skip_rows,
            take_rows: t.take_rows,
        }
    }

    pub(crate) fn stream_stats(s: &StreamStats) -> proto::StreamStats {
        proto::StreamStats {
            rows_scanned: s.rows_scanned,
            rows_sent: s.rows_sent,
            bytes_scanned: s.bytes_scanned,
            bytes_sent: s.bytes_sent,
            row_groups: s.row_groups,
            row_groups_pruned: s.row_groups_pruned,
            elapsed_ns: s.elapsed_ns,
            rows_output: s.rows_output,
            reduced_alone: s.reduced_alone,
        }
    }
}

mod from_proto {
    use super::*;

    pub(crate) fn scan_request(m: proto::ScanRequest) -> Result<ScanRequest> {
        let compression = match proto::Compression::try_from(m.compression) {
            Ok(proto::Compression::Unspecified | proto::Compression::Zstd) => Compression::Zstd,
            Ok(proto::Compression::None) => Compression::None,
            Ok(proto::Compression::Lz4) => Compression::Lz4,
            Ok(proto::Compression::Adaptive) => Compression::Adaptive,
            Err(_) => return Err(invalid("ScanRequest", "compression", m.compression)),
        };
        let filter_pushdown = match proto::FilterPushdown::try_from(m.filter_pushdown) {
            Ok(proto::FilterPushdown::Auto) => FilterPushdown::Auto,
            Ok(proto::FilterPushdown::On) => FilterPushdown::On,
            Ok(proto::FilterPushdown::Off) => FilterPushdown::Off,
            Err(_) => return Err(invalid("ScanRequest", "filter_pushdown", m.filter_pushdown)),
        };
        let query = match m.query.required("ScanRequest", "query")? {
            proto::scan_request::Query::Fragment(f) => Query::Fragment(fragment(f)?),
            proto::scan_request::Query::Sql(sql) => Query::Sql(sql),
        };
        let deferral = match m.deferral {
            None => Deferral::Never,
            Some(d) => match proto::deferral::When::try_from(d.when) {
                Ok(proto::deferral::When::Never) => Deferral::Never,
                Ok(proto::deferral::When::IfBusy) => Deferral::IfBusy { from: d.from },
                Ok(proto::deferral::When::Always) => Deferral::Always { from: d.from },
                Err(_) => return Err(invalid("Deferral", "when", d.when)),
            },
        };
        if let (Deferral::IfBusy { from } | Deferral::Always { from }, Query::Fragment(f)) =
            (deferral, &query)
            && from as usize > f.ops.len()
        {
            return Err(ProtocolError::Invalid {
                message: "Deferral",
                field: "from",
                reason: format!("{from} is past the fragment's {} op(s)", f.ops.len()),
            });
        }
        Ok(ScanRequest {
            query,
            compression,
            stats: m.stats,
            filter_pushdown,
            deferral,
            tokenizer: Some(m.tokenizer).filter(|t| !t.is_empty()),
        })
    }

    fn invalid(message: &'static str, field: &'static str, value: i32) -> ProtocolError {
        ProtocolError::Invalid {
            message,
            field,
            reason: format!("unknown enum value {value}"),
        }
    }

    fn fragment(m: proto::Fragment) -> Result<Fragment> {
        if m.dataset.is_empty() {
            return Err(ProtocolError::Missing {
                message: "Fragment",
                field: "dataset",
            });
        }
        let ops = m
            .ops
            .into_iter()
            .map(|call| {
                let mut args = call.args.into_iter();
                let input = match args.next().map(|a| a.value.required("Arg", "value")).transpose()? {
                    Some(proto::arg::Value::Column(c)) => c,
                    _ => {
                        return Err(ProtocolError::Invalid {
                            message: "OpCall",
                            field: "args",
                            reason: format!("`{}`: the first argument must be the input column", call.op),
                        });
                    }
                };
                let params = args
                    .map(|a| {
                        Ok(match a.value.required("Arg", "value")? {
                            proto::arg::Value::Int(i) => Value::Int(i),
                            proto::arg::Value::Float(f) => Value::Float(f),
                            proto::arg::Value::Text(t) => Value::Text(t),
                            proto::arg::Value::Column(c) => {
                                return Err(ProtocolError::Invalid {
                                    message: "OpCall",
                                    field: "args",
                                    reason: format!(
                                        "`{}`: parameter `{c}` must be a literal; only the first argument is a column",
                                        call.op
                                    ),
                                });
                            }
                        })
                    })
                    .collect::<Result<_>>()?;
                let output = if call.output.is_empty() {
                    input.clone()
                } else {
                    call.output
                };
                Ok(OpCall {
                    op: call.op,
                    input,
                    params,
                    output,
                })
            })
            .collect::<Result<_>>()?;
        Ok(Fragment {
            dataset: m.dataset,
            columns: m.columns,
            predicate: Some(m.predicate).filter(|p| !p.trim().is_empty()),
            ops,
        })
    }

    pub(crate) fn shard_ticket(m: proto::ShardTicket) -> Result<ShardTicket> {
        if m.version != TICKET_VERSION {
            return Err(ProtocolError::TicketVersion { found: m.version });
        }
        let request = scan_request(m.request.required("ShardTicket", "request")?)?;
        let shard = m
            .shard
            .map(|s| {
                if s.row_group_start >= s.row_group_end {
                    return Err(ProtocolError::Invalid {
                        message: "Shard",
                        field: "row_group_end",
                        reason: format!("empty row-group range {}..{}", s.row_group_start, s.row_group_end),
                    });
                }
                Ok(Shard {
                    dataset: s.dataset,
                    file: s.file,
                    row_groups: s.row_group_start..s.row_group_end,
                    rows: s.rows,
                    version: FileVersion {
                        size: s.file_size,
                        hash: s.file_version,
                    },
                    bytes: s.bytes,
                })
            })
            .transpose()?;
        Ok(ShardTicket {
            request,
            shard,
            skip_rows: m.skip_rows,
            take_rows: m.take_rows,
        })
    }

    pub(crate) fn stream_stats(m: proto::StreamStats) -> StreamStats {
        StreamStats {
            rows_scanned: m.rows_scanned,
            rows_sent: m.rows_sent,
            bytes_scanned: m.bytes_scanned,
            bytes_sent: m.bytes_sent,
            row_groups: m.row_groups,
            row_groups_pruned: m.row_groups_pruned,
            elapsed_ns: m.elapsed_ns,
            rows_output: m.rows_output,
            reduced_alone: m.reduced_alone,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fragment_request() -> ScanRequest {
        ScanRequest {
            query: Query::Fragment(Fragment {
                dataset: "images".into(),
                columns: vec!["image".into(), "label".into()],
                predicate: Some("label < 100".into()),
                ops: vec![OpCall::new(
                    "thumbnail",
                    "image",
                    vec![Value::Int(64), Value::Float(0.5), Value::Text("it's".into())],
                    "image",
                )],
            }),
            compression: Compression::Lz4,
            stats: true,
            filter_pushdown: FilterPushdown::On,
            deferral: Deferral::IfBusy { from: 0 },
            tokenizer: Some("sha256:00ff".into()),
        }
    }

    #[test]
    fn versions_are_compatible_within_a_minor_version_before_1_and_a_major_after() {
        assert!(compatible("0.1.0", "0.1.7").is_ok());
        assert!(compatible("1.2.0", "1.9.1").is_ok());
        let e = compatible("0.2.0", "0.1.0").expect_err("another minor before 1.0");
        assert!(
            e.contains("0.2.0") && e.contains("0.1.0") && e.contains("0.1.x"),
            "{e}"
        );
        assert!(compatible("2.0.0", "1.0.0").is_err());
        assert!(
            compatible("garbage", "0.1.0")
                .expect_err("unparsable")
                .contains("garbage")
        );
        assert!(compatible(VERSION, VERSION).is_ok());
    }

    #[test]
    fn a_deferred_fragment_reads_what_its_dropped_ops_need() {
        let call = |op: &str, input: &str, output: &str| OpCall::new(op, input, vec![], output);
        let f = Fragment {
            dataset: "d".into(),
            columns: vec!["pixels".into(), "label".into(), "h2".into()],
            predicate: Some("label < 3".into()),
            ops: vec![
                call("hash_bucket", "c1", "h1"),
                call("decode_resize", "image", "pixels"),
                call("hash_bucket", "h1", "h2"),
            ],
        };
        assert_eq!(f.deferred(3), f);
        let d = f.deferred(1);
        assert_eq!(d.ops, f.ops[..1]);
        assert_eq!(d.columns, ["image", "label", "h1"]);
        assert_eq!(d.predicate, f.predicate);
        // Everything deferred: the chain h2 ← h1 ← c1 is followed back to the source.
        assert_eq!(f.deferred(0).columns, ["image", "label", "c1"]);
        // In place (`op(x) AS x`), and a column both kept and read by a dropped op.
        let g = Fragment {
            columns: vec!["image".into(), "label".into()],
            ops: vec![
                call("thumbnail", "image", "image"),
                call("hash_bucket", "label", "label"),
            ],
            ..f.clone()
        };
        assert_eq!(g.deferred(0).columns, ["image", "label"]);
        assert_eq!(g.deferred(0).ops, []);
        assert_eq!(f.deferred(99), f);
    }

    #[test]
    fn a_deferral_past_the_ops_is_refused() {
        let mut ticket = ShardTicket {
            request: fragment_request(),
            shard: None,
            skip_rows: 0,
            take_rows: None,
        };
        ticket.request.deferral = Deferral::Always { from: 2 };
        assert!(matches!(
            ShardTicket::decode(&ticket.encode()),
            Err(ProtocolError::Invalid {
                message: "Deferral",
                ..
            })
        ));
        ticket.request.deferral = Deferral::Always { from: 1 };
        assert_eq!(ShardTicket::decode(&ticket.encode()).unwrap(), ticket);
    }

    #[test]
    fn ticket_round_trips() {
        let ticket = ShardTicket {
            request: fragment_request(),
            shard: Some(Shard {
                dataset: "images".into(),
                file: "part-0.parquet".into(),
                row_groups: 2..5,
                rows: 300,
                version: FileVersion {
                    size: 123_456,
                    hash: "9f86d081884c7d65".into(),
                },
                bytes: 99_000,
            }),
            skip_rows: 17,
            take_rows: Some(40),
        };
        assert_eq!(ShardTicket::decode(&ticket.encode()).unwrap(), ticket);
    }

    #[test]
    fn garbage_tickets_are_errors() {
        assert!(ShardTicket::decode(b"\xff\xff\xff").is_err());
        // Valid protobuf, but no request.
        let empty = proto::ShardTicket {
            version: TICKET_VERSION,
            ..Default::default()
        }
        .encode_to_vec();
        assert!(matches!(
            ShardTicket::decode(&empty),
            Err(ProtocolError::Missing { field: "request", .. })
        ));
        let old = proto::ShardTicket {
            version: 99,
            ..Default::default()
        }
        .encode_to_vec();
        assert!(matches!(
            ShardTicket::decode(&old),
            Err(ProtocolError::TicketVersion { found: 99 })
        ));
    }

    #[test]
    fn op_calls_take_their_input_column_first_and_literals_after() {
        let call = |args: Vec<proto::arg::Value>| {
            proto::ScanRequest {
                query: Some(proto::scan_request::Query::Fragment(proto::Fragment {
                    dataset: "images".into(),
                    ops: vec![proto::OpCall {
                        op: "thumbnail".into(),
                        args: args.into_iter().map(|v| proto::Arg { value: Some(v) }).collect(),
                        output: String::new(),
                    }],
                    ..Default::default()
                })),
                ..Default::default()
            }
            .encode_to_vec()
        };
        use proto::arg::Value as V;
        let ok = ShardTicket::decode(
            &proto::ShardTicket {
                version: TICKET_VERSION,
                request: Some(
                    proto::ScanRequest::decode(&call(vec![V::Column("image".into()), V::Int(64)])[..])
                        .unwrap(),
                ),
                ..Default::default()
            }
            .encode_to_vec(),
        )
        .unwrap();
        let Query::Fragment(f) = ok.request.query else {
            panic!("a fragment")
        };
        assert_eq!(
            f.ops,
            vec![OpCall::new("thumbnail", "image", vec![Value::Int(64)], "image")]
        );
        for bad in [
            vec![V::Int(64)],
            vec![V::Column("image".into()), V::Column("label".into())],
            vec![],
        ] {
            let request = proto::ScanRequest::decode(&call(bad.clone())[..]).unwrap();
            let err = from_proto::scan_request(request).expect_err("invalid op call");
            assert!(
                matches!(err, ProtocolError::Invalid { field: "args", .. }),
                "{bad:?}: {err}"
            );
        }
    }

    #[test]
    fn commands_are_requests_or_sql() {
        let r = fragment_request();
        assert_eq!(ScanRequest::decode_command(&r.encode()).unwrap(), r);
        // Multi-line SQL starting with a newline (0x0a, the tag of field 1) is still SQL.
        let sql = "\n    SELECT label\n    FROM images WHERE label < 10\n";
        assert_eq!(
            ScanRequest::decode_command(sql.as_bytes()).unwrap().query,
            Query::Sql(sql.into())
        );
        assert!(matches!(
            ScanRequest::decode_command(b"\xff\xfe"),
            Err(ProtocolError::UnrecognizedCommand)
        ));
        assert!(ScanRequest::decode_command(b"").is_err());
    }

    #[test]
    fn profile_round_trips() {
        let p = Profile {
            rows_sampled: 256,
            selectivity: 0.5,
            scan_ns_per_row: 1200.0,
            column_bytes_per_row: [("image".to_string(), 15000.0)].into(),
            ops: vec![OpProfile {
                op: "thumbnail".into(),
                input: "image".into(),
                output: "image".into(),
                bytes_in_per_row: 15000.0,
                bytes_out_per_row: 1500.0,
                ns_per_row: 2e6,
                output_codecs: Some(Codecs {
                    lz4: CodecCost {
                        ratio: 0.9,
                        compress_ns_per_byte: 0.5,
                        decompress_ns_per_byte: 0.1,
                    },
                    zstd: CodecCost {
                        ratio: 0.8,
                        compress_ns_per_byte: 3.0,
                        decompress_ns_per_byte: 0.9,
                    },
                }),
            }],
            server_cores: 16,
            column_codecs: [("image".to_string(), Codecs::default())].into(),
            scanned_fraction: Some(0.25),
            shards: Some(3),
        };
        assert_eq!(Profile::decode(&p.encode()).unwrap(), p);
        let unmeasured = Profile {
            scanned_fraction: None,
            shards: None,
            ..p.clone()
        };
        assert_eq!(Profile::decode(&unmeasured.encode()).unwrap(), unmeasured);
        let nonsense = Profile {
            scanned_fraction: Some(3.0),
            ..p
        };
        assert_eq!(
            Profile::decode(&nonsense.encode()).unwrap().scanned_fraction,
            None
        );
    }

    #[test]
    fn stats_round_trip() {
        let s = StreamStats {
            rows_scanned: 1,
            rows_sent: 2,
            bytes_scanned: 3,
            bytes_sent: 4,
            row_groups: 5,
            row_groups_pruned: 6,
            elapsed_ns: 7,
            rows_output: 8,
            reduced_alone: 1,
        };
        assert_eq!(StreamStats::decode(&s.encode()).unwrap(), s);
    }

    #[test]
    fn actions_and_count_replies_round_trip() {
        for a in ActionKind::ALL {
            assert_eq!(ActionKind::parse(a.name()), Some(a));
        }
        assert_eq!(ActionKind::parse("nope"), None);
        let c = CountReply { rows: 1 << 40 };
        assert_eq!(CountReply::decode(&c.encode()).unwrap(), c);
        assert!(CountReply::decode(b"\xff").is_err());
    }

    #[test]
    fn plan_estimate_round_trips() {
        let e = PlanEstimate {
            rows_upper_bound: 1,
            bytes_to_scan: 2,
            row_wise: true,
            row_groups_pruned: 3,
        };
        assert_eq!(PlanEstimate::decode(&e.encode()).unwrap(), e);
    }
}
