#!/usr/bin/env bash
# Minimises fuzz corpora before they are committed (cargo-fuzz's cmin: libFuzzer's -merge=1,
# keeping the fewest inputs with the same coverage). The named inputs stay as they are: the
# seeds (`seed-*` taken from a live server, `gen-*` made by the encoders) and every crash
# once found (`regression-*`), whatever their coverage.
#
#   scripts/fuzz-cmin.sh            # every target with a corpus
#   scripts/fuzz-cmin.sh sql        # one
set -euo pipefail
cd "$(dirname "$0")/.."
targets=("$@")
if [[ ${#targets[@]} -eq 0 ]]; then
    mapfile -t targets < <(ls fuzz/corpus)
fi
for target in "${targets[@]}"; do
    dir="fuzz/corpus/$target"
    keep=$(mktemp -d)
    find "$dir" -maxdepth 1 -type f \( -name 'seed-*' -o -name 'gen-*' -o -name 'regression-*' \) \
        -exec mv {} "$keep/" \;
    before=$(( $(ls "$dir" | wc -l) + $(ls "$keep" | wc -l) ))
    (cd fuzz && cargo +nightly fuzz cmin "$target" "corpus/$target" -- -rss_limit_mb=4096 -timeout=30 \
        > "logs/$target.cmin.log" 2>&1) || { tail -n 20 "fuzz/logs/$target.cmin.log"; exit 1; }
    mv "$keep"/* "$dir/" 2>/dev/null || true
    rmdir "$keep"
    echo "cmin $target: $before -> $(ls "$dir" | wc -l) inputs, $(du -sh "$dir" | cut -f1)"
done
