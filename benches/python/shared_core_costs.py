"""What one server core spends on each trainer that shares it: a trainer's own set-up
(planning, shard counts) as the intercept of the server's CPU against rows, and the CPU per
row and context switches with 1 to 16 trainers (2 streams each) on the core at once.

    .venv/bin/python benches/python/shared_core_costs.py PUSHDOWN_BIN DATA_ROOT

DATA_ROOT needs `img2048` and `img8192` (`pushdown gen images --rows N --name imgN --out D`).
The server runs on CPU 0 with one CPU thread and no cache; the trainers (`pushdown run`)
on CPU 1. Linux only (/proc).
"""
import glob
import subprocess
import sys
import time

from ab_binaries import free_port  # this folder is on sys.path when run as a script

SQL = "SELECT id, label, decode_resize(image, 64, 64) AS pixels FROM img{n}"


def cpu_seconds(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100.0


def context_switches(pid):
    total = 0
    for status in glob.glob(f"/proc/{pid}/task/*/status"):
        for line in open(status):
            if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                total += int(line.split()[1])
    return total


def trainer(binary, port, n):
    """One trainer's command: the CPU-bound query over imgN, two streams in flight."""
    cmd = ["taskset", "-c", "1", binary, "run", "--server", f"http://127.0.0.1:{port}"]
    cmd += ["--sql", SQL.format(n=n), "--concurrency", "2"]
    return cmd


def main():
    binary, data = sys.argv[1:3]
    port = free_port()
    server = subprocess.Popen(
        ["taskset", "-c", "0", binary, "serve", "--data", data, "--listen", f"127.0.0.1:{port}",
         "--cpu-threads", "1", "--cache", "off", "--cache-memory-mib", "0"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(2)

    def measure(n, k):
        """k trainers at once over imgN: (wall s, server CPU s, server context switches)."""
        c0, x0, t0 = cpu_seconds(server.pid), context_switches(server.pid), time.perf_counter()
        runs = [subprocess.Popen(trainer(binary, port, n), stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL) for _ in range(k)]
        if any(r.wait() != 0 for r in runs):
            raise SystemExit("a trainer failed")
        wall = time.perf_counter() - t0
        return wall, cpu_seconds(server.pid) - c0, context_switches(server.pid) - x0

    try:
        small = min(measure(2048, 1)[1] for _ in range(3))
        large = min(measure(8192, 1)[1] for _ in range(3))
        per_row = (large - small) / (8192 - 2048)
        setup = small - per_row * 2048
        print(f"a trainer's set-up: {1e3 * setup:.0f} ms of server CPU "
              f"({100 * setup / large:.1f}% of an 8192-row run); {1e3 * per_row:.3f} ms per row")
        print("| trainers | streams | rows/s, all | server ms CPU per row | context switches per 256 rows |")
        print("|---:|---:|---:|---:|---:|")
        for k in (1, 2, 4, 8, 16):
            wall, cpu, switches = min((measure(8192, k) for _ in range(2)), key=lambda m: m[0])
            rows = 8192 * k
            print(f"| {k} | {2 * k} | {rows / wall:.0f} | {1e3 * cpu / rows:.3f} | {switches / (rows / 256):.1f} |")
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
