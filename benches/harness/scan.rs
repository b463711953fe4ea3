//! `harness scan`: the server's scan against DuckDB's over the same local files.
//!
//! Two views. One thread each: the server (pinned to CPU 0, one CPU thread) and DuckDB (one
//! thread, CPU 0) on each workload's scan query, rows of the dataset per second, with the
//! engine in-process (no Flight) beside it. And the plain client: pyarrow's own Flight client
//! reading a query's endpoints one after another against a server with 2 threads, DuckDB with
//! 2 threads over the files, and DuckDB behind pyarrow's Flight server (the transport's floor).

use std::path::Path;

use anyhow::{Context, Result};

use crate::compare::{dataset_rows, duckdb_scan, engine_scan, server_scan, workloads};
use crate::{Datasets, Options};

/// The plain client's target: its time within this factor of DuckDB's local time.
const PLAIN_TARGET: f64 = 1.25;

#[derive(Debug, serde::Deserialize)]
struct PlainCell {
    query: String,
    sql: String,
    rows: u64,
    plain_s: f64,
    duckdb_flight_s: f64,
    memory_flight_s: f64,
    duckdb_s: f64,
}

pub async fn suite(options: &Options, data: &Datasets, command: &str) -> Result<String> {
    let reps = options.reps_resolved.max(3);
    let mut out = format!(
        "## Scan: the server against DuckDB\n\n\
         Command: `{command}`  \nMachine: {}.  \n\
         Best of {reps} runs per cell. DuckDB {} reads the same Parquet files (its external file cache on, as by default).\n\n\
         ### One thread each\n\n\
         The server pinned to CPU 0 with one CPU thread, its client on CPU 1 (uncompressed on loopback); DuckDB with one thread on CPU 0. \
         Rows of the dataset per second. DuckDB reads the same files, and also a copy written by its own Parquet writer with its defaults \
         (the layout DuckDB would choose); the server is held to the faster of the two.\n\n\
         | workload | query | server over Flight | the engine in-process | DuckDB, same files | DuckDB, its own layout | server ÷ faster DuckDB | |\n|---|---|---:|---:|---:|---:|---:|---|\n",
        crate::machine(),
        duckdb_version().unwrap_or_default(),
    );
    for w in workloads() {
        let rows_in = dataset_rows(data, w.pipeline.dataset.as_str());
        let server = server_scan(data, &w, rows_in, reps).await?;
        let engine = engine_scan(data, &w, rows_in, reps).await?;
        let duck =
            duckdb_scan(&data.root, &w, reps, true).context("DuckDB: scripts/setup-python.sh --bench")?;
        anyhow::ensure!(
            server.1 == duck.rows_out,
            "{}: {} rows from the server, {} from DuckDB",
            w.name,
            server.1,
            duck.rows_out
        );
        let own = duck.own_layout_rows_per_s.unwrap_or(0.0);
        let faster = duck.rows_per_s.max(own);
        out.push_str(&format!(
            "| {} | `{}` | {:.0} | {:.0} | {:.0} | {:.0} | {:.2} | {} |\n",
            w.name,
            w.scan,
            server.0,
            engine,
            duck.rows_per_s,
            own,
            server.0 / faster,
            if server.0 >= faster { "met" } else { "**missed**" }
        ));
    }
    out.push_str(&format!(
        "\n### The plain client: pyarrow reading endpoints in order, 2 threads\n\n\
         `pyarrow.flight` with no code of ours: `get_flight_info` on the SQL, then `do_get(...).read_all()` on each endpoint in turn \
         (uncompressed on loopback). The server has 2 CPU threads; DuckDB 2 threads over the files; \"DuckDB behind Flight\" is \
         DuckDB (2 threads) answering the same SQL through pyarrow's own Flight server (`benches/python/duckdb_flight_server.py`): \
         what the transport costs a server as fast as DuckDB. \"From memory\" is that server streaming the result DuckDB already \
         materialized (`--memo`): the transport alone, with no scan, as pyarrow's own server sends it. Target: pushdown ≤ \
         {PLAIN_TARGET} × DuckDB's local time; where even the transport alone takes longer, the cell says so.\n\n\
         | query | rows | pushdown (s) | DuckDB behind Flight (s) | from memory (s) | DuckDB local (s) | pushdown ÷ DuckDB local | transport alone ÷ DuckDB local | |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---|\n"
    ));
    for c in plain_client(&data.root, reps)? {
        let ratio = c.plain_s / c.duckdb_s;
        let floor = c.memory_flight_s / c.duckdb_s;
        out.push_str(&format!(
            "| {} (`{}`) | {} | {:.3} | {:.3} | {:.3} | {:.3} | {ratio:.2} | {floor:.2} | {} |\n",
            c.query,
            c.sql,
            c.rows,
            c.plain_s,
            c.duckdb_flight_s,
            c.memory_flight_s,
            c.duckdb_s,
            if ratio <= PLAIN_TARGET {
                "met"
            } else if floor > PLAIN_TARGET {
                "**missed**: the transport alone is over the target"
            } else {
                "**missed**"
            }
        ));
    }
    out.push('\n');
    Ok(out)
}

/// Runs `benches/python/bench_plain_client.py` against `harness serve` (this binary) with 2
/// threads; both processes on CPUs 0 and 1.
fn plain_client(root: &Path, reps: usize) -> Result<Vec<PlainCell>> {
    let venv = crate::s3::venv()?;
    let me = std::env::current_exe()?;
    let out = std::process::Command::new("taskset")
        .args(["-c", "0,1"])
        .arg(venv.join("python"))
        .arg("benches/python/bench_plain_client.py")
        .args(["--threads", "2", "--json", "--reps"])
        .arg(reps.to_string())
        .arg("--data")
        .arg(root)
        .arg("--server-cmd")
        .arg(format!("{} serve --threads 2", me.display()))
        .output()
        .context("running benches/python/bench_plain_client.py")?;
    anyhow::ensure!(
        out.status.success(),
        "bench_plain_client.py: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).context("bench_plain_client.py output"))
        .collect()
}

fn duckdb_version() -> Option<String> {
    let venv = crate::s3::venv().ok()?;
    let out = std::process::Command::new(venv.join("python"))
        .args(["-c", "import duckdb; print(duckdb.__version__)"])
        .output()
        .ok()?;
    Some(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}
