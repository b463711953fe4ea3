"""The contender of `harness text`: what a language-model team writes without pushdown.

Worker processes (torch's DataLoader when importable, else multiprocessing; `workers.py`)
each read their share of the dataset's Parquet row groups with pyarrow (`body` and
`quality`), keep the rows with `quality >= --min-quality`, tokenize the bodies with the
Hugging Face `tokenizers` library (the dataset's own `tokenizer.json`, `encode_batch`, the
library's threads off as in a forked DataLoader worker), append the eos id, and pack the
documents greedily into blocks of exactly `--length` tokens with their `position_ids`
(restarting at each document), `--batch` blocks per batch: the batches `pushdown.Loader(pack=)`
delivers. Prints one JSON line: tokens delivered, seconds, tokens/s, and the trainer host's
CPU seconds (this process and its workers) per million tokens.

    python bench_text.py --data DIR/text --workers 1 --length 2048 --batch 8
"""

import argparse
import functools
import json
import os
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from workers import cpu_seconds, units_of, worker_batches  # noqa: E402


def packed(units, k, tokenizer, length, batch, eos, min_quality):
    """Blocks of `length` tokens, `batch` per yield, from the documents of `units`."""
    import tokenizers

    tok = tokenizers.Tokenizer.from_file(tokenizer)
    tok.no_padding()
    tok.no_truncation()
    tokens, positions = [], []
    blocks_t, blocks_p = [], []
    for path, rg in units:
        table = pq.ParquetFile(path).read_row_group(rg, columns=["body", "quality"])
        table = table.filter(pc.greater_equal(table.column("quality"), min_quality))
        for enc in tok.encode_batch(table.column("body").to_pylist()):
            ids = enc.ids + [eos]
            tokens.extend(ids)
            positions.extend(range(len(ids)))
            while len(tokens) >= length:
                blocks_t.append(tokens[:length])
                blocks_p.append(positions[:length])
                del tokens[:length], positions[:length]
                if len(blocks_t) == batch:
                    yield np.array(blocks_t, dtype=np.uint32), np.array(blocks_p, dtype=np.int32)
                    blocks_t, blocks_p = [], []


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True, help="the text dataset's folder (with tokenizer.json)")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--length", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--eos", type=int, default=0)
    ap.add_argument("--min-quality", type=float, default=0.0)
    args = ap.parse_args()
    make = functools.partial(packed, tokenizer=os.path.join(args.data, "tokenizer.json"), length=args.length,
                             batch=args.batch, eos=args.eos, min_quality=args.min_quality)
    start, cpu0 = time.perf_counter(), cpu_seconds()
    source = worker_batches(units_of(args.data), args.workers, make)
    how, _ = next(source)
    tokens = 0
    for t, p in source:
        assert tuple(t.shape) == (args.batch, args.length) and tuple(p.shape) == tuple(t.shape)
        tokens += int(np.prod(t.shape))
    seconds, cpu = time.perf_counter() - start, cpu_seconds() - cpu0
    print(json.dumps({
        "loader": f"tokenizers + greedy packing, {args.workers} {how} worker(s)",
        "tokens": tokens,
        "seconds": round(seconds, 3),
        "tokens_per_s": round(tokens / seconds, 1),
        "trainer_cpu_s": round(cpu, 3),
        "cpu_s_per_million_tokens": round(cpu * 1e6 / max(tokens, 1), 3),
    }))


if __name__ == "__main__":
    main()
