//! The soak's clients, each a loop until its phase ends, and the judge of what they got: a
//! loader's epochs against the fault-free sequence, streams cancelled at random points,
//! malformed requests at a fixed rate, bursts of streams past the server's budget, and
//! pyarrow's plain client and ADBC's Flight SQL driver in processes of their own.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use arrow::array::AsArray;
use arrow::datatypes::Int64Type;
use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::{Action, FlightDescriptor, Ticket};
use futures::StreamExt;
use pushdown_client::{LoaderOptions, LoaderSource, Prepared, PushdownClient, StreamOptions};
use pushdown_protocol::{Query, ScanRequest};
use pushdown_task::Task;
use tonic::Code;

/// The loaders' query: thumbnails made on the servers.
pub const LOADER_SQL: &str = "SELECT id, label, thumbnail(image, 32) AS thumb FROM images";
/// What the cancelling clients open: the images themselves, large batches.
const CANCEL_SQL: &str = "SELECT id, image FROM images";
/// What a burst holds open: 16 images decoded to 512² (12 MiB, cut into 2 MiB messages), so a
/// stream not read past its first message keeps its slot, for little work.
const BURST_SQL: &str = "SELECT id, decode_resize(image, 512, 512) AS px FROM images WHERE id < 16";
/// pyarrow's plain client: a projection with a filter.
pub const PLAIN_SQL: &str = "SELECT label, i1, c1, day FROM clicks WHERE i1 < 3";
/// ADBC: an aggregate, answered whole.
pub const ADBC_SQL: &str = "SELECT count(*) AS n, sum(i1) AS s FROM clicks WHERE day < 12";
/// Epochs a loader reads from one plan before it plans again.
pub const EPOCHS: u64 = 3;
/// Longest an epoch, a cancelled stream or a malformed request may take: longer is a hang.
const LIMIT: Duration = Duration::from_secs(120);
/// After a restart the clients' channels reconnect with backoff: their failures this long
/// after the server is back still belong to its outage.
const GRACE_SECS: f64 = 15.0;

pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// What one kind of client got.
#[derive(Debug, Clone, Default)]
pub struct Tally {
    pub requests: u64,
    /// Answers checked exact (a loader's epoch, a plain or ADBC answer), or requests that did
    /// what they meant (a stream cancelled, a malformed request refused with its status).
    pub exact: u64,
    pub wrong: u64,
    pub first_wrong: Option<String>,
    /// Refusals with the status expected of them, by status.
    pub refused: BTreeMap<String, u64>,
    /// Failures of a killed server's requests during its outage.
    pub outage: u64,
    pub unexpected: u64,
    pub first_unexpected: Option<String>,
}

impl Tally {
    pub fn add(&mut self, other: &Tally) {
        self.requests += other.requests;
        self.exact += other.exact;
        self.wrong += other.wrong;
        self.outage += other.outage;
        self.unexpected += other.unexpected;
        for (code, n) in &other.refused {
            *self.refused.entry(code.clone()).or_default() += n;
        }
        if self.first_wrong.is_none() {
            self.first_wrong.clone_from(&other.first_wrong);
        }
        if self.first_unexpected.is_none() {
            self.first_unexpected.clone_from(&other.first_unexpected);
        }
    }

    fn wrong(&mut self, what: String) {
        self.wrong += 1;
        self.first_wrong.get_or_insert(what);
    }

    fn unexpected(&mut self, what: String) {
        self.unexpected += 1;
        self.first_unexpected.get_or_insert(what);
    }

    fn refused_with(&mut self, code: &str) {
        *self.refused.entry(code.to_owned()).or_default() += 1;
    }
}

/// Judges failures against the kill schedule: a server's outage runs from its SIGKILL to
/// [`GRACE_SECS`] after it serves again.
#[derive(Debug, Default)]
pub struct Judge {
    outages: parking_lot::Mutex<Vec<(usize, f64, f64)>>,
}

impl Judge {
    pub fn down(&self, server: usize) {
        self.outages.lock().push((server, unix_now(), f64::INFINITY));
    }

    pub fn up(&self, server: usize) {
        if let Some(o) = self.outages.lock().iter_mut().rev().find(|o| o.0 == server) {
            o.2 = unix_now();
        }
    }

    /// Whether `server` (any, when `None`) was out at `t`.
    fn out(&self, server: Option<usize>, t: f64) -> bool {
        self.outages
            .lock()
            .iter()
            .any(|&(s, from, to)| server.is_none_or(|x| x == s) && t >= from - 1.0 && t <= to + GRACE_SECS)
    }

    /// A failed request of `tally`'s kind: `kind` is the client's error kind (`Unavailable`,
    /// `ResourceExhausted`, ...). A server's budget refusing is expected anywhere; being
    /// unreachable, only during that server's outage.
    pub fn failed(&self, tally: &mut Tally, server: Option<usize>, t: f64, kind: &str, message: &str) {
        match kind {
            "ResourceExhausted" => tally.refused_with(kind),
            "Unavailable" if self.out(server, t) => tally.outage += 1,
            _ => tally.unexpected(format!("{kind}: {message}")),
        }
    }
}

fn kind_of(e: &pushdown_client::ClientError) -> &'static str {
    e.kind().name()
}

/// Epochs `0..EPOCHS` of the loader's sequence, fault-free: the reference every soak epoch is
/// compared with.
pub async fn reference_epochs(urls: &[String]) -> Result<Vec<Vec<i64>>> {
    let prepared = prepare(urls).await?;
    let mut epochs = Vec::new();
    for epoch in 0..EPOCHS {
        let ids = read_epoch(&prepared, epoch).await?;
        let mut sorted = ids.clone();
        sorted.sort_unstable();
        sorted.dedup();
        if ids.is_empty() || sorted.len() != ids.len() {
            bail!(
                "epoch {epoch} of the reference has {} ids, {} distinct",
                ids.len(),
                sorted.len()
            );
        }
        epochs.push(ids);
    }
    if epochs.windows(2).any(|w| w[0] == w[1]) {
        bail!("the reference's epochs are not shuffled apart");
    }
    Ok(epochs)
}

async fn prepare(urls: &[String]) -> Result<Prepared, pushdown_client::ClientError> {
    let client = PushdownClient::connect(urls).await?;
    let options = LoaderOptions {
        batch_size: Some(64),
        shuffle_buffer: Some(256),
        seed: 7,
        epochs: EPOCHS as usize,
        ..LoaderOptions::default()
    };
    Prepared::new(client, LoaderSource::Sql(LOADER_SQL.into()), options).await
}

async fn read_epoch(prepared: &Prepared, epoch: u64) -> Result<Vec<i64>, pushdown_client::ClientError> {
    let mut stream = prepared.epoch(epoch, 0, pushdown_client::SharedTotals::default());
    let mut ids = Vec::new();
    while let Some(batch) = stream.next().await {
        let batch = batch?;
        if let Some(id) = batch.column_by_name("id") {
            ids.extend(id.as_primitive::<Int64Type>().values().iter().copied());
        }
    }
    Ok(ids)
}

/// A loader reading epoch after epoch over both servers until `until`, planning again every
/// [`EPOCHS`] epochs; each epoch's ids compared with `reference`.
pub async fn loader(
    urls: Vec<String>,
    reference: Arc<Vec<Vec<i64>>>,
    until: Instant,
    judge: Arc<Judge>,
) -> Tally {
    let mut t = Tally::default();
    while Instant::now() < until {
        let prepared = match tokio::time::timeout(LIMIT, prepare(&urls)).await {
            Ok(Ok(p)) => p,
            Ok(Err(e)) => {
                t.requests += 1;
                judge.failed(&mut t, None, unix_now(), kind_of(&e), &e.to_string());
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
            Err(_) => {
                t.unexpected(format!("planning took over {LIMIT:?}"));
                continue;
            }
        };
        for epoch in 0..EPOCHS {
            if Instant::now() >= until {
                break;
            }
            t.requests += 1;
            match tokio::time::timeout(LIMIT, read_epoch(&prepared, epoch)).await {
                Ok(Ok(ids)) if ids == reference[epoch as usize] => t.exact += 1,
                Ok(Ok(ids)) => t.wrong(format!(
                    "epoch {epoch}: {} ids against {}, first difference at {}",
                    ids.len(),
                    reference[epoch as usize].len(),
                    ids.iter()
                        .zip(reference[epoch as usize].iter())
                        .take_while(|(a, b)| a == b)
                        .count()
                )),
                Ok(Err(e)) => judge.failed(&mut t, None, unix_now(), kind_of(&e), &e.to_string()),
                Err(_) => t.unexpected(format!("epoch {epoch} took over {LIMIT:?}")),
            }
        }
    }
    t
}

/// A small deterministic generator (xorshift): the points at which streams are cancelled.
struct Dice(u64);

impl Dice {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

/// Connects to one server, opens a stream of [`CANCEL_SQL`], reads 0–3 batches of it and
/// drops it, again and again until `until`, alternating servers.
pub async fn canceller(seed: u64, urls: Vec<String>, until: Instant, judge: Arc<Judge>) -> Tally {
    let mut t = Tally::default();
    let mut dice = Dice(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut k = seed as usize;
    while Instant::now() < until {
        let server = k % urls.len();
        k += 1;
        t.requests += 1;
        let take = dice.below(4);
        let once = async {
            let client = PushdownClient::connect(&[&urls[server]]).await?;
            let info = client
                .plan(&ScanRequest::new(Query::Sql(CANCEL_SQL.into())))
                .await?;
            let options = StreamOptions {
                concurrency: 1,
                ..StreamOptions::default()
            };
            let mut stream = client.stream(&info, options)?;
            for _ in 0..take {
                if let Some(batch) = stream.next().await {
                    batch?;
                }
            }
            Ok::<_, pushdown_client::ClientError>(())
        };
        match tokio::time::timeout(LIMIT, once).await {
            Ok(Ok(())) => t.exact += 1,
            Ok(Err(e)) => judge.failed(&mut t, Some(server), unix_now(), kind_of(&e), &e.to_string()),
            Err(_) => t.unexpected(format!(
                "a stream cancelled after {take} batches took over {LIMIT:?}"
            )),
        }
        tokio::time::sleep(Duration::from_millis(50 + dice.below(200))).await;
    }
    t
}

/// The malformed requests sent in turn, each with the status it must get.
const MALFORMED: [(&str, Code); 6] = [
    ("garbage ticket", Code::InvalidArgument),
    ("bad SQL", Code::InvalidArgument),
    ("unknown dataset", Code::NotFound),
    ("hostile decode_resize(8192²)", Code::InvalidArgument),
    ("unknown path", Code::NotFound),
    ("unknown action", Code::InvalidArgument),
];

async fn send_malformed(url: &str, which: usize) -> Result<(), tonic::Status> {
    let channel = tonic::transport::Channel::from_shared(url.to_owned())
        .map_err(|e| tonic::Status::invalid_argument(e.to_string()))?
        .connect()
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let mut client = FlightServiceClient::new(channel);
    let info = |sql: &str| FlightDescriptor::new_cmd(ScanRequest::new(Query::Sql(sql.into())).encode());
    match which {
        0 => {
            let mut stream = client
                .do_get(Ticket::new(vec![0xff, 0xff, 0xff]))
                .await?
                .into_inner();
            stream.message().await?;
        }
        1 => drop(client.get_flight_info(info("SELEC label FROM images")).await?),
        2 => drop(client.get_flight_info(info("SELECT * FROM nope")).await?),
        3 => drop(
            client
                .get_flight_info(info("SELECT decode_resize(image, 8192, 8192) FROM images"))
                .await?,
        ),
        4 => drop(
            client
                .get_schema(FlightDescriptor::new_path(vec!["nope".into()]))
                .await?,
        ),
        _ => drop(
            client
                .do_action(Action::new("no-such-action", Vec::new()))
                .await?,
        ),
    }
    Ok(())
}

/// One malformed request every `every`, alternating servers and kinds, until `until`.
pub async fn malformed(urls: Vec<String>, every: Duration, until: Instant, judge: Arc<Judge>) -> Tally {
    let mut t = Tally::default();
    let mut k = 0;
    while Instant::now() < until {
        let (server, which) = (k % urls.len(), (k / urls.len()) % MALFORMED.len());
        k += 1;
        t.requests += 1;
        let (name, want) = MALFORMED[which];
        match tokio::time::timeout(LIMIT, send_malformed(&urls[server], which)).await {
            Ok(Err(status)) if status.code() == want => {
                t.exact += 1;
                t.refused_with(&format!("{want:?}"));
            }
            Ok(Err(status)) => judge.failed(
                &mut t,
                Some(server),
                unix_now(),
                pushdown_client::ErrorKind::of_code(status.code()).name(),
                &format!("{name}: {status}"),
            ),
            Ok(Ok(())) => t.unexpected(format!("{name}: answered")),
            Err(_) => t.unexpected(format!("{name}: no answer in {LIMIT:?}")),
        }
        tokio::time::sleep(every).await;
    }
    t
}

/// `n` streams of one shard of [`BURST_SQL`] opened at once on one server, each held `hold`
/// after its first batch: those past the server's slots wait, then are refused with
/// `RESOURCE_EXHAUSTED`. Served and refused are both right; anything else is not.
pub async fn burst(url: String, n: usize, hold: Duration, judge: Arc<Judge>) -> Tally {
    let mut t = Tally::default();
    let ticket = async {
        let client = PushdownClient::connect(&[&url]).await?;
        let info = client
            .plan(&ScanRequest::new(Query::Sql(BURST_SQL.into())))
            .await?;
        let endpoint = info.endpoint.first().context("no endpoint")?;
        anyhow::Ok(endpoint.ticket.clone().context("no ticket")?)
    };
    let ticket = match ticket.await {
        Ok(ticket) => ticket,
        Err(e) => {
            t.unexpected(format!("planning the burst: {e:#}"));
            return t;
        }
    };
    let held = (0..n).map(|_| {
        let (url, ticket) = (url.clone(), ticket.clone());
        Task::spawn(async move {
            let channel = tonic::transport::Channel::from_shared(url)
                .map_err(|e| tonic::Status::invalid_argument(e.to_string()))?
                .connect()
                .await
                .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
            let mut stream = FlightServiceClient::new(channel)
                .do_get(ticket)
                .await?
                .into_inner();
            stream.message().await?;
            tokio::time::sleep(hold).await;
            Ok::<_, tonic::Status>(())
        })
    });
    for outcome in futures::future::join_all(held.collect::<Vec<_>>()).await {
        t.requests += 1;
        match outcome {
            Ok(Ok(())) => t.exact += 1,
            Ok(Err(status)) => judge.failed(
                &mut t,
                Some(0),
                unix_now(),
                pushdown_client::ErrorKind::of_code(status.code()).name(),
                &status.to_string(),
            ),
            Err(e) => t.unexpected(format!("a burst stream's task: {e}")),
        }
    }
    t
}

/// The interpreter of the Python clients: `PUSHDOWN_PYTHON`, else `.venv/bin/python`.
pub fn python() -> Result<PathBuf> {
    let python =
        std::env::var_os("PUSHDOWN_PYTHON").map_or_else(|| PathBuf::from(".venv/bin/python"), PathBuf::from);
    if !python.exists() {
        bail!(
            "no {}: run scripts/setup-python.sh (or set PUSHDOWN_PYTHON)",
            python.display()
        );
    }
    Ok(python)
}

fn soak_client(mode: &str, urls: &[String], sql: &str) -> Result<std::process::Command> {
    let grpc: Vec<String> = urls.iter().map(|u| u.replace("http://", "grpc://")).collect();
    let mut command = std::process::Command::new(python()?);
    command.arg("benches/python/soak_client.py").args([
        "--mode",
        mode,
        "--urls",
        &grpc.join(","),
        "--sql",
        sql,
    ]);
    Ok(command)
}

/// The answer `mode` (`plain` or `adbc`) gets for `sql` from `url` with no fault: what every
/// answer in the soak must equal.
pub fn python_reference(mode: &str, url: &str, sql: &str) -> Result<String> {
    let out = soak_client(mode, &[url.to_owned()], sql)?
        .args(["--expect", "?", "--seconds", "0"])
        .arg("--print")
        .output()
        .context("running soak_client.py")?;
    if !out.status.success() {
        bail!("soak_client.py --print: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8(out.stdout)?.trim().to_owned())
}

/// Runs `mode`'s client for `seconds` against `urls`, and judges what it reports.
pub async fn python_client(
    mode: &'static str,
    urls: Vec<String>,
    sql: &'static str,
    expect: String,
    seconds: f64,
    judge: Arc<Judge>,
) -> Tally {
    let mut t = Tally::default();
    let run = tokio::task::spawn_blocking({
        let urls = urls.clone();
        move || -> Result<serde_json::Value> {
            let out = soak_client(mode, &urls, sql)?
                .args(["--expect", &expect, "--seconds", &format!("{seconds:.1}")])
                .output()?;
            if !out.status.success() {
                bail!("{}", String::from_utf8_lossy(&out.stderr));
            }
            Ok(serde_json::from_slice(&out.stdout)?)
        }
    });
    let report = match run.await {
        Ok(Ok(report)) => report,
        Ok(Err(e)) => {
            t.unexpected(format!("soak_client.py --mode {mode}: {e:#}"));
            return t;
        }
        Err(e) => {
            t.unexpected(format!("soak_client.py --mode {mode}: {e}"));
            return t;
        }
    };
    let count = |k: &str| report[k].as_u64().unwrap_or(0);
    t.requests = count("requests");
    t.exact = count("exact");
    t.wrong = count("wrong");
    t.first_wrong = report["first_wrong"].as_str().map(str::to_owned);
    for error in report["errors"].as_array().into_iter().flatten() {
        let grpc = |u: &String| u.replace("http://", "grpc://");
        let server = urls
            .iter()
            .position(|u| Some(grpc(u).as_str()) == error["url"].as_str());
        let message = format!(
            "{} {}",
            error["class"].as_str().unwrap_or("?"),
            error["message"].as_str().unwrap_or("")
        );
        let kind = python_kind(&message);
        judge.failed(&mut t, server, error["t"].as_f64().unwrap_or(0.0), kind, &message);
    }
    t
}

/// The kind of a Python client's failure, from pyarrow's error class or the driver's message.
fn python_kind(message: &str) -> &'static str {
    let lower = message.to_lowercase();
    if lower.contains("resource exhausted")
        || lower.contains("resourceexhausted")
        || lower.contains("resource_exhausted")
    {
        "ResourceExhausted"
    } else if lower.contains("unavailable")
        || lower.contains("connection refused")
        || lower.contains("failed to connect")
        || lower.contains("connection reset")
        || lower.contains("broken pipe")
        || lower.contains("error while dialing")
    {
        "Unavailable"
    } else {
        "Internal"
    }
}
