"""pushdown.Loader from Python: reproducible, resumable, rank-fair, numpy out."""

import numpy as np
import pyarrow as pa
import pytest

import pushdown
from conftest import Served, generate

SQL = "SELECT id, label, caption FROM images WHERE label < 600"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("loader")
    generate(root, rows=300)
    return root


@pytest.fixture(scope="module")
def server(data):
    served = Served(data)
    yield f"http://{served.addr}"
    served.stop()


def ids(loader):
    return [batch["id"].tolist() for batch in loader]


def make(server, **kw):
    args = dict(sql=SQL, batch_size=16, shuffle_buffer=64, seed=3, epochs=2)
    args.update(kw)
    return pushdown.Loader([server], **args)


def test_batches_are_numpy_and_arrow(server):
    batch = next(make(server))
    assert isinstance(batch["id"], np.ndarray) and batch["id"].dtype == np.int64
    assert batch["id"].shape == (16,)
    assert isinstance(batch["caption"], pa.Array) and len(batch["caption"]) == 16


def test_arrow_columns_cross_whole_and_outlive_the_loader(server, data):
    """A batch's Arrow columns come through the C Data Interface as one record batch: the
    values equal pyarrow's own reading of the dataset, row by row (nulls included), and the
    arrays stay valid after the loader that made them is gone."""
    import pyarrow.dataset as ds

    sql = ("SELECT caption, id, CASE WHEN id % 7 = 0 THEN NULL ELSE caption END AS sparse "
           "FROM images WHERE label < 600")
    loader = make(server, sql=sql, epochs=1)
    kept = []
    for batch in loader:
        assert list(batch) == ["caption", "id", "sparse"], "the query's column order"
        assert isinstance(batch["caption"], pa.Array) and isinstance(batch["sparse"], pa.Array)
        kept.append(batch)
    del loader
    import gc

    gc.collect()
    table = ds.dataset(str(data / "images"), format="parquet").to_table(columns=["id", "caption", "label"])
    expected = {i: c for i, c, label in zip(*(table.column(n).to_pylist() for n in ["id", "caption", "label"]))
                if label < 600}
    seen = {}
    for batch in kept:
        for i, caption, sparse in zip(batch["id"].tolist(), batch["caption"].to_pylist(), batch["sparse"].to_pylist()):
            seen[i] = caption
            assert sparse == (None if i % 7 == 0 else caption), i
    assert seen == expected


def test_an_arrow_batch_is_taken_once(server):
    loader = iter(make(server, epochs=1))
    columns = loader._inner.next_batch()
    shared = {id(value) for _, kind, value in columns if kind == "arrow"}
    assert len(shared) == 1, "every Arrow column of a batch names one _ArrowBatch"
    value = next(value for _, kind, value in columns if kind == "arrow")
    assert pa.record_batch(value).num_rows == 16
    with pytest.raises(RuntimeError, match="already taken"):
        pa.record_batch(value)


def test_column_types_follow_the_schema_not_the_batch(server):
    # `maybe` is nullable (a CASE with a NULL arm) but a number: a tensor in every batch, as
    # long as no null reaches it; a date is Arrow (numpy holds numbers); `id` is a tensor.
    sql = ("SELECT id, CASE WHEN id % 50 = 0 THEN NULL ELSE label END AS maybe, "
           "CAST('2020-01-01' AS DATE) AS day FROM images WHERE label < 600")
    batches = list(make(server, sql=sql + " AND id % 50 <> 0", epochs=1))
    assert len(batches) > 5
    for batch in batches:
        assert isinstance(batch["id"], np.ndarray)
        assert isinstance(batch["maybe"], np.ndarray), type(batch["maybe"])
        assert isinstance(batch["day"], pa.Array) and batch["day"].type == pa.date32()
    # A null where a tensor is due is an error naming the column, never a switch to Arrow.
    with pytest.raises(pushdown.InvalidArgumentError, match="column `maybe` is null"):
        list(make(server, sql=sql, epochs=1))


def test_same_seed_same_sequence_whatever_the_concurrency(server):
    a = ids(make(server, concurrency=1, workers=1, prefetch=1))
    b = ids(make(server, concurrency=4, workers=3, prefetch=8))
    assert a == b
    for compression in ["zstd", "none", "lz4"]:
        assert ids(make(server, compression=compression)) == a, compression
    assert a != ids(make(server, seed=4))
    flat = [i for batch in a[: len(a) // 2] for i in batch]
    assert len(flat) == len(set(flat)), "one epoch has every row once"


@pytest.mark.parametrize("k", [0, 1, 5, 9, 17])
def test_resume_continues_exactly(server, k):
    whole = ids(make(server))
    first = make(server)
    head = [next(first)["id"].tolist() for _ in range(k)]
    state = first.state_dict()
    del first
    restored = make(server)
    restored.load_state_dict(state)
    assert head + ids(restored) == whole


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_ranks_have_equal_batches_and_cover_the_epoch(server, world):
    seen, counts = [], []
    for rank in range(world):
        loader = make(server, rank=rank, world_size=world, epochs=1, drop_last=True)
        batches = ids(loader)
        assert len(batches) == len(loader)
        counts.append(len(batches))
        seen += [i for b in batches for i in b]
    assert len(set(counts)) == 1, counts
    assert len(seen) == len(set(seen)), "no row twice"


def global_batches(server, world, state=None, **kw):
    """Every rank of `world` (global batch 16, global window 64), joined batch by batch."""
    ranks = []
    for rank in range(world):
        loader = make(server, rank=rank, world_size=world, batch_size=16 // world,
                      shuffle_buffer=64 // world, **kw)
        if state is not None:
            loader.load_state_dict(state)
        ranks.append(ids(loader))
    assert len({len(r) for r in ranks}) == 1
    return [sorted(i for r in ranks for i in r[t]) for t in range(len(ranks[0]))]


def test_a_state_saved_at_one_world_size_continues_at_another(server):
    whole = global_batches(server, 4, drop_last=True)
    assert global_batches(server, 1, drop_last=True) == whole, "the same global batches at W=1"
    states = []
    for rank in range(4):
        loader = make(server, rank=rank, world_size=4, batch_size=4, shuffle_buffer=16, drop_last=True)
        for _ in range(6):
            next(loader)
        states.append(loader.state_dict())
    assert all(s == states[0] for s in states), "the same state on every rank"
    assert global_batches(server, 2, states[0], drop_last=True) == whole[6:]
    # Another global batch is refused, saying what to pass.
    loader = make(server, rank=0, world_size=2, batch_size=4, shuffle_buffer=32, drop_last=True)
    with pytest.raises(ValueError, match="batch_size=8"):
        loader.load_state_dict(states[0])


def test_pipeline_pixels_and_flip_rate(server):
    def load(p):
        pipeline = {
            "dataset": "images",
            "steps": [
                {"op": "map", "call": "decode_resize", "input": "image", "params": [16, 12], "output": "pixels"},
                {"op": "select", "columns": ["id", "pixels"]},
                {"op": "map", "call": "random_flip", "input": "pixels", "params": [p]},
                {"op": "shuffle", "buffer": 50},
                {"op": "batch", "size": 20},
            ],
        }
        rows = {}
        for batch in pushdown.Loader(server, pipeline=pipeline, seed=9):
            assert batch["pixels"].shape[1:] == (12, 16, 3) and batch["pixels"].dtype == np.uint8
            for i, px in zip(batch["id"], batch["pixels"]):
                rows[int(i)] = px
        return rows

    plain, flipped = load(0.0), load(0.5)
    assert len(plain) == 300
    mirrored = 0
    for i, px in plain.items():
        if not np.array_equal(px, flipped[i]):
            assert np.array_equal(px[:, ::-1], flipped[i]), "a flip mirrors the row"
            mirrored += 1
    assert abs(mirrored / 300 - 0.5) < 4 * (0.25 / 300) ** 0.5


def test_every_placement_gives_the_same_batches(server):
    pipeline = {
        "dataset": "images",
        "steps": [
            {"op": "filter", "expr": "label < 700"},
            {"op": "map", "call": "decode_resize", "input": "image", "params": [16, 12], "output": "pixels"},
            {"op": "select", "columns": ["id", "pixels"]},
            {"op": "map", "call": "random_flip", "input": "pixels", "params": [0.5]},
            {"op": "shuffle", "buffer": 50},
            {"op": "batch", "size": 20},
        ],
    }

    def load(placement):
        loader = pushdown.Loader(server, pipeline=pipeline, seed=5, epochs=2, placement=placement)
        return [(b["id"].tolist(), b["pixels"].tobytes()) for b in loader]

    expected = load("server")
    assert expected and sum(len(ids) for ids, _ in expected) > 100
    for placement in ["trainer", "split:0.5", "adaptive", "costed"]:
        assert load(placement) == expected, placement
    with pytest.raises(ValueError, match="placement"):
        pushdown.Loader(server, pipeline=pipeline, placement="split:2")


def test_echo_repeats_each_row_and_resumes_exactly(server):
    plain = [i for b in ids(make(server, epochs=1)) for i in b]
    loader = make(server, epochs=1, echo=2)
    echoed = [i for b in ids(loader) for i in b]
    assert sorted(echoed) == sorted(plain * 2), "every row exactly twice"
    stats = loader.stats
    assert stats["rows"] == 2 * len(plain) and stats["distinct_rows"] == len(plain)
    assert stats["echo"] == 2
    # Resumed halfway, the echoed sequence goes on exactly.
    whole = ids(make(server, echo=2))
    first = make(server, echo=2)
    head = [next(first)["id"].tolist() for _ in range(7)]
    restored = make(server, echo=2)
    restored.load_state_dict(first.state_dict())
    assert head + ids(restored) == whole
    auto = make(server, epochs=1, echo="auto")
    assert len(ids(auto)) >= len(ids(make(server, epochs=1)))


def test_bad_arguments_are_clear(server):
    with pytest.raises(ValueError, match="exactly one"):
        pushdown.Loader(server)
    with pytest.raises(pushdown.NotFoundError, match="unknown dataset"):
        pushdown.Loader(server, sql="SELECT * FROM nope")
    with pytest.raises(ValueError, match="rank"):
        make(server, rank=2, world_size=2)
    with pytest.raises(ValueError, match="compression"):
        make(server, compression="gzip")
    with pytest.raises(ValueError, match="echo"):
        make(server, echo="twice")
    with pytest.raises(ValueError, match="echo"):
        make(server, echo=0)
    loader = make(server)
    with pytest.raises(ValueError):
        loader.load_state_dict({"pushdown_loader": b"garbage"})


def test_torch_dataset_is_optional(server):
    torch = pytest.importorskip("torch")
    from pushdown.torch import IterableDataset

    ds = IterableDataset([server], sql=SQL, batch_size=16, seed=1)
    batches = list(torch.utils.data.DataLoader(ds, batch_size=None))
    assert all(isinstance(b["id"], torch.Tensor) for b in batches)


def test_transform_runs_the_servers_kernels_on_batches_read_elsewhere(server, data):
    # The same pipeline through the Loader (ops on the server, no shuffle) and through a
    # Transform over the Parquet files read by pyarrow: bit-identical pixels per id.
    import pyarrow.dataset as pads

    pipeline = {
        "dataset": "images",
        "steps": [
            {"op": "filter", "expr": "label < 600"},
            {"op": "map", "call": "decode_resize", "input": "image", "params": [16, 12], "output": "pixels"},
            {"op": "map", "call": "hash_bucket", "input": "caption", "params": [97], "output": "bucket"},
            {"op": "select", "columns": ["id", "pixels", "bucket"]},
        ],
    }
    assert pushdown.Transform.filters(pipeline) == ["label < 600"]
    served = {}
    for batch in pushdown.Loader(server, pipeline=pipeline, batch_size=32):
        for i, px, b in zip(batch["id"], batch["pixels"], batch["bucket"]):
            served[int(i)] = (px.tobytes(), int(b))
    ds = pads.dataset(str(data / "images"), format="parquet")
    t = pushdown.Transform(pipeline)
    local = {}
    for k, batch in enumerate(ds.to_batches(columns=["id", "image", "caption", "label"],
                                              filter=pads.field("label") < 600)):
        out = t(batch, key=k)
        assert out.schema.names == ["id", "pixels", "bucket"]
        pixels = out.column("pixels").flatten().to_numpy(zero_copy_only=False)
        width = len(pixels) // max(out.num_rows, 1)
        for j, i in enumerate(out.column("id").to_pylist()):
            local[i] = (pixels[j * width:(j + 1) * width].tobytes(), out.column("bucket")[j].as_py())
    assert served and local == served

    # Random ops draw from (seed, key): the same key repeats, another key differs.
    flip = {"dataset": "images", "steps": [
        {"op": "map", "call": "decode_resize", "input": "image", "params": [16, 12], "output": "pixels"},
        {"op": "select", "columns": ["pixels"]},
        {"op": "map", "call": "random_flip", "input": "pixels", "params": [0.5]},
    ]}
    batch = next(iter(ds.to_batches(columns=["image"], batch_size=64)))
    t = pushdown.Transform(flip, seed=1)
    assert t(batch, key=3).equals(t(batch, key=3))
    assert not t(batch, key=3).equals(t(batch, key=4))

    with pytest.raises(ValueError, match="not an Arrow IPC stream"):
        t._inner.apply(b"nope", 0)
    with pytest.raises(ValueError, match="pixels|image"):
        t(pa.record_batch({"x": [1, 2]}), key=0)


MIX = [
    {"sql": "SELECT id, label FROM images WHERE id % 3 = 0", "weight": 0.7},
    {"sql": "SELECT id, label FROM images WHERE id % 3 <> 0", "weight": 0.3},
]


def mixed(server, other=None, **kw):
    sources = [dict(MIX[0]), dict(MIX[1])]
    if other is not None:
        sources[1]["servers"] = [other]
    args = dict(mixture=sources, batch_size=16, shuffle_buffer=64, seed=3, epochs=2)
    args.update(kw)
    return pushdown.Loader([server], **args)


def test_a_mixture_holds_its_sources_by_weight_and_resumes_elastically(server, data):
    # The second source on a server of its own.
    second = Served(data)
    try:
        other = f"http://{second.addr}"
        batches = ids(mixed(server, other))
        assert len(batches) == 2 * (300 // 16)
        for b in batches:
            assert len(b) == 16 and abs(sum(i % 3 == 0 for i in b) - 0.7 * 16) <= 1
        seen = {}
        for i in (i for b in batches for i in b):
            seen[i] = seen.get(i, 0) + 1
        firsts = [seen.get(i, 0) for i in range(0, 300, 3)]
        assert max(firsts) - min(firsts) <= 1 and min(firsts) >= 3, "once per its epoch"
        assert max(seen.get(i, 0) for i in range(300) if i % 3) == 1

        def joined(world, state=None):
            ranks = []
            for rank in range(world):
                loader = mixed(server, other, rank=rank, world_size=world, batch_size=16 // world,
                               shuffle_buffer=64 // world)
                if state is not None:
                    loader.load_state_dict(state)
                ranks.append(ids(loader))
            return [sorted(i for r in ranks for i in r[t]) for t in range(len(ranks[0]))]

        whole = joined(4)
        assert whole == [sorted(b) for b in batches], "the same global batches at W=1 and 4"
        states = []
        for rank in range(4):
            loader = mixed(server, other, rank=rank, world_size=4, batch_size=4, shuffle_buffer=16)
            for _ in range(7):
                next(loader)
            states.append(loader.state_dict())
        assert all(s == states[0] for s in states), "the same state on every rank"
        assert joined(2, states[0]) == whole[7:]
    finally:
        second.stop()


def test_mixtures_that_cannot_be_are_refused_by_name(server):
    bad = [MIX[0], {"sql": "SELECT id FROM images", "weight": 0.3}]
    with pytest.raises(ValueError, match=r"source 1's columns differ.*label"):
        pushdown.Loader([server], mixture=bad, batch_size=16)
    with pytest.raises(ValueError, match=r"mixture source 1: unknown keys \['wieght'\]"):
        pushdown.Loader([server], mixture=[MIX[0], {"sql": MIX[1]["sql"], "wieght": 1}])
    with pytest.raises(ValueError, match="not several"):
        pushdown.Loader([server], sql=SQL, mixture=MIX)
    with pytest.raises(ValueError, match="source 0 has weight 0"):
        pushdown.Loader([server], mixture=[{**MIX[0], "weight": 0}, MIX[1]])


def test_pushdown_run_reads_a_mixture_file(server, tmp_path):
    import subprocess

    from conftest import BIN

    mix = tmp_path / "mix.toml"
    mix.write_text(
        "batch_size = 16\nshuffle_buffer = 64\n"
        + "".join(f'[[source]]\nsql = "{s["sql"]}"\nweight = {s["weight"]}\n' for s in MIX)
    )
    out = subprocess.run([BIN, "run", "--mixture", str(mix), "--server", server, "--epochs", "2"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "mixture: 2 epoch(s) of 18 global batches; delivered 576 rows in 36 batches" in out.stdout
    mix.write_text('[[source]]\nsql = "SELECT id FROM images"\nweight = -2\n')
    out = subprocess.run([BIN, "run", "--mixture", str(mix), "--server", server],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "source 0 has weight -2" in out.stderr, out.stderr
