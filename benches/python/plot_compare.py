"""Plots of the contender comparison (benches/harness compare): one PNG of samples/s and
one of bytes on the wire per sample (cells run different numbers of epochs), a panel per
workload, bars per contender grouped by link.

    .venv/bin/python benches/python/plot_compare.py benches/results/compare.json benches/results
"""

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot(cells, metric, label, out, log=False):
    workloads = list(dict.fromkeys(c["workload"] for c in cells))
    fig, axes = plt.subplots(1, len(workloads), figsize=(5 * len(workloads), 4.2), squeeze=False)
    for ax, w in zip(axes[0], workloads):
        mine = [c for c in cells if c["workload"] == w]
        links = list(dict.fromkeys(c["link"] for c in mine))
        contenders = list(dict.fromkeys(c["contender"] for c in mine))
        width = 0.8 / len(contenders)
        for i, contender in enumerate(contenders):
            xs, ys = [], []
            for j, link in enumerate(links):
                for c in mine:
                    if c["link"] == link and c["contender"] == contender:
                        xs.append(j + i * width)
                        ys.append(metric(c))
            ax.bar(xs, ys, width, label=contender)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(links))])
        ax.set_xticklabels([l.split(" (")[0] for l in links])
        ax.set_title(w)
        ax.set_ylabel(label)
        if log:
            ax.set_yscale("log")
    axes[0][0].legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


def main():
    cells = json.loads(Path(sys.argv[1]).read_text())
    out = Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    plot(cells, lambda c: c["samples_per_s"], "samples/s", out / "compare-samples.png")
    plot(
        cells,
        lambda c: c["wire_bytes"] / max(c["samples"], 1),
        "bytes on the wire per sample (log)",
        out / "compare-bytes.png",
        log=True,
    )


if __name__ == "__main__":
    main()
