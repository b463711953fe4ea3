#!/usr/bin/env bash
# Proves the wheel works alone: a fresh virtual environment outside the checkout gets the
# wheel from OUT (as `scripts/build-wheel.sh OUT` made it) and pyarrow from PyPI; the wheel's
# own `pushdown` console script (not OUT's binary, not the checkout's) generates a dataset and
# serves it, and the README's quick start (its Python block, as written, on the port chosen
# here) reads it.
#
#   scripts/check-wheel.sh OUT
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(realpath "${1:-dist}")
wheel=$(ls "$out"/pushdown-*.whl | head -1)
work=$(mktemp -d)
server=""
trap '[[ -n "$server" ]] && kill "$server" 2>/dev/null; rm -rf "$work"' EXIT
# The quick start's Python block, between its markers in the README.
python3 - README.md "$work/quickstart.py" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
block = re.search(r"<!-- quickstart:python -->\s*```python\n(.*?)```", text, re.S)
if not block:
    sys.exit("README.md: no ```python block after <!-- quickstart:python -->")
open(sys.argv[2], "w").write(block.group(1))
PY
python3 -m venv "$work/venv"
"$work/venv/bin/python" -m pip install --quiet --disable-pip-version-check "$wheel" pyarrow
cd "$work"
# The console script, from the venv's bin/ (PATH holds no other `pushdown`).
pushdown="$work/venv/bin/pushdown"
[[ -x "$pushdown" ]] || { echo "the wheel installed no pushdown console script" >&2; exit 1; }
"$pushdown" --version
"$pushdown" gen images --rows 1000 --out data > /dev/null
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$pushdown" serve --data data --listen "127.0.0.1:$port" > serve.log 2>&1 &
server=$!
for _ in $(seq 150); do grep -q "listening on" serve.log && break; sleep 0.2; done
grep -q "listening on" serve.log || { cat serve.log; exit 1; }
sed -i "s/127.0.0.1:50051/127.0.0.1:$port/" quickstart.py
cat >> quickstart.py <<'PY'

# check-wheel.sh: what the quick start must have read.
import os
assert pushdown.__file__.startswith(os.environ["CHECK_VENV"]), pushdown.__file__
assert batch["pixels"].shape[1:] == (64, 64, 3) and str(batch["pixels"].dtype) == "uint8", batch["pixels"].shape
assert (batch["label"] < 10).all()
print(f"the quick start read {len(loader)} batches per epoch from {pushdown.__file__}")
PY
CHECK_VENV="$work/venv" "$work/venv/bin/python" quickstart.py
