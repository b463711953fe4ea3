#!/usr/bin/env bash
# `harness feed` and its GPU companion on a machine with an accelerator and no Rust toolchain:
# release binaries and the Python package are built elsewhere into DIST by
# `benches/cores-dist.sh DIST --python` (`pushdown`, which serves, `harness` for the CPU
# suite, and `python/pushdown/` with its `_native` module; any may be `.xz`-compressed). Needs python3 with torch,
# pyarrow, numpy and pillow. Results go to OUT (default benches/results/gpu): the feed section
# of RESULTS.md, and one JSON line per GPU run; the data goes to PUSHDOWN_FEED_DATA (default
# /tmp/pushdown-feed-data). Arguments after OUT go to `harness feed` (e.g. `--reps 1`);
# PUSHDOWN_GPU_STEPS sets the measured ResNet-50 steps of each GPU run (default 200). The GPU
# runs come first, then torchvision's train recipe at 224 px (bench_recipe.py, and ResNet-50
# fed by it), then the CPU feed suite (the longest; PUSHDOWN_FEED_CPU=0 leaves it out), so a
# short loan still measures the GPU.
#
#   benches/feed-gpu.sh DIST [OUT] [HARNESS-FEED-ARGS...]
set -euo pipefail
cd "$(dirname "$0")/.."
packed=$(realpath "$1")
out=$(realpath -m "${2:-benches/results/gpu}")
shift $(($# < 2 ? $# : 2))
mkdir -p "$out"
# Unpacked where it can run: a copy, with the compressed files expanded.
dist=/tmp/pushdown-feed-dist
scripts/unpack-dist.sh "$packed" "$dist"
steps=${PUSHDOWN_GPU_STEPS:-200}
cores=$(nproc)
half=$((cores / 2))
export PUSHDOWN_PYTHON=${PUSHDOWN_PYTHON:-python3}

# 1. The images (8,192, as `harness feed` makes them), unless already there.
data=${PUSHDOWN_FEED_DATA:-/tmp/pushdown-feed-data}
if [[ ! -d "$data/full/images" ]]; then
  "$dist/pushdown" gen images --rows 8192 --out "$data/full" > /dev/null
fi

# 2. ResNet-50 on the GPU: the ceiling, pushdown (server on half the cores, trainer on the
# other half), ResNet-18 likewise, both with the trainer on 4 cores, and the DataLoader on
# the trainer's half and on every core.
images="$data/full/images"
export PYTHONPATH="$dist/python${PYTHONPATH:+:$PYTHONPATH}"
gpu() { python3 benches/python/bench_feed_gpu.py --steps "$steps" "$@" | tee -a "$out/gpu.jsonl"; }
gpu --feed synthetic
# As `harness serve` makes it: the fragment cache off, `half` CPU threads.
taskset -c "0-$((half - 1))" "$dist/pushdown" serve --data "$data/full" \
  --listen 127.0.0.1:0 --cpu-threads "$half" --cache off > "$out/serve.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 100); do grep -q "listening on" "$out/serve.log" && break; sleep 0.2; done
addr=$(grep -o "listening on [^ ]*" "$out/serve.log" | head -1 | cut -d' ' -f3)
pushdown_on() {  # CPUS MODEL: the Python loader on CPUS feeding MODEL
  taskset -c "$1" python3 benches/python/bench_feed_gpu.py --steps "$steps" --feed pushdown --model "$2" \
    --server "http://$addr" --server-pid "$server" --server-cores "$half" | tee -a "$out/gpu.jsonl"
}
pushdown_on "$half-$((cores - 1))" resnet50
# ResNet-18, whose step outruns the servers: its own ceiling, then fed by pushdown (the
# figure measures the loader against the servers' capacity, not the model).
gpu --feed synthetic --model resnet18
pushdown_on "$half-$((cores - 1))" resnet18
# The trainer confined to 4 cores (as a node's share per GPU often is), both models.
if ((cores - half > 4)); then
  pushdown_on "$half-$((half + 3))" resnet50
  pushdown_on "$half-$((half + 3))" resnet18
fi
taskset -c "$half-$((cores - 1))" python3 benches/python/bench_feed_gpu.py --steps "$steps" --feed dataloader \
  --data "$images" --workers "$half" | tee -a "$out/gpu.jsonl"
gpu --feed dataloader --data "$images" --workers "$cores"

# 3. torchvision's train recipe at 224 px (bench_recipe.py): the CPU-only comparison, then
# ResNet-50 fed by pushdown (bfloat16 NCHW from the loader) and by the PIL DataLoader.
taskset -c "$half-$((cores - 1))" python3 benches/python/bench_recipe.py --data "$images" \
  --server "http://$addr" --workers "$half" --batch 256 | tee "$out/recipe.log"
taskset -c "$half-$((cores - 1))" python3 benches/python/bench_feed_gpu.py --steps "$steps" --recipe \
  --feed pushdown --server "http://$addr" --server-pid "$server" | tee -a "$out/gpu.jsonl"
taskset -c "$half-$((cores - 1))" python3 benches/python/bench_feed_gpu.py --steps "$steps" --recipe \
  --feed dataloader --data "$images" --workers "$half" | tee -a "$out/gpu.jsonl"
kill $server 2>/dev/null || true

# 4. The CPU-only feed suite: half the cores serve, the other half train (the longest part;
# PUSHDOWN_FEED_CPU=0 leaves it out).
if [[ "${PUSHDOWN_FEED_CPU:-1}" != 0 && -x "$dist/harness" ]]; then
  cp benches/RESULTS.md "$out/RESULTS.md"
  "$dist/harness" feed --results "$out/RESULTS.md" --data "$data" "$@" 2>&1 | tee "$out/feed.log"
fi
