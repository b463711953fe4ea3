"""The errors a Python user catches: one `pushdown.PushdownError` subclass per kind of
failure (gRPC's codes), each also the Python built-in a caller would catch for it, each
message saying its kind once; and the typed example script passes `mypy --strict`."""

import os
import pathlib
import signal
import shutil
import time

import pytest

from conftest import ROOT, Served, free_port, generate, write_corpus

pushdown = pytest.importorskip("pushdown")

IMAGES_ONLY = "token-for-images-only-0123456789"


@pytest.fixture(scope="module")
def open_server(tmp_path_factory):
    """Generated images, a file whose footer is damaged (`bad_<name>`), served openly."""
    root = tmp_path_factory.mktemp("root")
    entries = write_corpus(root)
    generate(root)
    damaged = next(e["name"] for e in entries if not e["pages_only"])
    served = Served(root)
    yield f"http://{served.addr}", root, damaged
    served.stop()


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    """`images` and `other` behind a token that grants `images` only."""
    data = tmp_path_factory.mktemp("data")
    generate(data)
    shutil.copytree(data / "images", data / "other")
    tokens = tmp_path_factory.mktemp("secrets") / "tokens"
    tokens.write_text(f"{IMAGES_ONLY} images\n")
    served = Served(data, args=["--auth-tokens", str(tokens)])
    yield f"http://{served.addr}"
    served.stop()


def said_once(error, words):
    text = str(error).lower()
    assert f"{words}: {words}" not in text, text
    return text


def test_each_kind_of_failure_is_its_own_class(open_server, secured):
    url, root, damaged = open_server
    cases = [
        (lambda: pushdown.Loader(url, sql="SELEC id FROM images"), pushdown.InvalidArgumentError, ValueError,
         "invalid argument"),
        (lambda: pushdown.Loader(url, sql="SELECT id FROM nope"), pushdown.NotFoundError, LookupError, "not found"),
        (lambda: pushdown.Loader(f"http://127.0.0.1:{free_port()}", sql="SELECT id FROM images",
                                 call_timeout_s=2.0), pushdown.UnavailableError, ConnectionError, "unavailable"),
        (lambda: pushdown.Loader(url, sql=f"SELECT id FROM bad_{damaged}"), pushdown.DataLossError, RuntimeError,
         "data loss"),
        (lambda: pushdown.Loader(secured, sql="SELECT id FROM images"), pushdown.UnauthenticatedError,
         PermissionError, "unauthenticated"),
        (lambda: pushdown.Loader(secured, sql="SELECT id FROM other", token=IMAGES_ONLY),
         pushdown.PermissionDeniedError, PermissionError, "permission denied"),
        (lambda: pushdown.Loader(url, sql="SELECT id FROM images", batch_size=0), pushdown.InvalidArgumentError,
         ValueError, None),
    ]
    for make, cls, builtin, words in cases:
        with pytest.raises(cls) as caught:
            make()
        assert isinstance(caught.value, pushdown.PushdownError) and isinstance(caught.value, builtin)
        assert caught.value.kind == cls.kind
        if words is not None:
            said_once(caught.value, words)


def test_a_frozen_server_times_out_and_changed_data_is_named(open_server, tmp_path):
    url, root, _ = open_server
    # A server that stops answering: the plan's deadline.
    data = tmp_path / "frozen"
    generate(data)
    frozen = Served(data)
    os.kill(frozen.proc.pid, signal.SIGSTOP)
    try:
        with pytest.raises(pushdown.PushdownError) as caught:
            pushdown.Loader(f"http://{frozen.addr}", sql="SELECT id FROM images", call_timeout_s=1.0)
        assert isinstance(caught.value, (pushdown.TimedOutError, pushdown.UnavailableError)), caught.value
        assert isinstance(caught.value, (TimeoutError, ConnectionError))
    finally:
        # A frozen host is killed, not asked to drain (graceful shutdown is other tests').
        frozen.proc.kill()
        frozen.proc.wait(timeout=30)
    # A state saved mid-epoch does not continue over files that changed since.
    data = tmp_path / "changing"
    generate(data)
    served = Served(data, args=["--catalog-refresh-secs", "1"])
    try:
        loader = pushdown.Loader(f"http://{served.addr}", sql="SELECT id FROM images", batch_size=10,
                                 shuffle_buffer=20)
        it = iter(loader)
        next(it)
        state = loader.state_dict()
        victim = sorted((data / "images").glob("*.parquet"))[0]
        shutil.copy(victim, data / "images" / "copy.parquet")
        time.sleep(2.5)  # the server lists its data root again every second
        later = pushdown.Loader(f"http://{served.addr}", sql="SELECT id FROM images", batch_size=10,
                                shuffle_buffer=20)
        with pytest.raises(pushdown.ChangedError) as caught:
            later.load_state_dict(state)
            for _ in range(3):
                next(iter(later))
        assert isinstance(caught.value, RuntimeError)
    finally:
        served.stop()


def test_the_typed_example_passes_mypy_strict():
    mypy = pytest.importorskip("mypy.api")
    example = ROOT / "examples" / "python" / "typed_loader.py"
    out, err, status = mypy.run(["--strict", "--no-incremental", "--cache-dir", os.devnull, str(example)])
    assert status == 0, out + err
    # The package says it is typed, and its native module has a stub.
    package = pathlib.Path(pushdown.__file__).parent
    assert (package / "py.typed").exists() and (package / "_native.pyi").exists()


def test_an_incompatible_client_version_is_refused_naming_both(open_server):
    """A client sends `pushdown-version`; another minor version (before 1.0) is refused with
    both versions named. A plain Flight client, which sends none, is served."""
    import pyarrow as pa
    import pyarrow.flight as flight

    url, _, _ = open_server
    client = flight.connect(url.replace("http://", "grpc://"))
    query = flight.FlightDescriptor.for_command(b"SELECT id FROM images")
    newer = flight.FlightCallOptions(headers=[(b"pushdown-version", b"0.99.0")])
    # pyarrow raises InvalidArgument as ArrowInvalid.
    with pytest.raises((flight.FlightError, pa.ArrowInvalid), match=r"0\.99\.0.*0\.1\.x"):
        client.get_flight_info(query, newer)
    assert client.get_flight_info(query).endpoints
    # The Python client's own version is the server's: it reads.
    assert sum(len(b["id"]) for b in pushdown.Loader(url, sql="SELECT id FROM images", batch_size=100)) > 0
