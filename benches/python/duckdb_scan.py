"""The scan contender: DuckDB over the same local Parquet files, one thread.

Prints JSON: {"rows_in": rows in the dataset, "rows_out": rows of the answer, "secs": the best
of --reps runs}. The query names a dataset as a table (`FROM images`); it is read from
`<data>/<dataset>/*.parquet`.
"""

import argparse
import json
import re
import time

import duckdb


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--sql", required=True)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()

    con = duckdb.connect()
    con.sql("SET threads = 1")
    dataset = re.search(r"\bFROM\s+(\w+)", args.sql, re.IGNORECASE).group(1)
    files = f"{args.data}/{dataset}/*.parquet"
    con.sql(f"CREATE VIEW {dataset} AS SELECT * FROM read_parquet('{files}')")
    rows_in = con.sql(f"SELECT count(*) FROM {dataset}").fetchall()[0][0]
    best, rows_out = float("inf"), 0
    for _ in range(max(1, args.reps)):
        start = time.perf_counter()
        # Fetched as Arrow, as a trainer would consume it: every row materialized.
        table = con.sql(args.sql).to_arrow_table()
        best = min(best, time.perf_counter() - start)
        rows_out = table.num_rows
    print(json.dumps({"rows_in": rows_in, "rows_out": rows_out, "secs": best}))


if __name__ == "__main__":
    main()
