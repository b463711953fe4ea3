//! The global order's cost against the per-rank order it replaced. `W` ranks (loaders in
//! this process, on the trainer's CPU) read every row of two epochs from one server (`harness
//! serve`, one CPU thread, pinned to CPU 0, fragment cache off) as fast as it serves them;
//! the server reduces each row (a thumbnail), so its core is the bottleneck. The per-rank
//! order is `partitions = W` (each rank one contiguous range, its own windows: the order
//! before the global one); the global order is the default, 8 partitions, whatever `W`.
//! Per cell: rows/s over the run, the server's CPU seconds per 1,000 rows, and the bytes its
//! store read per epoch (`store_bytes_read`, footers and pages). Cells alternate, best of
//! the repetitions.

use std::time::Instant;

use anyhow::Result;
use pushdown_client::{Loader, LoaderOptions, LoaderSource};

use crate::process::ServerProcess;
use crate::{Datasets, Options, machine};

/// The queries: without a filter (a part of a shard is a row selection of it), and with
/// one keeping 3 rows in 4 (a part's rows are found by the filter alone, then read as a
/// selection).
const QUERIES: [(&str, &str); 2] = [
    (
        "no filter",
        "SELECT id, label, thumbnail(image, 32) AS thumb FROM images",
    ),
    (
        "filter",
        "SELECT id, label, thumbnail(image, 32) AS thumb FROM images WHERE label % 4 <> 0",
    ),
];
/// Rows per global batch, and per global shuffle window: 240 does not divide the shards'
/// rows, so every boundary between partitions (and between ranks) cuts a shard, read by two
/// readers: the order's worst case for bytes read.
const GLOBAL_BATCH: usize = 240;
const GLOBAL_WINDOW: usize = 1920;
const EPOCHS: usize = 2;
const WORLDS: [usize; 3] = [1, 4, 8];

#[derive(Debug, Clone, Copy)]
struct Cell {
    query: usize,
    world: usize,
    partitions: usize,
    rows: u64,
    seconds: f64,
    server_cpu: f64,
    bytes_per_epoch: f64,
}

impl Cell {
    fn rate(&self) -> f64 {
        self.rows as f64 / self.seconds
    }

    fn cpu_per_1k(&self) -> f64 {
        self.server_cpu * 1000.0 / self.rows as f64
    }
}

/// The bytes the server's store has read so far (its `PUSHDOWN_METRICS_FILE`).
fn store_bytes(path: &std::path::Path) -> Result<u64> {
    // Written every 100 ms: wait for a write after the reads.
    std::thread::sleep(std::time::Duration::from_millis(300));
    Ok(std::fs::read_to_string(path)?.trim().parse()?)
}

/// `world` ranks reading two epochs side by side, in an order of `partitions`.
fn run(
    url: &str,
    server: &ServerProcess,
    metrics: &std::path::Path,
    (query, world, partitions): (usize, usize, usize),
) -> Result<Cell> {
    let (cpu0, bytes0) = (server.cpu_seconds(), store_bytes(metrics)?);
    let start = Instant::now();
    let ranks: Vec<std::thread::JoinHandle<Result<u64>>> = (0..world)
        .map(|rank| {
            let url = url.to_owned();
            std::thread::spawn(move || {
                let options = LoaderOptions {
                    batch_size: Some(GLOBAL_BATCH / world),
                    shuffle_buffer: Some(GLOBAL_WINDOW / world),
                    seed: 5,
                    rank,
                    world_size: world,
                    partitions: Some(partitions),
                    epochs: EPOCHS,
                    workers: Some(1),
                    report_every: None,
                    ..LoaderOptions::default()
                };
                let sql = QUERIES[query].1;
                let loader = Loader::new(&[url], LoaderSource::Sql(sql.into()), options)?;
                let mut rows = 0;
                for batch in loader {
                    rows += batch?.rows as u64;
                }
                Ok(rows)
            })
        })
        .collect();
    let mut rows = 0;
    for rank in ranks {
        rows += rank.join().map_err(|_| anyhow::anyhow!("a rank panicked"))??;
    }
    let seconds = start.elapsed().as_secs_f64();
    Ok(Cell {
        query,
        world,
        partitions,
        rows,
        seconds,
        server_cpu: server.cpu_seconds() - cpu0,
        bytes_per_epoch: (store_bytes(metrics)? - bytes0) as f64 / EPOCHS as f64,
    })
}

pub async fn suite(options: &Options, data: &Datasets, command: &str) -> Result<String> {
    let metrics = data.root.join("order-metrics.txt");
    let server = ServerProcess::start_with(
        "serve",
        &data.root.to_string_lossy(),
        "127.0.0.1:0",
        1,
        None,
        Some("0"),
        &[
            ("PUSHDOWN_CACHE".to_owned(), "off".to_owned()),
            (
                "PUSHDOWN_METRICS_FILE".to_owned(),
                metrics.to_string_lossy().into_owned(),
            ),
        ],
    )?;
    let url = format!("http://{}", server.addr);
    crate::connect(&url).await?;
    let mut best: Vec<Cell> = Vec::new();
    for rep in 0..options.reps_resolved {
        for (query, &world) in (0..QUERIES.len()).flat_map(|q| WORLDS.iter().map(move |w| (q, w))) {
            // Alternate which order goes first, so drift favours neither.
            let mut orders = vec![world, 8];
            orders.dedup();
            if rep % 2 == 1 {
                orders.reverse();
            }
            for partitions in orders {
                let url = url.clone();
                let cell =
                    tokio::task::block_in_place(|| run(&url, &server, &metrics, (query, world, partitions)))?;
                eprintln!(
                    "order: {} W={world} partitions={partitions}: {:.0} rows/s, {:.3} server CPU s/1k, {:.1} MB read/epoch",
                    QUERIES[query].0,
                    cell.rate(),
                    cell.cpu_per_1k(),
                    cell.bytes_per_epoch / 1e6
                );
                match best
                    .iter_mut()
                    .find(|c| c.query == query && c.world == world && c.partitions == partitions)
                {
                    Some(b) if b.rate() >= cell.rate() => {}
                    Some(b) => *b = cell,
                    None => best.push(cell),
                }
            }
        }
    }
    Ok(report(&best, options, data, command))
}

fn report(cells: &[Cell], options: &Options, data: &Datasets, command: &str) -> String {
    let rows = data
        .rows
        .iter()
        .find(|r| r.0.name() == "images")
        .map_or(0, |r| r.1);
    let mut out = String::from("## Global order: its cost against the per-rank order\n\n");
    out += &format!(
        "Command: `{command}`  \nMachine: {}. One server (`harness serve`, 1 CPU thread pinned to CPU 0, \
         fragment cache off); W ranks as loaders in one process on the other CPU, each reading as \
         fast as it is served.  \nData: images, {rows} rows; queries `{}` and `{}` (the thumbnail on \
         the server: its core is the bottleneck); global batch {GLOBAL_BATCH} rows, global shuffle window \
         {GLOBAL_WINDOW} rows (per rank: / W), {EPOCHS} epochs; best of {} run(s), the orders \
         alternating.\n\n",
        machine(),
        QUERIES[0].1,
        QUERIES[1].1,
        options.reps_resolved
    );
    out += "| query | W | order | partitions | rows/s | server CPU s / 1k rows | store MB read / epoch | rows/s vs per-rank | bytes vs per-rank |\n|---|---:|---|---:|---:|---:|---:|---:|---:|\n";
    let mut met = (true, true);
    for (query, &world) in (0..QUERIES.len()).flat_map(|q| WORLDS.iter().map(move |w| (q, w))) {
        let here = |c: &&Cell| c.query == query && c.world == world;
        let Some(base) = cells.iter().filter(here).find(|c| c.partitions == world) else {
            continue;
        };
        for c in cells.iter().filter(here) {
            let (rate, bytes) = (
                c.rate() / base.rate(),
                c.bytes_per_epoch / base.bytes_per_epoch.max(1.0),
            );
            if c.partitions != world {
                met.0 &= rate >= 0.95;
                met.1 &= bytes <= 1.05;
            }
            let order = match (c.partitions == world, world == 8) {
                (true, true) => "both (partitions = W = 8: the same order)",
                (true, false) => "per-rank (partitions = W)",
                _ => "global (default)",
            };
            out += &format!(
                "| {} | {world} | {order} | {} | {:.0} | {:.3} | {:.2} | {:.2}× | {:.3}× |\n",
                QUERIES[query].0,
                c.partitions,
                c.rate(),
                c.cpu_per_1k(),
                c.bytes_per_epoch / 1e6,
                rate,
                bytes
            );
        }
    }
    let word = |ok: bool| if ok { "met" } else { "missed" };
    out += &format!(
        "\n* the global order's rate ≥ 0.95× the per-rank order's at every W: **{}**\n\
         * its bytes read from storage per epoch ≤ 1.05× the per-rank order's: **{}**\n\n",
        word(met.0),
        word(met.1)
    );
    out
}
