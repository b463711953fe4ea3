"""The baseline of `harness import`: what a user writes with pyarrow to turn an image folder
or JSONL files into Parquet, tuned as its docs suggest (one ParquetWriter, zstd, batches of
rows, pyarrow's multi-threaded JSON reader), doing the same work as `pushdown import`: the
same files in torchvision's order, the Hub's image struct, zstd level 3 (row groups: 256
images, as it writes them; pyarrow's default for JSONL).

    import_pyarrow.py imagefolder|jsonl --out DIR [--reps N] INPUT...

Prints {"rows", "seconds" (best of the repetitions), "bytes_written"} as JSON.
"""

import argparse
import json
import os
import shutil
import time

import pyarrow as pa
import pyarrow.json as pj
import pyarrow.parquet as pq

EXTS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
IMAGE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])


def imagefolder(root, out):
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
    schema = pa.schema([("image", IMAGE), ("label", pa.int64())])
    rows = 0
    with pq.ParquetWriter(out, schema, compression="zstd", compression_level=3) as writer:
        batch = {"bytes": [], "path": [], "label": []}

        def flush():
            if batch["label"]:
                image = pa.StructArray.from_arrays(
                    [pa.array(batch["bytes"], pa.binary()), pa.array(batch["path"], pa.string())],
                    fields=list(IMAGE))
                writer.write_table(pa.table({"image": image, "label": pa.array(batch["label"], pa.int64())}),
                                   row_group_size=256)
                for v in batch.values():
                    v.clear()

        for label, c in enumerate(classes):
            for base, _, names in sorted(os.walk(os.path.join(root, c), followlinks=True)):
                for name in sorted(names):
                    if not name.lower().endswith(EXTS):
                        continue
                    path = os.path.join(base, name)
                    with open(path, "rb") as f:
                        batch["bytes"].append(f.read())
                    batch["path"].append(os.path.relpath(path, root))
                    batch["label"].append(label)
                    rows += 1
                    if len(batch["label"]) == 256:
                        flush()
        flush()
    return rows


def jsonl(files, out):
    tables = [pj.read_json(f) for f in files]
    table = pa.concat_tables(tables, promote_options="permissive")
    pq.write_table(table, out, compression="zstd", compression_level=3)
    return table.num_rows


def main():
    p = argparse.ArgumentParser()
    p.add_argument("kind", choices=["imagefolder", "jsonl"])
    p.add_argument("--out", required=True)
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("inputs", nargs="+")
    a = p.parse_args()
    best = None
    for _ in range(a.reps):
        shutil.rmtree(a.out, ignore_errors=True)
        os.makedirs(a.out)
        target = os.path.join(a.out, "train-00000-of-00001.parquet")
        start = time.perf_counter()
        rows = imagefolder(a.inputs[0], target) if a.kind == "imagefolder" else jsonl(a.inputs, target)
        secs = time.perf_counter() - start
        if best is None or secs < best[1]:
            best = (rows, secs, os.path.getsize(target))
    shutil.rmtree(a.out, ignore_errors=True)
    print(json.dumps({"rows": best[0], "seconds": best[1], "bytes_written": best[2]}))


if __name__ == "__main__":
    main()
