#!/usr/bin/env bash
# Copies what `benches/cores-dist.sh` packed (DIST) to DEST with its `.xz` files expanded, for
# a machine with python3 and no xz: `benches/feed-gpu.sh` and `scripts/test-torch-device.sh`.
#
#   scripts/unpack-dist.sh DIST DEST
set -euo pipefail
rm -rf "$2"
cp -r "$1" "$2"
find "$2" -name '*.xz' -print0 | while IFS= read -r -d '' f; do
  python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
    "$f" "${f%.xz}"
  rm "$f"
done
for exe in harness pushdown; do
  if [[ -f "$2/$exe" ]]; then chmod +x "$2/$exe"; fi
done
