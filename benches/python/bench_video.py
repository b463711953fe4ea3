"""The contender of `harness video`: what a video team writes without pushdown (the
torchvision / PyTorchVideo tutorials' recipe: `UniformTemporalSubsample`, short-side resize,
center crop). Worker processes (torch's DataLoader when importable, else multiprocessing;
`workers.py`) each read their share of the dataset's Parquet row groups with pyarrow, open
each clip with PyAV from its bytes, take `--frames` timestamps at the centres of equal
segments of the stream's duration (in its time base, from its start), decode the clip
sequentially and keep the frame shown at each (the last with a timestamp at or before it;
decoding stops past the last one; no seeking: the targets are a fraction of a second
apart), convert those to RGB (`frame.to_image()`), resize them with the aspect kept to
just cover `--size`² (PIL, bilinear) and center-crop, batching `--batch` clips as
`[B, T, S, S, 3]` uint8. Prints one JSON line: clips, seconds, clips/s and the trainer
host's CPU seconds (this process and its workers).

    python bench_video.py --data DIR/videos --workers 1 --batch 8
"""

import argparse
import functools
import io
import json
import time

import numpy as np
import pyarrow.parquet as pq

from workers import cpu_seconds, units_of, worker_batches


def cover_crop(image, size):
    """A PIL image resized (bilinear, aspect kept) to just cover size×size, center-cropped."""
    from PIL import Image

    w, h = image.size
    scale = size / min(w, h)
    rw, rh = max(round(w * scale), size), max(round(h * scale), size)
    image = image.resize((rw, rh), Image.BILINEAR)
    left, top = round((rw - size) / 2), round((rh - size) / 2)
    return np.asarray(image.crop((left, top, left + size, top + size)))


def clip_frames(data, n, size):
    """The `n` frames shown at the centres of `n` equal segments of the clip: [n, size, size, 3]."""
    import av

    picked = []
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        tb = stream.time_base
        start = stream.start_time or 0
        duration = stream.duration or round(container.duration / 1e6 / tb)
        targets = [start + (2 * i + 1) * duration // (2 * n) for i in range(n)]
        prev, rgb = None, None  # the frame on screen, and it converted once a target picks it
        for frame in container.decode(stream):
            if frame.pts is None:
                continue
            while len(picked) < n and frame.pts > targets[len(picked)]:
                if prev is None:  # a target before the first frame: the first frame shows
                    prev = frame
                if rgb is None:
                    rgb = cover_crop(prev.to_image(), size)
                picked.append(rgb)
            if len(picked) == n:
                break
            if prev is not frame:
                prev, rgb = frame, None
        while len(picked) < n:  # targets after the last frame's timestamp: the last frame
            if rgb is None:
                rgb = cover_crop(prev.to_image(), size)
            picked.append(rgb)
    return np.stack(picked)


def clips(units, k, batch, n, size):
    out = []
    for path, rg in units:
        table = pq.ParquetFile(path).read_row_group(rg, columns=["video"])
        for value in table.column("video").to_pylist():
            out.append(clip_frames(value["bytes"], n, size))
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
    ap.add_argument("--frames", type=int, default=16)
    ap.add_argument("--size", type=int, default=224)
    args = ap.parse_args()
    start, cpu0 = time.perf_counter(), cpu_seconds()
    make = functools.partial(clips, batch=args.batch, n=args.frames, size=args.size)
    source = worker_batches(units_of(args.data), args.workers, make)
    how, _ = next(source)
    count = 0
    for (frames,) in source:
        assert tuple(frames.shape[1:]) == (args.frames, args.size, args.size, 3), frames.shape
        assert frames.dtype == np.uint8, frames.dtype
        count += int(frames.shape[0])
    seconds, cpu = time.perf_counter() - start, cpu_seconds() - cpu0
    print(json.dumps({
        "loader": f"PyAV + PIL, {args.workers} {how} worker(s)",
        "clips": count,
        "seconds": round(seconds, 3),
        "clips_per_s": round(count / seconds, 2),
        "trainer_cpu_s": round(cpu, 3),
    }))


if __name__ == "__main__":
    main()
