#!/usr/bin/env bash
# Builds the S3-compatible server the tests and benchmarks use: tools/s3-server, s3s-fs's
# storage (crates.io; objects kept as files on disk, SigV4 signatures checked: real storage
# semantics over HTTP, unlike an in-memory mock), its GETs read with one pread (s3s-fs reads
# 4 KiB at a time, one blocking task each) behind a listener with TCP_NODELAY (s3s-fs's own
# binary stalls ~40 ms at the end of each ranged GET on Nagle's algorithm). Built again
# whenever its sources change; prints the binary's path.
set -euo pipefail
tools=${PUSHDOWN_TOOLS:-$HOME/.cache/pushdown/tools}
mkdir -p "$tools"
tools=$(cd "$tools" && pwd) # absolute, before leaving the caller's directory
cd "$(dirname "$0")/.."
bin="$tools/bin/s3-server"
stamp="$tools/s3-server.sources"
sources=$(find tools/s3-server -path tools/s3-server/target -prune -o -type f -print | LC_ALL=C sort |
  xargs cat | cksum)
if [[ ! -x "$bin" ]] || [[ "$(cat "$stamp" 2>/dev/null)" != "$sources" ]]; then
  echo "building the S3 server into $tools (about 2 minutes)" >&2
  # Its own target directory: never the workspace's (a concurrent build would wait on its lock).
  CARGO_TARGET_DIR="$tools/build" cargo install --quiet --locked --force --root "$tools" \
    --path tools/s3-server >&2
  rm -rf "$tools/build"
  echo "$sources" > "$stamp"
fi
echo "$bin"
