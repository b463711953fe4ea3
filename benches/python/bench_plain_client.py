"""The plain client: pyarrow's own Flight client reading a query's endpoints one after another
(no codec choice, no parallelism of its own) against DuckDB over the same local files, both
with the same number of threads. Also the same client against DuckDB behind pyarrow's own Flight
server, scanning (what the transport costs a server as fast as DuckDB) and answering from
memory (the transport alone, as pyarrow's own server sends it). Prints a Markdown table (or, with --json, one JSON object
per query); best of --reps per cell. `harness scan` runs it.

    taskset -c 0,1 .venv/bin/python benches/python/bench_plain_client.py [--threads 2] [--data DIR] [--json]

--threads: the server's `--cpu-threads` and DuckDB's `threads`. --data: a data root holding
`clicks/` and `lineitem/` (default target/bench-data/full, made by the harness). The server is
`$PUSHDOWN_BIN` (default the release build in $CARGO_TARGET_DIR or target/).
"""

import argparse
import json
import os
import shlex
import subprocess
import sys
import time

import duckdb
import pyarrow.flight as flight

target = os.environ.get("CARGO_TARGET_DIR", "target")
BIN = os.environ.get("PUSHDOWN_BIN", os.path.join(target, "release", "pushdown"))
QUERIES = {
    # A wide table (41 columns): a third of its columns, then a quarter of its rows.
    "clicks projection": "SELECT label, i1, i2, i3, i4, i5, i6, i7, c1, c2, c3, c4, c5, c6, day FROM clicks",
    "clicks filter 27%": "SELECT label, i2, i3, i4, c1, c2, c3, c4, c5 FROM clicks WHERE i1 < 2",
    "lineitem projection": "SELECT l_orderkey, l_partkey, l_quantity, l_extendedprice, l_shipdate FROM lineitem",
    "lineitem filter 25%": "SELECT l_orderkey, l_extendedprice, l_discount, l_shipmode, l_comment FROM lineitem "
                  "WHERE l_quantity < 13",
    "lineitem Q6 filter": "SELECT l_extendedprice, l_discount FROM lineitem WHERE l_shipdate >= DATE '1994-01-01' "
                 "AND l_shipdate < DATE '1995-01-01' AND l_discount BETWEEN 0.05 AND 0.07 AND l_quantity < 24",
}


def best(run, reps):
    out = None
    for _ in range(reps):
        start = time.perf_counter()
        rows = run()
        out = min(out or (float("inf"), 0), (time.perf_counter() - start, rows))
    return out


def measure(args):
    """One contender on every query, in a process of its own (`--measure`): a first pass over
    all the queries, then best of --reps for each; prints `{query: [seconds, rows]}`."""
    if args.measure == "duckdb":
        con = duckdb.connect()
        con.execute(f"SET threads={args.threads}")
        for dataset in ("clicks", "lineitem"):
            con.execute(f"CREATE VIEW {dataset} AS SELECT * FROM read_parquet('{args.data}/{dataset}/*.parquet')")

        def run(sql):
            return con.sql(sql).to_arrow_table().num_rows
    else:
        client = flight.connect(args.measure)

        def run(sql):
            info = client.get_flight_info(flight.FlightDescriptor.for_command(sql.encode()))
            return sum(client.do_get(ep.ticket).read_all().num_rows for ep in info.endpoints)
    for sql in QUERIES.values():
        run(sql)  # as a long-lived process would be; the memo server materializes its results
    cells = {name: best(lambda: run(sql), args.reps) for name, sql in QUERIES.items()}
    print(json.dumps(cells), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--data", default="target/bench-data/full")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--server-cmd", help="the server's command line, to which `--data DATA --listen "
                    "127.0.0.1:0` is appended (default: `$PUSHDOWN_BIN serve --cpu-threads THREADS`)")
    ap.add_argument("--measure", help=argparse.SUPPRESS)  # a Flight URL, or `duckdb`
    args = ap.parse_args()
    if args.measure:
        return measure(args)
    threads, data = args.threads, args.data
    server_cmd = shlex.split(args.server_cmd) if args.server_cmd else [BIN, "serve", "--cpu-threads", str(threads)]
    server = subprocess.Popen(
        [*server_cmd, "--data", data, "--listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    duck_server = os.path.join(os.path.dirname(__file__), "duckdb_flight_server.py")
    floor = subprocess.Popen(
        [sys.executable, duck_server, "--data", data, "--threads", str(threads)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    memo = subprocess.Popen(
        [sys.executable, duck_server, "--data", data, "--threads", str(threads), "--memo"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)

    # Each contender is timed in a client process of its own, so that none inherits another's
    # allocator state: after reading the memo server's million-row batches, pyarrow's mimalloc
    # in the same process faulted 3-5x as many pages on the next reads (+15-20% wall on the
    # clicks projection), whichever server sent them.
    def timed(target):
        out = subprocess.run(
            [sys.executable, __file__, "--measure", target, "--threads", str(threads), "--data", data,
             "--reps", str(args.reps)],
            check=True, stdout=subprocess.PIPE, text=True)
        return json.loads(out.stdout.strip().splitlines()[-1])

    try:
        urls = [f"grpc://{p.stdout.readline().split()[-1]}" for p in (server, floor, memo)]
        ours, duck_flight, in_memory, local = (timed(target) for target in (*urls, "duckdb"))
        if not args.json:
            print(f"| query | rows | pushdown, plain pyarrow client (s) | DuckDB behind pyarrow.flight (s) "
                  f"| its result from memory (s) | DuckDB local, {threads} threads (s) | pushdown ÷ DuckDB local |")
            print("|---|---:|---:|---:|---:|---:|---:|")
        for name, sql in QUERIES.items():
            (a, n), (f, k), (t, j), (b, m) = ours[name], duck_flight[name], in_memory[name], local[name]
            assert n == m == k == j, (f"{name}: {n} rows from the server, {k} from DuckDB's Flight server, "
                                      f"{j} from memory, {m} from DuckDB")
            if args.json:
                print(json.dumps({"query": name, "sql": sql, "rows": n, "plain_s": a, "duckdb_flight_s": f,
                                  "memory_flight_s": t, "duckdb_s": b}), flush=True)
            else:
                print(f"| {name} | {n} | {a:.3f} | {f:.3f} | {t:.3f} | {b:.3f} | {a / b:.2f}x |")
    finally:
        for p in (server, floor, memo):
            p.terminate()
            p.wait()


if __name__ == "__main__":
    main()
