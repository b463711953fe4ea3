"""The video dataset of `harness video`: scikit-image's photographs (astronaut, coffee,
chelsea, immunohistochemistry, the Hubble deep field, the motorcycle; all in its wheel)
filmed by a virtual camera that pans across them and zooms in and out (each clip its own
photograph and phase), rendered by PIL at 1280×720 and encoded by ffmpeg as H.264 (libx264,
`-preset veryfast`, yuv420p by swscale's fast_bilinear, 30 fps, a keyframe every 2 s:
`-g 60`) in MP4 with `-movflags +faststart`. Clips last 0.75 to 1.5 × `--seconds` (3 to 6 s
by default, 4 s on average; every row group the same mix). Each clip is encoded by one
ffmpeg thread, as many clips at once as there are CPUs. Written as Hugging Face `datasets`
writes a `Video` column (`struct<bytes, path>`, the feature in the file's metadata), row
groups of 8 clips, with an id. Prints the clips, their total MB and mean KB per clip.

    python make_video.py --out DIR/videos --clips 64
"""

import argparse
import functools
import math
import os
import pathlib
import subprocess
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor

import pyarrow as pa

WIDTH, HEIGHT, FPS, GOP = 1280, 720, 30, 60
PHOTOS = ["astronaut", "coffee", "chelsea", "immunohistochemistry", "hubble_deep_field", "motorcycle"]
# Clip lengths as multiples of --seconds: mean 1, 0.75 to 1.5; one cycle per row group.
LENGTHS = [0.75, 1.0, 1.25, 1.5, 1.0, 0.75, 1.0, 0.75]
ROW_GROUP = 8


@functools.lru_cache(maxsize=None)
def photograph(name):
    import skimage.data as skdata
    from PIL import Image

    pixels = skdata.stereo_motorcycle()[0] if name == "motorcycle" else getattr(skdata, name)()
    return Image.fromarray(pixels).convert("RGB")


def frames(photo, n, phase):
    """`n` raw RGB frames of WIDTH×HEIGHT: a window of the frame's aspect panning across the
    photograph (left and right every 3 s, up and down every 2.2 s) as it zooms in and out
    (every 1.8 s), starting `phase` frames into that motion."""
    from PIL import Image

    pw, ph = photo.size
    for k in range(phase, phase + n):
        zoom = 0.75 + 0.15 * math.cos(2 * math.pi * k / 53)
        cw, ch = pw * zoom, pw * zoom * HEIGHT / WIDTH
        if ch > ph * zoom:
            cw, ch = ph * zoom * WIDTH / HEIGHT, ph * zoom
        across = 1 - abs(1 - 2 * (k / 90 % 1))  # 0 → 1 → 0
        down = 0.5 - 0.5 * math.cos(2 * math.pi * k / 67)
        cx, cy = cw / 2 + (pw - cw) * across, ch / 2 + (ph - ch) * down
        box = (cx - cw / 2, cy - ch / 2, cx + cw / 2, cy + ch / 2)
        yield photo.resize((WIDTH, HEIGHT), Image.BILINEAR, box=box).tobytes()


def clip(i, seconds, tmp):
    """Clip `i`'s MP4 bytes: its frames piped to one single-threaded ffmpeg."""
    n = round(seconds * LENGTHS[i % len(LENGTHS)] * FPS)
    dst = os.path.join(tmp, f"{i:05d}.mp4")
    proc = subprocess.Popen(
        ["ffmpeg", "-hide_banner", "-loglevel", "error", "-y", "-f", "rawvideo", "-pix_fmt", "rgb24",
         "-s", f"{WIDTH}x{HEIGHT}", "-r", str(FPS), "-i", "-", "-c:v", "libx264", "-preset", "veryfast",
         "-g", str(GOP), "-pix_fmt", "yuv420p", "-sws_flags", "fast_bilinear", "-threads", "1",
         "-movflags", "+faststart", dst],
        stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    for frame in frames(photograph(PHOTOS[i % len(PHOTOS)]), n, phase=37 * i):
        proc.stdin.write(frame)
    proc.stdin.close()
    err = proc.stderr.read()
    if proc.wait() != 0:
        raise RuntimeError(f"ffmpeg, clip {i}: {err.decode()}")
    data = pathlib.Path(dst).read_bytes()
    os.remove(dst)
    return data


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--clips", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=4.0, help="mean clip length")
    args = ap.parse_args()
    start = time.perf_counter()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp, ProcessPoolExecutor(os.cpu_count() or 1) as pool:
        clips = list(pool.map(functools.partial(clip, seconds=args.seconds, tmp=tmp), range(args.clips)))

    import datasets

    datasets.disable_progress_bars()
    features = datasets.Features({"video": datasets.Video(), "id": datasets.Value("int64")})
    table = pa.table({
        "video": pa.array([{"bytes": data, "path": f"{i:05d}.mp4"} for i, data in enumerate(clips)],
                          type=features["video"].pa_type),
        "id": pa.array(range(len(clips)), type=pa.int64()),
    })
    path = out / "train-00000-of-00001.parquet"
    # The values are given as the struct, so no encoder runs; one row group per batch.
    datasets.Dataset(table, info=datasets.DatasetInfo(features=features)).to_parquet(str(path),
                                                                                     batch_size=ROW_GROUP)
    total = sum(len(c) for c in clips)
    print(f"{len(clips)} clips, {total / 1e6:.1f} MB, {total / 1e3 / max(len(clips), 1):.0f} KB per clip "
          f"mean, {time.perf_counter() - start:.1f} s -> {path}")


if __name__ == "__main__":
    main()
