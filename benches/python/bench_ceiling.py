"""The Python `Loader`'s ceiling: `harness ceiling`'s cell through the Python module.

The feed pipeline (decode_resize at the server, random_flip, shuffle 4096, batch 256 in the
trainer) from a server whose fragment cache the harness has warmed; the loader's threads
confined by `cpu_affinity` to --cpus, and this (consuming) thread confined alike. Batches go
to torch tensors (pinned memory where CUDA is present) when torch is installed, else stay
numpy arrays. Prints one line of JSON: rows, seconds, this process's CPU seconds, and every
thread's CPU seconds by name.

    .venv/bin/python benches/python/bench_ceiling.py --server http://127.0.0.1:PORT --cpus 1 --epochs 4
"""

import argparse
import json
import os
import sys
import time

import pushdown

if pushdown.BUILD_PROFILE != "release":
    sys.exit(
        f"pushdown is a {pushdown.BUILD_PROFILE} build, several times slower than what users run: "
        "PUSHDOWN_PY_PROFILE=release scripts/setup-python.sh --bench"
    )

B = 256


def threads():
    """CPU seconds of each thread of this process, by `name#tid`."""
    out = {}
    tick = os.sysconf("SC_CLK_TCK")
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 1 :].split()
        out[f"{name}#{tid}"] = (int(fields[11]) + int(fields[12])) / tick
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--cpus", required=True, help="e.g. 1 or 0,1")
    ap.add_argument("--epochs", type=int, default=4)
    args = ap.parse_args()
    cpus = [int(c) for c in args.cpus.split(",")]
    os.sched_setaffinity(0, cpus)
    try:
        import torch

        pin = torch.cuda.is_available()
    except ImportError:
        torch, pin = None, False
    pipeline = {
        "dataset": "images",
        "steps": [
            {"op": "map", "call": "decode_resize", "input": "image", "params": [128, 128], "output": "pixels"},
            {"op": "select", "columns": ["pixels", "label"]},
            {"op": "map", "call": "random_flip", "input": "pixels", "params": [0.5]},
            {"op": "shuffle", "buffer": 4096},
            {"op": "batch", "size": B},
        ],
    }
    loader = pushdown.Loader(args.server, pipeline=pipeline, seed=1, epochs=args.epochs,
                             placement="server", cpu_affinity=cpus)
    before, cpu0, start, rows = threads(), time.process_time(), time.perf_counter(), 0
    for batch in loader:
        if torch is not None:
            x = torch.from_numpy(batch["pixels"])
            y = torch.from_numpy(batch["label"])
            if pin:
                x, y = x.pin_memory(), y.pin_memory()
        rows += len(batch["label"])
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu0
    after = threads()
    busy = sorted(((k, v - before.get(k, 0.0)) for k, v in after.items()), key=lambda kv: -kv[1])
    print(json.dumps({
        "rows": rows,
        "seconds": elapsed,
        "cpu": cpu,
        "consumer": "torch" + (" pinned" if pin else "") if torch is not None else "numpy",
        "threads": [[k, v] for k, v in busy if v > 0],
        "peak_streams": loader.stats.get("peak_streams"),
    }))


if __name__ == "__main__":
    main()
