"""A client of `harness soak` that is not ours: pyarrow's own Flight client reading a query's
endpoints one after another (`--mode plain`), or ADBC's Flight SQL driver (`--mode adbc`), query
after query against the servers in turn until --seconds have passed. Every answer is checked
against the one the harness measured before the soak began (--expect: the row count, or for
ADBC the JSON of the one row the aggregate gives). Prints one JSON object: requests, exact
answers, wrong answers (the first shown), and every error with its time (Unix seconds), server
and class, for the harness to judge against its kill schedule. `--print`: the answer of the first
server, once (the reference, taken before any fault).

    .venv/bin/python benches/python/soak_client.py --mode plain --urls grpc://127.0.0.1:1,... \
        --sql "SELECT ..." --expect 1234 --seconds 60
"""

import argparse
import json
import time

import pyarrow.flight as flight


def plain_query(url, sql):
    client = flight.connect(url)
    try:
        info = client.get_flight_info(flight.FlightDescriptor.for_command(sql.encode()))
        return sum(client.do_get(ep.ticket).read_all().num_rows for ep in info.endpoints)
    finally:
        client.close()


def adbc_query(url, sql):
    import adbc_driver_flightsql.dbapi as flight_sql

    with flight_sql.connect(url, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(sql)
        rows = cur.fetch_arrow_table().to_pylist()
    return json.dumps(rows, sort_keys=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["plain", "adbc"], required=True)
    ap.add_argument("--urls", required=True, help="comma-separated grpc:// URLs, used in turn")
    ap.add_argument("--sql", required=True)
    ap.add_argument("--expect", required=True)
    ap.add_argument("--seconds", type=float, required=True)
    ap.add_argument("--pause", type=float, default=0.05, help="seconds between queries")
    ap.add_argument("--print", action="store_true", help="print the first server's answer and stop")
    args = ap.parse_args()
    urls = args.urls.split(",")
    query = plain_query if args.mode == "plain" else adbc_query
    if args.print:
        print(query(urls[0], args.sql), flush=True)
        return
    expect = int(args.expect) if args.mode == "plain" else json.dumps(json.loads(args.expect), sort_keys=True)
    out = {"mode": args.mode, "requests": 0, "exact": 0, "wrong": 0, "first_wrong": None, "errors": []}
    until = time.time() + args.seconds
    k = 0
    while time.time() < until:
        url = urls[k % len(urls)]
        k += 1
        out["requests"] += 1
        try:
            got = query(url, args.sql)
        except Exception as e:  # judged by the harness: only outages of a killed server are expected
            out["errors"].append({"t": time.time(), "url": url, "class": type(e).__name__,
                                  "message": str(e)[:300]})
        else:
            if got == expect:
                out["exact"] += 1
            else:
                out["wrong"] += 1
                out["first_wrong"] = out["first_wrong"] or repr(got)[:300]
        time.sleep(args.pause)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
