"""Shared fixtures: the `pushdown` binary, generated data, a served data root."""

import json
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


def write_corpus(root):
    """The malformed-file corpus as a data root (`healthy/`, `bad_<name>/`); its entries."""
    corpus_bin = str(pathlib.Path(BIN).with_name("malformed-corpus"))
    out = subprocess.run([corpus_bin, str(root)], check=True, capture_output=True, text=True)
    return [json.loads(line) for line in out.stdout.splitlines()]


@pytest.fixture(scope="session")
def moto():
    """A real S3-compatible server (moto) on loopback: its boto3 client and the environment
    that points `pushdown serve` at it."""
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    creds = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing", "region_name": "us-east-1"}
    client = boto3.client("s3", endpoint_url=endpoint, **creds)
    env = {
        "AWS_ENDPOINT": endpoint,
        "AWS_ALLOW_HTTP": "true",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "us-east-1",
    }
    yield client, env
    server.stop()


class Served:
    """`pushdown serve` in a subprocess; the address is read from its first stdout line."""

    def __init__(self, data, env=None, args=()):
        self.proc = subprocess.Popen(
            [BIN, "serve", "--data", str(data), "--listen", "127.0.0.1:0", *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, **(env or {})},
        )
        line = self.proc.stdout.readline()
        if not line.startswith("listening on "):
            self.proc.kill()
            raise RuntimeError(f"server did not start: {line!r} {self.proc.stderr.read()}")
        self.addr = line.split()[-1]

    def alive(self):
        return self.proc.poll() is None

    def stop(self):
        self.proc.terminate()
        return self.proc.wait(timeout=30)
