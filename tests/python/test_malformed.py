"""One malformed Parquet file is that file's DataLoss, never the server's end.

The real `pushdown serve` over a data root holding every file of the malformed corpus (written
by the `malformed-corpus` binary, each in its own dataset beside a healthy one), from local
disk and from a real S3-compatible server, read with pyarrow's own Flight client; then the
same files copied into a running server's data root one by one, across catalog refreshes.
"""

import shutil

import pyarrow as pa
import pyarrow.flight as flight
import pytest

from conftest import Served, write_corpus

HEALTHY_ROWS = 300  # rows of the corpus's healthy file; `healthy/` holds two copies


def command(sql):
    return flight.FlightDescriptor.for_command(sql.encode())


def assert_healthy(client):
    info = client.get_flight_info(command("SELECT id, text, value FROM healthy"))
    table = pa.concat_tables(client.do_get(ep.ticket).read_all() for ep in info.endpoints)
    assert sorted(table["id"].to_pylist()) == sorted(list(range(HEALTHY_ROWS)) * 2)
    by_id = {row["id"]: row for row in table.to_pylist()}
    assert by_id[7]["text"] == "row 7 of the healthy file, category 0"
    assert by_id[22]["value"] is None and by_id[23]["value"] == 11.5


def assert_data_loss(error, name):
    text = str(error)
    assert "data loss" in text.lower(), text
    assert f"{name}.parquet" in text, text


def assert_entry_fails(client, entry):
    """Requests touching the entry's file fail with DataLoss naming it."""
    name = entry["name"]
    sql = f"SELECT id, text, value FROM bad_{name}"
    if not entry["pages_only"]:
        with pytest.raises(flight.FlightError) as failed:
            client.get_flight_info(command(sql))
        assert_data_loss(failed.value, name)
        return
    info = client.get_flight_info(command(sql))
    failures = 0
    for endpoint in info.endpoints:
        try:
            ids = client.do_get(endpoint.ticket).read_all()["id"].to_pylist()
            assert ids == list(range(ids[0], ids[0] + len(ids))) if ids else True
        except flight.FlightError as e:
            assert_data_loss(e, name)
            failures += 1
    assert failures > 0, f"{name}: a stream over the damaged pages must fail"


def upload_tree(s3, root, bucket, prefix):
    for path in sorted(p for p in root.rglob("*.parquet")):
        s3.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(root).as_posix()}")


@pytest.fixture(params=["local", "s3"])
def backend(request, s3server, tmp_path):
    """Where the data root lives: (place(root) -> data URL, copy(src_dir, dataset), env)."""
    if request.param == "local":
        data = tmp_path / "root"
        data.mkdir()

        def place(src):
            shutil.copytree(src, data, dirs_exist_ok=True)
            return data

        def copy(src, dataset):
            shutil.copytree(src, data / dataset)

        return place, copy, {}
    s3, env = s3server.client(), s3server.env()
    bucket = f"corpus-{request.node.name.replace('_', '-').replace('[', '-').strip(']')}"[:60].lower()
    s3.create_bucket(Bucket=bucket)

    def place(src):
        upload_tree(s3, src, bucket, "root")
        return f"s3://{bucket}/root"

    def copy(src, dataset):
        upload_tree(s3, src, bucket, f"root/{dataset}")

    return place, copy, env


def test_server_starts_over_every_malformed_file(backend, tmp_path):
    place, _, env = backend
    corpus = tmp_path / "corpus"
    entries = write_corpus(corpus)
    assert len(entries) >= 15
    served = Served(place(corpus), env=env)
    try:
        client = flight.connect(f"grpc://{served.addr}")
        names = {f.descriptor.path[0].decode() for f in client.list_flights()}
        assert names == {"healthy"} | {f"bad_{e['name']}" for e in entries}
        assert_healthy(client)
        for entry in entries:
            assert_entry_fails(client, entry)
        assert_healthy(client)
        assert served.alive()
    finally:
        assert served.stop() == 0


def test_malformed_files_copied_into_a_running_server(backend, tmp_path):
    place, copy, env = backend
    corpus = tmp_path / "corpus"
    entries = write_corpus(corpus)
    start = tmp_path / "start"
    shutil.copytree(corpus / "healthy", start / "healthy")
    served = Served(place(start), env=env, args=["--catalog-refresh-secs", "0"])
    try:
        client = flight.connect(f"grpc://{served.addr}")
        assert_healthy(client)
        for entry in entries:
            dataset = f"bad_{entry['name']}"
            copy(corpus / dataset, dataset)
            assert_healthy(client)
            assert_entry_fails(client, entry)
        assert served.alive()
    finally:
        assert served.stop() == 0
