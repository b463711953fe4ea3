"""pushdown.torch.IterableDataset under torch's own DataLoader: 0 and 2 workers, ranks, resume.

torch is heavy (the PyPI wheel pulls CUDA libraries, ~4 GB), so `.ci/run` does not install
it and these tests skip there; `scripts/test-torch.sh` installs it and runs them with
PUSHDOWN_REQUIRE_TORCH=1, which turns a missing torch into a failure instead of a skip."""

import os

import pytest

import pushdown
from conftest import Served, generate

if os.environ.get("PUSHDOWN_REQUIRE_TORCH"):
    import torch  # noqa: F401  (a missing torch fails here, loudly)
torch = pytest.importorskip("torch")
from pushdown.torch import IterableDataset  # noqa: E402

SQL = "SELECT id, label FROM images WHERE label < 900"
ARGS = dict(sql=SQL, batch_size=8, shuffle_buffer=32, seed=11, epochs=2)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("torch")
    generate(root, rows=300)
    served = Served(root)
    yield f"http://{served.addr}"
    served.stop()


def loader_ids(server, **kw):
    return [b["id"].tolist() for b in pushdown.Loader([server], **{**ARGS, **kw})]


def dataloader_ids(ds, workers=0):
    out = []
    for batch in torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers):
        assert isinstance(batch["id"], torch.Tensor) and batch["id"].dtype == torch.int64
        assert isinstance(batch["label"], torch.Tensor)
        out.append(batch["id"].tolist())
    return out


def interleave(*streams):
    """What torch's DataLoader yields from several workers: one batch of each in turn."""
    out, streams = [], [list(s) for s in streams]
    while any(streams):
        for s in streams:
            if s:
                out.append(s.pop(0))
    return out


def test_main_process_loading_is_the_loaders_sequence(server):
    got = dataloader_ids(IterableDataset([server], rank=0, world_size=1, **ARGS))
    assert got == loader_ids(server)


def test_workers_never_change_the_sequence(server):
    # Worker k of n yields batches k, k+n, ... of the rank's loader; the DataLoader's round
    # robin puts them back in order: the batches are the rank's, whatever num_workers is.
    alone = dataloader_ids(IterableDataset([server], rank=0, world_size=1, **ARGS))
    for workers in [2, 3]:
        got = dataloader_ids(IterableDataset([server], rank=0, world_size=1, **ARGS), workers=workers)
        assert got == alone, f"{workers} workers"


def test_ranks_from_the_environment_and_workers_within_a_rank(server, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    ds = IterableDataset([server], **ARGS)
    assert (ds.rank, ds.world_size) == (1, 2)
    got = dataloader_ids(ds, workers=2)
    assert got == loader_ids(server, rank=1, world_size=2)
    rank0 = dataloader_ids(IterableDataset([server], rank=0, world_size=2, **ARGS), workers=2)
    ids0 = [i for b in rank0 for i in b]
    ids1 = [i for b in got for i in b]
    alone = [i for b in loader_ids(server) for i in b]
    # Every row in each epoch; a last global batch of uneven rows repeats at most one row
    # per rank (as torch's DistributedSampler pads).
    assert set(ids0 + ids1) == set(alone)
    assert 0 <= len(ids0 + ids1) - len(alone) < 2 * 2


def test_resume_from_a_saved_state_dict_continues_the_sequence(server, tmp_path):
    whole = loader_ids(server)
    ds = IterableDataset([server], rank=0, world_size=1, **ARGS)
    seen = []
    for batch in torch.utils.data.DataLoader(ds, batch_size=None):
        seen.append(batch["id"].tolist())
        if len(seen) == len(whole) // 2 + 3:  # in the second epoch
            torch.save(ds.state_dict(), tmp_path / "ckpt")
            break
    resumed = IterableDataset([server], rank=0, world_size=1, **ARGS)
    resumed.load_state_dict(torch.load(tmp_path / "ckpt"))
    rest = dataloader_ids(resumed)
    assert seen + rest == whole


def test_spawned_workers_unpickle_the_dataset_and_keep_the_sequence(server):
    """`spawn` (macOS, Windows, CUDA jobs) pickles the dataset into each worker."""
    ds = IterableDataset([server], rank=0, world_size=1, **ARGS)
    got = []
    for batch in torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2,
                                             multiprocessing_context="spawn"):
        assert batch["label"].dtype == torch.int64
        got.append(batch["id"].tolist())
    assert got == loader_ids(server)


def test_a_restored_state_continues_in_every_worker(server):
    whole = loader_ids(server)
    ds = IterableDataset([server], rank=0, world_size=1, **ARGS)
    seen = []
    for batch in torch.utils.data.DataLoader(ds, batch_size=None):
        seen.append(batch["id"].tolist())
        if len(seen) == 5:
            break
    restored = IterableDataset([server], rank=0, world_size=1, **ARGS)
    restored.load_state_dict(ds.state_dict())
    assert seen + dataloader_ids(restored, workers=2) == whole
