"""Layouts other tools write, read as tutorials read them.

A Hub snapshot written by `datasets` itself (`data/train-00000-of-00001.parquet`,
`data/test-00000-of-00001.parquet`, in a folder named `cifar-10`), pyarrow files whose
schemas drifted (int32 then int64, a column added), hive `key=value/` folders, and the
server's start-up warnings. The oracle is pyarrow reading the same files.
"""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import Served

datasets = pytest.importorskip("datasets")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("layouts")
    # A Hub snapshot, as `datasets` writes each split.
    hub = root / "cifar-10" / "data"
    hub.mkdir(parents=True)
    for split, n, offset in [("train", 120, 0), ("test", 40, 1000)]:
        ds = datasets.Dataset.from_dict(
            {"idx": list(range(offset, offset + n)), "label": [i % 10 for i in range(n)]},
            features=datasets.Features({"idx": datasets.Value("int64"), "label": datasets.ClassLabel(num_classes=10)}),
        )
        ds.to_parquet(str(hub / f"{split}-00000-of-00001.parquet"))
    # Drift: label int32 in the old file, int64 beside a new column in the new one.
    (root / "MyPets").mkdir()
    pq.write_table(pa.table({"id": pa.array(range(30), pa.int64()),
                             "label": pa.array([i % 3 for i in range(30)], pa.int32())}),
                   root / "MyPets" / "2023.parquet")
    pq.write_table(pa.table({"label": pa.array([i % 3 for i in range(30, 50)], pa.int64()),
                             "id": pa.array(range(30, 50), pa.int64()),
                             "weight": pa.array([float(i) for i in range(30, 50)], pa.float32())}),
                   root / "MyPets" / "2024.parquet")
    # Hive folders.
    for lang, ids in [("en", range(0, 10)), ("fr", range(10, 25))]:
        (root / "web" / f"lang={lang}").mkdir(parents=True)
        pq.write_table(pa.table({"id": pa.array(ids, pa.int64())}), root / "web" / f"lang={lang}" / "part-0.parquet")
    # A folder that cannot be a dataset name, and one hidden.
    for skipped in ["bad,name", ".cache"]:
        (root / skipped).mkdir()
        pq.write_table(pa.table({"id": [1]}), root / skipped / "x.parquet")
    server = Served(root)
    yield f"http://{server.addr}", root
    server.stop()


def test_a_hub_snapshot_reads_by_split_with_every_row_once(served):
    import pushdown

    url, root = served
    want = pq.read_table(root / "cifar-10" / "data" / "train-00000-of-00001.parquet")
    got_idx, got_label = [], []
    for batch in pushdown.Loader(url, sql="SELECT idx, label FROM \"cifar-10\" WHERE split = 'train'",
                                 batch_size=32):
        assert isinstance(batch["label"], np.ndarray) and isinstance(batch["idx"], np.ndarray)
        got_idx.extend(batch["idx"].tolist())
        got_label.extend(batch["label"].tolist())
    assert sorted(zip(got_idx, got_label)) == sorted(zip(want["idx"].to_pylist(), want["label"].to_pylist()))
    # A pipeline names the dataset as the folder does.
    pipeline = {"dataset": "cifar-10", "steps": [{"op": "filter", "expr": "split = 'test'"},
                                                 {"op": "select", "columns": ["idx", "split"]},
                                                 {"op": "batch", "size": 16}]}
    test = [(i, s) for b in pushdown.Loader(url, pipeline=pipeline) for i, s in zip(b["idx"].tolist(), b["split"].to_pylist())]
    assert sorted(test) == [(i, "test") for i in range(1000, 1040)]


def test_drifted_files_widen_into_tensors_and_a_missing_column_is_null(served):
    import pushdown

    url, _ = served
    ids, labels = [], []
    for batch in pushdown.Loader(url, sql="SELECT id, label FROM MyPets", batch_size=8):
        assert batch["label"].dtype == np.int64, batch["label"].dtype
        ids.extend(batch["id"].tolist())
        labels.extend(batch["label"].tolist())
    assert sorted(zip(ids, labels)) == [(i, i % 3) for i in range(50)]
    # The files that lack `weight` read it as null: a tensor column names the null, and a
    # fill makes it a tensor again.
    with pytest.raises(pushdown.InvalidArgumentError, match="column `weight` is null"):
        list(pushdown.Loader(url, sql="SELECT id, weight FROM \"MyPets\"", batch_size=64))
    weights = {}
    for batch in pushdown.Loader(url, sql="SELECT id, COALESCE(weight, -1) AS w FROM \"MyPets\"", batch_size=64):
        assert isinstance(batch["w"], np.ndarray)
        weights.update(zip(batch["id"].tolist(), batch["w"].tolist()))
    assert weights == {i: (-1.0 if i < 30 else float(i)) for i in range(50)}


def test_hive_folders_are_columns(served):
    import pushdown

    url, _ = served
    got = sorted(i for b in pushdown.Loader(url, sql="SELECT id FROM web WHERE lang = 'fr'", batch_size=8)
                 for i in b["id"].tolist())
    assert got == list(range(10, 25))


def test_the_operator_is_told_what_was_skipped_and_when_nothing_is_served(served, tmp_path):
    url, root = served
    server = Served(root)
    server.stop()
    log = server.proc.stderr.read()
    assert "bad,name" in log and "skipping folder" in log, log
    assert ".cache" not in log, "hidden folders are skipped silently"
    empty = Served(tmp_path)
    empty.stop()
    log = empty.proc.stderr.read()
    assert "no datasets" in log, log
