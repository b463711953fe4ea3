"""Plots `harness soak`'s samples: for each server, RSS, open file descriptors, threads and
in-flight streams over the run's minutes, load phases shaded and restarts marked.

    .venv/bin/python benches/python/plot_soak.py benches/results/soak/samples.csv benches/results/soak/soak.png
"""

import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    samples, out = sys.argv[1], sys.argv[2]
    rows = list(csv.DictReader(open(samples)))
    servers = sorted({r["server"] for r in rows})
    panels = [("rss_bytes", "RSS (MiB)", 1 / 2**20), ("fds", "open file descriptors", 1),
              ("threads", "threads", 1), ("streams", "in-flight streams", 1)]
    fig, axes = plt.subplots(len(panels), len(servers), figsize=(6 * len(servers), 9), sharex=True,
                             squeeze=False)
    for col, server in enumerate(servers):
        mine = [r for r in rows if r["server"] == server]
        lives = sorted({int(r["life"]) for r in mine})
        for row, (field, label, scale) in enumerate(panels):
            ax = axes[row][col]
            for life in lives:
                points = [r for r in mine if int(r["life"]) == life]
                ax.plot([float(r["minute"]) for r in points], [float(r[field]) * scale for r in points],
                        color="C0", linewidth=1)
            for life in lives[1:]:
                start = min(float(r["minute"]) for r in mine if int(r["life"]) == life)
                ax.axvline(start, color="C3", linewidth=0.8, linestyle=":")
            quiet = [r for r in mine if r["phase"] == "quiet"]
            ax.scatter([float(r["minute"]) for r in quiet], [float(r[field]) * scale for r in quiet],
                       s=6, color="C1", zorder=3, label="quiet" if row == 0 else None)
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
            if row == 0:
                restarts = f", {len(lives) - 1} SIGKILL restarts (dotted)" if len(lives) > 1 else ""
                ax.set_title(f"server {server}{restarts}")
                ax.legend(loc="lower right", fontsize=8)
        axes[-1][col].set_xlabel("minute")
    fig.tight_layout()
    fig.savefig(out, dpi=90)


if __name__ == "__main__":
    main()
