#!/usr/bin/env bash
# The PyTorch adapter's tests under real torch on a machine with torch and no Rust toolchain
# (a lent GPU machine): the release `pushdown` binary and Python package packed into DIST by
# `benches/cores-dist.sh DIST --python` (either may be `.xz`-compressed). Runs what
# `scripts/test-torch.sh` runs, with that machine's python3 (which needs torch, pyarrow, numpy
# and pytest). A torchdata wheel in DIST (pure Python; `pip download --no-deps torchdata`) is
# unpacked beside the package, and `pushdown.nodes` is then tested under torchdata's own loader.
# Arguments go to pytest.
#
#   scripts/test-torch-device.sh DIST [PYTEST-ARGS...]
set -euo pipefail
cd "$(dirname "$0")/.."
packed=$(realpath "$1")
shift
dist=/tmp/pushdown-torch-dist
scripts/unpack-dist.sh "$packed" "$dist"
nodes=()
for wheel in "$dist"/torchdata-*.whl; do
  [[ -f "$wheel" ]] || continue
  python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$wheel" "$dist/python"
  export PUSHDOWN_REQUIRE_TORCHDATA=1
  nodes=(tests/python/test_nodes.py)
done
PYTHONPATH="$dist/python" PUSHDOWN_BIN="$dist/pushdown" PUSHDOWN_REQUIRE_TORCH=1 \
  python3 -m pytest -q -p no:cacheprovider "${nodes[@]}" tests/python/test_torch.py tests/python/test_torch_loop.py \
  tests/python/test_loader.py -k "torch or loop or epoch or pickles or int64 or batch_step or cast_to or version" "$@"
