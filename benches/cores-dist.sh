#!/usr/bin/env bash
# Builds what `benches/cores-device.sh` runs on a lent machine that has no Rust toolchain:
# release `harness` and `pushdown`, stripped and xz-compressed into DIST (default
# target/device-dist), small enough to carry (about 25 MB each; stripped alone, 160 MB).
#
#   benches/cores-dist.sh [DIST]
#
# CARGO_TARGET_DIR is honoured (the release build is shared with the benchmarks').
set -euo pipefail
cd "$(dirname "$0")/.."
dist=${1:-target/device-dist}
target=${CARGO_TARGET_DIR:-target}
cargo build --release -p pushdown-cli -p pushdown-benches --bin pushdown --bin harness
mkdir -p "$dist"
for exe in harness pushdown; do
  strip -o "$dist/$exe" "$target/release/$exe"
  xz -9 -T2 -f "$dist/$exe"
done
ls -l "$dist"
