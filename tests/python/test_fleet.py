"""A fleet of real `pushdown serve` processes under faults: one SIGKILLed mid-epoch and
restarted on its port, one SIGSTOPped (a stall: connections open, no bytes) and resumed.
The delivered sequence must equal a fault-free run's, through `pushdown run --out` and
through the Python `Loader`."""

import subprocess
import threading
import time

import pyarrow.parquet as pq
import pytest

from conftest import BIN, FleetNode, generate

# Thumbnails keep each server busy for a while per shard, so faults land mid-epoch.
SQL = "SELECT id, label, thumbnail(image, 16) AS t FROM images WHERE label < 900"


@pytest.fixture
def fleet(tmp_path):
    data = tmp_path / "data"
    generate(data, rows=900)
    nodes = [FleetNode(data) for _ in range(3)]
    yield data, nodes
    for n in nodes:
        n.close()


def run_ids(urls, out, extra=()):
    # Four epochs: the run lasts past the faults (one epoch takes well under a second).
    args = [BIN, "run", "--sql", SQL, "--seed", "3", "--out", str(out), "--stall-timeout", "2",
            "--retries", "8", "--epochs", "4"]
    for u in urls:
        args += ["--server", u]
    return subprocess.Popen([*args, *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def ids_of(path):
    return pq.read_table(path).column("id").to_pylist()


def faults(nodes, at, done):
    """SIGKILL node 0, SIGSTOP node 1, restart node 0, SIGCONT node 1, at times `at`."""
    steps = [nodes[0].kill, nodes[1].stop, nodes[0].start, nodes[1].cont]
    start = time.monotonic()
    for when, step in zip(at, steps):
        while time.monotonic() - start < when:
            if done.is_set():
                return
            time.sleep(0.01)
        step()
        done.happened = getattr(done, "happened", 0) + 1


def test_run_over_three_servers_survives_kill_stall_and_restart(fleet, tmp_path):
    data, nodes = fleet
    ref = run_ids([nodes[2].url], tmp_path / "ref.parquet")
    assert ref.wait(timeout=300) == 0, ref.stderr.read()
    expected = ids_of(tmp_path / "ref.parquet")
    # Each row once per epoch.
    assert len(expected) == 4 * len(set(expected)) > 0

    out = tmp_path / "fleet.parquet"
    proc = run_ids([n.url for n in nodes], out)
    done = threading.Event()
    injector = threading.Thread(target=faults, args=(nodes, [0.6, 0.9, 1.8, 2.6], done))
    injector.start()
    stdout, stderr = proc.communicate(timeout=300)
    done.set()
    injector.join()
    assert proc.returncode == 0, stderr
    assert getattr(done, "happened", 0) >= 2, f"the run ended before the faults: {stdout}"
    assert ids_of(out) == expected, stdout


def test_loader_over_three_servers_survives_kill_stall_and_restart(fleet):
    import pushdown

    data, nodes = fleet
    kwargs = dict(sql=SQL, batch_size=20, shuffle_buffer=60, seed=5)
    expected = [i for b in pushdown.Loader(nodes[2].url, **kwargs) for i in b["id"].tolist()]
    loader = pushdown.Loader([n.url for n in nodes], concurrency=3, stall_timeout_s=2.0,
                             max_retries=8, **kwargs)
    got = []
    for k, batch in enumerate(loader):
        got.extend(batch["id"].tolist())
        if k == 2:
            nodes[0].kill()
        elif k == 4:
            nodes[1].stop()
        elif k == 10:
            nodes[0].start()
        elif k == 14:
            nodes[1].cont()
        time.sleep(0.05)
    assert k >= 14, "the epoch ended before the faults"
    assert got == expected
    assert len(got) == len(set(got))
