//! [`PushdownClient`]: a fleet's servers behind one handle: planning, typed actions, and
//! the shard streams of a plan.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use arrow::datatypes::SchemaRef;
use arrow_flight::{Action, Criteria, FlightDescriptor, FlightEndpoint, FlightInfo};
use futures::TryStreamExt;
use pushdown_ops::Tokenizers;
use pushdown_protocol::{ActionKind, CountReply, ScanRequest};

use crate::connect::ConnectOptions;
use crate::error::{ClientError, Result};
use crate::fleet::{self, Fleet};
use crate::retry::{self, Attempts, Failure, Policy, Verdict};
use crate::stream::{ShardStream, StreamOptions};

/// Planning asks a server again after a transient failure, 3 times, backing off from 100 ms.
const PLAN_RETRY: Policy = Policy {
    max_retries: 3,
    backoff: Duration::from_millis(100),
    pass_elsewhere: false,
    once: false,
    rest_each_failure: false,
};

/// How long a plan waits for a silent server once every other server has answered, when
/// the others hold its files: a server that recovered answers in this time and rejoins.
const SILENT_GRACE: Duration = Duration::from_millis(250);

/// The servers' answers to a plan, and those that could not be reached or gave no answer
/// in time (transient failures). A server's error that is not transient is the plan's.
///
/// Each server is asked once, concurrently, within the call deadline. A server already
/// silent ([`fleet::Member::is_silent`]) is not waited for past [`SILENT_GRACE`] after the
/// others answered, unless files only it holds would be left out: a frozen server costs
/// the first plan one deadline, not every plan one.
async fn ask_to_plan(
    nodes: Vec<Arc<fleet::Member>>,
    descriptor: &FlightDescriptor,
) -> Result<(
    Vec<(Arc<fleet::Member>, FlightInfo)>,
    Vec<(Arc<fleet::Member>, tonic::Status)>,
)> {
    use futures::StreamExt;
    let mut pending: futures::stream::FuturesUnordered<_> = nodes
        .iter()
        .map(|node| async move {
            let answer = node.within("planning", plan_on(node, descriptor.clone())).await;
            (Arc::clone(node), answer)
        })
        .collect();
    let mut waiting = nodes.clone();
    let mut answers = Vec::new();
    let mut unreachable = Vec::new();
    let mut cut_at: Option<tokio::time::Instant> = None;
    loop {
        let all = offered_by_all(&answers);
        let optional =
            |n: &Arc<fleet::Member>| n.is_silent() && n.held_alone(&all).is_none_or(|files| files.is_empty());
        if !answers.is_empty() && waiting.iter().all(optional) {
            cut_at.get_or_insert_with(|| tokio::time::Instant::now() + SILENT_GRACE);
        } else {
            cut_at = None;
        }
        let next = match cut_at {
            Some(at) => tokio::time::timeout_at(at, pending.next()).await.ok().flatten(),
            None => pending.next().await,
        };
        let Some((node, answer)) = next else { break };
        waiting.retain(|n| !Arc::ptr_eq(n, &node));
        match answer {
            Ok(info) => {
                node.succeeded();
                answers.push((node, info));
            }
            Err(status) if Failure::of(status.code()) == Failure::Transient => {
                unreachable.push((node, status))
            }
            Err(status) => return Err(ClientError::server(&node.url, status)),
        }
    }
    for node in waiting {
        tracing::debug!(server = %node.url, "planned without a server still silent");
        unreachable.push((
            node,
            tonic::Status::deadline_exceeded(
                "silent since an earlier deadline, and the others hold its files",
            ),
        ));
    }
    Ok((answers, unreachable))
}

/// The files (dataset, path) that the row-wise plans of `answers` offer.
fn offered_by_all(answers: &[(Arc<fleet::Member>, FlightInfo)]) -> BTreeSet<(String, String)> {
    answers
        .iter()
        .filter_map(|(_, info)| fleet::files_of(info))
        .flatten()
        .collect()
}

/// `node`'s own answer to a plan, retried on it alone after a transient failure.
async fn plan_on(
    node: &Arc<fleet::Member>,
    descriptor: FlightDescriptor,
) -> Result<FlightInfo, tonic::Status> {
    let mut attempts = Attempts::new(vec![Arc::clone(node)], 0, PLAN_RETRY);
    loop {
        match node.flight.clone().get_flight_info(descriptor.clone()).await {
            Ok(info) => return Ok(info.into_inner()),
            Err(status) => match attempts.failed(node, status).await {
                Verdict::Fail(status) => return Err(status),
                Verdict::Next | Verdict::Retry => {}
            },
        }
    }
}

/// Connections to the pushdown servers of a fleet (one or more), each holding some of the
/// datasets' files.
#[derive(Debug, Clone)]
pub struct PushdownClient {
    fleet: Arc<Fleet>,
    /// The tokenizer the trainer gives ([`ConnectOptions::tokenizer`]).
    given: Option<Arc<GivenTokenizer>>,
}

/// A tokenizer a trainer gives the servers: its bytes, its content id, and its model here.
#[derive(Debug)]
struct GivenTokenizer {
    id: String,
    json: bytes::Bytes,
    model: Arc<pushdown_ops::TokenizerModel>,
}

/// The longest wait for one server's scaling signal.
pub const SCALING_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

impl PushdownClient {
    /// The servers of `urls`: `http://host:port` or `grpc://host:port`, or `dns://name:port`
    /// for every address the name resolves to. Connections open lazily: a server that is
    /// down is an error only when a request needs it.
    pub async fn connect<S: AsRef<str>>(urls: &[S]) -> Result<Self> {
        Self::connect_with(urls, ConnectOptions::default()).await
    }

    /// [`Self::connect`] with credentials and TLS settings: `https://` and `grpc+tls://`
    /// URLs (and `dns://` names when a CA is given) are reached over TLS.
    /// A tokenizer given ([`ConnectOptions::tokenizer`]) is parsed here first: a file the
    /// `tokenizers` library cannot read is refused before any server is asked.
    pub async fn connect_with<S: AsRef<str>>(urls: &[S], options: ConnectOptions) -> Result<Self> {
        let given = match &options.tokenizer {
            Some(json) => {
                let model = pushdown_ops::load_tokenizer(json)
                    .map_err(|e| ClientError::Invalid(format!("the tokenizer given: {e}")))?;
                Some(Arc::new(GivenTokenizer {
                    id: pushdown_ops::tokenizer_id(json),
                    json: bytes::Bytes::from(json.as_ref().clone()),
                    model: Arc::new(model),
                }))
            }
            None => None,
        };
        Ok(Self {
            fleet: Arc::new(Fleet::connect(urls, options).await?),
            given,
        })
    }

    /// The id of the tokenizer this client gives the servers (`sha256:…`), if it gives one.
    pub fn tokenizer_id(&self) -> Option<&str> {
        self.given.as_deref().map(|g| g.id.as_str())
    }

    /// `request` naming the given tokenizer as its calls' default (where it names none),
    /// once every server that answers keeps it: each is asked whether it does (`has_tokenizer`)
    /// and given it (`give_tokenizer`) only where it does not. A server that cannot be
    /// reached is left to planning's own rules; one that refuses the tokenizer fails this.
    async fn with_given_tokenizer(&self, request: &ScanRequest) -> Result<ScanRequest> {
        let mut request = request.clone();
        let Some(given) = &self.given else {
            return Ok(request);
        };
        if request.tokenizer.is_some() {
            return Ok(request);
        }
        futures::future::try_join_all(self.fleet.nodes().into_iter().map(|node| async move {
            let has = Action::new(ActionKind::HasTokenizer.name(), bytes::Bytes::from(given.id.clone()));
            let kept = match node.action(has).await {
                Ok(answer) => answer.first().is_some_and(|r| &r.body[..] == b"yes"),
                Err(status) if Failure::of(status.code()) == Failure::Transient => {
                    tracing::warn!(server = %node.url, error = %status.message(), "could not ask for the tokenizer");
                    return Ok(());
                }
                Err(status) => return Err(ClientError::server(&node.url, status)),
            };
            if !kept {
                let give = Action::new(ActionKind::GiveTokenizer.name(), given.json.clone());
                match node.action(give).await {
                    Ok(_) => tracing::debug!(server = %node.url, id = %given.id, "gave the tokenizer"),
                    Err(status) if Failure::of(status.code()) == Failure::Transient => {
                        tracing::warn!(server = %node.url, error = %status.message(), "could not give the tokenizer");
                    }
                    Err(status) => return Err(ClientError::server(&node.url, status)),
                }
            }
            Ok(())
        }))
        .await?;
        request.tokenizer = Some(given.id.clone());
        Ok(request)
    }

    /// The servers known so far (those given, and those endpoints named).
    pub fn urls(&self) -> Vec<String> {
        self.fleet.nodes().iter().map(|n| n.url.clone()).collect()
    }

    pub(crate) fn fleet(&self) -> &Arc<Fleet> {
        &self.fleet
    }

    /// Calls `f` (`what` names it) on the servers in turn until one answers, each within
    /// the call deadline: a transient failure, or no answer in time, moves on to the next
    /// server; any other failure is the answer.
    async fn on_any<T, F, Fut>(&self, what: &str, f: F) -> Result<T>
    where
        F: Fn(fleet::Flight) -> Fut,
        Fut: std::future::Future<Output = Result<T, tonic::Status>>,
    {
        let nodes = Fleet::ranked(&self.fleet.nodes(), 0);
        retry::first_answer(nodes, false, "no server to ask", |node| {
            let call = f(node.flight.clone());
            async move { node.within(what, call).await }
        })
        .await
    }

    /// Plans a request on every server and merges their answers: one endpoint per shard, in
    /// (dataset, file, row group) order, located on the servers that hold its file at the
    /// planned version. DNS names are resolved again first (servers that joined are asked
    /// too). Each server's answer, its retries included, has the call deadline
    /// ([`ConnectOptions::call_timeout`]). A server that cannot be reached, or gives no
    /// answer in time:
    ///
    /// * when no server answered: the plan fails, naming it;
    /// * when the files it offered in its last plan are all offered by others: the plan
    ///   goes on without it (nothing is lost; a dead or frozen server does not stop the
    ///   next epoch);
    /// * when some of them are offered by none: the plan fails naming it and those files
    ///   ([`ClientError::Unreachable`]), never a short epoch;
    /// * when it never answered this client: its files are unknown, so the plan goes on
    ///   with those that answered and a warning names it (a fleet of replicas starts while
    ///   one member hangs; files only it holds join the first plan after it answers).
    pub async fn plan(&self, request: &ScanRequest) -> Result<FlightInfo> {
        self.fleet.rediscover().await;
        let request = self.with_given_tokenizer(request).await?;
        let descriptor = FlightDescriptor::new_cmd(request.encode());
        let (answers, unreachable) = ask_to_plan(self.fleet.nodes(), &descriptor).await?;
        let offered: Vec<Option<BTreeSet<(String, String)>>> =
            answers.iter().map(|(_, info)| fleet::files_of(info)).collect();
        let all = offered_by_all(&answers);
        for (node, status) in unreachable {
            Self::plan_without(&node, &status, &all, answers.is_empty())?;
        }
        for ((node, _), files) in answers.iter().zip(offered) {
            if let Some(files) = files {
                node.set_offered(files);
            }
        }
        fleet::merge(answers)
    }

    /// Whether a plan goes on without `node`, which could not be reached or gave no answer
    /// in time (`status`), given the files `all` that the servers that answered offer (the
    /// rules of [`Self::plan`]).
    fn plan_without(
        node: &fleet::Member,
        status: &tonic::Status,
        all: &BTreeSet<(String, String)>,
        none_answered: bool,
    ) -> Result<()> {
        let reason = crate::error::status_text(status);
        if none_answered {
            return Err(ClientError::server(&node.url, status.clone()));
        }
        match node.held_alone(all) {
            Some(files) if files.is_empty() => tracing::warn!(
                server = %node.url,
                error = %reason,
                "planning without a server that does not answer (the others hold its files)"
            ),
            Some(files) => {
                return Err(ClientError::Unreachable {
                    server: node.url.clone(),
                    files,
                    reason,
                });
            }
            None => tracing::warn!(
                server = %node.url,
                error = %reason,
                "planning without a server that has not answered yet: files only it holds are \
                 not in this plan (they join the first plan after it answers)"
            ),
        }
        Ok(())
    }

    /// The schema of a dataset of the catalog.
    pub async fn dataset_schema(&self, dataset: &str) -> Result<SchemaRef> {
        let descriptor = FlightDescriptor::new_path(vec![dataset.to_owned()]);
        let result = self
            .on_any("the schema", |mut c| {
                let d = descriptor.clone();
                async move { c.get_schema(d).await.map(tonic::Response::into_inner) }
            })
            .await?;
        let schema = arrow::datatypes::Schema::try_from(&result)?;
        Ok(std::sync::Arc::new(schema))
    }

    /// The catalog of the first server that answers: (dataset, rows, bytes, schema) per
    /// dataset.
    pub async fn list_datasets(&self) -> Result<Vec<(String, i64, i64, SchemaRef)>> {
        let infos: Vec<FlightInfo> = self
            .on_any("listing the catalog", |mut c| async move {
                c.list_flights(Criteria::default())
                    .await?
                    .into_inner()
                    .try_collect()
                    .await
            })
            .await?;
        infos
            .into_iter()
            .map(|info| {
                let name = info
                    .flight_descriptor
                    .as_ref()
                    .and_then(|d| d.path.first().cloned())
                    .unwrap_or_default();
                let (rows, bytes) = (info.total_records, info.total_bytes);
                let schema = info.try_decode_schema()?;
                Ok((name, rows, bytes, std::sync::Arc::new(schema)))
            })
            .collect()
    }

    /// Runs a server action on the first server that answers, returning its results' bodies.
    pub async fn action(&self, kind: ActionKind, body: bytes::Bytes) -> Result<Vec<bytes::Bytes>> {
        let what = format!("the {} action", kind.name());
        let results: Vec<arrow_flight::Result> = self
            .on_any(&what, |mut c| {
                let action = Action::new(kind.name(), body.clone());
                async move { c.do_action(action).await?.into_inner().try_collect().await }
            })
            .await?;
        Ok(results.into_iter().map(|r| r.body).collect())
    }

    /// Asks every server to list its data root now (files added or removed since its last
    /// polling), so that the next [`Self::plan`] sees them. Returns each server's dataset
    /// versions, by server.
    pub async fn refresh(&self) -> Result<Vec<(String, Vec<pushdown_protocol::DatasetVersion>)>> {
        futures::future::try_join_all(self.fleet.nodes().into_iter().map(|node| async move {
            let action = Action::new(ActionKind::Refresh.name(), bytes::Bytes::new());
            let results = node
                .action(action)
                .await
                .map_err(|status| ClientError::server(&node.url, status))?;
            let versions = results
                .iter()
                .map(|r| {
                    pushdown_protocol::DatasetVersion::decode(&r.body)
                        .map_err(|e| ClientError::reply("the refresh action", e))
                })
                .collect::<Result<Vec<_>>>()?;
            Ok((node.url.clone(), versions))
        }))
        .await
    }

    /// Sends a loader's report (its wait and rows since the last one) to every server, for
    /// their scaling signal. Best effort: a server that cannot take it (down, or older than
    /// the `report` action) is skipped; the loader never fails for a report.
    pub async fn report(&self, report: &pushdown_protocol::ClientReport) {
        let body = report.to_bytes();
        futures::future::join_all(self.fleet.nodes().into_iter().map(|node| {
            let action = Action::new(ActionKind::Report.name(), body.clone());
            async move {
                match tokio::time::timeout(Duration::from_secs(2), node.action(action)).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(status)) => {
                        tracing::debug!(server = %node.url, status = %crate::error::status_text(&status), "a server did not take the report")
                    }
                    Err(_) => tracing::debug!(server = %node.url, "a server did not take the report in 2 s"),
                }
            }
        }))
        .await;
    }

    /// Each server's scaling signal: its busy fraction, its clients' wait, and how many
    /// servers would remove their stall.
    pub async fn scaling(&self) -> Result<Vec<(String, pushdown_protocol::ScalingSignal)>> {
        self.scaling_each()
            .await
            .into_iter()
            .map(|(url, signal)| Ok((url, signal?)))
            .collect()
    }

    /// Each server's scaling signal, or why it could not give one (a server that is down,
    /// or gives no answer in [`SCALING_TIMEOUT`], does not hide the others').
    pub async fn scaling_each(&self) -> Vec<(String, Result<pushdown_protocol::ScalingSignal>)> {
        futures::future::join_all(self.fleet.nodes().into_iter().map(|node| async move {
            let signal = tokio::time::timeout(SCALING_TIMEOUT, async {
                let action = Action::new(ActionKind::Scaling.name(), bytes::Bytes::new());
                let results = node
                    .action(action)
                    .await
                    .map_err(|status| ClientError::server(&node.url, status))?;
                let body = results
                    .first()
                    .ok_or_else(|| ClientError::reply("the scaling action", "no result"))?;
                pushdown_protocol::ScalingSignal::from_bytes(&body.body)
                    .map_err(|e| ClientError::reply("the scaling action", e))
            })
            .await
            .unwrap_or_else(|_| {
                Err(ClientError::Timeout {
                    what: format!("{}'s scaling signal", node.url),
                    after: SCALING_TIMEOUT,
                })
            });
            (node.url.clone(), signal)
        }))
        .await
    }

    /// The ops the servers of the fleet run (their `ops` action; the ops every answering server
    /// lists), or `None` where none can say (every server older than the action, or none
    /// answering): then every op is taken as running there, and a server that cannot run a
    /// call refuses it by name. An empty answer is no answer.
    pub async fn server_ops(&self) -> Option<BTreeSet<String>> {
        let answers = futures::future::join_all(self.fleet.nodes().into_iter().map(|node| async move {
            let action = Action::new(ActionKind::Ops.name(), bytes::Bytes::new());
            let answer = tokio::time::timeout(Duration::from_secs(10), node.action(action)).await;
            let Ok(Ok(results)) = answer else { return None };
            let ops: BTreeSet<String> = results
                .iter()
                .flat_map(|r| {
                    String::from_utf8_lossy(&r.body)
                        .lines()
                        .map(str::to_owned)
                        .collect::<Vec<_>>()
                })
                .filter(|name| !name.is_empty())
                .collect();
            (!ops.is_empty()).then_some(ops)
        }))
        .await;
        answers
            .into_iter()
            .flatten()
            .reduce(|a, b| a.intersection(&b).cloned().collect())
    }

    /// Runs the server's `profile` action on the fragment of `request`.
    pub async fn profile(&self, request: &ScanRequest) -> Result<pushdown_protocol::Profile> {
        let request = self.with_given_tokenizer(request).await?;
        let bodies = self.action(ActionKind::Profile, request.encode()).await?;
        let body = bodies
            .first()
            .ok_or_else(|| ClientError::reply("the profile action", "no result"))?;
        pushdown_protocol::Profile::decode(body).map_err(|e| ClientError::reply("the profile action", e))
    }

    /// The rows the DoGet of `endpoint` would stream, counted by a server holding it (the
    /// `count` action: only the filter's columns are read).
    pub async fn count(&self, endpoint: &FlightEndpoint) -> Result<u64> {
        let ticket = endpoint
            .ticket
            .as_ref()
            .ok_or_else(|| ClientError::reply("planning", "an endpoint has no ticket"))?;
        let holders = Fleet::ranked(&self.fleet.holders(endpoint)?, 0);
        // A holder without the shard's file at its version is passed over for the next.
        let results = retry::first_answer(holders, true, "no server holds the shard", |node| {
            let action = Action::new(ActionKind::Count.name(), ticket.ticket.clone());
            async move { node.action(action).await }
        })
        .await?;
        let body = results
            .first()
            .ok_or_else(|| ClientError::reply("the count action", "no result"))?;
        Ok(CountReply::decode(&body.body)
            .map_err(|e| ClientError::reply("the count action", e))?
            .rows)
    }

    /// The tokenizer shipped with `dataset` (its `tokenizer.json`), from the server.
    pub async fn tokenizer(&self, dataset: &str) -> Result<std::sync::Arc<pushdown_ops::TokenizerModel>> {
        let bodies = self
            .action(ActionKind::Tokenizer, bytes::Bytes::from(dataset.to_owned()))
            .await?;
        let body = bodies
            .first()
            .ok_or_else(|| ClientError::reply("the tokenizer action", "no result"))?;
        pushdown_ops::load_tokenizer(body)
            .map(std::sync::Arc::new)
            .map_err(|e| ClientError::reply("the tokenizer action", e))
    }

    /// The resources the client-side `steps` of a pipeline over `dataset` need, as their ops
    /// declare them ([`pushdown_ops::Op::needs`]): the tokenizers their calls name, or for
    /// calls that name none the one this client gives, else `dataset`'s.
    pub async fn resources_for(&self, steps: &[pushdown_planner::Step], dataset: &str) -> Result<Tokenizers> {
        let calls: Vec<pushdown_ops::Call> = steps
            .iter()
            .filter_map(|step| match step {
                pushdown_planner::Step::Map(m) => Some(m.call()),
                _ => None,
            })
            .collect();
        self.resources_for_calls(&calls, dataset).await
    }

    /// [`Self::resources_for`] op calls (a fragment's ops the server may leave to this client).
    pub async fn resources_for_calls(
        &self,
        calls: &[pushdown_ops::Call],
        dataset: &str,
    ) -> Result<Tokenizers> {
        let default = self.tokenizer_id().unwrap_or(dataset).to_owned();
        let mut tokenizers = Tokenizers::new(Some(default.clone()));
        if let Some(given) = &self.given {
            tokenizers.insert(given.id.clone(), Arc::clone(&given.model));
        }
        for call in calls {
            for need in call.needs()? {
                match need {
                    pushdown_ops::Need::Tokenizer(name) => {
                        let name = name.unwrap_or_else(|| default.clone());
                        if !tokenizers.contains(&name) {
                            let tokenizer = self.tokenizer(&name).await?;
                            tokenizers.insert(name, tokenizer);
                        }
                    }
                }
            }
        }
        Ok(tokenizers)
    }

    /// Streams every endpoint of `info`.
    pub fn stream(&self, info: &FlightInfo, options: StreamOptions) -> Result<ShardStream> {
        ShardStream::start(Arc::clone(&self.fleet), info, options)
    }
}
