#!/usr/bin/env bash
# The PyTorch adapter's tests (tests/python/test_torch.py, test_torch_loop.py with real torch
# instead of its stand-in, and the torch test of test_loader.py) and the torchdata node's
# (tests/python/test_nodes.py under torchdata's own loader),
# with torch installed into .venv. Not part of `.ci/run`: PyPI's Linux torch wheel brings its
# CUDA libraries (~5 GB), too heavy for CI's cold budget. Builds the debug `pushdown` binary
# the tests serve with, as scripts/test.sh does.
set -euo pipefail
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-target}
cargo build --locked --workspace
scripts/setup-python.sh
.venv/bin/python -m pip install --quiet --disable-pip-version-check -r tests/python/requirements-torch.txt
PUSHDOWN_BIN="$target/debug/pushdown" PUSHDOWN_REQUIRE_TORCHDATA=1 \
  .venv/bin/python -m pytest -q tests/python/test_nodes.py "$@"
PUSHDOWN_BIN="$target/debug/pushdown" PUSHDOWN_REQUIRE_TORCH=1 \
  .venv/bin/python -m pytest -q tests/python/test_torch.py tests/python/test_torch_loop.py \
  tests/python/test_loader.py -k "torch or loop or epoch or pickles or int64 or batch_step or cast_to or version" "$@"
