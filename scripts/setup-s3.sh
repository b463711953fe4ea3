#!/usr/bin/env bash
# Builds the S3-compatible server the tests and benchmarks use: tools/s3-server, s3s-fs's
# storage (crates.io; objects kept as files on disk, SigV4 signatures checked: real storage
# semantics over HTTP, unlike an in-memory mock) behind a listener with TCP_NODELAY (s3s-fs's
# own binary stalls ~40 ms at the end of each ranged GET on Nagle's algorithm). Rebuilt when
# its sources change; prints the binary's path.
set -euo pipefail
cd "$(dirname "$0")/.."
tools=${PUSHDOWN_TOOLS:-$HOME/.cache/pushdown/tools}
bin="$tools/bin/s3-server"
stamp="$tools/s3-server.sources"
sources=$(cat tools/s3-server/Cargo.toml tools/s3-server/Cargo.lock tools/s3-server/src/*.rs | sha256sum | cut -d' ' -f1)
if [[ ! -x "$bin" ]] || [[ "$(cat "$stamp" 2>/dev/null)" != "$sources" ]]; then
  echo "building the S3 server into $tools (about 2 minutes, once)" >&2
  # Its own target directory: never the workspace's (a concurrent build would wait on its lock).
  CARGO_TARGET_DIR="$tools/build" cargo install --quiet --locked --force --root "$tools" \
    --path tools/s3-server >&2
  rm -rf "$tools/build"
  echo "$sources" > "$stamp"
fi
echo "$bin"
