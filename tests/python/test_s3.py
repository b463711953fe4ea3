"""Serving from object storage: a real S3-compatible server (moto, in-process on loopback)."""

import boto3
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as flight
import pyarrow.parquet as pq
import pytest
from moto.server import ThreadedMotoServer

from conftest import Served, generate


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    creds = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing", "region_name": "us-east-1"}
    client = boto3.client("s3", endpoint_url=endpoint, **creds)
    client.create_bucket(Bucket="lake")
    data = tmp_path_factory.mktemp("data")
    generate(data, rows=200)
    for path in sorted((data / "images").glob("*.parquet")):
        client.upload_file(str(path), "lake", f"training/images/{path.name}")
    env = {
        "AWS_ENDPOINT": endpoint,
        "AWS_ALLOW_HTTP": "true",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "us-east-1",
    }
    yield env, data
    server.stop()


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
