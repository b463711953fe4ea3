"""The training loop every PyTorch tutorial writes, over pushdown.

    ds = pushdown.torch.IterableDataset(servers, ..., shuffle_buffer=...)
    for epoch in range(E):
        for batch in DataLoader(ds, batch_size=None):
            ...

Each pass must be the next epoch (its own permutation), equal to ``Loader(epochs=E)``'s
epochs; ``len`` must count one epoch's batches; a state saved mid-epoch inside the loop must
resume exactly; the dataset must pickle and be a real subclass; a pipeline's batch step is
honoured (``drop_last`` included); integer columns arrive as int64. `.ci/run` has no torch
(its wheel is too heavy): there these tests run against a minimal stand-in of the parts of
torch the adapter uses (``IterableDataset``, ``get_worker_info``, ``from_numpy``, dtypes),
iterating the dataset as a main-process DataLoader does (one ``iter()`` per epoch).
``scripts/test-torch.sh`` runs them with real torch and its DataLoader.
"""

import importlib
import os
import pickle
import sys
import types

import numpy as np
import pytest

import pushdown
from conftest import Served, generate

SQL = "SELECT id, label FROM images WHERE label < 900"
ARGS = dict(sql=SQL, batch_size=8, shuffle_buffer=32, seed=11)
REAL_TORCH = bool(os.environ.get("PUSHDOWN_REQUIRE_TORCH"))


def _numpy_dtype(name):
    import ml_dtypes

    return ml_dtypes.bfloat16 if name == "bfloat16" else name


def stand_in():
    """Just what pushdown.torch touches of torch."""

    class Dtype:
        def __init__(self, name, floating=False):
            self.name, self.is_floating_point = name, floating

        def __repr__(self):
            return f"torch.{self.name}"

    names = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "bool"]
    dtypes = {n: Dtype(n) for n in names}
    dtypes.update({n: Dtype(n, True) for n in ["float16", "bfloat16", "float32", "float64"]})

    class Tensor:
        def __init__(self, array):
            self.array = array

        @property
        def dtype(self):
            return dtypes[self.array.dtype.name]

        def to(self, dtype):
            return Tensor(self.array.astype(_numpy_dtype(dtype.name)))

        def view(self, dtype):
            return Tensor(self.array.view(_numpy_dtype(dtype.name)))

        def tolist(self):
            return self.array.tolist()

    class IterableDataset:
        def __iter__(self):
            raise NotImplementedError

    torch = types.ModuleType("torch")
    torch.__dict__.update(dtypes)
    torch.Tensor = Tensor
    torch.from_numpy = Tensor
    utils = types.ModuleType("torch.utils")
    data = types.ModuleType("torch.utils.data")
    data.IterableDataset = IterableDataset
    data.get_worker_info = lambda: None
    data.DataLoader = lambda ds, batch_size=None: ds  # main-process loading: iter(ds)
    torch.utils, utils.data = utils, data
    return {"torch": torch, "torch.utils": utils, "torch.utils.data": data}


@pytest.fixture(scope="module")
def torch():
    """Real torch under scripts/test-torch.sh, else the stand-in (removed afterwards)."""
    if REAL_TORCH:
        import torch as real

        yield real
        return
    saved = {k: sys.modules.get(k) for k in ["torch", "torch.utils", "torch.utils.data", "pushdown.torch"]}
    sys.modules.update(stand_in())
    sys.modules.pop("pushdown.torch", None)
    try:
        yield sys.modules["torch"]
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v


@pytest.fixture(scope="module")
def adapter(torch):
    return importlib.import_module("pushdown.torch")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("loop")
    generate(root, rows=300)
    served = Served(root)
    yield f"http://{served.addr}"
    served.stop()


def epochs_of(server, epochs, **kw):
    """`Loader(epochs=E)` iterated once, cut into its epochs."""
    loader = pushdown.Loader([server], epochs=epochs, **{**ARGS, **kw})
    per_epoch = len(loader)
    batches = [b["id"].tolist() for b in loader]
    assert len(batches) == per_epoch * epochs
    return [batches[e * per_epoch:(e + 1) * per_epoch] for e in range(epochs)]


def loop(torch, ds, epochs):
    out = []
    for _ in range(epochs):
        out.append([b["id"].tolist() for b in torch.utils.data.DataLoader(ds, batch_size=None)])
    return out


def test_each_pass_of_the_tutorial_loop_is_the_next_epoch(torch, adapter, server):
    want = epochs_of(server, 3)
    assert len({tuple(map(tuple, e)) for e in want}) == 3, "three different permutations"
    ds = adapter.IterableDataset([server], rank=0, world_size=1, **ARGS)
    assert isinstance(ds, torch.utils.data.IterableDataset)
    assert len(ds) == len(want[0]), "len() is one epoch's batches"
    assert loop(torch, ds, 3) == want
    # A plain Loader is the same: each `for` is the next epoch.
    loader = pushdown.Loader([server], **ARGS)
    assert [[b["id"].tolist() for b in loader] for _ in range(3)] == want
    # set_epoch picks the epoch of the next pass.
    loader.set_epoch(1)
    assert [b["id"].tolist() for b in loader] == want[1]
    ds.set_epoch(2)
    assert loop(torch, ds, 1) == [want[2]]


def test_a_pass_left_early_is_abandoned_and_the_next_is_the_next_epoch(server):
    want = epochs_of(server, 2)
    loader = pushdown.Loader([server], **ARGS)
    for i, _ in enumerate(loader):
        if i == 2:
            break
    assert [b["id"].tolist() for b in loader] == want[1]
    assert loader.epoch == 2


def test_a_state_saved_mid_epoch_in_the_loop_resumes_exactly(torch, adapter, server):
    want = epochs_of(server, 3)
    ds = adapter.IterableDataset([server], rank=0, world_size=1, **ARGS)
    seen, state = [], None
    for epoch in range(3):
        for i, b in enumerate(torch.utils.data.DataLoader(ds, batch_size=None)):
            seen.append(b["id"].tolist())
            if epoch == 1 and i == 4:
                state = pickle.loads(pickle.dumps(ds.state_dict()))
                break
        if state is not None:
            break
    resumed = adapter.IterableDataset([server], rank=0, world_size=1, **ARGS)
    resumed.load_state_dict(state)
    resumed.set_epoch(1)  # what a loop that resumes at its saved epoch calls: keeps the position
    rest = loop(torch, resumed, 2)
    assert seen + rest[0] == want[0] + want[1]
    assert rest[1] == want[2]


def test_the_dataset_pickles_after_use_and_is_the_same_class(torch, adapter, server):
    ds = adapter.IterableDataset([server], rank=0, world_size=1, dtypes={"label": None}, **ARGS)
    first = loop(torch, ds, 1)
    copy = pickle.loads(pickle.dumps(ds))
    assert type(copy) is adapter.IterableDataset and isinstance(copy, torch.utils.data.IterableDataset)
    assert copy.dtypes == {"label": None} and copy.kwargs == ds.kwargs
    assert loop(torch, copy, 1) == first, "a fresh copy starts at epoch 0"


def test_integer_columns_arrive_as_int64_unless_asked_otherwise(torch, adapter, server):
    ds = adapter.IterableDataset([server], rank=0, world_size=1, **ARGS)
    batch = next(iter(ds))
    assert batch["label"].dtype == torch.int64 and batch["id"].dtype == torch.int64
    kept = adapter.IterableDataset([server], rank=0, world_size=1, dtypes={"label": None}, **ARGS)
    native = next(iter(pushdown.Loader([server], **ARGS)))["label"].dtype
    kept_dtype = str(next(iter(kept))["label"].dtype).removeprefix("torch.")
    assert kept_dtype == native.name != "int64"


def test_half_precision_pixels_arrive_as_torch_half_types(torch, adapter, server):
    """normalize(..., 'bfloat16' | 'float16'): torch.bfloat16 and torch.float16 tensors, each
    value the float32 run's rounded to nearest even (torch's own cast is the oracle)."""
    sql = "SELECT id, normalize(decode_resize(image, 8, 8), [0.485, 0.456, 0.406], '[0.229, 0.224, 0.225]', 'chw'{}) AS x FROM images"
    kw = dict(batch_size=16, shuffle_buffer=1)

    def run(dtype):
        ds = adapter.IterableDataset([server], rank=0, world_size=1, sql=sql.format(dtype), **kw)
        return list(torch.utils.data.DataLoader(ds, batch_size=None))

    full = run("")
    for name in ["bfloat16", "float16"]:
        half = run(f", '{name}'")
        assert len(half) == len(full)
        for h, f in zip(half, full):
            assert h["id"].tolist() == f["id"].tolist()
            assert h["x"].dtype == getattr(torch, name), (name, h["x"].dtype)
            assert f["x"].to(getattr(torch, name)).tolist() == h["x"].tolist(), name
    # A plain Loader gives ml_dtypes' bfloat16 where that package is installed.
    import ml_dtypes

    loader = pushdown.Loader([server], sql=sql.format(", 'bfloat16'"), **kw)
    batch = next(iter(loader))
    assert batch["x"].dtype == ml_dtypes.bfloat16 and batch["x"].shape[1:] == (3, 8, 8)
    assert loader.bfloat16_columns == {"x"}


def test_a_pipelines_batch_step_is_honoured_and_a_disagreeing_batch_size_refused(server):
    pipeline = {"dataset": "images", "steps": [{"op": "filter", "expr": "id < 21"},
                                               {"op": "select", "columns": ["id"]},
                                               {"op": "batch", "size": 8, "drop_last": True}]}
    sizes = [len(b["id"]) for b in pushdown.Loader(server, pipeline=pipeline)]
    assert sizes == [8, 8], sizes
    assert [len(b["id"]) for b in pushdown.Loader(server, pipeline=pipeline, batch_size=8)] == [8, 8]
    with pytest.raises(ValueError, match="disagrees with the pipeline's batch step"):
        pushdown.Loader(server, pipeline=pipeline, batch_size=5)


def test_cast_to_widens_token_lists_for_embeddings(tmp_path):
    import pyarrow as pa

    tokens = pa.array([[101, 2023, 102], [101, 102]], pa.list_(pa.uint32()))
    batch = pa.RecordBatch.from_arrays([tokens], ["ids"])
    pipeline = {"dataset": "t", "steps": [{"op": "map", "call": "cast_to", "input": "ids", "params": ["int64"]}]}
    out = pushdown.Transform(pipeline)(batch)
    assert out.schema.field("ids").type == pa.list_(pa.int64())
    assert out.column(0).to_pylist() == [[101, 2023, 102], [101, 102]]


def test_version_and_the_torch_hint(monkeypatch):
    assert isinstance(pushdown.__version__, str) and pushdown.__version__
    # Without torch (`None` in sys.modules makes `import torch` fail), the error names the extra.
    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.delitem(sys.modules, "pushdown.torch", raising=False)
    with pytest.raises(ImportError, match=r"pip install 'pushdown\[torch\]'"):
        importlib.import_module("pushdown.torch")
    monkeypatch.delitem(sys.modules, "pushdown.torch", raising=False)
    assert np.int64  # numpy stays the only requirement of `import pushdown`


def test_batch_size_none_is_unbatched_and_resumes_inside_a_batch(server):
    # The order cuts shuffle windows in whole batches: unbatched rows are those of batches of
    # one window.
    batched = [i for b in pushdown.Loader(server, sql=SQL, shuffle_buffer=32, seed=4, batch_size=32)
               for i in b["id"].tolist()]
    single = pushdown.Loader(server, sql=SQL, shuffle_buffer=32, seed=4, batch_size=None)
    assert len(single) == len(batched), "len() counts rows when unbatched"
    rows = []
    for row in single:
        assert np.asarray(row["id"]).shape == () and isinstance(row["label"], np.ndarray)
        rows.append(int(row["id"]))
        if len(rows) == 45:  # inside the second batch
            state = single.state_dict()
            break
    resumed = pushdown.Loader(server, sql=SQL, shuffle_buffer=32, seed=4, batch_size=None)
    resumed.load_state_dict(state)
    rows += [int(r["id"]) for r in resumed]
    assert rows == batched, "the rows a batched loader gives, in its order, each once"
    with pytest.raises(ValueError, match="single rows"):
        pushdown.Loader(server, batch_size=None, pipeline={"dataset": "images", "steps": [
            {"op": "batch", "size": 4}]})


def test_workers_yield_the_ranks_batches_in_turn_whatever_their_number(torch, adapter, server):
    """DataLoader workers (as ``get_worker_info`` tells them) each yield every n-th batch of
    the rank's sequence; the DataLoader's round robin gives the sequence back, unchanged by
    num_workers, and a restored state continues in every worker."""
    if REAL_TORCH:
        pytest.skip("test_torch.py drives real workers")
    want = epochs_of(server, 1)[0]
    data = sys.modules["torch.utils.data"]

    def with_workers(ds, n):
        streams = []
        for k in range(n):
            data.get_worker_info = lambda k=k: types.SimpleNamespace(num_workers=n, id=k)
            copy = pickle.loads(pickle.dumps(ds))  # each worker has its own copy
            streams.append([b["id"].tolist() for b in copy])
        data.get_worker_info = lambda: None
        out = []
        while any(streams):
            for s in streams:
                if s:
                    out.append(s.pop(0))
        return out

    try:
        for n in [2, 3]:
            ds = adapter.IterableDataset([server], rank=0, world_size=1, **ARGS)
            assert with_workers(ds, n) == want, f"{n} workers"
        first = pushdown.Loader([server], **ARGS)
        head = [next(iter(first))["id"].tolist()]
        state = first.state_dict()
        restored = adapter.IterableDataset([server], rank=0, world_size=1, **ARGS)
        restored.load_state_dict(state)
        assert head + with_workers(restored, 2) == want
    finally:
        data.get_worker_info = lambda: None


def test_a_mixture_through_the_torch_dataset_is_the_loaders(torch, adapter, server):
    """``mixture=`` passes through ``pushdown.torch``: each pass is the mixture's next epoch,
    the same batches as ``Loader(mixture=...)``, and ``len`` is the mixture's epoch."""
    mixture = [
        {"sql": "SELECT id, label FROM images WHERE id % 2 = 0", "weight": 3},
        {"sql": "SELECT id, label FROM images WHERE id % 2 = 1", "weight": 1},
    ]
    args = dict(mixture=mixture, batch_size=8, shuffle_buffer=32, seed=11)
    loader = pushdown.Loader([server], epochs=2, **args)
    per_epoch = len(loader)
    assert per_epoch == 300 // 8
    want = [b["id"].tolist() for b in loader]
    assert all(sum(i % 2 == 0 for i in b) == 6 for b in want), "3 in 4 rows from the first"
    ds = adapter.IterableDataset([server], rank=0, world_size=1, **args)
    assert len(ds) == per_epoch
    assert loop(torch, ds, 2) == [want[:per_epoch], want[per_epoch:]]
