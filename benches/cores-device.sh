#!/usr/bin/env bash
# The harness suites that need cores (`shared`, `fleet`) on a machine that has them and no Rust
# toolchain: release binaries are built elsewhere and put in DIST (`harness` and `pushdown`
# side by side, or their `.xz`: stripped, they are still too large to carry otherwise;
# `benches/cores-dist.sh DIST` builds them).
# Results go to OUT (default benches/results/cores): each suite's section of a copy of
# RESULTS.md, its log, what the machine is (cores, pinning, SMT siblings), and the shared
# suite's trainer logs. The data goes to PUSHDOWN_CORES_DATA (default /tmp/pushdown-cores-data).
#
#   benches/cores-device.sh DIST [OUT] [SUITE...]      (suites: default `shared fleet`)
#
# `PUSHDOWN_REPS` sets each suite's repetitions; the harness's own variables
# (`PUSHDOWN_TRAINERS`, `PUSHDOWN_CELL_SECONDS`, …) pass through.
set -uo pipefail
dist=$(realpath "$1") || exit 1
out=$(realpath -m "${2:-$(dirname "$0")/results/cores}")
shift $(($# < 2 ? $# : 2))
cd "$(dirname "$0")/.."
suites=${*:-shared fleet}
mkdir -p "$out"
data=${PUSHDOWN_CORES_DATA:-/tmp/pushdown-cores-data}
bin=/tmp/pushdown-cores-bin
mkdir -p "$bin"
for exe in harness pushdown; do
  if [ -f "$dist/$exe.xz" ]; then
    python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
      "$dist/$exe.xz" "$bin/$exe"
  else
    cp "$dist/$exe" "$bin/$exe"
  fi || { echo "no usable $exe in $dist" >&2; exit 1; }
  chmod +x "$bin/$exe"
done
{
  echo "cores: $(nproc) (of $(grep -c ^processor /proc/cpuinfo))"
  uname -srm
  grep -m1 'model name' /proc/cpuinfo
  echo "pinning: $(taskset -c 2 grep Cpus_allowed_list /proc/self/status 2>&1)"
  echo "ip: $(command -v ip || echo none); tc: $(command -v tc || echo none)"
  for c in 0 1 2 3 4; do
    echo "cpu$c siblings: $(cat /sys/devices/system/cpu/cpu$c/topology/thread_siblings_list 2>&1)"
  done
} > "$out/machine.txt" 2>&1
cat "$out/machine.txt"
cp benches/RESULTS.md "$out/RESULTS.md"
status=0
for suite in $suites; do
  echo "== $suite ($(date +%T))"
  "$bin/harness" "$suite" --results "$out/RESULTS.md" --data "$data" \
    ${PUSHDOWN_REPS:+--reps "$PUSHDOWN_REPS"} 2>&1 | tee "$out/$suite.log" || status=1
done
if [ -d "$data/full/shared-logs" ]; then
  tar -czf "$out/shared-logs.tgz" -C "$data/full" shared-logs
fi
echo "== done ($(date +%T))"
exit $status
