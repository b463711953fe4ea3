"""The no-pushdown contender most users write: pyarrow.dataset over S3, tuned.

Reads one workload's Parquet files from an S3-compatible server with the projection and the
filter pushed into the scan (row groups pruned by statistics), pre-buffered coalesced range
reads and read-ahead across files and batches, on every thread pyarrow has; applies the
pipeline's per-row steps with `pushdown.Transform` (the same kernels the server runs), and
counts the samples. Runs whole epochs until `--min-secs` have passed; prints one JSON line:
samples, seconds, seconds waited for the reader, CPU seconds of this process, bytes received
on the loopback interface.

Started by the benchmark harness (`harness compare`), pinned to the trainer's core.
"""

import argparse
import datetime
import decimal
import json
import os
import sys
import time

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.fs as pafs

import pushdown

if pushdown.BUILD_PROFILE != "release":
    sys.exit(
        f"pushdown is a {pushdown.BUILD_PROFILE} build, several times slower than what users run: "
        "PUSHDOWN_PY_PROFILE=release scripts/setup-python.sh --bench"
    )

f = pads.field


def money(text):
    return pa.scalar(decimal.Decimal(text), pa.decimal128(15, 2))


# Each workload's columns and filter, as a pyarrow.dataset user writes them (the same
# filters as the pipelines' SQL).
WORKLOADS = {
    "images": (["image", "label"], f("label") < 100),
    "clicks": (["label", "i1", "i2", "i3", "i4", "c1", "c2", "c3", "c4", "c5"], f("day") == 3),
    "text": (["body"], (f("lang") == "en") & (f("quality") > 0.5)),
    "lineitem": (
        ["l_quantity", "l_extendedprice", "l_discount", "l_tax"],
        (f("l_shipdate") >= pa.scalar(datetime.date(1994, 1, 1)))
        & (f("l_shipdate") < pa.scalar(datetime.date(1995, 1, 1)))
        & (f("l_discount") >= money("0.05"))
        & (f("l_discount") <= money("0.07"))
        & (f("l_quantity") < money("24")),
    ),
}


def received():
    """Bytes received on the loopback interface (the harness counts shaped links itself):
    pyarrow's S3 client reads sockets with recv, which /proc/self/io does not count."""
    with open("/proc/net/dev") as dev:
        for line in dev:
            name, _, fields = line.partition(":")
            if name.strip() == "lo":
                return int(fields.split()[0])
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--endpoint", required=True, help="host:port of the S3 server")
    ap.add_argument("--bucket", required=True)
    ap.add_argument("--key", required=True)
    ap.add_argument("--secret", required=True)
    ap.add_argument("--workload", required=True, choices=sorted(WORKLOADS))
    ap.add_argument("--pipeline", required=True, help="the pipeline, JSON")
    ap.add_argument("--min-secs", type=float, default=1.5)
    args = ap.parse_args()

    s3 = pafs.S3FileSystem(
        endpoint_override=args.endpoint, scheme="http", access_key=args.key,
        secret_key=args.secret, region="us-east-1",
    )
    fmt = pads.ParquetFileFormat(
        default_fragment_scan_options=pads.ParquetFragmentScanOptions(
            pre_buffer=True, cache_options=pa.CacheOptions(lazy=True, prefetch_limit=8),
        )
    )
    # Listing the files is once per job, not per epoch. (A list of files, not the prefix:
    # s3s-fs answers HEAD on a "directory" key with an error.)
    files = sorted(
        i.path for i in s3.get_file_info(pafs.FileSelector(f"{args.bucket}/{args.workload}"))
        if i.path.endswith(".parquet")
    )
    dataset = pads.dataset(files, filesystem=s3, format=fmt)
    columns, filter = WORKLOADS[args.workload]
    tokenizers = {}
    tokenizer = f"{args.bucket}/{args.workload}/tokenizer.json"
    if s3.get_file_info(tokenizer).type == pafs.FileType.File:
        with s3.open_input_file(tokenizer) as fh:
            tokenizers[args.workload] = fh.read()
    transform = pushdown.Transform(args.pipeline, seed=1, tokenizers=tokenizers)

    samples, waited, key = 0, 0.0, 0
    read0, cpu0 = received(), time.process_time()
    start = time.perf_counter()
    while time.perf_counter() - start < args.min_secs:
        scanner = dataset.scanner(
            columns=columns, filter=filter, use_threads=True,
            batch_readahead=16, fragment_readahead=4,
        )
        batches = iter(scanner.to_batches())
        while True:
            asked = time.perf_counter()
            batch = next(batches, None)
            waited += time.perf_counter() - asked
            if batch is None:
                break
            if batch.num_rows:
                samples += transform(batch, key=key).num_rows
                key += 1
    secs = time.perf_counter() - start
    print(json.dumps({
        "samples": samples, "secs": secs, "waited": waited,
        "cpu_s": time.process_time() - cpu0, "received": received() - read0,
    }))


if __name__ == "__main__":
    os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
    main()
