"""A secured `pushdown serve` (tokens, TLS) read by pyarrow's own Flight client and by
pushdown.Loader, as users outside the project would."""

import datetime
import ipaddress

import pyarrow as pa
import pyarrow.flight as flight
import pytest

from conftest import BIN, Served, generate

IMAGES_ONLY = "images-reader-token-0123456789"
ADMIN = "platform-admin-token-9876543210"


def bearer(token):
    return flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {token}".encode())])


def sql(text):
    return flight.FlightDescriptor.for_command(text.encode())


def read(client, text, options):
    info = client.get_flight_info(sql(text), options)
    tables = [client.do_get(ep.ticket, options).read_all() for ep in info.endpoints]
    return pa.concat_tables(tables) if tables else info.schema.empty_table()


def write_pki(folder):
    """A CA and a server certificate it signed for localhost / 127.0.0.1, as PEM files."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "pushdown test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([
                x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = {name: folder / f"{name}.pem" for name in ("ca", "cert", "key")}
    paths["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths["cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths["key"].write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    return paths


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    """Two datasets (`images`, `other`) behind tokens and TLS."""
    data = tmp_path_factory.mktemp("data")
    generate(data)
    import subprocess
    subprocess.run([BIN, "gen", "images", "--name", "other", "--rows", "100", "--out", str(data)],
                   check=True, capture_output=True)
    folder = tmp_path_factory.mktemp("secrets")
    pki = write_pki(folder)
    tokens = folder / "tokens"
    tokens.write_text(f"# trainers of team a\n{IMAGES_ONLY} images\n{ADMIN} *\n")
    served = Served(data, args=["--auth-tokens", str(tokens), "--tls-cert", str(pki["cert"]),
                                "--tls-key", str(pki["key"])])
    try:
        yield served, pki
    finally:
        served.stop()
        stderr = served.proc.stderr.read()
        for token in (IMAGES_ONLY, ADMIN):
            assert token not in stderr, "tokens are never logged"


def connect(served, pki):
    return flight.connect(f"grpc+tls://localhost:{served.addr.rsplit(':', 1)[1]}",
                          tls_root_certs=pki["ca"].read_bytes())


def test_pyarrow_reads_granted_datasets_over_tls(secured):
    served, pki = secured
    client = connect(served, pki)
    got = read(client, "SELECT id, label FROM images WHERE label < 10", bearer(IMAGES_ONLY))
    assert got.num_rows > 0 and got.column_names == ["id", "label"]
    assert all(v < 10 for v in got["label"].to_pylist())
    listed = [f.descriptor.path[0].decode() for f in client.list_flights(options=bearer(IMAGES_ONLY))]
    assert listed == ["images"], "a token lists only what it may read"
    listed = sorted(f.descriptor.path[0].decode() for f in client.list_flights(options=bearer(ADMIN)))
    assert listed == ["images", "other"]


def test_pyarrow_is_refused_without_a_token_or_outside_its_grant(secured):
    served, pki = secured
    client = connect(served, pki)
    with pytest.raises(flight.FlightUnauthenticatedError):
        client.get_flight_info(sql("SELECT id FROM images"))
    with pytest.raises(flight.FlightUnauthenticatedError):
        client.get_flight_info(sql("SELECT id FROM images"), bearer("images-reader-token-wrong"))
    with pytest.raises(flight.FlightUnauthorizedError):
        client.get_flight_info(sql("SELECT id FROM other"), bearer(IMAGES_ONLY))
    # The admin's ticket for `other` does not work for the images-only token.
    info = client.get_flight_info(sql("SELECT id FROM other"), bearer(ADMIN))
    with pytest.raises(flight.FlightUnauthorizedError):
        client.do_get(info.endpoints[0].ticket, bearer(IMAGES_ONLY)).read_all()
    # The server goes on serving.
    assert read(client, "SELECT id FROM other", bearer(ADMIN)).num_rows == 100


def test_pyarrow_basic_token_handshake(secured):
    served, pki = secured
    client = connect(served, pki)
    header = client.authenticate_basic_token("trainer", IMAGES_ONLY)
    assert header == (b"authorization", f"Bearer {IMAGES_ONLY}".encode())
    options = flight.FlightCallOptions(headers=[header])
    assert read(client, "SELECT id FROM images", options).num_rows == 300
    with pytest.raises(flight.FlightUnauthenticatedError):
        client.authenticate_basic_token("trainer", "not-a-valid-token-000")


def test_pyarrow_without_the_ca_cannot_connect(secured):
    served, _ = secured
    client = flight.connect(f"grpc+tls://localhost:{served.addr.rsplit(':', 1)[1]}")
    with pytest.raises(flight.FlightUnavailableError):
        client.get_flight_info(sql("SELECT id FROM images"), bearer(ADMIN))


def test_loader_with_token_and_ca(secured):
    import pushdown

    served, pki = secured
    url = f"https://localhost:{served.addr.rsplit(':', 1)[1]}"
    loader = pushdown.Loader(url, sql="SELECT id, label FROM images", batch_size=100,
                             token=IMAGES_ONLY, tls_ca=pki["ca"])
    ids = [i for batch in loader for i in batch["id"].tolist()]
    assert sorted(ids) == list(range(300))
    with pytest.raises(Exception, match="PermissionDenied|permission denied"):
        list(pushdown.Loader(url, sql="SELECT id FROM other", token=IMAGES_ONLY, tls_ca=pki["ca"]))


def test_an_open_bind_on_the_network_is_warned_about_in_plain_or_json_logs(tmp_path):
    """`--listen 0.0.0.0:…` without tokens (or client certificates) warns at start-up; logs
    off a terminal carry no colour codes, and `--log-format json` writes one object a line."""
    import json
    import subprocess

    data = tmp_path / "data"
    generate(data)

    def start(*extra):
        proc = subprocess.Popen([BIN, "serve", "--data", str(data), "--listen", "0.0.0.0:0", *extra],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = proc.stdout.readline()
        proc.terminate()
        _, err = proc.communicate(timeout=30)
        assert line.startswith("listening on "), (line, err)
        return err

    err = start()
    assert "without --auth-tokens" in err, err
    assert "\x1b[" not in err, "no colour codes in a file"
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{ADMIN} *\n")
    assert "without --auth-tokens" not in start("--auth-tokens", str(tokens))
    records = [json.loads(line) for line in start("--log-format", "json").splitlines() if line.strip()]
    warned = [r for r in records if "without --auth-tokens" in r.get("fields", {}).get("message", "")]
    assert warned and warned[0]["level"] == "WARN", records


def test_tokens_are_reloaded_on_sighup_and_a_bad_file_keeps_the_old_ones(tmp_path):
    import signal
    import time

    import pushdown

    data = tmp_path / "data"
    generate(data)
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{IMAGES_ONLY} images\n")
    served = Served(data, args=["--auth-tokens", str(tokens)])
    url = f"http://{served.addr}"

    def reads(token):
        try:
            list(pushdown.Loader(url, sql="SELECT id FROM images", token=token, batch_size=100))
            return True
        except pushdown.UnauthenticatedError:
            return False

    try:
        assert reads(IMAGES_ONLY) and not reads(ADMIN)
        tokens.write_text(f"{ADMIN} *\n")
        served.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while not reads(ADMIN):
            assert time.monotonic() < deadline, "the new token is not accepted"
            time.sleep(0.2)
        assert not reads(IMAGES_ONLY), "the old token is revoked"
        tokens.write_text("too-short images\n")
        served.proc.send_signal(signal.SIGHUP)
        time.sleep(1.0)
        assert reads(ADMIN) and served.alive(), "a file that does not parse keeps the tokens in force"
    finally:
        served.stop()
