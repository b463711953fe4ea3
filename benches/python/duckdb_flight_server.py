"""DuckDB behind pyarrow's own Flight server: the plain-client benchmark's transport floor.

Answers `GetFlightInfo(CMD sql)` with one endpoint whose ticket is the SQL, and `DoGet` with
DuckDB's Arrow record batch reader over that query (uncompressed IPC, as pyarrow streams a
reader). Datasets are views over `<data>/<name>/*.parquet`. Prints `listening on HOST:PORT`.

    .venv/bin/python benches/python/duckdb_flight_server.py --data DIR --threads 2
"""

import argparse
import pathlib

import duckdb
import pyarrow.flight as flight


class DuckDBFlight(flight.FlightServerBase):
    def __init__(self, data, threads):
        super().__init__("grpc://127.0.0.1:0")
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
        reader = self.con.cursor().sql(ticket.ticket.decode()).fetch_record_batch()
        return flight.RecordBatchStream(reader)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    server = DuckDBFlight(args.data, args.threads)
    print(f"listening on 127.0.0.1:{server.port}", flush=True)
    server.serve()


if __name__ == "__main__":
    main()
