"""``pushdown.nodes.LoaderNode``: a ``torchdata.nodes`` source, as torchdata's loader drives it.

Each ``reset()`` without a state must be the next epoch (``Loader(epochs=E)``'s epochs, not a
replay of epoch 0); ``get_state()`` mid-epoch, given to a new node's ``reset``, must continue
exactly; a state that is not the node's is refused by name. With torchdata installed (it needs
torch: ``scripts/test-torch.sh``, or ``scripts/test-torch-device.sh`` on a machine that has
torch and no Rust toolchain; both set ``PUSHDOWN_REQUIRE_TORCHDATA=1``)
the node is a real ``BaseNode``, driven by ``torchdata.nodes.Loader`` behind a ``Prefetcher``,
its ``state_dict``/``load_state_dict`` included. ``.ci/run`` has no torch: there the node runs
on its stand-in base, driven the way ``torchdata.nodes.Loader`` drives a root.
"""

import os
import pickle

import pytest

import pushdown
from conftest import Served, generate
from pushdown.nodes import HAVE_TORCHDATA, LoaderNode

ARGS = dict(sql="SELECT id, label FROM images WHERE label < 900", batch_size=8, shuffle_buffer=32, seed=5)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("nodes")
    generate(root, rows=300)
    served = Served(root)
    yield f"http://{served.addr}"
    served.stop()


def epochs_of(server, epochs):
    loader = pushdown.Loader([server], epochs=epochs, **ARGS)
    per_epoch = len(loader)
    batches = [b["id"].tolist() for b in loader]
    return [batches[e * per_epoch:(e + 1) * per_epoch] for e in range(epochs)]


def drain(node):
    out = []
    while True:
        try:
            out.append(next(node)["id"].tolist())
        except StopIteration:
            return out


def test_each_reset_is_the_next_epoch(server):
    want = epochs_of(server, 3)
    assert len({tuple(map(tuple, e)) for e in want}) == 3
    node = LoaderNode([server], **ARGS)
    assert len(node) == len(want[0])
    got = []
    for _ in range(3):
        node.reset(None)
        got.append(drain(node))
    assert got == want
    # The first item before any reset resets lazily: epoch 0.
    assert drain(LoaderNode(pushdown.Loader([server], **ARGS))) == want[0]


def test_a_state_mid_epoch_continues_exactly(server):
    want = epochs_of(server, 2)
    node = LoaderNode([server], **ARGS)
    node.reset(None)
    drain(node)
    node.reset(None)
    seen = [next(node)["id"].tolist() for _ in range(3)]
    state = pickle.loads(pickle.dumps(node.state_dict()))
    resumed = LoaderNode([server], **ARGS)
    resumed.reset(state)
    assert seen + drain(resumed) == want[1]
    # A state taken at an epoch's end continues with the epoch after it, and the reset after
    # that with the one after that.
    end = resumed.state_dict()
    again = LoaderNode([server], **ARGS)
    again.reset(end)
    want = epochs_of(server, 4)
    assert drain(again) == want[2]
    again.reset(None)
    assert drain(again) == want[3]


def test_bad_arguments_and_states_are_named(server):
    with pytest.raises(pushdown.InvalidArgumentError, match="not a LoaderNode state"):
        LoaderNode([server], **ARGS).reset({"num_yielded": 3})
    with pytest.raises(pushdown.InvalidArgumentError, match="not both"):
        LoaderNode(pushdown.Loader([server], **ARGS), seed=1)
    with pytest.raises(pushdown.InvalidArgumentError, match="servers="):
        LoaderNode(sql="SELECT id FROM images")


def test_under_torchdatas_own_loader(server):
    if not HAVE_TORCHDATA:
        if os.environ.get("PUSHDOWN_REQUIRE_TORCHDATA"):
            pytest.fail("PUSHDOWN_REQUIRE_TORCHDATA is set but torchdata does not import")
        pytest.skip("torchdata (and torch) absent: scripts/test-torch-device.sh runs this")
    import torchdata.nodes as tn

    want = epochs_of(server, 3)
    node = LoaderNode([server], **ARGS)
    assert isinstance(node, tn.BaseNode)
    loader = tn.Loader(tn.Prefetcher(node, prefetch_factor=2))
    assert [[b["id"].tolist() for b in loader] for _ in range(2)] == want[:2]
    # Saved mid-epoch 2, restored into a new pipeline.
    seen = []
    for i, b in enumerate(loader):
        seen.append(b["id"].tolist())
        if i == 3:
            break
    state = loader.state_dict()
    resumed = tn.Loader(tn.Prefetcher(LoaderNode([server], **ARGS), prefetch_factor=2))
    resumed.load_state_dict(state)
    assert seen + [b["id"].tolist() for b in resumed] == want[2]
