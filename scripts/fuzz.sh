#!/usr/bin/env bash
# Fuzzes every decoder of outside input with cargo-fuzz (libFuzzer; needs a nightly
# toolchain): the targets are the functions of crates/fuzz-targets, whose docs state each
# one's property. Not part of CI (an instrumented DataFusion build alone would take most of
# its time); CI replays every target's checked-in corpus on stable Rust instead
# (`cargo test -p pushdown-fuzz-targets`).
#
#   scripts/fuzz.sh               # every target, 60 s each
#   scripts/fuzz.sh sql 600       # one target, 10 minutes
#   FUZZ_JOBS=2 scripts/fuzz.sh parquet 1800   # two fuzzing processes sharing one corpus
#
# The corpus grows in fuzz/corpus/<target>/ itself (minimise it before committing:
# `cargo +nightly fuzz cmin TARGET`); findings land in fuzz/artifacts/<target>/, each run's
# log in fuzz/logs/<target>.log, and its figures in fuzz/ledger.tsv, from which the
# "Fuzzing" section of benches/RESULTS.md is rendered (scripts/fuzz-ledger.py).
# Seeds: PUSHDOWN_WRITE_FUZZ_SEEDS=1 cargo test -p pushdown-fuzz-targets writes the made ones
# (gen-<n>); PUSHDOWN_WRITE_FUZZ_SEEDS=fuzz/corpus cargo test -p pushdown-tests --test security
# arbitrary writes those taken from a live server (seed-<n>).
set -euo pipefail
cd "$(dirname "$0")/.."

targets=(ticket command messages flight_sql parameters prepared_handle sql pipeline loader_state
         parquet client_ipc tokens views audio)
if [[ $# -ge 1 ]]; then targets=("$1"); fi
seconds=${2:-60}

if ! rustup run nightly rustc --version >/dev/null 2>&1; then
    rustup toolchain install nightly --profile minimal
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    cargo +nightly install cargo-fuzz --locked
fi

# Parallel fuzzing processes (libFuzzer's -jobs; their own logs land in fuzz/fuzz-<n>.log).
parallel=()
if [[ ${FUZZ_JOBS:-1} -gt 1 ]]; then parallel=(-jobs="$FUZZ_JOBS" -workers="$FUZZ_JOBS"); fi
mkdir -p fuzz/logs
status=0
for target in "${targets[@]}"; do
    printf '\n==> fuzz %s for %ss\n' "$target" "$seconds"
    mkdir -p "fuzz/corpus/$target" "fuzz/artifacts/$target"
    # Built first, so the run's time is fuzzing time.
    (cd fuzz && cargo +nightly fuzz build "$target" > "logs/$target.build.log" 2>&1) ||
        { tail -n 20 "fuzz/logs/$target.build.log"; exit 1; }
    # The corpus folder grows in place (new inputs get hash names); the seeds stay.
    # The CPU seconds of the fuzzing processes are the run's time in the ledger: on a busy
    # machine, wall time overstates the fuzzing done.
    if ! (cd fuzz && /usr/bin/time -f "%U %S" -o "logs/$target.cpu" cargo +nightly fuzz run "$target" \
        "corpus/$target" -- -max_total_time="$seconds" -rss_limit_mb=4096 -timeout=30 "${parallel[@]}" \
        -print_final_stats=1 > "logs/$target.log" 2>&1); then
        status=1
        grep -E "panicked|ERROR|SUMMARY|Test unit written" "fuzz/logs/$target.log" | head -n 20 || true
    fi
    grep -E "^#[0-9]+ +DONE|stat::number_of_executed_units" "fuzz/logs/$target.log" || true
    # (time's file starts with "Command exited with non-zero status N" when the fuzzer
    # stopped on a finding or was interrupted; the figures are its last line.)
    cpu=$(tail -n 1 "fuzz/logs/$target.cpu" 2>/dev/null | awk '{print int($1 + $2)}')
    python3 scripts/fuzz-ledger.py add "$target" "${cpu:-0}" "fuzz/logs/$target.log"
done
python3 scripts/fuzz-ledger.py render
exit $status
