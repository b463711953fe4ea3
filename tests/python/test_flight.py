"""Interoperability: plain pyarrow.flight (no code of ours) pulls reduced streams."""

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as flight
import pyarrow.parquet as pq
import pytest

from conftest import Served, generate


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    data = tmp_path_factory.mktemp("data")
    generate(data)
    served = Served(data)
    try:
        yield flight.connect(f"grpc://{served.addr}"), data
    finally:
        assert served.stop() == 0, "graceful shutdown on SIGTERM"


def read_all(client, info):
    tables = [client.do_get(ep.ticket).read_all() for ep in info.endpoints]
    return pa.concat_tables(tables) if tables else info.schema.empty_table()


def test_select_with_filter(server):
    client, data = server
    sql = b"SELECT label FROM images WHERE label < 10"
    info = client.get_flight_info(flight.FlightDescriptor.for_command(sql))
    assert len(info.endpoints) >= 2, "one endpoint per shard"
    got = read_all(client, info)
    assert got.schema.names == ["label"]

    local = pq.read_table(data / "images", columns=["label"])
    expected = local.filter(pc.less(local["label"], 10))
    assert sorted(got["label"].to_pylist()) == sorted(expected["label"].to_pylist())
    assert got.num_rows > 0


def test_catalog_and_errors(server):
    client, _ = server
    flights = list(client.list_flights())
    assert [f.descriptor.path for f in flights] == [[b"images"]]
    assert flights[0].total_records == 300

    with pytest.raises(Exception) as err:
        client.get_flight_info(flight.FlightDescriptor.for_command(b"SELECT * FROM nope"))
    assert "nope" in str(err.value) and "images" in str(err.value)

    with pytest.raises(Exception) as err:
        client.get_flight_info(flight.FlightDescriptor.for_command(b"DROP TABLE images"))
    assert "read-only" in str(err.value)


def test_aggregate_is_one_stream(server):
    client, data = server
    info = client.get_flight_info(
        flight.FlightDescriptor.for_command(b"SELECT count(*) AS n FROM images WHERE label < 500"))
    assert len(info.endpoints) == 1
    got = read_all(client, info)
    local = pq.read_table(data / "images", columns=["label"])
    assert got["n"][0].as_py() == pc.sum(pc.less(local["label"], 500)).as_py()


def test_whole_dataset_by_path(server):
    client, data = server
    info = client.get_flight_info(flight.FlightDescriptor.for_path("images"))
    got = read_all(client, info)
    assert got.num_rows == 300
    assert got.schema == pq.read_schema(next((data / "images").glob("*.parquet"))).remove_metadata()
