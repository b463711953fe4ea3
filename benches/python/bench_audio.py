"""The contender of `harness audio`: what a speech team writes without pushdown (the
Hugging Face / torchaudio tutorials' recipe). Worker processes (torch's DataLoader when
importable, else multiprocessing; `workers.py`) each read their share of the dataset's
Parquet row groups with pyarrow, decode every clip with `soundfile` (libsndfile), mix to
mono, resample to 16 kHz with `soxr` (HQ), and compute Whisper's log-mel features with
`transformers.WhisperFeatureExtractor` (its numpy path: 80 bins, 30 s padded), batching
`--batch` clips as `[B, 80, 3000]` float32. Prints one JSON line: clips, seconds, clips/s
and the trainer host's CPU seconds (this process and its workers).

    python bench_audio.py --data DIR/speech --workers 1 --batch 8
"""

import argparse
import functools
import io
import json
import time

import numpy as np
import pyarrow.parquet as pq

from workers import cpu_seconds, units_of, worker_batches


def features(units, k, batch):
    import soundfile as sf
    import soxr
    from transformers import WhisperFeatureExtractor

    extractor = WhisperFeatureExtractor(feature_size=80)
    out = []
    for path, rg in units:
        table = pq.ParquetFile(path).read_row_group(rg, columns=["audio"])
        for value in table.column("audio").to_pylist():
            x, sr = sf.read(io.BytesIO(value["bytes"]), dtype="float32", always_2d=True)
            x = x.mean(axis=1)
            if sr != 16000:
                x = soxr.resample(x, sr, 16000)
            out.append(extractor(x, sampling_rate=16000, return_tensors="np").input_features[0])
            if len(out) == batch:
                yield (np.stack(out),)
                out = []
    if out:
        yield (np.stack(out),)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--batch", type=int, default=8)
    args = ap.parse_args()
    start, cpu0 = time.perf_counter(), cpu_seconds()
    source = worker_batches(units_of(args.data), args.workers, functools.partial(features, batch=args.batch))
    how, _ = next(source)
    clips = 0
    for (mel,) in source:
        assert tuple(mel.shape[1:]) == (80, 3000), mel.shape
        clips += int(mel.shape[0])
    seconds, cpu = time.perf_counter() - start, cpu_seconds() - cpu0
    print(json.dumps({
        "loader": f"soundfile + soxr + WhisperFeatureExtractor, {args.workers} {how} worker(s)",
        "clips": clips,
        "seconds": round(seconds, 3),
        "clips_per_s": round(clips / seconds, 2),
        "trainer_cpu_s": round(cpu, 3),
    }))


if __name__ == "__main__":
    main()
