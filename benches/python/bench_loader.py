"""Trainer-side throughput: pushdown.Loader (Rust) vs numpy, same steps, same run.

Steps: shuffle + random crop 56×56 + random flip + batch 256 over 64×64 RGB images.
The server decodes and downscales (decode_resize 64×64); both contenders start from what
crosses the network. numpy gets the pixels already in memory (no network, no IPC decoding:
its best case); the Rust loader pays for receiving and decoding the stream too. Throughput is
per CPU second of this process (all its threads), so "per core".

    scripts/setup-python.sh && PUSHDOWN_PY_PROFILE=release scripts/setup-python.sh
    .venv/bin/python benches/python/bench_loader.py --server http://127.0.0.1:PORT

Also reports, for a consumer that spends --step-ms per batch (an accelerator step), the
fraction of its time spent waiting for data.
"""

import argparse
import time

import numpy as np

import pushdown

B, CROP = 256, 56


def numpy_epoch(pixels, rng):
    n = len(pixels)
    order = rng.permutation(n)
    batches = 0
    for start in range(0, n - B + 1, B):
        idx = order[start : start + B]
        ys = rng.integers(0, 64 - CROP + 1, B)
        xs = rng.integers(0, 64 - CROP + 1, B)
        flip = rng.random(B) < 0.5
        # Per-sample crop offsets: gather with broadcast index arrays.
        rows = ys[:, None] + np.arange(CROP)[None, :]
        cols = xs[:, None] + np.arange(CROP)[None, :]
        cols = np.where(flip[:, None], cols[:, ::-1], cols)
        batch = pixels[idx[:, None, None], rows[:, :, None], cols[:, None, :]]
        batches += 1
        assert batch.shape == (B, CROP, CROP, 3)
    return batches


def pipeline():
    return {
        "dataset": "images",
        "steps": [
            {"op": "map", "call": "decode_resize", "input": "image", "params": [64, 64], "output": "pixels"},
            {"op": "select", "columns": ["pixels", "label"]},
            {"op": "map", "call": "random_crop", "input": "pixels", "params": [CROP, CROP]},
            {"op": "map", "call": "random_flip", "input": "pixels", "params": [0.5]},
            {"op": "shuffle", "buffer": 4096},
            {"op": "batch", "size": B, "drop_last": True},
        ],
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--step-ms", type=float, default=20.0)
    args = ap.parse_args()

    # The reduced pixels, once, for numpy.
    pixels = np.concatenate(
        [
            b["pixels"]
            for b in pushdown.Loader(
                args.server, sql="SELECT decode_resize(image, 64, 64) AS pixels FROM images", batch_size=1024
            )
        ]
    )
    rng = np.random.default_rng(0)
    c0, t0 = time.process_time(), time.perf_counter()
    np_batches = sum(numpy_epoch(pixels, rng) for _ in range(args.epochs))
    np_cpu, np_wall = time.process_time() - c0, time.perf_counter() - t0

    loader = pushdown.Loader(
        args.server, pipeline=pipeline(), seed=0, epochs=args.epochs, workers=args.workers, prefetch=8
    )
    c0, t0 = time.process_time(), time.perf_counter()
    rs_batches = 0
    for batch in loader:
        assert batch["pixels"].shape == (B, CROP, CROP, 3)
        rs_batches += 1
    rs_cpu, rs_wall = time.process_time() - c0, time.perf_counter() - t0

    stepped = pushdown.Loader(
        args.server, pipeline=pipeline(), seed=0, epochs=1, workers=args.workers, prefetch=8
    )
    for batch in stepped:
        time.sleep(args.step_ms / 1000)
    waited = stepped.stats

    print(f"images: {len(pixels)} rows of 64x64x3; {args.epochs} epochs; batch {B}; crop {CROP}; workers {args.workers}")
    print("| contender | batches | batches/s (wall) | batches per CPU second |")
    print("|---|---:|---:|---:|")
    print(f"| numpy (pixels in memory) | {np_batches} | {np_batches / np_wall:.1f} | {np_batches / np_cpu:.1f} |")
    print(f"| pushdown.Loader (stream + Rust ops) | {rs_batches} | {rs_batches / rs_wall:.1f} | {rs_batches / rs_cpu:.1f} |")
    print(
        f"consumer at {args.step_ms:.0f} ms/step: waited {waited['wait_fraction'] * 100:.1f}% of "
        f"{waited['elapsed_s']:.2f} s over {waited['batches']} batches"
    )


if __name__ == "__main__":
    main()
