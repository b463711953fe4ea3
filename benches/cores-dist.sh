#!/usr/bin/env bash
# Builds what `benches/cores-device.sh` and `benches/feed-gpu.sh` run on a lent machine that has
# no Rust toolchain: release `harness` and `pushdown`, stripped and xz-compressed into DIST
# (default target/device-dist), small enough to carry (about 25 MB each; stripped alone,
# 160 MB). `--python` adds the release Python package (`python/pushdown/`, its `_native`
# module stripped and compressed the same way) that `feed-gpu.sh` imports.
#
#   benches/cores-dist.sh [DIST] [--python]
#
# CARGO_TARGET_DIR is honoured (the release build is shared with the benchmarks').
set -euo pipefail
cd "$(dirname "$0")/.."
python=false
args=()
for a in "$@"; do
  if [[ "$a" == --python ]]; then python=true; else args+=("$a"); fi
done
dist=${args[0]:-target/device-dist}
target=${CARGO_TARGET_DIR:-target}
cargo build --release -p pushdown-cli -p pushdown-benches --bin pushdown --bin harness
mkdir -p "$dist"
for exe in harness pushdown; do
  strip -o "$dist/$exe" "$target/release/$exe"
  xz -9 -T2 -f "$dist/$exe"
done
if $python; then
  wheels=$(mktemp -d)
  PATH="$PWD/.venv/bin:$PATH" maturin build --quiet --release -m crates/python/Cargo.toml -o "$wheels"
  rm -rf "$dist/python"
  mkdir -p "$dist/python"
  python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' \
    "$(ls "$wheels"/*.whl | head -1)" "$dist/python"
  native=$(ls "$dist"/python/pushdown/_native*.so)
  strip "$native"
  xz -9 -T2 -f "$native"
  rm -rf "$wheels"
fi
ls -lR "$dist"
