"""The plain client: pyarrow's own Flight client reading a query's endpoints one after another
(no codec choice, no parallelism of its own) against DuckDB over the same local files, both
with the same number of threads. Prints a Markdown table; best of 3 per cell.

    taskset -c 0,1 .venv/bin/python benches/python/bench_plain_client.py [THREADS] [DATA]

THREADS: the server's `--cpu-threads` and DuckDB's `threads` (default 2). DATA: a data root
holding `lineitem/` (default target/bench-data/full, made by `harness compare`). The server is
`$PUSHDOWN_BIN` (default the release build in $CARGO_TARGET_DIR or target/).
"""

import os
import subprocess
import sys
import time

import duckdb
import pyarrow.flight as flight

target = os.environ.get("CARGO_TARGET_DIR", "target")
BIN = os.environ.get("PUSHDOWN_BIN", os.path.join(target, "release", "pushdown"))
QUERIES = {
    "projection": "SELECT l_orderkey, l_partkey, l_quantity, l_extendedprice, l_shipdate FROM lineitem",
    "filter 25%": "SELECT l_orderkey, l_extendedprice, l_discount, l_shipmode, l_comment FROM lineitem "
                  "WHERE l_quantity < 13",
    "Q6 filter": "SELECT l_extendedprice, l_discount FROM lineitem WHERE l_shipdate >= DATE '1994-01-01' "
                 "AND l_shipdate < DATE '1995-01-01' AND l_discount BETWEEN 0.05 AND 0.07 AND l_quantity < 24",
}


def best(run, reps=3):
    out = None
    for _ in range(reps):
        start = time.perf_counter()
        rows = run()
        out = min(out or (float("inf"), 0), (time.perf_counter() - start, rows))
    return out


def main():
    threads = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    data = sys.argv[2] if len(sys.argv) > 2 else "target/bench-data/full"
    server = subprocess.Popen(
        [BIN, "serve", "--data", data, "--listen", "127.0.0.1:0", "--cpu-threads", str(threads)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        client = flight.connect(f"grpc://{server.stdout.readline().split()[-1]}")
        con = duckdb.connect()
        con.execute(f"SET threads={threads}")
        con.execute(f"CREATE VIEW lineitem AS SELECT * FROM read_parquet('{data}/lineitem/*.parquet')")
        print(f"| query | rows | plain pyarrow, endpoints in order (s) | DuckDB local, {threads} threads (s) | ratio |")
        print("|---|---:|---:|---:|---:|")
        for name, sql in QUERIES.items():
            def ours():
                info = client.get_flight_info(flight.FlightDescriptor.for_command(sql.encode()))
                return sum(client.do_get(ep.ticket).read_all().num_rows for ep in info.endpoints)

            def theirs():
                return con.sql(sql).to_arrow_table().num_rows

            (a, n), (b, m) = best(ours), best(theirs)
            assert n == m, f"{name}: {n} rows from the server, {m} from DuckDB"
            print(f"| {name} | {n} | {a:.3f} | {b:.3f} | {a / b:.2f}x |")
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
