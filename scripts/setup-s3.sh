#!/usr/bin/env bash
# Installs the S3-compatible server the tests and benchmarks use: s3s-fs (crates.io), a Rust
# S3 server that keeps objects as files on disk and checks SigV4 request signatures: real
# storage semantics over HTTP, unlike an in-memory mock. Idempotent; prints the binary's path.
set -euo pipefail
version=0.14.1 # 0.15+ needs a newer rustc than the toolchain here
tools=${PUSHDOWN_TOOLS:-$HOME/.cache/pushdown/tools}
bin="$tools/bin/s3s-fs"
if [[ ! -x "$bin" ]] || [[ "$("$bin" --version 2>/dev/null)" != "s3s-fs $version" ]]; then
  echo "installing s3s-fs $version into $tools (about 2 minutes, once)" >&2
  # Its own target directory: never the workspace's (a concurrent build would wait on its lock).
  CARGO_TARGET_DIR="$tools/build" cargo install --quiet --locked --root "$tools" \
    --features binary "s3s-fs@$version" >&2
  rm -rf "$tools/build"
fi
echo "$bin"
