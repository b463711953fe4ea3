#!/usr/bin/env python3
"""Layering checks (scripts/test.sh runs them):

* no module of a crate imports a module that imports it back, directly or through others
  (a cycle among a crate's top-level modules; test modules excluded);
* the engine names neither `tonic` nor `arrow_flight`;
* a layered crate's `lib.rs` (or `main.rs` beside one) only documents, declares modules and
  re-exports: it defines no item the modules would have to import back;
* every module imports only modules of its own layer or of the layers below it, as the
  crate's `lib.rs` documents them in a table (`| layer | modules |`, the top layer first;
  every module named in exactly one row). The table is the check's input, so the documented
  order cannot go stale: an upward import, or a module the table omits, fails.

`--plant` proves the direction check fails: it copies a crate, plants an upward import in its
bottom layer and expects exactly that failure.

A module's imports are every `crate::m` path it names (`use crate::{a::X, b}` included),
and names the crate root re-exports resolved to the module they come from.
"""
import pathlib
import re
import shutil
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
CRATES = ["crates/engine", "crates/pushdown-server", "crates/client", "crates/planner",
          "crates/ops", "crates/cli", "crates/import"]


def product_text(path):
    """The module's code without its test module and comments (docs may name anything)."""
    text = path.read_text()
    cut = re.search(r"#\[cfg\(test\)\]\s*mod tests", text)
    text = text[: cut.start()] if cut else text
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("//"))


def root_exports(lib):
    """Names the crate root re-exports, by the module they come from."""
    names = {}
    for m in re.finditer(r"pub use (\w+)::(\{[^}]*\}|\w+)", product_text(lib)):
        module, items = m.group(1), m.group(2).strip("{}")
        for item in items.split(","):
            item = item.strip().split(" as ")[-1].strip()
            if item:
                names[item] = module
    return names


def crate_paths(text):
    """Every first segment after `crate::`, expanding `crate::{a, b::c}` groups."""
    found = set()
    for m in re.finditer(r"crate::(\{[^}]*\}|\w+)", text):
        seg = m.group(1)
        if seg.startswith("{"):
            for part in seg.strip("{}").split(","):
                part = part.strip()
                if part:
                    found.add(re.split(r"::|\s", part)[0])
        else:
            found.add(seg)
    return found


def graph(src):
    modules = {p.stem: p for p in src.glob("*.rs") if p.stem not in ("lib", "main")}
    for d in src.iterdir():
        if d.is_dir() and (d / "mod.rs").exists():
            modules[d.name] = d / "mod.rs"
    lib = src / "lib.rs"
    exports = root_exports(lib) if lib.exists() else {}
    edges = {}
    if lib.exists():
        # The crate root is a module too when it defines more than it re-exports: its own
        # items are named `crate::Item` by the others, and it names theirs `module::Item`.
        code = product_text(lib)
        defined = set(re.findall(r"^pub (?:struct|enum|fn|async fn|type|trait|const|static) (\w+)", code, re.M))
        for name in defined:
            exports.setdefault(name, "lib")
        body = "\n".join(l for l in code.splitlines() if not re.match(r"\s*(pub )?(use|mod) ", l))
        uses = "\n".join(l for l in code.splitlines() if re.match(r"\s*use ", l))
        modules_named = {m for m in modules if re.search(r"\b" + m + r"::", body + "\n" + uses)}
        # Names it re-exports and uses itself come from their modules.
        modules_named |= {
            module
            for name, module in root_exports(lib).items()
            if module in modules and re.search(r"\b" + name + r"\b", body)
        }
        if defined:
            modules["lib"] = lib
            edges["lib"] = modules_named
    for name, path in modules.items():
        if name == "lib":
            continue
        deps = set()
        for seg in crate_paths(product_text(path)):
            target = seg if seg in modules else exports.get(seg)
            if target and target != name and target in modules:
                deps.add(target)
        edges[name] = deps
    return edges


def layer_table(lib):
    """The documented layers of a crate's `lib.rs`, the top first: a list of module sets."""
    rows, inside = [], False
    for line in lib.read_text().splitlines():
        if not line.startswith("//!"):
            if inside:
                break
            continue
        cells = [c.strip() for c in line[3:].strip().strip("|").split("|")]
        if not inside:
            inside = len(cells) == 2 and cells == ["layer", "modules"]
            continue
        if not line[3:].strip().startswith("|"):
            break
        if set(cells[-1]) <= set("-: "):
            continue
        rows.append(set(re.findall(r"`(\w+)`", cells[-1])))
    return rows


def direction_failures(crate, edges, rows):
    """Imports that go up the documented layers, and modules the table misplaces."""
    if not rows:
        return [f"{crate}/src/lib.rs: no layer table (`| layer | modules |`, the top layer first)"]
    failures, layer = [], {}
    for i, row in enumerate(rows):
        for module in row:
            if module in layer:
                failures.append(f"{crate}: `{module}` is in two rows of the layer table")
            layer[module] = i
    modules = {m for m in edges if m not in ("lib", "tests")}
    for module in sorted(modules - layer.keys()):
        failures.append(f"{crate}: module `{module}` is in no row of the layer table")
    for module in sorted(layer.keys() - modules):
        failures.append(f"{crate}: the layer table names `{module}`, which is not a module")
    for module in sorted(modules & layer.keys()):
        for dep in sorted(edges[module] & layer.keys()):
            if layer[dep] < layer[module]:
                failures.append(
                    f"{crate}: `{module}` (layer {layer[module] + 1}) imports `{dep}` from the "
                    f"layer above it ({layer[dep] + 1}): move the code or the table row"
                )
    return failures


def cycles(edges):
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def crate_failures(root, crate):
    failures = []
    src = root / crate / "src"
    edges = graph(src)
    for comp in cycles(edges):
        detail = "; ".join(f"{m} → {', '.join(sorted(edges[m] & set(comp)))}" for m in comp)
        failures.append(f"{crate}: modules import each other: {detail}")
    lib = src / "lib.rs"
    failures += direction_failures(crate, edges, layer_table(lib) if lib.exists() else [])
    return failures


def plant():
    """Plants `use crate::<top module>` in a bottom-layer module of a copy of the engine."""
    crate = "crates/engine"
    rows = layer_table(ROOT / crate / "src/lib.rs")
    top, bottom = sorted(rows[0])[0], sorted(rows[-1])[0]
    with tempfile.TemporaryDirectory() as tmp:
        copy = pathlib.Path(tmp)
        shutil.copytree(ROOT / crate / "src", copy / crate / "src")
        if crate_failures(copy, crate):
            print(f"plant: {crate} fails before planting")
            return 1
        victim = copy / crate / "src" / f"{bottom}.rs"
        victim.write_text(f"use crate::{top}::*;\n" + victim.read_text())
        got = crate_failures(copy, crate)
    want = f"`{bottom}` (layer {len(rows)}) imports `{top}`"
    if not any(want in f for f in got):
        print(f"plant: `use crate::{top}` planted in `{bottom}` was not reported; got: {got}")
        return 1
    print(f"plant: an upward import (`{bottom}` → `{top}`) planted in a copy of {crate} fails the check")
    return 0


def main():
    if sys.argv[1:] == ["--plant"]:
        return plant()
    failures = []
    for crate in CRATES:
        failures += crate_failures(ROOT, crate)
        src = ROOT / crate / "src"
        lib = src / "lib.rs"
        if lib.exists():
            defined = re.findall(
                r"^(?:pub(?:\([\w:]+\))? )?(?:struct|enum|fn|async fn|type|trait|const|static|impl)\b[^\n]*",
                product_text(lib),
                re.M,
            )
            for item in defined:
                failures.append(f"{crate}/src/lib.rs defines `{item.strip()}`: move it to a module")
    for path in sorted((ROOT / "crates/engine/src").rglob("*.rs")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"\b(tonic|arrow_flight)::", line) and not line.lstrip().startswith("//"):
                failures.append(f"{path.relative_to(ROOT)}:{n}: the engine names gRPC: {line.strip()}")
    if failures:
        print("\n".join(failures))
        return 1
    print(
        f"layers: no module cycles in {len(CRATES)} crates, every import goes down its crate's "
        "documented layers, their lib.rs files only re-export; "
        "the engine names no gRPC"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
