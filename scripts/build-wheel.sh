#!/usr/bin/env bash
# What a trainer and a storage host install, built once on a machine with Rust: the Python
# package as an abi3 wheel (one wheel for every CPython >= 3.9, tagged with the lowest
# manylinux its symbols allow; it links only the C library). The wheel is both sides: its
# `pushdown` console script is the server and CLI, inside the native module. Beside it, the
# standalone `pushdown` binary (on mimalloc, for hosts without Python): the same feature
# resolution (scripts/check-features.py), so it compiles no dependency again. Into OUT
# (default dist/):
#
#   scripts/build-wheel.sh [OUT] [--debug]
#
# `--debug` builds both in the debug profile (what CI checks: the same package, quickly, from
# the test build's artifacts). `scripts/check-wheel.sh OUT` installs the wheel into a fresh
# virtual environment and runs the README's quick start against the binary.
set -euo pipefail
cd "$(dirname "$0")/.."
profile=release
out=dist
for a in "$@"; do
  if [[ "$a" == --debug ]]; then profile=dev; else out=$a; fi
done
target=${CARGO_TARGET_DIR:-target}
mkdir -p "$out"
rm -f "$out"/pushdown-*.whl
# maturin, and nothing else: the test environment (.venv, scripts/setup-python.sh) would also
# install the test oracles and build a debug module first. Its pin is the tests' one.
venv=.venv
if [[ ! -x "$venv/bin/maturin" ]]; then
  venv=.venv-build
  if [[ ! -x "$venv/bin/maturin" ]]; then
    "${PYTHON:-python3}" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
      "$(grep -E '^maturin==' tests/python/requirements.txt)"
  fi
fi
PATH="$PWD/$venv/bin:$PATH" maturin build --quiet --locked --profile "$profile" \
  -m crates/python/Cargo.toml -o "$out"
# The binary on the wheel's artifacts: every dependency resolves as it did for the wheel.
cargo build --quiet --locked --profile "$profile" -p pushdown-cli --bin pushdown ${PUSHDOWN_CARGO_TIMINGS:+--timings}
dir=$([[ "$profile" == dev ]] && echo debug || echo release)
strip -o "$out/pushdown" "$target/$dir/pushdown"
ls -l "$out"/pushdown-*.whl "$out/pushdown"
echo "the binary links: $(ldd "$out/pushdown" | awk '{print $1}' | tr '\n' ' ')"
