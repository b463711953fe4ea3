//! The servers a client reads from, and one plan for all of them.
//!
//! ```text
//!  --server A --server B  (or dns://name:port: one server per address the name resolves to)
//!     │ GetFlightInfo on every server, concurrently
//!     ▼
//!  merge: shards keyed by (dataset, file, row groups), each carrying its file's version
//!     │ one file at two versions, or cut two ways  → error naming the file and servers
//!     │ endpoints sorted by (dataset, file, row group): the same list whichever servers hold them
//!     │ each endpoint's locations = the servers that offered it (locality)
//!     ▼
//!  a stream picks, per shard, the holder with the fewest streams in flight that is not
//!  resting after a failure (an idle server takes pending shards from a busy one)
//! ```
//!
//! No coordinator: each client computes the same plan from the servers' answers, so the
//! sample sequence depends on the files and their versions, never on which servers hold them.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::{FlightEndpoint, FlightInfo, Location};
use parking_lot::{Mutex, RwLock};
use pushdown_protocol::{PlanEstimate, ShardTicket};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::connect::{ConnectOptions, MAX_MESSAGE_BYTES, plan_estimate};
use crate::error::{ClientError, Result};

/// A Flight client that sends the caller's credentials with every request.
pub(crate) type Flight = FlightServiceClient<InterceptedService<Channel, Credentials>>;

/// Adds `authorization: Bearer <token>` to each request, when there is a token, and the
/// client's version (`pushdown-version`).
#[derive(Clone)]
pub(crate) struct Credentials(Option<tonic::metadata::AsciiMetadataValue>);

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Credentials(bearer)"
        } else {
            "Credentials(none)"
        })
    }
}

impl Credentials {
    pub(crate) fn new(token: Option<&str>) -> Result<Self> {
        let Some(token) = token else {
            return Ok(Self(None));
        };
        let mut value: tonic::metadata::AsciiMetadataValue = format!("Bearer {token}")
            .parse()
            .map_err(|_| ClientError::Invalid("the token must be printable ASCII".into()))?;
        value.set_sensitive(true);
        Ok(Self(Some(value)))
    }
}

impl tonic::service::Interceptor for Credentials {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            request.metadata_mut().insert("authorization", value.clone());
        }
        // This client's version: a server refuses an incompatible one by name.
        request.metadata_mut().insert(
            pushdown_protocol::VERSION_HEADER,
            tonic::metadata::AsciiMetadataValue::from_static(pushdown_protocol::VERSION),
        );
        Ok(request)
    }
}

/// Longest a failing server rests before it is tried again.
const MAX_REST: Duration = Duration::from_secs(10);

/// What one stream may hold that this client has not read yet (HTTP/2's stream window).
pub(crate) const STREAM_WINDOW: u32 = 8 << 20;

/// HTTP/2's largest window, for the connection: it never limits the streams on it. Streams in
/// flight share one connection, and the loader reads them one at a time (shard after shard),
/// so the others fill their own windows and stop. Those unread bytes also count against the
/// connection's window: with a window smaller than their sum (32 MiB against 8 streams of
/// 8 MiB) the streams not being read took all of it, and the one being read got nothing, for
/// ever (the deadlock at more than 4 streams). Memory stays bounded by the streams in flight
/// × [`STREAM_WINDOW`], which the loader bounds.
pub(crate) const CONNECTION_WINDOW: u32 = (1 << 31) - 1;

/// One server as the client sees it.
#[derive(Debug)]
pub(crate) struct Member {
    pub(crate) url: String,
    pub(crate) flight: Flight,
    /// Streams in flight to it.
    active: AtomicUsize,
    /// Consecutive failures; reset by a success.
    failures: AtomicU32,
    /// Not chosen before this instant while others can be.
    resting_until: Mutex<Option<Instant>>,
    /// The files (dataset, path) it offered in its last row-wise plan: whether a plan made
    /// while it is unreachable can do without it.
    offered: Mutex<Option<BTreeSet<(String, String)>>>,
    /// The deadline of each call made before streaming ([`ConnectOptions::call_timeout`]).
    call_timeout: Duration,
    /// It let a call's deadline or a stream's stall timeout pass without a word, and has
    /// not answered since: ranked last, and a plan does not wait for it where the others
    /// can do without it.
    silent: AtomicBool,
}

impl Member {
    /// `tls_name`: the name the server's certificate must carry, when not the URL's host
    /// (an address a DNS name resolved to).
    fn connect(url: &str, options: &ConnectOptions, tls_name: Option<&str>) -> Result<Self> {
        let http = http_url(url)?;
        let bad = |reason: String| ClientError::BadUrl {
            url: url.to_owned(),
            reason,
        };
        let mut endpoint = Endpoint::from_shared(http.clone()).map_err(|e| bad(e.to_string()))?;
        if http.starts_with("https://") {
            let mut tls = match &options.tls_ca {
                Some(ca) => ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca)),
                None => ClientTlsConfig::new().with_native_roots(),
            };
            if let Some((cert, key)) = &options.tls_identity {
                tls = tls.identity(Identity::from_pem(cert, key));
            }
            if let Some(name) = tls_name {
                tls = tls.domain_name(name);
            }
            endpoint = endpoint.tls_config(tls).map_err(|e| bad(format!("TLS: {e}")))?;
        }
        // Lazy: a server that is down now is not an error until something needs it, and the
        // channel reconnects by itself when the server comes back.
        // Connecting is bounded by the call's deadline too (a SYN that is dropped); a
        // listener that accepts and never answers is bounded by `within`.
        let channel = endpoint
            .connect_timeout(options.call_timeout.min(Duration::from_secs(5)))
            .tcp_nodelay(true)
            .initial_stream_window_size(Some(STREAM_WINDOW))
            .initial_connection_window_size(Some(CONNECTION_WINDOW))
            .connect_lazy();
        Ok(Self {
            url: http,
            flight: FlightServiceClient::with_interceptor(
                channel,
                Credentials::new(options.token.as_deref())?,
            )
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES),
            active: AtomicUsize::new(0),
            failures: AtomicU32::new(0),
            resting_until: Mutex::new(None),
            offered: Mutex::new(None),
            call_timeout: options.call_timeout,
            silent: AtomicBool::new(false),
        })
    }

    /// `call` (`what` names it) within this client's deadline for calls made before
    /// streaming. No answer in time is `DeadlineExceeded`, a transient failure: the server
    /// is passed over like one that failed. Every call but a shard's stream goes through
    /// here; streams have their stall timeout.
    pub(crate) async fn within<T>(
        &self,
        what: &str,
        call: impl std::future::Future<Output = Result<T, tonic::Status>>,
    ) -> Result<T, tonic::Status> {
        match tokio::time::timeout(self.call_timeout, call).await {
            Ok(answer) => answer,
            Err(_) => {
                self.fell_silent();
                tracing::warn!(
                    server = %self.url,
                    call = what,
                    deadline = ?self.call_timeout,
                    "a server gave no answer in time; passing it over"
                );
                Err(tonic::Status::deadline_exceeded(format!(
                    "no answer to {what} in {:?} (the call timeout)",
                    self.call_timeout
                )))
            }
        }
    }

    /// Runs `action` here, collecting its results, within the call deadline.
    pub(crate) async fn action(
        &self,
        action: arrow_flight::Action,
    ) -> Result<Vec<arrow_flight::Result>, tonic::Status> {
        use futures::TryStreamExt;
        let what = format!("the {} action", action.r#type);
        self.within(&what, async {
            self.flight
                .clone()
                .do_action(action)
                .await?
                .into_inner()
                .try_collect()
                .await
        })
        .await
    }

    /// Marks a stream in flight until the guard drops.
    pub(crate) fn busy(self: &Arc<Self>) -> Busy {
        self.active.fetch_add(1, Ordering::Relaxed);
        Busy(Arc::clone(self))
    }

    /// A transient failure: rest for `base` doubled per consecutive failure (capped).
    pub(crate) fn failed(&self, base: Duration) {
        let n = self.failures.fetch_add(1, Ordering::Relaxed).min(16);
        let rest = base.saturating_mul(1 << n).min(MAX_REST);
        *self.resting_until.lock() = Some(Instant::now() + rest);
    }

    /// It let a deadline pass without a word (a call's, or a stream's stall timeout).
    pub(crate) fn fell_silent(&self) {
        self.silent.store(true, Ordering::Relaxed);
    }

    /// Whether it has been silent since its last answer.
    pub(crate) fn is_silent(&self) -> bool {
        self.silent.load(Ordering::Relaxed)
    }

    pub(crate) fn succeeded(&self) {
        self.silent.store(false, Ordering::Relaxed);
        self.failures.store(0, Ordering::Relaxed);
        *self.resting_until.lock() = None;
    }

    pub(crate) fn set_offered(&self, files: BTreeSet<(String, String)>) {
        *self.offered.lock() = Some(files);
    }

    /// The files it last offered that none of `others` offers now; `None` when it never
    /// answered a row-wise plan (nothing is known of its files).
    pub(crate) fn held_alone(&self, others: &BTreeSet<(String, String)>) -> Option<Vec<String>> {
        let offered = self.offered.lock();
        Some(
            offered
                .as_ref()?
                .iter()
                .filter(|f| !others.contains(*f))
                .map(|(d, f)| format!("{d}/{f}"))
                .collect(),
        )
    }

    /// Resting after a failure, or silent since its last deadline.
    pub(crate) fn resting(&self, now: Instant) -> bool {
        self.is_silent() || self.resting_until.lock().is_some_and(|t| t > now)
    }
}

/// A stream in flight on a node.
pub(crate) struct Busy(Arc<Member>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Every server the client knows: those it was given, those its DNS names resolve to, and
/// any an endpoint names.
#[derive(Debug, Default)]
pub(crate) struct Fleet {
    nodes: RwLock<Vec<Arc<Member>>>,
    options: ConnectOptions,
    /// `dns://name:port` URLs given, resolved again at each [`Self::rediscover`].
    names: Vec<String>,
}

impl Fleet {
    /// The servers of `urls`: `http://` / `grpc://host:port` each, or `dns://name:port` for
    /// every address `name` resolves to (a Kubernetes headless Service, say).
    pub(crate) async fn connect<S: AsRef<str>>(urls: &[S], options: ConnectOptions) -> Result<Self> {
        if urls.is_empty() {
            return Err(ClientError::Invalid("at least one server URL is needed".into()));
        }
        let mut fleet = Self {
            options,
            ..Self::default()
        };
        for url in urls {
            let url = url.as_ref();
            match url.strip_prefix("dns://") {
                Some(name) => {
                    for resolved in resolve(url, name, fleet.options.call_timeout).await? {
                        fleet.resolved_node(&resolved, name)?;
                    }
                    fleet.names.push(url.to_owned());
                }
                None => {
                    fleet.node(url)?;
                }
            }
        }
        Ok(fleet)
    }

    /// Resolves the DNS names again: servers that joined behind them join the fleet (a
    /// scaled-up Service). Servers that left stay known; they fail, rest, and are left out of
    /// plans while unreachable. A name that no longer resolves keeps its last servers.
    pub(crate) async fn rediscover(&self) {
        for url in &self.names {
            let name = url.trim_start_matches("dns://");
            match resolve(url, name, self.options.call_timeout).await {
                Ok(addrs) => {
                    for a in addrs {
                        if let Err(e) = self.resolved_node(&a, name) {
                            tracing::warn!(%url, address = %a, error = %e, "ignoring a resolved address");
                        }
                    }
                }
                Err(e) => tracing::warn!(%url, error = %e, "re-resolving failed; keeping the known servers"),
            }
        }
    }

    pub(crate) fn nodes(&self) -> Vec<Arc<Member>> {
        self.nodes.read().clone()
    }

    /// The node serving `url`, connecting (lazily) to a new one.
    pub(crate) fn node(&self, url: &str) -> Result<Arc<Member>> {
        self.node_named(url, None)
    }

    /// The node at `address` (`http://ip:port`), which `name` (`host:port`) resolved to:
    /// with TLS, reached at that address and checked against the name's certificate.
    fn resolved_node(&self, address: &str, name: &str) -> Result<Arc<Member>> {
        let host = name.trim_end_matches('/');
        let host = host.rsplit_once(':').map_or(host, |(h, _)| h);
        match (&self.options.tls_ca, address.strip_prefix("http://")) {
            (Some(_), Some(rest)) => self.node_named(&format!("https://{rest}"), Some(host)),
            _ => self.node_named(address, None),
        }
    }

    fn node_named(&self, url: &str, tls_name: Option<&str>) -> Result<Arc<Member>> {
        let key = http_url(url)?;
        let known = |nodes: &[Arc<Member>]| nodes.iter().find(|n| n.url == key).cloned();
        if let Some(n) = known(&self.nodes.read()) {
            return Ok(n);
        }
        let mut nodes = self.nodes.write();
        if let Some(n) = known(&nodes) {
            return Ok(n);
        }
        let node = Arc::new(Member::connect(url, &self.options, tls_name)?);
        nodes.push(Arc::clone(&node));
        Ok(node)
    }

    /// The servers that can redeem `endpoint`'s ticket: its locations, or every server when
    /// it names none (Flight: "the service that answered").
    pub(crate) fn holders(&self, endpoint: &FlightEndpoint) -> Result<Vec<Arc<Member>>> {
        if endpoint.location.is_empty() {
            return Ok(self.nodes());
        }
        endpoint.location.iter().map(|l| self.node(&l.uri)).collect()
    }

    /// Nodes in the order to try them: working before resting, fewer streams in flight
    /// first, ties rotated by `spread` so equal servers share the shards.
    pub(crate) fn ranked(holders: &[Arc<Member>], spread: usize) -> Vec<Arc<Member>> {
        let now = Instant::now();
        let n = holders.len().max(1);
        let mut ranked: Vec<(bool, usize, usize, &Arc<Member>)> = holders
            .iter()
            .enumerate()
            .map(|(i, node)| {
                (
                    node.resting(now),
                    node.active.load(Ordering::Relaxed),
                    (i + n - spread % n) % n,
                    node,
                )
            })
            .collect();
        ranked.sort_by_key(|(resting, active, turn, _)| (*resting, *active, *turn));
        ranked.into_iter().map(|(.., node)| Arc::clone(node)).collect()
    }
}

/// The files (dataset, path) a row-wise plan's shards read; `None` for a whole query.
pub(crate) fn files_of(info: &FlightInfo) -> Option<BTreeSet<(String, String)>> {
    info.endpoint
        .iter()
        .map(|e| {
            let ticket = ShardTicket::decode(&e.ticket.as_ref()?.ticket).ok()?;
            let shard = ticket.shard?;
            Some((shard.dataset, shard.file))
        })
        .collect()
}

/// `http://host:port` for a server URL (`grpc://` and `grpc+tcp://` are Flight's names for it).
pub(crate) fn http_url(url: &str) -> Result<String> {
    match url.split_once("://") {
        Some(("grpc" | "grpc+tcp", rest)) => Ok(format!("http://{}", rest.trim_end_matches('/'))),
        Some(("grpc+tls", rest)) => Ok(format!("https://{}", rest.trim_end_matches('/'))),
        Some(("http" | "https", _)) => Ok(url.trim_end_matches('/').to_owned()),
        _ => Err(ClientError::BadUrl {
            url: url.to_owned(),
            reason: "expected http(s)://host:port, grpc(+tls)://host:port or dns://name:port".into(),
        }),
    }
}

/// The addresses `name` resolves to, within `deadline` (a DNS server that hangs is a
/// deadline like any other).
async fn resolve(url: &str, name: &str, deadline: Duration) -> Result<Vec<String>> {
    let bad = |reason: String| ClientError::BadUrl {
        url: url.to_owned(),
        reason,
    };
    let host_port = name.trim_end_matches('/');
    let mut addrs: Vec<std::net::SocketAddr> =
        tokio::time::timeout(deadline, tokio::net::lookup_host(host_port))
            .await
            .map_err(|_| ClientError::Timeout {
                what: format!("resolving `{host_port}`"),
                after: deadline,
            })?
            .map_err(|e| bad(format!("resolving `{host_port}`: {e}")))?
            .collect();
    addrs.sort();
    addrs.dedup();
    if addrs.is_empty() {
        return Err(bad(format!("`{host_port}` resolves to no address")));
    }
    Ok(addrs.into_iter().map(|a| format!("http://{a}")).collect())
}

/// The plans of every server, made one: the shards any server offered, each once, in
/// (dataset, file, row group) order, located on every server that offered it.
pub(crate) fn merge(answers: Vec<(Arc<Member>, FlightInfo)>) -> Result<FlightInfo> {
    let Some((first_node, first)) = answers.first() else {
        return Err(ClientError::NoAnswer("no server answered".into()));
    };
    let schema = first.clone().try_decode_schema()?;
    if answers.len() > 1 && !row_wise(first) {
        same_scans(&answers, first_node, first)?;
    }
    if answers.len() == 1 || !row_wise(first) {
        // One server, or a query that is not row-wise: it runs whole on the first server.
        let mut info = first.clone();
        for e in &mut info.endpoint {
            e.location = located(first_node, e);
        }
        return Ok(info);
    }
    let mut shards = Offered::new();
    for (node, info) in &answers {
        shards.add_answer(first_node, &schema, node, info)?;
    }
    shards.into_info(first)
}

/// Where `node`'s `endpoint` is redeemed: its locations, or `node` when it names none.
fn located(node: &Member, endpoint: &FlightEndpoint) -> Vec<Location> {
    if endpoint.location.is_empty() {
        vec![Location {
            uri: node.url.clone(),
        }]
    } else {
        endpoint.location.clone()
    }
}

/// Whether `info` is a row-wise plan (one endpoint per shard).
fn row_wise(info: &FlightInfo) -> bool {
    plan_estimate(info).is_some_and(|e| e.row_wise)
}

/// Checks that every server would scan what the first one does.
fn same_scans(answers: &[(Arc<Member>, FlightInfo)], first_node: &Member, first: &FlightInfo) -> Result<()> {
    // A query that is not row-wise runs whole on one server, over that server's files:
    // only right when every server holds the same files of what it reads.
    let scans = |info: &FlightInfo| plan_estimate(info).map(|e| (e.rows_upper_bound, e.bytes_to_scan));
    if let Some((node, _)) = answers.iter().find(|(_, info)| scans(info) != scans(first)) {
        return Err(ClientError::ServersDisagree {
            about: "the datasets the query reads".into(),
            detail: format!(
                "{} and {} hold different files of them, and a query that is not row-wise \
                 (an aggregate, join, sort, limit or volatile function) runs whole on one server",
                first_node.url, node.url
            ),
        });
    }
    Ok(())
}

/// Row-group ranges → (endpoint, holders, rows, bytes).
type Cuts = BTreeMap<(u32, u32), (FlightEndpoint, Vec<Location>, u64, u64)>;

/// The shards of the servers' row-wise plans, gathered answer by answer.
struct Offered {
    /// (dataset, file) → (version, the server that offered it first, its cuts).
    files: BTreeMap<(String, String), (pushdown_protocol::FileVersion, String, Cuts)>,
    /// The most row groups any server pruned.
    pruned: u64,
    /// Every server knew its plan's total records.
    all_totals_known: bool,
}

impl Offered {
    fn new() -> Self {
        Self {
            files: BTreeMap::new(),
            pruned: 0,
            all_totals_known: true,
        }
    }

    /// Adds `node`'s plan, which must have the first server's schema and be row-wise too.
    fn add_answer(
        &mut self,
        first_node: &Member,
        schema: &arrow::datatypes::Schema,
        node: &Member,
        info: &FlightInfo,
    ) -> Result<()> {
        if info.clone().try_decode_schema()? != *schema {
            return Err(ClientError::ServersDisagree {
                about: "the query's schema".into(),
                detail: format!(
                    "{} and {} answer with different schemas",
                    first_node.url, node.url
                ),
            });
        }
        if !row_wise(info) {
            return Err(ClientError::ServersDisagree {
                about: "how the query shards".into(),
                detail: format!(
                    "{} does not shard it row-wise while {} does (different versions?)",
                    node.url, first_node.url
                ),
            });
        }
        let pruned = plan_estimate(info).map_or(0, |e| e.row_groups_pruned);
        self.pruned = self.pruned.max(pruned);
        self.all_totals_known &= info.total_records >= 0;
        for endpoint in &info.endpoint {
            self.add_endpoint(node, endpoint)?;
        }
        Ok(())
    }

    /// Adds one shard `node` offered: a new one, or another holder of one already known (of
    /// the same file version).
    fn add_endpoint(&mut self, node: &Member, endpoint: &FlightEndpoint) -> Result<()> {
        let ticket = endpoint
            .ticket
            .as_ref()
            .and_then(|t| ShardTicket::decode(&t.ticket).ok())
            .and_then(|t| t.shard)
            .ok_or_else(|| {
                ClientError::reply(
                    "planning",
                    format!("{} sent an endpoint that is not a shard", node.url),
                )
            })?;
        let key = (ticket.dataset.clone(), ticket.file.clone());
        let (version, owner, cuts) = self
            .files
            .entry(key)
            .or_insert_with(|| (ticket.version.clone(), node.url.clone(), Cuts::new()));
        if *version != ticket.version {
            return Err(ClientError::ServersDisagree {
                about: format!("`{}/{}`", ticket.dataset, ticket.file),
                detail: format!("{owner} has {version}, {} has {}", node.url, ticket.version),
            });
        }
        let range = (ticket.row_groups.start, ticket.row_groups.end);
        let (_, holders, ..) = cuts
            .entry(range)
            .or_insert_with(|| (endpoint.clone(), Vec::new(), ticket.rows, ticket.bytes));
        for l in located(node, endpoint) {
            if !holders.contains(&l) {
                holders.push(l);
            }
        }
        Ok(())
    }

    /// The merged plan: `first`'s, with every shard once, in (dataset, file, row group)
    /// order, and the estimate of them all.
    fn into_info(self, first: &FlightInfo) -> Result<FlightInfo> {
        let Offered {
            files,
            pruned,
            all_totals_known,
        } = self;
        let mut endpoints = Vec::new();
        let (mut rows, mut bytes) = (0u64, 0u64);
        for ((dataset, file), (_, _, cuts)) in files {
            // Row-group ranges of one file must not overlap: servers that cut a file differently
            // (other shard sizes) would deliver its rows twice.
            disjoint(&dataset, &file, &cuts)?;
            for (_, (mut endpoint, holders, r, b)) in cuts {
                endpoint.location = holders;
                rows += r;
                bytes += b;
                endpoints.push(endpoint);
            }
        }
        let estimate = PlanEstimate {
            rows_upper_bound: rows,
            bytes_to_scan: bytes,
            row_wise: true,
            row_groups_pruned: pruned,
        };
        let total_records = if endpoints.is_empty() {
            0
        } else if all_totals_known {
            rows as i64
        } else {
            -1
        };
        let mut info = first
            .clone()
            .with_total_records(total_records)
            .with_app_metadata(estimate.encode());
        info.endpoint = endpoints;
        Ok(info)
    }
}

/// Checks that the row-group ranges of `dataset/file` do not overlap.
fn disjoint(dataset: &str, file: &str, cuts: &Cuts) -> Result<()> {
    let mut end = 0;
    for (start, stop) in cuts.keys() {
        if *start < end {
            return Err(ClientError::ServersDisagree {
                about: format!("`{dataset}/{file}`"),
                detail: "servers cut it into different shards (give them the same shard settings)".into(),
            });
        }
        end = *stop;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_normalize_to_one_key() {
        assert_eq!(http_url("grpc://h:1/").unwrap(), "http://h:1");
        assert_eq!(http_url("grpc+tcp://h:1").unwrap(), "http://h:1");
        assert_eq!(http_url("http://h:1").unwrap(), "http://h:1");
        assert!(http_url("h:1").is_err());
    }

    #[tokio::test]
    async fn a_dns_name_stands_for_every_address_it_resolves_to() {
        let fleet = Fleet::connect(&["dns://localhost:50999"], ConnectOptions::default())
            .await
            .expect("localhost resolves");
        let mut want: Vec<String> = tokio::net::lookup_host("localhost:50999")
            .await
            .expect("lookup")
            .map(|a| format!("http://{a}"))
            .collect();
        want.sort();
        want.dedup();
        let mut got: Vec<String> = fleet.nodes().iter().map(|n| n.url.clone()).collect();
        got.sort();
        assert!(!got.is_empty());
        assert_eq!(got, want);
        assert!(
            Fleet::connect(&["dns://no-such-host.invalid:1"], ConnectOptions::default())
                .await
                .is_err()
        );
    }

    #[tokio::test]
    async fn idle_working_servers_are_chosen_first_and_ties_rotate() {
        let fleet = Fleet::connect(
            &["http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3"],
            ConnectOptions::default(),
        )
        .await
        .unwrap();
        let nodes = fleet.nodes();
        let first = |spread| Fleet::ranked(&nodes, spread)[0].url.clone();
        assert_eq!(first(0), nodes[0].url);
        assert_eq!(first(1), nodes[1].url);
        assert_eq!(first(2), nodes[2].url);
        let _busy = nodes[1].busy();
        assert_ne!(first(1), nodes[1].url, "a busy server yields to an idle one");
        nodes[2].failed(Duration::from_secs(5));
        let order = Fleet::ranked(&nodes, 2);
        assert_eq!(
            order.last().unwrap().url,
            nodes[2].url,
            "a resting server comes last"
        );
        nodes[2].succeeded();
        assert_eq!(first(2), nodes[2].url, "and is used again once it works");
    }
}
