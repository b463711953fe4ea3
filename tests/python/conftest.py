"""Shared fixtures: the `pushdown` binary, generated data, a served data root."""

import json
import os
import pathlib
import signal
import socket
import subprocess
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = os.environ.get("PUSHDOWN_BIN", str(ROOT / "target" / "debug" / "pushdown"))


def generate(data, rows=300, row_group_rows=50, rows_per_file=150):
    subprocess.run(
        [BIN, "gen", "images", "--rows", str(rows), "--out", str(data),
         "--row-group-rows", str(row_group_rows), "--rows-per-file", str(rows_per_file)],
        check=True, capture_output=True,
    )


def write_corpus(root):
    """The malformed-file corpus as a data root (`healthy/`, `bad_<name>/`); its entries."""
    corpus_bin = str(pathlib.Path(BIN).with_name("malformed-corpus"))
    out = subprocess.run([corpus_bin, str(root)], check=True, capture_output=True, text=True)
    return [json.loads(line) for line in out.stdout.splitlines()]


S3_SERVER = os.environ.get("PUSHDOWN_S3_SERVER") or str(
    pathlib.Path.home() / ".cache" / "pushdown" / "tools" / "bin" / "s3-server")
S3_KEY, S3_SECRET = "pushdown-test", "pushdown-test-secret"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class S3Server:
    """The S3 server of scripts/setup-s3.sh (s3s-fs's storage) on loopback: a real S3-compatible
    server that keeps objects as files under `root` and checks every request's SigV4 signature."""

    def __init__(self, root):
        if not os.access(S3_SERVER, os.X_OK):
            pytest.fail(f"no S3 server at {S3_SERVER}: run scripts/setup-s3.sh")
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [S3_SERVER, "--host", "127.0.0.1", "--port", str(self.port),
             "--access-key", S3_KEY, "--secret-key", S3_SECRET, str(root)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.proc.kill()
                    raise RuntimeError(f"the S3 server did not start on port {self.port}")
                time.sleep(0.05)

    def env(self, secret=S3_SECRET):
        """The environment that points `pushdown serve` (object_store's AWS_* variables) here."""
        return {
            "AWS_ENDPOINT": self.endpoint,
            "AWS_ALLOW_HTTP": "true",
            "AWS_ACCESS_KEY_ID": S3_KEY,
            "AWS_SECRET_ACCESS_KEY": secret,
            "AWS_REGION": "us-east-1",
        }

    def client(self):
        import boto3
        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=S3_KEY,
                            aws_secret_access_key=S3_SECRET, region_name="us-east-1")

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)


@pytest.fixture(scope="session")
def s3server(tmp_path_factory):
    """One S3 server for the session; tests use their own buckets."""
    server = S3Server(tmp_path_factory.mktemp("s3"))
    yield server
    server.stop()


class Served:
    """`pushdown serve` in a subprocess; the address is read from its stdout (after the metrics
    address, `self.metrics`, when `--metrics-listen` is among `args`)."""

    def __init__(self, data, env=None, args=()):
        self.proc = subprocess.Popen(
            [BIN, "serve", "--data", str(data), "--listen", "127.0.0.1:0", *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, **(env or {})},
        )
        line = self.proc.stdout.readline()
        self.metrics = None
        if line.startswith("metrics on "):
            self.metrics = line.split()[-1]
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


class FleetNode:
    """`pushdown serve` on a fixed port, restartable there."""

    def __init__(self, data, args=("--cache", "off")):
        self.data = data
        self.args = list(args)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = None
        self.start()

    def start(self):
        for _ in range(50):
            proc = subprocess.Popen(
                # The cache off by default: the faults are timed against streams that compute
                # (a reference run would otherwise leave this run's shards cached, and quick).
                [BIN, "serve", "--data", str(self.data), "--listen", f"127.0.0.1:{self.port}",
                 "--shard-mib", "1", *self.args],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            )
            if proc.stdout.readline().startswith("listening on "):
                self.proc = proc
                return
            proc.wait()
            time.sleep(0.1)  # the old socket may linger a moment
        raise RuntimeError(f"cannot serve on port {self.port}")

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self):
        os.kill(self.proc.pid, signal.SIGSTOP)

    def cont(self):
        os.kill(self.proc.pid, signal.SIGCONT)

    def close(self):
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
            self.proc.wait()
