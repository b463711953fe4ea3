#!/usr/bin/env python3
"""The fuzzing ledger: every `scripts/fuzz.sh` run, one line each in fuzz/ledger.tsv
(checked in), and the "Fuzzing" section of benches/RESULTS.md rendered from it.

    scripts/fuzz-ledger.py add TARGET SECONDS LOG   # a run's CPU seconds, its figures from libFuzzer's log
    scripts/fuzz-ledger.py render [RESULTS.md]      # the section between the fuzz markers

A run's figures come from libFuzzer's own lines: the last status line (`#N ... cov: E ft: F
corp: C/...`), `-print_final_stats=1`'s `stat::number_of_executed_units`; its time is the SECONDS given:
the CPU seconds the fuzzing processes used (`scripts/fuzz.sh` measures them), so a run on a
machine busy with other work counts only what it fuzzed. A crash is a
run whose log says `ERROR: libFuzzer` or `panicked`; its artifact is named in the log.
The table sums the runs of each target; coverage and corpus are the latest run's.
"""
import datetime
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
LEDGER = ROOT / "fuzz" / "ledger.tsv"
FIELDS = ["date", "target", "seconds", "execs", "edges", "features", "corpus", "crash"]
BEGIN, END = "<!-- fuzz:begin -->", "<!-- fuzz:end -->"

# What each target decodes (crates/fuzz-targets documents each one's property).
WHAT = {
    "ticket": "`DoGet` ticket",
    "command": "`GetFlightInfo` command, explain/profile bodies (protobuf or SQL)",
    "messages": "action bodies and the answers a client decodes; action names, version header, codec",
    "flight_sql": "Flight SQL command (`Any`), prepared handle inside",
    "parameters": "Flight SQL `DoPut` parameters (Arrow IPC)",
    "prepared_handle": "prepared-statement handle (bound SQL)",
    "sql": "SQL through a real `Node`: allow-list, size caps, planning, streams",
    "pipeline": "pipeline TOML and JSON",
    "loader_state": "`LoaderState` bytes (PDL2–4, PDM1, PDK1, PDB1)",
    "parquet": "a Parquet file as the engine opens and scans it (`Node`)",
    "client_ipc": "a `DoGet` stream as the client decodes it (Arrow IPC, trailer)",
    "tokens": "tokens file, bearer and handshake headers",
    "views": "views file (TOML, each view SQL-checked)",
}


def read():
    if not LEDGER.exists():
        return []
    lines = LEDGER.read_text().splitlines()
    return [dict(zip(FIELDS, line.split("\t"))) for line in lines[1:] if line.strip()]


def add(target, seconds, log):
    text = pathlib.Path(log).read_text(errors="replace")
    status = re.findall(r"^#(\d+)\s+\w+\s+cov: (\d+) ft: (\d+) corp: (\d+)", text, re.M)
    execs = re.findall(r"stat::number_of_executed_units: (\d+)", text)
    crash = ""
    if re.search(r"ERROR: libFuzzer|panicked at|ERROR: AddressSanitizer", text):
        m = re.search(r"Test unit written to (\S+)", text)
        crash = m.group(1) if m else "crash (see log)"
    last = status[-1] if status else ("0", "0", "0", "0")
    row = {
        "date": datetime.date.today().isoformat(),
        "target": target,
        "seconds": str(int(float(seconds))),
        "execs": execs[-1] if execs else last[0],
        "edges": last[1],
        "features": last[2],
        "corpus": last[3],
        "crash": crash,
    }
    rows = read() + [row]
    LEDGER.write_text("\t".join(FIELDS) + "\n" + "".join("\t".join(r[f] for f in FIELDS) + "\n" for r in rows))
    print(f"ledger: {target} {row['seconds']} s, {row['execs']} executions, cov {row['edges']}, "
          f"corpus {row['corpus']}{', CRASH ' + crash if crash else ''}")


def render(results):
    rows = read()
    by = {}
    for r in rows:
        by.setdefault(r["target"], []).append(r)
    out = [BEGIN, "## Fuzzing: every decoder of outside input under libFuzzer", "",
           "Command: `scripts/fuzz.sh TARGET SECONDS` (cargo-fuzz, libFuzzer with AddressSanitizer, "
           "nightly Rust) on this 2-core machine; each run is a line of `fuzz/ledger.tsv`, its time "
           "the CPU seconds the fuzzer used (runs before 2026-11-28's second session: wall seconds "
           "on an otherwise idle core), summed "
           "here per target. Coverage (libFuzzer's edges `cov` and features `ft`) and the corpus "
           "are the latest run's; the corpus is then minimised (`cargo fuzz cmin`) and checked in, "
           "and `.ci/run` replays it (`cargo test -p pushdown-fuzz-targets`).", "",
           "| target | decodes | runs | fuzzing time (CPU min) | executions | edges (cov) | features (ft) | corpus | crashes found |",
           "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for target, what in WHAT.items():
        rs = by.get(target, [])
        secs = sum(int(r["seconds"]) for r in rs)
        execs = sum(int(r["execs"]) for r in rs)
        last = rs[-1] if rs else None
        crashes = [r for r in rs if r["crash"]]
        out.append(
            f"| {target} | {what} | {len(rs)} | {secs / 60:.0f} | {execs:,} | "
            f"{last['edges'] if last else '–'} | {last['features'] if last else '–'} | "
            f"{last['corpus'] if last else '–'} | {len(crashes)} |"
        )
    out += ["", "<!-- fuzz:notes -->", END]
    path = pathlib.Path(results)
    text = path.read_text()
    notes = ""
    if BEGIN in text:
        head, rest = text.split(BEGIN, 1)
        body, tail = rest.split(END, 1)
        if "<!-- fuzz:notes -->" in body:
            notes = body.split("<!-- fuzz:notes -->", 1)[1]
    else:
        head, tail = text.rstrip() + "\n\n", "\n"
    section = "\n".join(out[:-2]) + "\n\n<!-- fuzz:notes -->" + (notes if notes else "\n") + END
    path.write_text(head + section + tail)


if __name__ == "__main__":
    if len(sys.argv) >= 5 and sys.argv[1] == "add":
        add(sys.argv[2], sys.argv[3], sys.argv[4])
    elif len(sys.argv) >= 2 and sys.argv[1] == "render":
        render(sys.argv[2] if len(sys.argv) > 2 else ROOT / "benches" / "RESULTS.md")
    else:
        sys.exit(__doc__)
