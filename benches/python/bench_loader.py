"""Trainer-side throughput: pushdown.Loader (Rust) vs numpy, same steps, same run.

Steps: shuffle (window of 4096) + random crop 56×56 + random flip + batch 256 over 64×64 RGB
images. The server decodes and downscales (decode_resize 64×64); every contender starts from
what crosses the network:

* numpy, pixels in memory: no network, no IPC decoding (its best case, a ceiling);
* numpy fed by the same stream: the reduced pixels arrive as numpy arrays (pushdown.Loader,
  no shuffle, no ops), numpy shuffles windows, crops, flips and batches: the same work as
* pushdown.Loader: stream + Rust shuffle, crop, flip, batch.

Throughput is per CPU second of this process (all its threads), so "per core".

    scripts/setup-python.sh && PUSHDOWN_PY_PROFILE=release scripts/setup-python.sh
    .venv/bin/python benches/python/bench_loader.py --server http://127.0.0.1:PORT

Also reports, for a consumer that spends --step-ms per batch (an accelerator step), the
fraction of its time spent waiting for data.
"""

import argparse
import sys
import time
from pathlib import Path

import numpy as np

import pushdown

if pushdown.BUILD_PROFILE != "release":
    sys.exit(
        f"pushdown is a {pushdown.BUILD_PROFILE} build, several times slower than what users run: "
        "PUSHDOWN_PY_PROFILE=release scripts/setup-python.sh --bench"
    )

B, CROP, WINDOW = 256, 56, 4096


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


def numpy_streamed(server, epochs, rng, compression):
    """numpy doing the client steps on the stream of reduced pixels."""
    batches = 0
    for _ in range(epochs):
        window = []
        rows = 0
        source = pushdown.Loader(
            server,
            sql="SELECT decode_resize(image, 64, 64) AS pixels FROM images",
            batch_size=1024,
            compression=compression,
        )
        for b in source:
            window.append(b["pixels"])
            rows += len(b["pixels"])
            if rows >= WINDOW:
                batches += numpy_epoch(np.concatenate(window), rng)
                window, rows = [], 0
        if window:
            batches += numpy_epoch(np.concatenate(window), rng)
    return batches


def pipeline():
    return {
        "dataset": "images",
        "steps": [
            {"op": "map", "call": "decode_resize", "input": "image", "params": [64, 64], "output": "pixels"},
            {"op": "select", "columns": ["pixels", "label"]},
            {"op": "map", "call": "random_crop", "input": "pixels", "params": [CROP, CROP]},
            {"op": "map", "call": "random_flip", "input": "pixels", "params": [0.5]},
            {"op": "shuffle", "buffer": WINDOW},
            {"op": "batch", "size": B, "drop_last": True},
        ],
    }


def rust_loader(args, epochs, compression):
    return pushdown.Loader(
        args.server,
        pipeline=pipeline(),
        seed=0,
        epochs=epochs,
        workers=args.workers,
        prefetch=8,
        compression=compression,
    )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--step-ms", type=float, default=20.0)
    ap.add_argument("--compression", default="zstd,none", help="comma-separated: zstd, lz4, none")
    ap.add_argument("--results", help="Markdown file whose `loader` section to replace")
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
    rows = [("numpy, pixels in memory (no network)", "–", np_batches, np_wall, np_cpu)]
    waits = []

    for compression in args.compression.split(","):
        c0, t0 = time.process_time(), time.perf_counter()
        ns_batches = numpy_streamed(args.server, args.epochs, rng, compression)
        rows.append(("numpy fed by the stream", compression, ns_batches, time.perf_counter() - t0, time.process_time() - c0))

        loader = rust_loader(args, args.epochs, compression)
        c0, t0 = time.process_time(), time.perf_counter()
        rs_batches = 0
        for batch in loader:
            assert batch["pixels"].shape == (B, CROP, CROP, 3)
            rs_batches += 1
        rows.append(("pushdown.Loader (stream + Rust)", compression, rs_batches, time.perf_counter() - t0, time.process_time() - c0))

        stepped = rust_loader(args, 1, compression)
        for batch in stepped:
            time.sleep(args.step_ms / 1000)
        waits.append((compression, stepped.stats))

    out = [
        f"Images: {len(pixels)} rows of 64×64×3 (server: decode_resize 64×64); {args.epochs} epochs; "
        f"shuffle window {WINDOW}; random crop {CROP}×{CROP}; random flip 0.5; batch {B}; "
        f"loader workers {args.workers}.",
        "",
        "| contender | stream compression | batches | batches/s (wall) | batches per CPU second | CPU ms per batch |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for name, comp, n, wall, cpu in rows:
        out.append(f"| {name} | {comp} | {n} | {n / wall:.1f} | {n / cpu:.1f} | {1000 * cpu / n:.1f} |")
    out.append("")
    for comp, st in waits:
        out.append(
            f"* A consumer spending {args.step_ms:.0f} ms per step ({comp}): waited {st['wait_fraction'] * 100:.1f}% "
            f"of {st['elapsed_s']:.2f} s over {st['batches']} batches."
        )
    text = "\n".join(out) + "\n"
    print(text)
    if args.results:
        write_section(Path(args.results), "loader", text, " ".join(sys.argv[1:]))


def write_section(path, name, body, argv):
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    section = (
        f"{begin}\n## Trainer side: pushdown.Loader against numpy, per CPU second\n\n"
        f"Command: `taskset -c 1 .venv/bin/python benches/python/bench_loader.py {argv}`, against "
        f"`pushdown gen images --rows 8192 --out DATA && taskset -c 0 pushdown serve --data DATA --listen ADDR --cpu-threads 1` "
        f"(release builds; the loader on one core, the server on the other).\n\n{body}{end}"
    )
    current = path.read_text() if path.exists() else ""
    a, b = current.find(begin), current.find(end)
    if a >= 0 and b > a:
        current = current[:a] + section + current[b + len(end):]
    else:
        current = current.rstrip() + "\n\n" + section + "\n"
    path.write_text(current)


if __name__ == "__main__":
    main()
