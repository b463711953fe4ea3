"""The DataLoader-style contender of `harness feed`: the trainer host decodes.

What a PyTorch user writes without pushdown: worker processes read the Parquet files
(pyarrow, one row group at a time), decode each JPEG with PIL, resize it to 128x128
(bilinear, as torchvision's ``Resize``), flip it at random, and hand batches of 256 to the
training loop through the DataLoader's queues, two batches prefetched per worker; each
worker shuffles within its own window (4096 / workers rows), as an IterableDataset does. With
torch importable it runs ``torch.utils.data.DataLoader`` itself (tensors through shared
memory); without, the same workers on ``multiprocessing`` queues.

The consumer takes a batch, then "trains" for ``256 / demand`` seconds (``--demand`` samples/s;
0: no step). Prints one JSON line: rows, seconds, seconds waited for batches (and for the first one), CPU seconds of
this process and its workers, and which loader ran.

    .venv/bin/python benches/python/bench_feed.py --data DIR/images --workers 4 --demand 2000
"""

import argparse
import io
import json
import os
import random
import resource
import sys
import time

import numpy as np
import pyarrow.parquet as pq
from PIL import Image

BATCH, SIDE, WINDOW = 256, 128, 4096


def row_groups(data):
    files = sorted(
        os.path.join(data, f) for f in os.listdir(data) if f.endswith(".parquet")
    )
    return [(f, rg) for f in files for rg in range(pq.ParquetFile(f).num_row_groups)]


def decode(jpeg, rng):
    img = Image.open(io.BytesIO(jpeg)).convert("RGB").resize((SIDE, SIDE), Image.BILINEAR)
    pixels = np.asarray(img)
    return pixels[:, ::-1] if rng.random() < 0.5 else pixels


def samples(units, seed, window):
    """One worker's samples: its row groups decoded, shuffled within its window."""
    rng = random.Random(seed)
    buffer = []
    for path, rg in units:
        table = pq.ParquetFile(path).read_row_group(rg, columns=["image", "label"])
        images = table.column("image").to_pylist()
        labels = table.column("label").to_pylist()
        for jpeg, label in zip(images, labels):
            buffer.append((decode(jpeg, rng), label))
            if len(buffer) >= window:
                i = rng.randrange(len(buffer))
                buffer[i], buffer[-1] = buffer[-1], buffer[i]
                yield buffer.pop()
    rng.shuffle(buffer)
    yield from buffer


def batches(units, seed, window):
    pixels, labels = [], []
    for p, label in samples(units, seed, window):
        pixels.append(p)
        labels.append(label)
        if len(pixels) == BATCH:
            yield np.stack(pixels), np.asarray(labels)
            pixels, labels = [], []
    if pixels:
        yield np.stack(pixels), np.asarray(labels)


def share(units, worker, workers):
    return units[worker::workers]


def torch_epochs(units, workers, epochs, seed):
    import torch
    from torch.utils.data import DataLoader, IterableDataset, get_worker_info

    window = max(1, WINDOW // workers)

    class Images(IterableDataset):
        def __init__(self, epoch):
            self.epoch = epoch

        def __iter__(self):
            info = get_worker_info()
            w, n = (info.id, info.num_workers) if info else (0, 1)
            for pixels, labels in batches(share(units, w, n), seed * 1000 + self.epoch * 100 + w, window):
                yield torch.from_numpy(pixels), torch.from_numpy(labels)

    for epoch in range(epochs):
        loader = DataLoader(Images(epoch), batch_size=None, num_workers=workers, prefetch_factor=2)
        yield from loader


def _worker(units, seed, window, queue):
    for b in batches(units, seed, window):
        queue.put(b)
    queue.put(None)


def mp_epochs(units, workers, epochs, seed):
    import multiprocessing as mp

    window = max(1, WINDOW // workers)
    for epoch in range(epochs):
        queue = mp.Queue(maxsize=2 * workers)
        procs = [
            mp.Process(target=_worker, args=(share(units, w, workers), seed * 1000 + epoch * 100 + w, window, queue))
            for w in range(workers)
        ]
        for p in procs:
            p.start()
        done = 0
        while done < workers:
            b = queue.get()
            if b is None:
                done += 1
            else:
                yield b
        for p in procs:
            p.join()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True, help="the images dataset's folder")
    ap.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    ap.add_argument("--demand", type=float, default=0.0, help="samples/s the consumer takes (0: no step)")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--loader", choices=["auto", "torch", "mp"], default="auto")
    args = ap.parse_args()

    units = row_groups(args.data)
    kind = args.loader
    if kind == "auto":
        try:
            import torch  # noqa: F401

            kind = "torch"
        except ImportError:
            kind = "mp"
    epochs = torch_epochs if kind == "torch" else mp_epochs
    rows, waited, first_wait = 0, 0.0, None
    start = time.perf_counter()
    it = epochs(units, args.workers, args.epochs, args.seed)
    while True:
        asked = time.perf_counter()
        b = next(it, None)
        waited += time.perf_counter() - asked
        if first_wait is None:
            first_wait = waited
        if b is None:
            break
        n = len(b[1])
        rows += n
        if args.demand > 0:
            time.sleep(n / args.demand)
    elapsed = time.perf_counter() - start
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime
    loader = "torch.utils.data.DataLoader" if kind == "torch" else "multiprocessing workers"
    json.dump(
        {
            "rows": rows,
            "elapsed": elapsed,
            "waited": waited,
            "first_wait": first_wait or 0.0,
            "cpu_s": cpu,
            "loader": loader,
            "workers": args.workers,
        },
        sys.stdout,
    )
    print()


if __name__ == "__main__":
    main()
