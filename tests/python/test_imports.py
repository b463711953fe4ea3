"""`pushdown import` on data other tools wrote, with those tools as the oracle.

* imagefolder: a tree PIL writes (class folders, a nested folder, upper-case extensions);
  labels must follow torchvision's `ImageFolder` rule (`class_to_idx` by sorted class name;
  torchvision's own where it is installed), rows in its order, pixels equal to PIL's decode of
  the file, and the server serves the dataset by its folder's name, decoding what it holds.
* webdataset: shards the `webdataset` package's `ShardWriter` writes; every sample's fields
  equal the library's own reading of the shards.
* audiofolder: WAVs with a `metadata.csv`; `datasets` reads the dataset back with its
  `Audio` feature, bytes and transcriptions intact.
* jsonl: rows equal `json.loads` of each line.
* Bad inputs (a corrupt member, an unreadable file, a file with no label, a bad JSON line)
  are each named in the summary with their count; the rest is imported. The same input
  writes the same bytes.
"""

import io
import json
import os
import pathlib
import subprocess
import wave

import numpy as np
import pyarrow.parquet as pq
import pytest

from conftest import BIN, Served

pushdown = pytest.importorskip("pushdown")
imports = pytest.importorskip("pushdown.imports")
Image = pytest.importorskip("PIL.Image")


def read_rows(out):
    t = pq.ParquetDataset(sorted(str(p) for p in pathlib.Path(out, "data").glob("*.parquet")))
    return t.read().to_pylist()


def png(seed, size=(24, 16)):
    rng = np.random.default_rng(seed)
    img = Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))
    buf = io.BytesIO()
    img.save(buf, format="PNG" if seed % 2 else "JPEG")
    return buf.getvalue()


def torchvision_rule(root):
    """`class_to_idx` and `(path, label)` samples: torchvision's own where installed, else its
    rule (datasets/folder.py) written out."""
    try:
        from torchvision.datasets import ImageFolder

        ds = ImageFolder(str(root), loader=lambda p: p)
        return ds.class_to_idx, [(os.path.relpath(p, root), t) for p, t in ds.samples]
    except ImportError:
        pass
    exts = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
    class_to_idx = {c: i for i, c in enumerate(classes)}
    samples = []
    for c in sorted(class_to_idx):
        for base, _, names in sorted(os.walk(os.path.join(root, c), followlinks=True)):
            for name in sorted(names):
                if name.lower().endswith(exts):
                    samples.append((os.path.relpath(os.path.join(base, name), root), class_to_idx[c]))
    return class_to_idx, samples


def test_imagefolder_labels_follow_torchvision_and_pixels_survive(tmp_path):
    root = tmp_path / "pets"
    files = {
        "cat/001.jpg": png(0), "cat/002.PNG": png(1), "cat/kittens/003.jpg": png(2),
        "dog/a.png": png(3), "dog/b.jpeg": png(4), "bird/z.png": png(5), "bird/y.jpg": png(6),
    }
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    (root / "dog/bad.jpg").write_bytes(b"this is not a JPEG")         # corrupt
    (root / "dog/notes.txt").write_text("not an image")               # another extension
    (root / "stray.png").write_bytes(png(7))                          # no class folder
    (root / "bird/gone.png").symlink_to(root / "nowhere.png")         # unreadable
    class_to_idx, samples = torchvision_rule(root)
    samples = [(p, t) for p, t in samples if not p.endswith(("bad.jpg", "gone.png"))]

    data = tmp_path / "data"
    summary = imports.imagefolder(root, out=data / "pets")
    assert summary["rows"] == len(samples) == 7
    skipped = {reason: s["count"] for reason, s in summary["skipped"].items()}
    assert skipped == {"corrupt": 1, "unreadable": 1, "missing_label": 1, "other_file": 1}, summary
    assert any("dog/bad.jpg" in n for n in summary["skipped"]["corrupt"]["named"])
    assert summary["skipped"]["missing_label"]["named"] == ["stray.png"]

    rows = read_rows(data / "pets")
    assert [(r["image"]["path"], r["label"]) for r in rows] == samples
    for r in rows:
        original = np.asarray(Image.open(root / r["image"]["path"]).convert("RGB"))
        imported = np.asarray(Image.open(io.BytesIO(r["image"]["bytes"])).convert("RGB"))
        assert np.array_equal(original, imported), r["image"]["path"]
    meta = pq.read_schema(next((data / "pets" / "data").glob("*.parquet"))).metadata
    names = json.loads(meta[b"label_names"])
    assert {c: i for i, c in enumerate(names)} == class_to_idx
    hub = json.loads(meta[b"huggingface"])["info"]["features"]
    assert hub["image"] == {"_type": "Image"} and hub["label"]["names"] == names

    # Deterministic: the same input writes the same bytes.
    first = {p.name: p.read_bytes() for p in (data / "pets" / "data").iterdir()}
    imports.imagefolder(root, out=data / "pets")
    assert {p.name: p.read_bytes() for p in (data / "pets" / "data").iterdir()} == first
    assert not (data / "pets" / "_import").exists()

    # The server serves it by the folder's name and decodes what it holds.
    served = Served(data)
    try:
        loader = pushdown.Loader(
            [f"http://{served.addr}"],
            sql="SELECT label, decode_resize(image, 8, 8) AS pixels, split FROM pets",
            batch_size=7, shuffle_buffer=1, seed=0,
        )
        batches = list(loader)
        labels = sorted(int(x) for b in batches for x in b["label"])
        assert labels == sorted(t for _, t in samples)
        assert batches[0]["pixels"].shape[1:] == (8, 8, 3)
    finally:
        served.stop()


def test_webdataset_fields_equal_the_librarys_reading(tmp_path):
    wds = pytest.importorskip("webdataset")
    pattern = str(tmp_path / "shard-%06d.tar")
    with wds.ShardWriter(pattern, maxcount=5, verbose=0) as sink:
        for i in range(12):
            sample = {"__key__": f"s{i:04d}", "jpg": png(i), "txt": f"caption {i} ünïcode",
                      "json": {"i": i, "tags": ["a", str(i)]}, "cls": i % 3}
            if i == 7:
                sample["jpg"] = b"\xff\xd8 not really a jpeg"          # a corrupt member
            if i % 4 == 0:
                del sample["json"]                                    # a sample without one
            sink.write(sample)
    shards = sorted(str(p) for p in tmp_path.glob("shard-*.tar"))
    assert len(shards) == 3
    summary = imports.webdataset(shards, out=tmp_path / "data" / "laion")
    assert summary["skipped"]["corrupt"]["count"] == 1, summary
    assert "s0007" in summary["skipped"]["corrupt"]["named"][0]

    expected = [s for s in wds.WebDataset(shards, shardshuffle=False) if s["__key__"] != "s0007"]
    rows = read_rows(tmp_path / "data" / "laion")
    assert summary["rows"] == len(rows) == len(expected) == 11
    for row, s in zip(rows, expected):
        assert row["__key__"] == s["__key__"]
        assert row["__url__"] == s["__url__"]
        assert row["jpg"]["bytes"] == s["jpg"]
        assert row["txt"] == s["txt"].decode("utf-8")
        assert row["cls"] == int(s["cls"])
        if "json" in s:
            assert json.loads(row["json"]) == json.loads(s["json"])
        else:
            assert row["json"] is None

    # A shard cut short (a copy interrupted mid-member): the samples before the cut are
    # imported, the cut and the sample it fell in are named.
    whole = pathlib.Path(shards[0]).read_bytes()
    cut = tmp_path / "cut.tar"
    cut.write_bytes(whole[: len(whole) // 2 + 100])
    summary = imports.webdataset([str(cut)], out=tmp_path / "data" / "cut")
    named = summary["skipped"]["corrupt"]["named"]
    assert any("tar stops here" in n for n in named), summary
    assert 0 < summary["rows"] < 5
    rows = read_rows(tmp_path / "data" / "cut")
    assert [r["__key__"] for r in rows] == [f"s{i:04d}" for i in range(summary["rows"])]


def write_wav(path, seconds, rate=16000, freq=440.0):
    t = np.arange(int(seconds * rate)) / rate
    pcm = (0.3 * np.sin(2 * np.pi * freq * t) * 32767).astype("<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.tobytes())


def test_audiofolder_is_read_back_by_datasets_as_audio(tmp_path):
    datasets = pytest.importorskip("datasets")
    root = tmp_path / "speech"
    (root / "clips").mkdir(parents=True)
    lines = ["file_name,transcription,speaker"]
    for i in range(6):
        write_wav(root / "clips" / f"{i}.wav", 0.1 + 0.05 * i, freq=200.0 + 50 * i)
        if i != 4:
            lines.append(f"clips/{i}.wav,utterance number {i},{i % 2}")   # 4.wav: no row
    lines.append("clips/missing.wav,never recorded,0")                    # no such file
    (root / "clips" / "5.wav").write_bytes(b"RIFF\x00\x00\x00\x00WAVEjunk")  # corrupt
    (root / "metadata.csv").write_text("\n".join(lines) + "\n")

    out = tmp_path / "data" / "speech"
    summary = imports.audiofolder(root, out=out)
    skipped = {reason: s["count"] for reason, s in summary["skipped"].items()}
    assert skipped == {"missing_label": 1, "missing_file": 1, "corrupt": 1}, summary
    assert summary["rows"] == 4

    ds = datasets.load_dataset("parquet", data_files=sorted(str(p) for p in (out / "data").glob("*.parquet")),
                               split="train")
    assert isinstance(ds.features["audio"], datasets.Audio), ds.features
    ds = ds.cast_column("audio", datasets.Audio(decode=False))
    got = [(r["audio"]["path"], r["transcription"], r["speaker"]) for r in ds]
    assert got == [(f"clips/{i}.wav", f"utterance number {i}", i % 2) for i in (0, 1, 2, 3)]
    for r in ds:
        assert r["audio"]["bytes"] == (root / r["audio"]["path"]).read_bytes()


def test_jsonl_rows_equal_the_lines_and_bad_lines_are_named(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    rows_a = [{"text": f"doc {i}", "id": i, "score": 0.5 * i} for i in range(5)]
    rows_b = [{"text": "late", "id": 9, "lang": "fr"}]
    a.write_text("\n".join(json.dumps(r) for r in rows_a[:3]) + "\n{broken json\n\n"
                 + "\n".join(json.dumps(r) for r in rows_a[3:]) + "\n")
    b.write_text(json.dumps(rows_b[0]) + "\n[1, 2]\n")
    summary = imports.jsonl([a, b], out=tmp_path / "data" / "text")
    assert summary["rows"] == 6
    named = summary["skipped"]["corrupt"]["named"]
    assert summary["skipped"]["corrupt"]["count"] == 2
    assert named[0].startswith(f"{a}:4") and named[1].startswith(f"{b}:2"), named
    got = read_rows(tmp_path / "data" / "text")
    want = [{"text": r["text"], "id": r["id"], "score": r.get("score"), "lang": r.get("lang")}
            for r in rows_a + rows_b]
    assert [{k: g[k] for k in ("text", "id", "score", "lang")} for g in got] == want


def test_the_command_line_imports_and_refuses_bad_arguments(tmp_path):
    (tmp_path / "in.jsonl").write_text('{"text": "hello"}\n')
    run = subprocess.run([BIN, "import", "jsonl", str(tmp_path / "in.jsonl"), "--out", str(tmp_path / "ds")],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "imported 1 rows (jsonl)" in run.stdout and "data/train-00000-of-00001.parquet" in run.stdout
    bad = subprocess.run([BIN, "import", "tarballs", "x", "--out", str(tmp_path / "ds")],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "unknown kind `tarballs`" in bad.stderr, bad.stderr
    nothing = subprocess.run([BIN, "import", "imagefolder", str(tmp_path / "absent"), "--out", str(tmp_path / "ds2")],
                             capture_output=True, text=True, timeout=120)
    assert nothing.returncode == 1 and "not a folder" in nothing.stderr, nothing.stderr


def test_imports_from_and_into_an_object_store(s3server, tmp_path):
    """`s3://` inputs and output (the S3 server of scripts/setup-s3.sh): the same rows and the
    same bytes as the import of the same files on disk, nothing staged left in the bucket,
    and a server over the bucket serves the dataset by its name."""
    wds = pytest.importorskip("webdataset")
    client = s3server.client()
    for bucket in ("import-raw", "import-lake"):  # the session's server: buckets of our own
        client.create_bucket(Bucket=bucket)
    root = tmp_path / "pets"
    files = {f"{c}/{i:03d}.{'png' if i % 2 else 'jpg'}": png(10 * k + i)
             for k, c in enumerate(["cat", "dog", "bird"]) for i in range(7)}
    files["dog/deep/x.jpg"] = png(99)
    files["cat/broken.jpg"] = b"not a jpeg"
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
        client.put_object(Bucket="import-raw", Key=f"photos/pets/{rel}", Body=data)
    client.put_object(Bucket="import-raw", Key="photos/pets-other/fish/f.jpg", Body=png(5))  # a sibling prefix
    shards = tmp_path / "shards"
    shards.mkdir()
    with wds.ShardWriter(str(shards / "shard-%06d.tar"), maxcount=4, verbose=0) as sink:
        for i in range(10):
            sink.write({"__key__": f"k{i:03d}", "jpg": png(i), "cls": i % 2})
    for p in sorted(shards.glob("*.tar")):
        client.upload_file(str(p), "import-raw", f"shards/{p.name}")

    def cli(*args):
        run = subprocess.run([BIN, "import", *args], capture_output=True, text=True, timeout=300,
                             env={**os.environ, **s3server.env()})
        assert run.returncode == 0, run.stderr
        return run.stdout

    local = tmp_path / "local"
    imports.imagefolder(root, out=local / "pets")
    out = cli("imagefolder", "s3://import-raw/photos/pets", "--out", "s3://import-lake/training/pets")
    assert "imported 22 rows (imagefolder)" in out and "cat/broken.jpg" in out, out
    listed = client.list_objects_v2(Bucket="import-lake", Prefix="training/")["Contents"]
    keys = sorted(o["Key"] for o in listed)
    want = sorted(f"training/pets/{p.relative_to(local / 'pets')}" for p in (local / "pets" / "data").iterdir())
    assert keys == want, "the dataset's files, and nothing staged beside them"
    for key in keys:
        body = client.get_object(Bucket="import-lake", Key=key)["Body"].read()
        assert body == (local / "pets" / key.removeprefix("training/pets/")).read_bytes(), key

    # Shards from a prefix, into a local folder: the rows of the local shards' import.
    imports.webdataset(sorted(shards.glob("*.tar")), out=local / "laion")
    cli("webdataset", "s3://import-raw/shards/", "--out", str(tmp_path / "fromS3" / "laion"))
    here, there = read_rows(local / "laion"), read_rows(tmp_path / "fromS3" / "laion")
    assert [r["__url__"] for r in there] == [f"s3://import-raw/shards/{pathlib.Path(r['__url__']).name}" for r in here]
    strip = lambda rows: [{k: v for k, v in r.items() if k != "__url__"} for r in rows]
    assert strip(there) == strip(here) and len(here) == 10

    served = Served("s3://import-lake/training", env=s3server.env())
    try:
        loader = pushdown.Loader([f"http://{served.addr}"], sql="SELECT label FROM pets",
                                 batch_size=22, shuffle_buffer=1, seed=0)
        labels = sorted(int(x) for b in loader for x in b["label"])
        assert labels == sorted(r["label"] for r in read_rows(local / "pets"))
    finally:
        served.stop()
