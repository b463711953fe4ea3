"""DuckDB behind pyarrow's own Flight server: the plain-client benchmark's transport floor.

Answers `GetFlightInfo(CMD sql)` with one endpoint whose ticket is the SQL, and `DoGet` with
DuckDB's Arrow record batch reader over that query (uncompressed IPC, as pyarrow streams a
reader). Datasets are views over `<data>/<name>/*.parquet`. Prints `listening on HOST:PORT`.

With `--memo`, `DoGet` streams the query's result from memory, as DuckDB's first answer
materialized it: no scan at all, so what a client reading it measures is the transport alone,
the floor of any Flight server on the machine.

    .venv/bin/python benches/python/duckdb_flight_server.py --data DIR --threads 2 [--memo]
"""

import argparse
import pathlib

import duckdb
import pyarrow.flight as flight


class DuckDBFlight(flight.FlightServerBase):
    def __init__(self, data, threads, memo=False):
        super().__init__("grpc://127.0.0.1:0")
        self.memo = {} if memo else None
        self.con = duckdb.connect()
        self.con.execute(f"SET threads={threads}")
        for d in sorted(pathlib.Path(data).iterdir()):
            if d.is_dir() and any(d.glob("*.parquet")):
                self.con.execute(f"CREATE VIEW {d.name} AS SELECT * FROM read_parquet('{d}/*.parquet')")

    def get_flight_info(self, context, descriptor):
        sql = descriptor.command
        schema = self.con.cursor().sql(sql.decode()).limit(0).arrow().schema
        return flight.FlightInfo(schema, descriptor, [flight.FlightEndpoint(sql, [])], -1, -1)

    def do_get(self, context, ticket):
        sql = ticket.ticket.decode()
        if self.memo is None:
            return flight.RecordBatchStream(self.con.cursor().sql(sql).fetch_record_batch())
        if sql not in self.memo:
            self.memo[sql] = self.con.cursor().sql(sql).to_arrow_table()
        return flight.RecordBatchStream(self.memo[sql])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--memo", action="store_true", help="stream each query's result from memory")
    args = ap.parse_args()
    server = DuckDBFlight(args.data, args.threads, args.memo)
    print(f"listening on 127.0.0.1:{server.port}", flush=True)
    server.serve()


if __name__ == "__main__":
    main()
