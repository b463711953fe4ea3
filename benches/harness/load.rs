//! `harness load`: 64 concurrent clients for a bounded time against one server with caps
//! and tokens set: legal requests must all succeed, hostile and forbidden ones must all be
//! refused, and the server's memory must stay within its pool plus a stated overhead.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use futures::StreamExt;
use pushdown_client::{ConnectOptions, PushdownClient, StreamOptions};
use pushdown_protocol::{Query, ScanRequest};

use crate::process::{ServerProcess, peak_rss, reset_peak_rss};
use crate::{Datasets, FarArgs, Options};

const CLIENTS: usize = 64;
/// Reads every dataset.
const ADMIN: &str = "load-test-admin-token-000000";
/// Reads `images` only.
const IMAGES_ONLY: &str = "load-test-images-token-00000";
/// The server's caps.
const POOL_MIB: usize = 256;
const STREAM_SLOTS: usize = 16;
/// Stated overhead per stream slot beyond the pool: two encoded Flight messages of up to
/// 2 MiB queued to the socket, the batch being encoded, and the decoder's pages.
const PER_SLOT_MIB: u64 = 16;

/// `harness load-serve`: the capped, token-guarded server of the load test.
pub fn serve(far: &FarArgs) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let config = pushdown_server::ServerConfig {
            cpu_threads: far.threads,
            memory_limit: POOL_MIB << 20,
            max_concurrent_streams: STREAM_SLOTS,
            queue_timeout: Duration::from_secs(120),
            max_op_batch_bytes: 64 << 20,
            // The bound checked is the query pool's; the cache's budget is another.
            cache: pushdown_server::CacheConfig {
                default_mode: pushdown_server::CacheMode::Off,
                ..pushdown_server::CacheConfig::default()
            },
            ..pushdown_server::ServerConfig::default()
        };
        let tokens = pushdown_server::Tokens::parse(&format!("{ADMIN} *\n{IMAGES_ONLY} images\n"))
            .map_err(anyhow::Error::msg)?;
        let store = pushdown_server::open_store(&far.data.to_string_lossy())?;
        let server = pushdown_server::Server::builder(store)
            .config(config)
            .tokens(tokens)
            .open()
            .await?;
        let running = server.spawn(far.listen).await?;
        println!("listening on {}", running.addr());
        use std::io::Write;
        std::io::stdout().flush()?;
        std::future::pending::<()>().await;
        Ok(())
    })
}

/// What a request should get.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    Rows,
    Refused(tonic::Code),
}

struct Request {
    name: &'static str,
    token: &'static str,
    sql: String,
    expect: Expect,
}

fn request(kind: usize, k: usize) -> Request {
    match kind {
        0 => Request {
            name: "clicks projection + filter",
            token: ADMIN,
            sql: format!(
                "SELECT label, i1, c1 FROM clicks WHERE day = {} AND i1 < 3",
                k % 24
            ),
            expect: Expect::Rows,
        },
        1 => Request {
            name: "images thumbnail(32)",
            token: IMAGES_ONLY,
            sql: format!(
                "SELECT id, thumbnail(image, 32) AS t FROM images WHERE label < {}",
                10 + k % 20
            ),
            expect: Expect::Rows,
        },
        2 => Request {
            name: "text tokenize(64)",
            token: ADMIN,
            sql: format!(
                "SELECT id, tokenize(body, 64) AS t FROM text WHERE id % 50 = {}",
                k % 50
            ),
            expect: Expect::Rows,
        },
        3 => Request {
            name: "lineitem Q6 (aggregate)",
            token: ADMIN,
            sql: "SELECT sum(l_extendedprice * l_discount) FROM lineitem WHERE l_quantity < 24 \
                  AND l_discount BETWEEN 0.05 AND 0.07"
                .into(),
            expect: Expect::Rows,
        },
        4 => Request {
            name: "hostile decode_resize(8192²)",
            token: IMAGES_ONLY,
            sql: "SELECT decode_resize(image, 8192, 8192) AS px FROM images".into(),
            expect: Expect::Refused(tonic::Code::InvalidArgument),
        },
        _ => Request {
            name: "forbidden dataset",
            token: IMAGES_ONLY,
            sql: "SELECT * FROM lineitem LIMIT 5".into(),
            expect: Expect::Refused(tonic::Code::PermissionDenied),
        },
    }
}

const KINDS: usize = 6;

#[derive(Default, Clone)]
struct Tally {
    ok: u64,
    failed: u64,
    refused_as_expected: u64,
    wrongly_answered: u64,
    rows: u64,
    latencies: Vec<f64>,
    first_failure: Option<String>,
}

async fn run_one(client: &PushdownClient, sql: &str) -> Result<u64, String> {
    let info = client
        .plan(&ScanRequest::new(Query::Sql(sql.into())))
        .await
        .map_err(|e| e.to_string())?;
    let mut stream = client
        .stream(
            &info,
            StreamOptions {
                concurrency: 1,
                ..StreamOptions::default()
            },
        )
        .map_err(|e| e.to_string())?;
    let mut rows = 0;
    while let Some(batch) = stream.next().await {
        rows += batch.map_err(|e| e.to_string())?.num_rows() as u64;
    }
    Ok(rows)
}

async fn connect_as(url: &str, token: &str) -> Result<PushdownClient> {
    Ok(PushdownClient::connect_with(
        &[url],
        ConnectOptions {
            token: Some(token.to_owned()),
            ..ConnectOptions::default()
        },
    )
    .await?)
}

async fn client_loop(i: usize, url: String, until: Instant) -> Result<Vec<Tally>> {
    let admin = connect_as(&url, ADMIN).await?;
    let images = connect_as(&url, IMAGES_ONLY).await?;
    let mut tallies = vec![Tally::default(); KINDS];
    let mut k = 0;
    while Instant::now() < until {
        let kind = (i + k) % KINDS;
        let r = request(kind, k);
        let client = if r.token == ADMIN { &admin } else { &images };
        let start = Instant::now();
        let outcome = run_one(client, &r.sql).await;
        let t = &mut tallies[kind];
        t.latencies.push(start.elapsed().as_secs_f64());
        match (r.expect, outcome) {
            (Expect::Rows, Ok(n)) => {
                t.ok += 1;
                t.rows += n;
            }
            (Expect::Rows, Err(e)) => {
                t.failed += 1;
                t.first_failure.get_or_insert(e);
            }
            (Expect::Refused(code), Err(e)) if e.contains(code.description()) => t.refused_as_expected += 1,
            (Expect::Refused(_), Err(e)) => {
                t.failed += 1;
                t.first_failure.get_or_insert(e);
            }
            (Expect::Refused(_), Ok(_)) => t.wrongly_answered += 1,
        }
        k += 1;
    }
    Ok(tallies)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

pub async fn suite(options: &Options, data: &Datasets, command: &str) -> Result<String> {
    let secs = if options.quick { 10 } else { 30 };
    let server = ServerProcess::start_with(
        "load-serve",
        &data.root.to_string_lossy(),
        "127.0.0.1:0",
        2,
        None,
        Some("0"),
        &[],
    )?;
    let url = format!("http://{}", server.addr);
    let pid = server.pid();
    // Warm: every request once, one client; the RSS after it is the idle baseline.
    for kind in 0..KINDS {
        let r = request(kind, 0);
        let client = connect_as(&url, r.token).await?;
        let _ = run_one(&client, &r.sql).await;
    }
    let baseline = crate::process::current_rss(&pid).context("server RSS")?;
    reset_peak_rss(&pid);
    let cpu_before = server.cpu_seconds();
    let start = Instant::now();
    let until = start + Duration::from_secs(secs);
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|i| pushdown_task::Task::spawn(client_loop(i, url.clone(), until)))
        .collect();
    let mut totals = vec![Tally::default(); KINDS];
    for task in tasks {
        for (kind, t) in task.await??.into_iter().enumerate() {
            let total = &mut totals[kind];
            total.ok += t.ok;
            total.failed += t.failed;
            total.refused_as_expected += t.refused_as_expected;
            total.wrongly_answered += t.wrongly_answered;
            total.rows += t.rows;
            total.latencies.extend(t.latencies);
            if total.first_failure.is_none() {
                total.first_failure = t.first_failure;
            }
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    let cpu = server.cpu_seconds() - cpu_before;
    let peak = peak_rss(&pid).context("server peak RSS")?;
    let alive = crate::process::current_rss(&pid).is_some();
    drop(server);

    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let bound = ((POOL_MIB as u64) << 20) + baseline + STREAM_SLOTS as u64 * (PER_SLOT_MIB << 20);
    let mut table = String::from(
        "| request | expected | done | refused as expected | failed | wrongly answered | rows | p50 s | p99 s |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    let mut failures = Vec::new();
    let (mut failed, mut wrong, mut done) = (0, 0, 0);
    for (kind, t) in totals.iter_mut().enumerate() {
        let r = request(kind, 0);
        t.latencies.sort_by(f64::total_cmp);
        failed += t.failed;
        wrong += t.wrongly_answered;
        done += t.ok + t.refused_as_expected + t.failed + t.wrongly_answered;
        if let Some(f) = &t.first_failure {
            failures.push(format!("{}: {f}", r.name));
        }
        table.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {:.3} | {:.3} |\n",
            r.name,
            match r.expect {
                Expect::Rows => "rows",
                Expect::Refused(tonic::Code::InvalidArgument) => "InvalidArgument",
                Expect::Refused(tonic::Code::PermissionDenied) => "PermissionDenied",
                Expect::Refused(_) => "an error",
            },
            t.ok,
            t.refused_as_expected,
            t.failed,
            t.wrongly_answered,
            t.rows,
            percentile(&t.latencies, 0.5),
            percentile(&t.latencies, 0.99),
        ));
    }
    let memory_ok = peak <= bound;
    let ok = failed == 0 && wrong == 0 && memory_ok && alive;
    Ok(format!(
        "## Load: {CLIENTS} concurrent clients against one capped server\n\n\
         Command: `{command}`  \nMachine: {}.  \n\
         One server process (2 CPU threads, pinned to CPU 0) with tokens, a {POOL_MIB} MiB query pool, \
         {STREAM_SLOTS} stream slots (others wait up to 120 s), op output capped at 16 MiB per row and 64 MiB per batch; \
         {CLIENTS} clients in the harness process (CPU 1), each with two connections (an admin token and an images-only token), \
         looping for {secs} s over six requests in rotation: four legal ones and two that must be refused.\n\n\
         {table}\n\
         {done} requests in {elapsed:.1} s ({:.1}/s); server CPU {cpu:.1} s ({:.2} cores).  \n\
         Server RSS: idle after warm-up {:.0} MiB; peak under load **{:.0} MiB**; bound = pool {POOL_MIB} MiB + idle + \
         {STREAM_SLOTS} slots × {PER_SLOT_MIB} MiB = {:.0} MiB.  \n\
         Target: zero failed requests that should succeed, no refused request answered, server alive, peak RSS within the bound: **{}**.{}\n\n",
        crate::machine(),
        done as f64 / elapsed,
        cpu / elapsed,
        mib(baseline),
        mib(peak),
        mib(bound),
        if ok { "met" } else { "missed" },
        if failures.is_empty() {
            String::new()
        } else {
            format!("  \nFirst failures: {}", failures.join("; "))
        },
    ))
}
