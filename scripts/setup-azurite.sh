#!/usr/bin/env bash
# Installs Azurite, Microsoft's own Azure Storage emulator (npm), for the Azure Blob tests
# (tests/python/test_clouds.py), once, under the tools folder; prints the path of its blob
# service (`azurite-blob`). Needs Node.js and npm.
set -euo pipefail
version=3.37.0
tools=${PUSHDOWN_TOOLS:-$HOME/.cache/pushdown/tools}
dir="$tools/azurite-$version"
bin="$dir/node_modules/.bin/azurite-blob"
if [[ ! -x "$bin" ]]; then
  echo "installing Azurite $version into $dir" >&2
  mkdir -p "$dir"
  npm install --silent --no-audit --no-fund --prefix "$dir" "azurite@$version" >&2
fi
echo "$bin"
