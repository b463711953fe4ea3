#!/usr/bin/env bash
# Fuzzes the server's entry points with cargo-fuzz (libFuzzer; needs a nightly toolchain):
# ticket and command decoding, Flight SQL prepared-statement handles, and the SQL entry point
# of a real server. Not part of CI: an instrumented DataFusion build alone would take most
# of CI's time. The test suite runs seeded property tests over the same entry points on
# stable Rust (tests/tests/security.rs).
#
#   scripts/fuzz.sh               # every target, 60 s each
#   scripts/fuzz.sh sql 600       # one target, 10 minutes
#
# Seeds are checked in under fuzz/corpus/<target>/; findings land in fuzz/artifacts/<target>/.
# Regenerate the binary seeds from a live server with:
#   PUSHDOWN_WRITE_FUZZ_SEEDS=fuzz/corpus cargo test -p pushdown-tests --test security arbitrary
set -euo pipefail
cd "$(dirname "$0")/.."

targets=(ticket command prepared_handle sql)
if [[ $# -ge 1 ]]; then targets=("$1"); fi
seconds=${2:-60}

if ! rustup run nightly rustc --version >/dev/null 2>&1; then
    rustup toolchain install nightly --profile minimal
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    cargo +nightly install cargo-fuzz --locked
fi

for target in "${targets[@]}"; do
    printf '\n==> fuzz %s for %ss\n' "$target" "$seconds"
    mkdir -p "fuzz/corpus/$target"
    # A scratch copy of the corpus grows; the checked-in seeds stay as they are.
    work=$(mktemp -d)
    cp -r "fuzz/corpus/$target/." "$work/"
    (cd fuzz && cargo +nightly fuzz run "$target" "$work" -- -max_total_time="$seconds" -rss_limit_mb=4096)
    rm -rf "$work"
done
