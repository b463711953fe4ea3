"""torchvision's train recipe at 224 px, two ways, on the trainer's CPU.

* **pushdown**: a `pushdown.Loader` over the `images` dataset with the train pipeline: the
  server sends each JPEG reduced to at most `--thumb` px on its longer side (aspect kept);
  the trainer runs `random_resized_crop(224, 224)`, `random_flip(0.5)` and
  `normalize(ImageNet, 'chw')` on the loader's own threads: NCHW float32 batches.
* **pushdown, server pixels**: the same, the server decoding each image to pixels stretched
  to 256² instead (not the recipe: the aspect is lost before the crop); it shows what
  decoding on the server would save the trainer once pixels can keep their aspect.
* **dataloader**: what a PyTorch user writes without pushdown: worker processes read the
  Parquet row groups (pyarrow), decode each JPEG in full with PIL, take torchvision's
  `RandomResizedCrop(224)` box (torchvision itself when importable, else the same rule on
  PIL), flip half of them, `ToTensor` + `Normalize` with numpy, batches of `--batch` through
  the DataLoader (torch) or `multiprocessing` queues.

Both run as fast as they deliver (no training step). Per contender: images/s, the trainer
host's CPU seconds per 1,000 images (this process and its worker processes; a pushdown server
on another host is not the trainer's), and bytes per image received over the link
(pushdown's stream; the DataLoader reads the files themselves).

    .venv/bin/python benches/python/bench_recipe.py --data DIR/images --server http://HOST:PORT
"""

import argparse
import functools
import io
import json
import math
import os
import random
import time

import numpy as np
import pyarrow.parquet as pq
from PIL import Image

from workers import cpu_seconds, units_of, worker_batches

MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)


def crop_box(rng, width, height, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
    """torchvision's RandomResizedCrop.get_params: (top, left, h, w)."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(*log_ratio))
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return rng.randint(0, height - h), rng.randint(0, width - w), h, w
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        h, w = height, int(round(height * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def transform(jpeg, rng, side):
    img = Image.open(io.BytesIO(jpeg)).convert("RGB")
    top, left, h, w = crop_box(rng, img.width, img.height)
    img = img.resize((side, side), Image.BILINEAR, box=(left, top, left + w, top + h))
    x = np.asarray(img, dtype=np.float32) / 255.0
    if rng.random() < 0.5:
        x = x[:, ::-1]
    return ((x - MEAN) / STD).transpose(2, 0, 1)


def batches(units, seed, side, batch):
    rng = random.Random(seed)
    xs, labels = [], []
    for path, rg in units:
        table = pq.ParquetFile(path).read_row_group(rg, columns=["image", "label"])
        for jpeg, label in zip(table.column("image").to_pylist(), table.column("label").to_pylist()):
            xs.append(transform(jpeg, rng, side))
            labels.append(label)
            if len(xs) == batch:
                yield np.stack(xs), np.asarray(labels)
                xs, labels = [], []
    if xs:
        yield np.stack(xs), np.asarray(labels)


def _batches_of(units, k, side, batch):
    return batches(units, 1000 + k, side, batch)


def dataloader(data, workers, side, batch):
    """Batches from worker processes (`workers.py`: torch's DataLoader when importable, else
    multiprocessing queues)."""
    return worker_batches(units_of(data), workers, functools.partial(_batches_of, side=side, batch=batch))


def pushdown_batches(server, side, thumb, batch, pixels=False, dtype="float32", epochs=1):
    """The recipe through pushdown: the server sends JPEGs of at most `thumb` px, or with
    `pixels`, decoded pixels stretched to `thumb`² (not the recipe: the aspect is lost
    before the crop; it shows what decoding on the server saves the trainer). `dtype`:
    normalize's output type (`bfloat16` arrives as its uint16 bits without ml_dtypes)."""
    import pushdown

    reduce = ({"op": "map", "call": "decode_resize", "input": "image", "params": [thumb, thumb]} if pixels
              else {"op": "map", "call": "thumbnail", "input": "image", "params": [thumb]})
    pipeline = {
        "dataset": "images",
        "steps": [
            reduce,
            {"op": "shuffle", "buffer": 4096},
            {"op": "map", "call": "random_resized_crop", "input": "image", "params": [side, side]},
            {"op": "map", "call": "random_flip", "input": "image", "params": [0.5]},
            {"op": "map", "call": "normalize", "input": "image",
             "params": [MEAN.tolist(), STD.tolist(), "chw", dtype]},
            {"op": "select", "columns": ["image", "label"]},
            {"op": "batch", "size": batch},
        ],
    }
    loader = pushdown.Loader([server], pipeline=pipeline, placement="server", epochs=epochs,
                             workers=max(1, (os.cpu_count() or 2) - 1))
    yield "pushdown, server pixels (stretched)" if pixels else "pushdown, server JPEG", loader
    for b in loader:
        yield b["image"], b["label"]


def measure(source, side):
    start, cpu0 = time.perf_counter(), cpu_seconds()
    name, handle = next(source)
    images = 0
    for x, _ in source:
        assert tuple(x.shape[1:]) == (3, side, side), x.shape
        images += x.shape[0]
    seconds, cpu = time.perf_counter() - start, cpu_seconds() - cpu0
    received = handle.stats["bytes_received"] if handle is not None else None
    return {
        "loader": name,
        "images": images,
        "seconds": round(seconds, 3),
        "images_per_s": round(images / seconds, 1),
        "trainer_cpu_s_per_1k": round(cpu * 1000 / max(images, 1), 3),
        "bytes_per_image": None if received is None else round(received / max(images, 1)),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True, help="the images dataset's folder")
    ap.add_argument("--server", required=True, help="a pushdown server over the dataset's root")
    ap.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    ap.add_argument("--side", type=int, default=224)
    ap.add_argument("--thumb", type=int, default=320)
    ap.add_argument("--batch", type=int, default=64)
    args = ap.parse_args()
    rows = [
        measure(dataloader(args.data, args.workers, args.side, args.batch), args.side),
        measure(pushdown_batches(args.server, args.side, args.thumb, args.batch), args.side),
        measure(pushdown_batches(args.server, args.side, 256, args.batch, pixels=True), args.side),
    ]
    for row in rows:
        print(json.dumps(row))
    base = rows[0]["trainer_cpu_s_per_1k"]
    for row in rows[1:]:
        print(f"{row['loader']}: trainer CPU {row['trainer_cpu_s_per_1k'] / base:.0%} of the DataLoader's")


if __name__ == "__main__":
    main()
