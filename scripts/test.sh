#!/usr/bin/env bash
# The project's test command (README, CI): formatting, generated code, lints, docs, the Rust
# tests (unit, differential, I/O accounting, end-to-end), the Python interop tests, and the
# wheel installed where the source tree is not.
set -euo pipefail
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-target}

step() { printf '\n==> %s\n' "$*"; }

# FFmpeg's libraries (the video ops), ffmpeg, sox and espeak-ng (the media tests' data), from
# Debian's packages; every cargo command below builds the video ops (one feature set, so
# nothing is compiled twice).
step "media libraries and tools (scripts/setup-media.sh)"
scripts/setup-media.sh
features=(--features pushdown-ops/video)
# The workspace without the protobuf generator (built alone by regen-proto.sh, linted below):
# its protox would give the test build features no other build has (check-features.py).
ws=(--workspace --exclude pushdown-protocol-gen)

step "cargo fmt --check"
cargo fmt --all -- --check

step "generated proto code is up to date"
scripts/regen-proto.sh --check

step "layers: imports go down each crate's documented layers, no gRPC in the engine, no product function over 80 lines"
python3 scripts/check-layers.py
python3 scripts/check-layers.py --plant
python3 scripts/long-functions.py 80 --check

step "one feature resolution: the test build, the wheel, the CLI and the harness compile each dependency once"
python3 scripts/check-features.py
python3 scripts/check-features.py --plant

step "clippy"
cargo clippy --locked "${ws[@]}" --all-targets "${features[@]}" -- -D warnings
cargo clippy --locked -p pushdown-protocol-gen -- -D warnings

step "docs"
RUSTDOCFLAGS="-D warnings" cargo doc --locked "${ws[@]}" --no-deps --quiet "${features[@]}"

step "cargo test"
cargo test --locked "${ws[@]}" "${features[@]}"

step "python interop (pyarrow.flight)"
cargo build --locked "${ws[@]}" "${features[@]}"
scripts/setup-python.sh
s3_server=$(scripts/setup-s3.sh)
PUSHDOWN_BIN="$target/debug/pushdown" PUSHDOWN_S3_SERVER="$s3_server" .venv/bin/python -m pytest -q tests/python

step "soak, 2 minutes: two servers under mixed load, one SIGKILLed every minute (harness soak)"
PUSHDOWN_BIN="$target/debug/pushdown" "$target/debug/harness" soak --quick --minutes 2 --kill-every 1 \
  --phase-secs 40 --quiet-secs 12 --data "$target/bench-data" --out "$target/soak-ci" \
  --results "$target/soak-ci.md" > /dev/null

step "the wheel in a fresh virtual environment, outside the checkout (the README's quick start)"
scripts/build-wheel.sh "$target/wheel-check" --debug
scripts/check-wheel.sh "$target/wheel-check"
