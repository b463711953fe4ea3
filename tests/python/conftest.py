"""Shared fixtures: the `pushdown` binary, generated data, a served data root."""

import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = os.environ.get("PUSHDOWN_BIN", str(ROOT / "target" / "debug" / "pushdown"))


def generate(data, rows=300):
    subprocess.run(
        [BIN, "gen", "images", "--rows", str(rows), "--out", str(data),
         "--row-group-rows", "50", "--rows-per-file", "150"],
        check=True, capture_output=True,
    )


class Served:
    """`pushdown serve` in a subprocess; the address is read from its first stdout line."""

    def __init__(self, data, env=None):
        self.proc = subprocess.Popen(
            [BIN, "serve", "--data", str(data), "--listen", "127.0.0.1:0"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, **(env or {})},
        )
        line = self.proc.stdout.readline()
        if not line.startswith("listening on "):
            self.proc.kill()
            raise RuntimeError(f"server did not start: {line!r} {self.proc.stderr.read()}")
        self.addr = line.split()[-1]

    def stop(self):
        self.proc.terminate()
        return self.proc.wait(timeout=30)
