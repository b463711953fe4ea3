#!/usr/bin/env python3
"""One feature resolution for every build (scripts/test.sh runs this).

Cargo compiles a dependency once per set of features it is built with. The workspace's
builds (the test build, the wheel's native module, the release CLI, the benchmark harness)
each resolve features for the packages they name, so a dependency enabled with one feature
more in one of them is compiled again for the other, with everything built on it: DataFusion
twice, an hour before a first batch. This check resolves each build as cargo would
(`cargo tree -e features`) and fails, naming the package and the features, where a
third-party package shared by two builds gets different features in them. The workspace's own
crates are left out: the test build adds `pushdown-ops/video` (FFmpeg), which the wheel must
not link. So is the protobuf generator (protox), built alone by `scripts/regen-proto.sh`: the
test build excludes it, or its `regex-automata/default` would set the test build apart.

    scripts/check-features.py            # compare the builds
    scripts/check-features.py --plant    # prove it fails on a planted difference
"""
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VIDEO = ["--features", "pushdown-ops/video"]
# Each build as its command selects packages (dev-dependencies excluded: `cargo build`).
BUILDS = {
    "test build (cargo build --workspace, video)": ["--workspace", "--exclude",
                                                    "pushdown-protocol-gen", *VIDEO],
    "wheel (maturin: -p pushdown-python)": ["-p", "pushdown-python"],
    "CLI (cargo build -p pushdown-cli)": ["-p", "pushdown-cli"],
    "harness (cargo build -p pushdown-benches)": ["-p", "pushdown-benches"],
}
# Packages that differ by design, each with why. mimalloc: the binaries take it with
# `override` (it then serves C's malloc too: zstd's contexts); the wheel's module takes it as
# Rust's allocator only, since inside a module loaded into Python
# an overriding `malloc` would free what the C library allocated (realpath's buffers). A small
# C library, built twice.
BY_DESIGN = {"mimalloc", "libmimalloc-sys"}
LINE = re.compile(r"^(\S+) v(\S+)(?: \((.*?)\))?(?: \[(.*)\])?")


def resolve(args, extra=()):
    """{package: features} of one build, third-party packages only."""
    out = subprocess.run(
        ["cargo", "tree", "--locked", "-q", "-e", "normal,build", "--prefix", "none",
         "-f", "{p} [{f}]", *args, *extra],
        cwd=ROOT, check=True, capture_output=True, text=True).stdout
    packages = {}
    for line in out.splitlines():
        m = LINE.match(line.replace(" (*)", ""))
        if not m or (m.group(3) or "").startswith("/"):
            continue  # a workspace crate (a path source)
        features = set(filter(None, (m.group(4) or "").split(",")))
        packages.setdefault(f"{m.group(1)} {m.group(2)}", set()).update(features)
    return packages


def differences(builds):
    """Lines naming each shared package whose features differ between two builds."""
    names = list(builds)
    found = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            for package in sorted(builds[a].keys() & builds[b].keys()):
                if package.split()[0] in BY_DESIGN:
                    continue
                fa, fb = builds[a][package], builds[b][package]
                if fa != fb:
                    found.append(f"{package}: only in {a}: {sorted(fa - fb)}; "
                                 f"only in {b}: {sorted(fb - fa)}")
    return found


def main():
    builds = {name: resolve(args) for name, args in BUILDS.items()}
    if "--plant" in sys.argv[1:]:
        # A feature the CLI's build alone turns on must be reported.
        name = "CLI (cargo build -p pushdown-cli)"
        planted = builds[name]["tokio " + next(k.split()[1] for k in builds[name]
                                               if k.startswith("tokio "))]
        planted.add("planted-feature")
        if not any("planted-feature" in d for d in differences(builds)):
            sys.exit("check-features --plant: a planted difference was not reported")
        print("check-features --plant: the planted difference is reported")
        return
    found = differences(builds)
    if found:
        print("builds resolve shared dependencies with different features "
              "(each compiled more than once):", file=sys.stderr)
        for line in found:
            print("  " + line, file=sys.stderr)
        sys.exit(1)
    shared = set.intersection(*(set(b) for b in builds.values()))
    print(f"check-features: {len(builds)} builds, {len(shared)} dependencies they all share "
          "resolved alike")


if __name__ == "__main__":
    main()
