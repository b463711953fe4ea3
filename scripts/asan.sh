#!/usr/bin/env bash
# Runs the Rust test suite under AddressSanitizer (nightly Rust): the standard library and
# every crate rebuilt instrumented (-Zbuild-std), LeakSanitizer on, in a target folder of
# its own. Not part of CI (the instrumented build alone takes most of an hour on 2 cores).
#
#   scripts/asan.sh                       # the whole workspace
#   scripts/asan.sh -p pushdown-client    # extra arguments go to `cargo test`
#
# The log lands in asan.log (gitignored); a finding is a report starting with
# "ERROR: AddressSanitizer" or "ERROR: LeakSanitizer" in it, and its test fails.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! rustup run nightly rustc --version >/dev/null 2>&1; then
    rustup toolchain install nightly --profile minimal
fi
rustup component add rust-src --toolchain nightly >/dev/null
host=$(rustc +nightly -vV | sed -n 's/^host: //p')

export RUSTFLAGS="-Zsanitizer=address"
export RUSTDOCFLAGS="-Zsanitizer=address"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:detect_stack_use_after_return=1:abort_on_error=0}"
export CARGO_TARGET_DIR="${PUSHDOWN_ASAN_TARGET:-$HOME/.cache/pushdown/asan-target}"
export CARGO_INCREMENTAL=0
status=0
cargo +nightly test -Zbuild-std --target "$host" --workspace --no-fail-fast "$@" > asan.log 2>&1 || status=$?
grep -E "^test result|FAILED|ERROR: (Address|Leak)Sanitizer|SUMMARY: " asan.log | sort | uniq -c | sort -rn | head -n 40
exit $status
