#!/usr/bin/env python3
"""Product functions longer than a limit (default 80 lines), longest first.

Counts a function from its `fn` line to its closing brace; skips test modules (`#[cfg(test)]
mod tests` to the end of the file, and `tests.rs` files), benches, fuzz targets and tests/.
Usage: scripts/long-functions.py [LIMIT] [--check]  (--check: exit 1 when any is over)
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
FN = re.compile(r"^\s*(?:pub(?:\([\w:]+\))?\s+)?(?:const\s+)?(?:async\s+)?(?:unsafe\s+)?fn\s+(\w+)")


def functions(path):
    lines = path.read_text().splitlines()
    cut = next((i for i, l in enumerate(lines) if re.match(r"\s*#\[cfg\(test\)\]", l)
                and i + 1 < len(lines) and re.match(r"\s*mod tests", lines[i + 1])), len(lines))
    i = 0
    while i < cut:
        m = FN.match(lines[i])
        if not m:
            i += 1
            continue
        depth, start, opened = 0, i, False
        j = i
        while j < cut:
            code = re.sub(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])\'|//.*', "", lines[j])
            if not opened and ";" in code and "{" not in code:
                break  # a declaration without a body (trait method)
            depth += code.count("{") - code.count("}")
            opened = opened or "{" in code
            if opened and depth <= 0:
                yield m.group(1), start + 1, j - start + 1
                break
            j += 1
        i = start + 1


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    limit = int(args[0]) if args else 80
    found = []
    for path in sorted((ROOT / "crates").rglob("*.rs")) + sorted((ROOT / "baselines").rglob("*.rs")):
        if path.name == "tests.rs" or "/tests/" in str(path) or "/benches/" in str(path):
            continue
        for name, line, length in functions(path):
            if length > limit:
                found.append((length, f"{path.relative_to(ROOT)}:{line}", name))
    for length, where, name in sorted(found, reverse=True):
        print(f"{length:5} {where} {name}")
    print(f"{len(found)} functions over {limit} lines", file=sys.stderr)
    return 1 if found and "--check" in sys.argv else 0


if __name__ == "__main__":
    sys.exit(main())
