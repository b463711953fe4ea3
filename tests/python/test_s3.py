"""Serving from object storage: a real S3-compatible server (moto, in-process on loopback)."""

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as flight
import pyarrow.parquet as pq
import pytest

from conftest import Served, generate


@pytest.fixture(scope="module")
def s3(moto, tmp_path_factory):
    client, env = moto
    client.create_bucket(Bucket="lake")
    data = tmp_path_factory.mktemp("data")
    generate(data, rows=200)
    for path in sorted((data / "images").glob("*.parquet")):
        client.upload_file(str(path), "lake", f"training/images/{path.name}")
    return env, data


def test_serves_a_dataset_from_s3(s3):
    env, data = s3
    served = Served("s3://lake/training", env=env)
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
