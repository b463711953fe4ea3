"""Interoperability: plain pyarrow.flight (no code of ours) pulls reduced streams."""

import random
import subprocess

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as flight
import pyarrow.parquet as pq
import pytest

from conftest import Served, free_port, generate


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


def test_adaptive_streams_mix_codecs_that_pyarrow_decodes(tmp_path):
    # A plain client off this host gets an adaptive stream: each batch compressed only while
    # the client holds the stream back (forced here, on loopback, by the operator's flag). A
    # reader with gRPC's smallest flow-control window that takes a batch every 20 ms holds
    # it back: the stream starts uncompressed, turns to LZ4 then zstd, and pyarrow decodes
    # the mix to the rows pyarrow reads from the files.
    import time
    import urllib.request

    generate(tmp_path, rows=600, row_group_rows=20, rows_per_file=600)
    port = free_port()
    served = Served(tmp_path, args=["--plain-client-codec", "adaptive",
                                    "--metrics-listen", f"127.0.0.1:{port}"])
    try:
        client = flight.connect(f"grpc://{served.addr}", generic_options=[("grpc.http2.bdp_probe", 0)])
        info = client.get_flight_info(flight.FlightDescriptor.for_command(b"SELECT id, image FROM images"))
        batches = []
        for ep in info.endpoints:
            for chunk in client.do_get(ep.ticket):
                batches.append(chunk.data)
                time.sleep(0.02)
        got = pa.Table.from_batches(batches).sort_by("id")
        local = pq.read_table(tmp_path / "images", columns=["id", "image"]).sort_by("id")
        assert got.equals(local)
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
        codecs = {line.split('"')[1]: float(line.split()[-1]) for line in metrics.splitlines()
                  if line.startswith("pushdown_batches_sent_total")}
        assert codecs.get("none", 0) > 0 and codecs.get("lz4", 0) + codecs.get("zstd", 0) > 0, codecs
    finally:
        served.stop()


def write_noise(data, rows=512, row_bytes=64 << 10):
    """`noise`: seeded random bytes (no codec shrinks them), 32 MiB in one shard; a stream
    of it is far larger than the socket and HTTP/2 buffers hold, so a client that stops
    reading holds it open on the server."""
    (data / "noise").mkdir(parents=True)
    rng = random.Random(7)
    table = pa.table({
        "id": pa.array(range(rows), pa.int64()),
        "blob": pa.array([rng.randbytes(row_bytes) for _ in range(rows)], pa.binary()),
    })
    pq.write_table(table, data / "noise" / "part-0.parquet", row_group_size=16)


def stalled_stream(served):
    """A stream of `noise` read to its first batch, then left."""
    client = flight.connect(f"grpc://{served.addr}")
    info = client.get_flight_info(flight.FlightDescriptor.for_command(b"SELECT id, blob FROM noise"))
    reader = client.do_get(info.endpoints[0].ticket)
    assert reader.read_chunk().data.num_rows > 0
    return client, reader


def test_sigterm_ends_a_stalled_stream_after_the_drain_and_exits(tmp_path):
    write_noise(tmp_path)
    served = Served(tmp_path, args=["--drain-secs", "1"])
    client, reader = stalled_stream(served)
    served.proc.terminate()
    # Before: the stalled stream held the stopping server for its request timeout (an hour).
    assert served.proc.wait(timeout=60) == 0, served.proc.stderr.read()
    log = served.proc.stderr.read()
    assert "drain deadline passed" in log, log
    # Never a stream that looks complete: what was sent, then an error.
    with pytest.raises(flight.FlightError):
        reader.read_all()
    client.close()


def test_a_second_signal_stops_a_draining_server_at_once(tmp_path):
    write_noise(tmp_path)
    served = Served(tmp_path, args=["--drain-secs", "600"])
    client, reader = stalled_stream(served)
    served.proc.terminate()
    with pytest.raises(subprocess.TimeoutExpired):
        served.proc.wait(timeout=1)  # draining: the stalled stream has 600 s
    served.proc.terminate()
    assert served.proc.wait(timeout=30) == 1
    with pytest.raises(flight.FlightError):
        reader.read_all()
    client.close()
