"""Serving from object storage: s3s-fs's storage (tools/s3-server, scripts/setup-s3.sh), a real
S3-compatible server that keeps objects on disk and checks request signatures, on loopback. Several servers over one
prefix give the answers of the same files on local disk; refused credentials are named."""

import os
import subprocess

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as flight
import pyarrow.parquet as pq
import pytest

from conftest import BIN, Served, generate

SQL = "SELECT id, label, thumbnail(image, 8) AS t FROM images WHERE label < 600"


@pytest.fixture(scope="module")
def lake(s3server, tmp_path_factory):
    client = s3server.client()
    client.create_bucket(Bucket="lake")
    data = tmp_path_factory.mktemp("data")
    generate(data, rows=600)
    for path in sorted((data / "images").glob("*.parquet")):
        client.upload_file(str(path), "lake", f"training/images/{path.name}")
    return s3server, data


def test_serves_a_dataset_from_s3(lake):
    s3server, data = lake
    served = Served("s3://lake/training", env=s3server.env())
    try:
        client = flight.connect(f"grpc://{served.addr}")
        assert [f.descriptor.path for f in client.list_flights()] == [[b"images"]]
        info = client.get_flight_info(
            flight.FlightDescriptor.for_command(b"SELECT id, label FROM images WHERE label < 200"))
        got = pa.concat_tables(client.do_get(ep.ticket).read_all() for ep in info.endpoints)
        local = pq.read_table(data / "images", columns=["id", "label"])
        expected = local.filter(pc.less(local["label"], 200))
        assert sorted(got["id"].to_pylist()) == sorted(expected["id"].to_pylist())
    finally:
        assert served.stop() == 0


def run_table(addrs, out):
    args = [BIN, "run", "--sql", SQL, "--seed", "4", "--out", str(out)]
    for a in addrs:
        args += ["--server", f"http://{a}"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return pq.read_table(out)


def test_three_servers_over_one_prefix_give_the_local_disks_answers(lake, tmp_path):
    s3server, data = lake
    fleet = [Served("s3://lake/training", env=s3server.env()) for _ in range(3)]
    local = Served(data)
    try:
        over_s3 = run_table([s.addr for s in fleet], tmp_path / "s3.parquet")
        on_disk = run_table([local.addr], tmp_path / "disk.parquet")
        # The same rows in the same order: the sequence is a function of the files (whose
        # versions hash their footers, the same wherever the bytes are kept) and the seed.
        assert over_s3.num_rows > 0
        assert over_s3.equals(on_disk)
        table = pq.read_table(data / "images", columns=["id", "label"])
        want = table.filter(pc.less(table["label"], 600))["id"].to_pylist()
        assert sorted(over_s3["id"].to_pylist()) == sorted(want)
    finally:
        for s in [*fleet, local]:
            assert s.stop() == 0


def test_refused_credentials_are_named_and_not_retried(lake):
    s3server, _ = lake
    env = {**os.environ, **s3server.env(secret="not-the-secret"), "RUST_BACKTRACE": "0"}
    done = subprocess.run(
        [BIN, "serve", "--data", "s3://lake/training", "--listen", "127.0.0.1:0"],
        env=env, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode != 0
    assert "refused this server's credentials (SignatureDoesNotMatch)" in done.stderr, done.stderr
    assert "AWS_SECRET_ACCESS_KEY" in done.stderr
