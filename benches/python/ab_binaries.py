"""A/B of two `pushdown` binaries (a refactor's before and after) on what users run most:
the plain client (pyarrow.flight reading a query's endpoints in order) and `pushdown run`,
each binary against its own server over loopback, the two alternated, best of N.

    .venv/bin/python benches/python/ab_binaries.py OLD_BIN NEW_BIN DATA_ROOT [REPS]

DATA_ROOT needs `clicks` and `images` (e.g. `pushdown gen clicks --rows 1500000 --out D`,
`pushdown gen images --rows 3000 --out D`). Prints a Markdown table of seconds and ratios.
"""
import socket
import subprocess
import sys
import time

import pyarrow.flight as fl

QUERIES = {
    "plain client, clicks projection": (
        "SELECT label, i1, i2, i3, i4, i5, i6, i7, c1, c2, c3, c4, c5, c6, day FROM clicks"
    ),
    "plain client, clicks filter": "SELECT label, i2, i3, i4, c1, c2, c3, c4, c5 FROM clicks WHERE i1 < 2",
}
RUN_SQL = "SELECT thumbnail(image, 32) AS t, label FROM images"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def serve(binary, data):
    port = free_port()
    server = subprocess.Popen(
        [binary, "serve", "--data", data, "--listen", f"127.0.0.1:{port}", "--cpu-threads", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(400):
        try:
            list(fl.connect(f"grpc://127.0.0.1:{port}").list_flights())
            return server, port
        except Exception:
            time.sleep(0.05)
    server.kill()
    raise SystemExit(f"{binary} did not start serving")


def plain(port, sql):
    client = fl.connect(f"grpc://127.0.0.1:{port}")
    start = time.perf_counter()
    info = client.get_flight_info(fl.FlightDescriptor.for_command(sql))
    for endpoint in info.endpoints:
        client.do_get(endpoint.ticket).read_all()
    return time.perf_counter() - start


def run(binary, port):
    start = time.perf_counter()
    subprocess.run(
        [binary, "run", "--server", f"http://127.0.0.1:{port}", "--sql", RUN_SQL],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return time.perf_counter() - start


def main():
    old, new, data = sys.argv[1:4]
    reps = int(sys.argv[4]) if len(sys.argv) > 4 else 5
    binaries = {"old": old, "new": new}
    best = {}

    def keep(cell, name, seconds):
        best[(cell, name)] = min(best.get((cell, name), float("inf")), seconds)

    for rep in range(reps):
        for name in ("old", "new") if rep % 2 == 0 else ("new", "old"):
            server, port = serve(binaries[name], data)
            try:
                plain(port, QUERIES["plain client, clicks projection"])  # page cache, catalog
                for cell, sql in QUERIES.items():
                    keep(cell, name, plain(port, sql))
                keep("`pushdown run`, images thumbnails", name, run(binaries[name], port))
            finally:
                server.terminate()
                server.wait()
    print("| cell | old (s) | new (s) | new ÷ old |\n|---|---:|---:|---:|")
    for cell in dict.fromkeys(c for c, _ in best):
        o, n = best[(cell, "old")], best[(cell, "new")]
        print(f"| {cell} | {o:.3f} | {n:.3f} | {n / o:.2f} |")


if __name__ == "__main__":
    main()
