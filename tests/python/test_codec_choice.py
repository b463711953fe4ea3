"""One function chooses a stream's codec (``pushdown_protocol::choose_codec``, exposed as
``pushdown._native.choose_codec``), and every path takes its answer: the Python ``Loader``,
``pushdown run`` and a plain Flight client (pyarrow's, which cannot ask for a codec).

Each case runs one client against a server and reads back, from the server's own counter
``pushdown_streams_by_codec_total``, the codec every stream's ticket asked for; it must be the
function's answer for what that client knows (a codec forced, a bandwidth given, a server on
this host) and nothing else. The cases differ in their answers, so a path that chose by its
own rule would show.
"""

import subprocess
import time
import urllib.request

import pyarrow.flight as flight
import pytest

import pushdown
from pushdown import _native
from conftest import BIN, Served, generate

SQL = "SELECT id, label FROM images WHERE label < 700"


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("codec")
    generate(root, rows=300)
    return root


def serve(root, *args):
    return Served(root, args=["--metrics-listen", "127.0.0.1:0", "--cache", "off", "--read-ahead", "off", *args])


@pytest.fixture(scope="module")
def server(root):
    served = serve(root)
    yield served
    served.stop()


def streams_by_codec(served):
    """The server's count of streams begun, by the codec their tickets asked for."""
    text = urllib.request.urlopen(served.metrics).read().decode()
    counts = {}
    for line in text.splitlines():
        if line.startswith("pushdown_streams_by_codec_total{"):
            codec = line.split('codec="')[1].split('"')[0]
            counts[codec] = float(line.split()[-1])
    return counts


def codecs_of(served, run, streams):
    """The codecs the streams `run` began asked for (waiting until `streams` were counted)."""
    before = streams_by_codec(served)
    run()
    deadline = time.monotonic() + 5
    while True:
        after = streams_by_codec(served)
        began = {c: n - before.get(c, 0) for c, n in after.items() if n > before.get(c, 0)}
        if sum(began.values()) >= streams or time.monotonic() > deadline:
            return set(began)


def shards(served):
    client = flight.connect(f"grpc+tcp://{served.addr}")
    return len(client.get_flight_info(flight.FlightDescriptor.for_command(SQL)).endpoints)


def loader_run(served, **options):
    def run():
        loader = pushdown.Loader([f"http://{served.addr}"], sql=SQL, batch_size=64, shuffle_buffer=0, **options)
        assert sum(len(b["id"]) for b in loader) > 0
    return run


def cli_run(served, *args):
    def run():
        out = subprocess.run([BIN, "run", "--server", f"http://{served.addr}", "--sql", SQL, *args],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
    return run


def plain_run(served):
    def run():
        client = flight.connect(f"grpc+tcp://{served.addr}")
        info = client.get_flight_info(flight.FlightDescriptor.for_command(SQL))
        for endpoint in info.endpoints:
            client.do_get(endpoint.ticket).read_all()
    return run


def test_the_function_answers_differently_for_what_a_client_knows():
    # The cases below are worth testing only because the answers differ.
    assert _native.choose_codec("local") == "none"
    assert _native.choose_codec("unknown") == "adaptive"
    assert _native.choose_codec("1Gbit") == "zstd"
    assert _native.choose_codec("10Gbit") == "lz4"
    assert _native.choose_codec("1Gbit", profiled="not_link_bound") == "none"
    assert _native.choose_codec("1Gbit", profiled="measured:lz4") == "lz4"
    assert _native.choose_codec("local", forced="zstd") == "zstd"
    with pytest.raises(ValueError, match="gzip"):
        _native.choose_codec("local", forced="gzip")


@pytest.mark.parametrize("options, knows", [
    ({}, dict(link="local")),
    ({"bandwidth_bytes_per_s": 125e6}, dict(link="1Gbit")),
    ({"bandwidth_bytes_per_s": 1.25e9}, dict(link="10Gbit")),
    ({"compression": "lz4"}, dict(link="local", forced="lz4")),
])
def test_the_python_loader_takes_the_functions_codec(server, options, knows):
    want = _native.choose_codec(**knows)
    assert codecs_of(server, loader_run(server, **options), shards(server)) == {want}


@pytest.mark.parametrize("args, knows", [
    ([], dict(link="local")),
    (["--bandwidth", "1Gbit"], dict(link="1Gbit")),
    (["--bandwidth", "10Gbit"], dict(link="10Gbit")),
])
def test_pushdown_run_takes_the_functions_codec(server, args, knows):
    want = _native.choose_codec(**knows)
    assert codecs_of(server, cli_run(server, *args), shards(server)) == {want}


def test_a_plain_client_takes_the_functions_codec(root, server):
    assert codecs_of(server, plain_run(server), shards(server)) == {_native.choose_codec("local")}
    # The server's --plain-client-codec is forced for plain clients.
    forced = serve(root, "--plain-client-codec", "zstd")
    try:
        want = _native.choose_codec("local", forced="zstd")
        assert codecs_of(forced, plain_run(forced), shards(forced)) == {want}
    finally:
        forced.stop()
