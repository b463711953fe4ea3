"""The scan contender: DuckDB over the same local Parquet files, one thread.

Prints JSON: {"rows_in": rows in the dataset, "rows_out": rows of the answer, "secs": the best
of --reps runs, "own_layout_secs": the same over a copy of the dataset written by DuckDB's own
Parquet writer (its defaults), or null without --own-layout}. A layout is chosen by whoever
writes the files; timing DuckDB on the layout it writes itself keeps ours from being the
only one tuned. The query names a dataset as a table (`FROM images`); it is read from
`<data>/<dataset>/*.parquet`.
"""

import argparse
import json
import re
import tempfile
import time

import duckdb


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--sql", required=True)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--own-layout", action="store_true")
    args = ap.parse_args()

    con = duckdb.connect()
    con.sql("SET threads = 1")
    dataset = re.search(r"\bFROM\s+(\w+)", args.sql, re.IGNORECASE).group(1)
    files = f"{args.data}/{dataset}/*.parquet"
    con.sql(f"CREATE VIEW {dataset} AS SELECT * FROM read_parquet('{files}')")
    rows_in = con.sql(f"SELECT count(*) FROM {dataset}").fetchall()[0][0]
    best, rows_out = timed(con, args.sql, args.reps)
    own = None
    if args.own_layout:
        with tempfile.TemporaryDirectory() as tmp:
            con.sql(f"COPY (SELECT * FROM read_parquet('{files}')) TO '{tmp}/{dataset}.parquet' (FORMAT parquet)")
            con.sql(f"CREATE OR REPLACE VIEW {dataset} AS SELECT * FROM read_parquet('{tmp}/{dataset}.parquet')")
            own, own_rows = timed(con, args.sql, args.reps)
            assert own_rows == rows_out, (own_rows, rows_out)
    print(json.dumps({"rows_in": rows_in, "rows_out": rows_out, "secs": best, "own_layout_secs": own}))


def timed(con, sql, reps):
    """(best seconds, rows) of `reps` runs."""
    best, rows_out = float("inf"), 0
    for _ in range(max(1, reps)):
        start = time.perf_counter()
        # Fetched as Arrow, as a trainer would consume it: every row materialized.
        table = con.sql(sql).to_arrow_table()
        best = min(best, time.perf_counter() - start)
        rows_out = table.num_rows
    return best, rows_out


if __name__ == "__main__":
    main()
