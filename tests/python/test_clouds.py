"""Object stores other than S3 (whose tests are test_s3.py), and their settings' errors.

* **Azure Blob Storage** against Azurite, Microsoft's own emulator (``scripts/setup-azurite.sh``
  installs it from npm): files uploaded with Microsoft's ``azure-storage-blob`` are served from
  ``az://container/prefix`` with object_store's ``AZURE_*`` settings, and a query's rows equal
  those of the same files served from a local folder.
* **Google Cloud Storage**: ``gs://`` is accepted and configured from ``GOOGLE_*`` (a malformed
  key is refused at start-up, naming the URL). No emulator that can be installed here speaks
  the XML API object_store uses, so no request reaches a GCS server in these tests.
* **S3 over plain http** without ``AWS_ALLOW_HTTP=true`` is refused at start-up naming that
  variable (the store would otherwise fail every request with "builder error").
"""

import os
import pathlib
import subprocess
import time

import pyarrow as pa
import pyarrow.flight as flight
import pytest

import pushdown
from conftest import BIN, Served, free_port, generate

ROOT = pathlib.Path(__file__).resolve().parents[2]
EMULATOR_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
SQL = "SELECT id, label, decode_resize(image, 8, 8) AS pixels FROM images WHERE label < 600"


def read(served, sql=SQL):
    client = flight.connect(f"grpc+tcp://{served.addr}")
    info = client.get_flight_info(flight.FlightDescriptor.for_command(sql.encode()))
    table = pa.concat_tables([client.do_get(ep.ticket).read_all() for ep in info.endpoints])
    return table.sort_by("id")


@pytest.fixture(scope="module")
def azurite(tmp_path_factory):
    blob = subprocess.run([str(ROOT / "scripts" / "setup-azurite.sh")], check=True, capture_output=True,
                          text=True).stdout.strip()
    port = free_port()
    proc = subprocess.Popen(
        [blob, "--blobHost", "127.0.0.1", "--blobPort", str(port), "--location",
         str(tmp_path_factory.mktemp("azurite")), "--silent", "--skipApiVersionCheck", "--loose"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            import socket

            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"Azurite did not start on port {port}")
            time.sleep(0.1)
    yield url
    # Azurite closes gracefully, waiting for idle keep-alive connections: not for long.
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=30)


def test_azure_blob_storage_serves_what_a_local_folder_does(azurite, tmp_path):
    from azure.storage.blob import BlobServiceClient

    local = tmp_path / "local"
    generate(local, rows=300)
    service = BlobServiceClient.from_connection_string(
        "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;"
        f"AccountKey={EMULATOR_KEY};BlobEndpoint={azurite}/devstoreaccount1;"
    )
    container = service.create_container("training")
    files = sorted(p for p in local.rglob("*.parquet"))
    assert files
    for path in files:
        with open(path, "rb") as f:
            container.upload_blob(f"root/{path.relative_to(local)}", f)
    env = {"AZURE_STORAGE_USE_EMULATOR": "true", "AZURITE_BLOB_STORAGE_URL": azurite}
    in_azure = Served("az://training/root", env=env)
    on_disk = Served(local)
    try:
        got, want = read(in_azure), read(on_disk)
        assert got.num_rows == want.num_rows > 0
        assert got.equals(want)
        loader = pushdown.Loader([f"http://{in_azure.addr}"], sql="SELECT id FROM images", batch_size=50)
        assert sorted(i for b in loader for i in b["id"].tolist()) == list(range(300))
    finally:
        in_azure.stop()
        on_disk.stop()
        service.close()


def start_fails(data, env):
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "GOOGLE_", "AZURE_"))}
    proc = subprocess.run([BIN, "serve", "--data", data, "--listen", "127.0.0.1:0"],
                          env={**clean, **env}, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0, proc.stdout
    return proc.stderr


def test_google_cloud_storage_is_configured_from_its_variables():
    err = start_fails("gs://bucket/prefix", {"GOOGLE_SERVICE_ACCOUNT_KEY": "{not json"})
    assert "gs://bucket/prefix" in err and "not enabled" not in err, err


def test_s3_over_plain_http_names_the_setting_it_needs():
    err = start_fails("s3://bucket/prefix", {"AWS_ENDPOINT": "http://127.0.0.1:9", "AWS_REGION": "us-east-1"})
    assert "AWS_ALLOW_HTTP=true" in err and "http://127.0.0.1:9" in err, err
