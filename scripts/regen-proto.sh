#!/usr/bin/env bash
# Regenerates the checked-in prost code from proto/ and fails if it changed.
# Usage: scripts/regen-proto.sh [--check]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo run --quiet -p pushdown-protocol-gen
cargo fmt -p pushdown-protocol
if [[ "${1:-}" == "--check" ]]; then
  if ! git diff --exit-code -- crates/protocol/src/generated; then
    echo "generated proto code is stale: run scripts/regen-proto.sh and commit" >&2
    exit 1
  fi
fi
