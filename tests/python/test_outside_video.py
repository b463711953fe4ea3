"""Video that other tools made, read as video tutorials read it.

Real photographs (scikit-image's astronaut, coffee and chelsea, shipped in its wheel; the
rocket's smooth sky leaves neighbouring frames too alike) are filmed by a virtual camera that
pans across them and zooms in and out, so that every frame differs clearly from the frames
beside it (by a mean absolute difference of 12 or more after the resize; the test checks more
than twice its tolerance) and the frame a target time picked can be told from them. numpy and
PIL render the frames; ffmpeg (a subprocess, fed raw RGB) encodes them as yuv420p with every
codec the ops decode into every container they come in: H.264 (libx264, with B-frames) in MP4
and Matroska, HEVC (libx265) in MP4 and Matroska, VP9 (libvpx-vp9, one with hidden alt-ref
frames) in WebM and Matroska, AV1 (libsvtav1 and libaom-av1) in MP4, WebM and Matroska, and
a WebM written to a pipe (its header states no duration: the last packet's end gives it).
Sizes 320×240, 426×240, 640×360 and one 1280×720 clip; 10, 24, 25 and 30000/1001 frames a
second; two 12 s clips with a keyframe each second (their targets 3 s apart are reached by
seeking); two clips stored sideways with a display-matrix rotation (as phones record portrait
video: PyAV's rotation -90 and +90, written by remuxing with ffmpeg's `rotate` tag); one
variable-frame-rate clip (every third frame dropped, `-fps_mode vfr`: intervals of one and
two frames, a first timestamp after 0). Hugging Face `datasets` writes them to Parquet under
its `Video` feature (`struct<bytes, path>`, the feature in the file's metadata; the values
are given as that struct, so no torchcodec encode runs); the same clips are in a plain
`binary` column too.

The oracle is PyAV (FFmpeg's libraries as its wheel builds them, not the server's):
* `decode_frames`, at 8 frames of 112×112 (Hub table) and 4 of 96×160 (binary table): the
  stream's timeline from PyAV's metadata (its start, and its duration, else the container's,
  else where its last packet ends), targets at the centres of equal segments in the stream's
  time base, every frame decoded by PyAV and the one shown at each target (the last with a
  timestamp at or before it) chosen by index, converted to RGB, turned upright as players
  show it (FFmpeg's autorotate, by -`frame.rotation`; checked against the ffmpeg CLI's own
  autorotated output), resized by PIL (bilinear) to just cover the size and center-cropped.
  Each frame must be nearer to the oracle's chosen frame than to the frames beside it, and
  within a mean absolute difference of 2 of 255 of it.
* `video_info` and `video_seconds`: PyAV's stream metadata: duration × time base (within
  1e-6 s or one tick), average frame rate (within 1e-6), the coded width and height, the
  codec's name (`h264`, `hevc`, `vp9`, `av1`), the stated frame count (0 where the
  container states none) and the rotation players apply (-`frame.rotation`), exactly.
The trainer's side: `video_frames` at the server (4 frames a second), then `random_clip`
and `to_chw` in the trainer (pushdown.Loader's pipeline): each clip is a strided run of the
server's frames, `[B, T, C, H, W]` `uint8`, its start drawn per row and seed.
Damaged clips (an MP4 and a Matroska file cut to half their bytes, an audio-only file,
wrong magic bytes, random bytes, empty bytes) are each an error naming the row and the op,
and the server keeps serving.
"""

import io
import math
import shutil
import subprocess
from fractions import Fraction

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import Served

av = pytest.importorskip("av")
datasets = pytest.importorskip("datasets")
skdata = pytest.importorskip("skimage.data")
from PIL import Image  # noqa: E402

# Most mean absolute difference (of 255) between a frame and the oracle's.
TOLERANCE = 2.0
QUIET = ["-hide_banner", "-loglevel", "error", "-y"]
X265 = ["-x265-params", "log-level=error"]

# (name, ffmpeg codec arguments, extension, (width, height), frame rate, seconds, photograph)
CLIPS = [
    ("h264-mp4", ["-c:v", "libx264", "-preset", "veryfast", "-bf", "2"], "mp4",
     (320, 240), "25", 3.0, "astronaut"),
    ("h264-mkv", ["-c:v", "libx264", "-preset", "veryfast"], "mkv",
     (426, 240), "30000/1001", 3.0, "coffee"),
    ("h264-mp4-720p", ["-c:v", "libx264", "-preset", "ultrafast"], "mp4",
     (1280, 720), "24", 1.5, "coffee"),
    ("hevc-mp4", ["-c:v", "libx265", "-preset", "ultrafast", "-tag:v", "hvc1", *X265], "mp4",
     (640, 360), "24", 2.0, "chelsea"),
    ("hevc-mkv", ["-c:v", "libx265", "-preset", "superfast", *X265], "mkv",
     (320, 240), "10", 4.0, "astronaut"),
    ("vp9-webm", ["-c:v", "libvpx-vp9", "-deadline", "realtime", "-cpu-used", "8", "-b:v", "800k"],
     "webm", (640, 360), "30000/1001", 2.0, "coffee"),
    # Hidden alt-ref frames (packets that show no frame) where the encoder looks ahead.
    ("vp9-mkv-altref", ["-c:v", "libvpx-vp9", "-deadline", "good", "-cpu-used", "8", "-b:v", "500k",
                        "-auto-alt-ref", "1", "-lag-in-frames", "16"],
     "mkv", (426, 240), "25", 3.0, "astronaut"),
    ("av1-mp4-svt", ["-c:v", "libsvtav1", "-preset", "12", "-svtav1-params", "lp=1"], "mp4",
     (320, 240), "24", 2.0, "chelsea"),
    ("av1-webm-aom", ["-c:v", "libaom-av1", "-usage", "realtime", "-cpu-used", "8", "-b:v", "400k"],
     "webm", (426, 240), "10", 3.0, "coffee"),
    ("av1-mkv-svt", ["-c:v", "libsvtav1", "-preset", "12", "-svtav1-params", "lp=1"], "mkv",
     (640, 360), "30000/1001", 2.0, "astronaut"),
    # Longer, a keyframe each second: targets 3 s apart are reached by seeking (the server
    # seeks where a target is over 2 s ahead of the last frame it decoded).
    ("h264-mp4-12s", ["-c:v", "libx264", "-preset", "veryfast", "-g", "10", "-bf", "2"], "mp4",
     (320, 240), "10", 12.0, "coffee"),
    ("vp9-webm-12s", ["-c:v", "libvpx-vp9", "-deadline", "realtime", "-cpu-used", "8", "-b:v", "300k",
                      "-g", "10"], "webm", (320, 240), "10", 12.0, "chelsea"),
]
# A WebM written to a pipe: no duration in its header, the packets' end gives it.
PIPED = ("vp9-webm-piped", ["-c:v", "libvpx-vp9", "-deadline", "realtime", "-cpu-used", "8",
                            "-b:v", "500k", "-f", "webm"], "webm", (320, 240), "25", 2.0, "chelsea")
# Stored sideways, shown upright: (name, codec arguments, display size, `rotate` tag, rotation
# PyAV must report).
ROTATED = [
    ("h264-mp4-rot-90", ["-c:v", "libx264", "-preset", "ultrafast"], (240, 320), "270", -90),
    ("hevc-mp4-rot+90", ["-c:v", "libx265", "-preset", "ultrafast", *X265], (240, 320), "90", 90),
]
VFR = ("h264-mp4-vfr", ["-c:v", "libx264", "-preset", "veryfast"], "mp4", (320, 240), "30", 3.0,
       "chelsea")


def tool(name):
    path = shutil.which(name)
    assert path, f"{name} is missing: scripts/setup-media.sh installs it (Debian's package)"
    return path


def photograph(name):
    return Image.fromarray(getattr(skdata, name)()).convert("RGB")


def filmed(photo, size, n):
    """`n` frames of `size` (width, height): a window of the frame's aspect panning across the
    photograph (left and right every 48 frames, up and down every 37) as it zooms in and out
    (every 29), so that no two frames are alike and neighbours differ clearly."""
    w, h = size
    pw, ph = photo.size
    frames = []
    for k in range(n):
        zoom = 0.55 + 0.15 * math.cos(2 * math.pi * k / 29)
        cw, ch = pw * zoom, pw * zoom * h / w
        if ch > ph * zoom:
            cw, ch = ph * zoom * w / h, ph * zoom
        across = 1 - abs(1 - 2 * (k / 48 % 1))  # 0 → 1 → 0
        down = 0.5 - 0.5 * math.cos(2 * math.pi * k / 37)
        cx, cy = cw / 2 + (pw - cw) * across, ch / 2 + (ph - ch) * down
        box = (cx - cw / 2, cy - ch / 2, cx + cw / 2, cy + ch / 2)
        frames.append(np.asarray(photo.resize((w, h), Image.BILINEAR, box=box)))
    return frames


def encode(frames, size, rate, args, dst=None, vf=()):
    """Raw RGB frames through ffmpeg (yuv420p): the encoded file's bytes (to `dst`, or a pipe)."""
    w, h = size
    out = ["-"] if dst is None else [str(dst)]
    proc = subprocess.run(
        [tool("ffmpeg"), *QUIET, "-f", "rawvideo", "-pix_fmt", "rgb24", "-s", f"{w}x{h}", "-r", rate,
         "-i", "-", *vf, *args, "-pix_fmt", "yuv420p", *out],
        input=b"".join(f.tobytes() for f in frames), capture_output=True)
    assert proc.returncode == 0, proc.stderr.decode()
    return proc.stdout if dst is None else dst.read_bytes()


def n_frames(rate, seconds):
    return int(round(float(Fraction(rate)) * seconds))


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    """(id → (name, bytes)) and the data root: `hub/` (the `Video` struct, by `datasets`) and
    `plain/` (a binary column), the same clips in each."""
    tmp = tmp_path_factory.mktemp("video")
    rows = {}
    for name, args, ext, size, rate, seconds, photo in CLIPS:
        dst = tmp / f"{len(rows)}-{name}.{ext}"
        rows[len(rows)] = (name, encode(filmed(photograph(photo), size, n_frames(rate, seconds)),
                                        size, rate, args, dst))
    name, args, ext, size, rate, seconds, photo = PIPED
    rows[len(rows)] = (name, encode(filmed(photograph(photo), size, n_frames(rate, seconds)),
                                    size, rate, args))
    for name, args, (w, h), tag, _ in ROTATED:
        # The camera films upright; the file holds each frame turned the other way, and the tag
        # (ffmpeg writes it as the MP4 display matrix when remuxing) turns it back.
        upright = filmed(photograph("coffee"), (w, h), n_frames("24", 2.0))
        turn = {"270": 1, "90": -1}[tag]  # np.rot90's quarter turns (counterclockwise)
        stored = [np.ascontiguousarray(np.rot90(f, turn)) for f in upright]
        plain = tmp / f"{len(rows)}-{name}-untagged.mp4"
        encode(stored, (h, w), "24", args, plain)
        dst = tmp / f"{len(rows)}-{name}.mp4"
        subprocess.run([tool("ffmpeg"), *QUIET, "-i", str(plain), "-c", "copy",
                        "-metadata:s:v:0", f"rotate={tag}", str(dst)], check=True, capture_output=True)
        rows[len(rows)] = (name, dst.read_bytes())
    name, args, ext, size, rate, seconds, photo = VFR
    dst = tmp / f"{len(rows)}-{name}.{ext}"
    rows[len(rows)] = (name, encode(filmed(photograph(photo), size, n_frames(rate, seconds)), size, rate,
                                    args, dst, vf=["-vf", "select=mod(n\\,3)", "-fps_mode", "vfr"]))
    root = tmp / "root"
    write_hub(root / "hub", rows)
    (root / "plain").mkdir()
    pq.write_table(pa.table({
        "video": pa.array([data for _, data in rows.values()], type=pa.binary()),
        "id": pa.array(list(rows), type=pa.int64()),
    }), root / "plain" / "part-0.parquet", row_group_size=4)
    return root, rows


def write_hub(folder, rows):
    features = datasets.Features({"video": datasets.Video(), "id": datasets.Value("int64")})
    table = pa.table({
        "video": pa.array([{"bytes": data, "path": f"{i}-{name}"} for i, (name, data) in rows.items()],
                          type=features["video"].pa_type),
        "id": pa.array(list(rows), type=pa.int64()),
    })
    folder.mkdir(parents=True)
    path = folder / "train-00000-of-00001.parquet"
    datasets.Dataset(table, info=datasets.DatasetInfo(features=features)).to_parquet(str(path))
    assert b"Video" in pq.read_schema(path).metadata[b"huggingface"]


def round_half_away(x):
    return int(math.copysign(math.floor(abs(x) + 0.5), x))


def opened(data):
    container = av.open(io.BytesIO(data))
    return container, container.streams.video[0]


def timeline(data):
    """The stream's start, duration (in its time base) and time base, as PyAV states them:
    the stream's duration, else the container's, else where its last packet ends."""
    container, stream = opened(data)
    with container:
        tb = stream.time_base
        start = stream.start_time if stream.start_time is not None else 0
        if stream.duration:
            duration = stream.duration
        elif container.duration:
            duration = round_half_away(container.duration / 1e6 / float(tb))
        else:
            ends = [p.pts + max(p.duration or 0, 0) for p in container.demux(stream) if p.pts is not None]
            duration = max(ends) - start
    return start, duration, tb


def targets(start, duration, n):
    return [start + (2 * i + 1) * duration // (2 * n) for i in range(n)]


def upright(frame):
    """The frame as RGB, turned as FFmpeg's autorotate turns it (by -frame.rotation)."""
    rgb = frame.to_ndarray(format="rgb24")
    theta = (-round(frame.rotation)) % 360
    assert theta % 90 == 0, frame.rotation
    return np.ascontiguousarray(np.rot90(rgb, -theta // 90))  # clockwise by theta


def cover_crop(rgb, h, w):
    fh, fw = rgb.shape[:2]
    scale = max(h / fh, w / fw)
    rw, rh = max(round_half_away(fw * scale), w), max(round_half_away(fh * scale), h)
    img = Image.fromarray(rgb).resize((rw, rh), Image.BILINEAR)
    top, left = round((rh - h) / 2), round((rw - w) / 2)  # round(): ties to even
    return np.asarray(img)[top:top + h, left:left + w]


def decoded(data):
    """Every frame PyAV decodes, in presentation order: [(pts, frame)]."""
    container, stream = opened(data)
    with container:
        frames = [(f.pts, f) for f in container.decode(stream)]
    frames.sort(key=lambda pf: pf[0])
    return frames


def chosen(pts, target):
    """The index of the frame shown at `target`: the last at or before it, else the first."""
    before = [j for j, p in enumerate(pts) if p <= target]
    return before[-1] if before else 0


def mad(a, b):
    return float(np.mean(np.abs(a.astype(np.int16) - b.astype(np.int16))))


def load(served, sql, batch_size=4, shapes=None):
    """Rows by id; each batch's column shapes appended to `shapes` where given."""
    import pushdown

    out = {}
    for batch in pushdown.Loader(f"http://{served.addr}", sql=sql, batch_size=batch_size):
        cols = dict(batch.items())
        if shapes is not None:
            shapes.append({k: getattr(v, "shape", None) for k, v in cols.items()})
        ids = cols.pop("id").tolist()
        for j, i in enumerate(ids):
            out[i] = {k: v[j] for k, v in cols.items()}
    return out


def test_rotated_and_variable_rate_clips_are_what_they_claim(clips, tmp_path):
    _, rows = clips
    by_name = {name: data for name, data in rows.values()}
    for name, _, (w, h), _, rotation in ROTATED:
        frames = decoded(by_name[name])
        assert frames[0][1].rotation == rotation, (name, frames[0][1].rotation)
        assert (frames[0][1].width, frames[0][1].height) == (h, w), "stored sideways"
        # The oracle's turn is the one the ffmpeg CLI makes (autorotate is on by default).
        clip = tmp_path / f"{name}.mp4"  # MP4's index is at its end: a file, not a pipe
        clip.write_bytes(by_name[name])
        cli = subprocess.run([tool("ffmpeg"), "-v", "error", "-i", str(clip), "-frames:v", "1",
                              "-f", "rawvideo", "-pix_fmt", "rgb24", "-"], capture_output=True, check=True)
        shown = np.frombuffer(cli.stdout, np.uint8).reshape(h, w, 3)
        assert mad(upright(frames[0][1]), shown) <= 1.0, f"{name}: not turned as ffmpeg turns it"
    pts = [p for p, _ in decoded(by_name[VFR[0]])]
    steps = set(np.diff(pts).tolist())
    assert len(steps) >= 2, f"variable frame rate: intervals {steps}"


SHAPES = [("hub", (8, 112, 112)), ("plain", (4, 96, 160))]


def check_decode_frames(root, rows, table, shape):
    """`decode_frames` over `rows` (a subset of the clips) against the oracle."""
    n, h, w = shape
    served = Served(root)
    shapes = []
    try:
        ids = ", ".join(str(i) for i in rows)
        got = load(served, f"SELECT id, decode_frames(video, {n}, {h}, {w}) AS frames FROM {table} "
                           f"WHERE id IN ({ids})", shapes=shapes)
    finally:
        served.stop()
    assert sorted(got) == sorted(rows), "every clip once"
    for batch in shapes:  # a batch of B clips is one [B, T, H, W, 3] array
        assert batch["frames"][1:] == (n, h, w, 3) and batch["frames"][0] == batch["id"][0], batch
    failures, worst, apart = [], {}, {}
    for i, (name, data) in rows.items():
        frames = np.asarray(got[i]["frames"])
        assert frames.dtype == np.uint8 and frames.shape == (n, h, w, 3), (name, frames.dtype, frames.shape)
        start, duration, _ = timeline(data)
        decoded_frames = decoded(data)
        pts = [p for p, _ in decoded_frames]
        cache = {}

        def oracle(j):
            if j not in cache:
                cache[j] = cover_crop(upright(decoded_frames[j][1]), h, w)
            return cache[j]

        for t, target in enumerate(targets(start, duration, n)):
            j = chosen(pts, target)
            near = {k: mad(frames[t], oracle(k)) for k in (j - 1, j, j + 1) if 0 <= k < len(pts)}
            worst[name] = round(max(worst.get(name, 0.0), near[j]), 2)
            # The camera moves: the frames beside the chosen one are told apart from it.
            beside = min(mad(oracle(j), oracle(k)) for k in near if k != j)
            apart[name] = round(min(apart.get(name, np.inf), beside), 2)
            assert beside > 2 * TOLERANCE, f"{name}: frames {j} and a neighbour differ by {beside:.2f} only"
            if near[j] > TOLERANCE or min(near, key=near.get) != j:
                frame = decoded_frames[j][1]
                stored = ""
                if frame.rotation:
                    sideways = cover_crop(frame.to_ndarray(format="rgb24"), h, w)
                    stored = (f"; against frame {j} as stored (not turned upright) "
                              f"{mad(frames[t], sideways):.2f}")
                failures.append(f"{name} frame {t} (target {target}, oracle's frame {j} at pts {pts[j]}): "
                                f"mean |Δ| against frames {near}{stored}")
    print(f"{table} {shape}: worst mean |Δ| per clip {worst}; nearest neighbour's {apart}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("table,shape", SHAPES)
def test_decode_frames_picks_the_frames_pyav_shows_and_their_pixels(clips, table, shape):
    root, rows = clips
    turned = {name for name, *_ in ROTATED}
    check_decode_frames(root, {i: row for i, row in rows.items() if row[0] not in turned}, table, shape)


def test_video_info_and_seconds_match_pyav_metadata(clips):
    root, rows = clips
    served = Served(root)
    try:
        got = {table: load(served, f"SELECT id, video_info(video) AS info, video_seconds(video) AS secs "
                                   f"FROM {table}")
               for table in ("hub", "plain")}
    finally:
        served.stop()
    for i, (name, data) in rows.items():
        _, duration, tb = timeline(data)
        container, stream = opened(data)
        with container:
            cc = stream.codec_context
            rate = stream.average_rate or stream.base_rate
            want = {
                "seconds": float(duration * tb),
                "fps": float(rate),
                "width": cc.width,
                "height": cc.height,
                "codec": cc.codec.canonical_name,
                "frames": stream.frames or 0,
                # Degrees clockwise players turn the frames: -PyAV's counter-clockwise angle.
                "rotation": (-round(next(container.decode(stream)).rotation)) % 360,
            }
            tick = float(tb)
        for table in ("hub", "plain"):
            info = got[table][i]["info"]
            info = info.as_py() if hasattr(info, "as_py") else dict(info)
            where = f"{name} ({table})"
            assert abs(info["seconds"] - want["seconds"]) <= max(1e-6, tick), (where, info, want)
            assert abs(info["fps"] - want["fps"]) <= 1e-6, (where, info, want)
            keys = ("width", "height", "codec", "frames", "rotation")
            assert {k: info[k] for k in keys} == {k: want[k] for k in keys}, (where, info, want)
            assert float(got[table][i]["secs"]) == info["seconds"], (where, got[table][i]["secs"], info)


def audio_only(tmp):
    dst = tmp / "tone.m4a"
    subprocess.run([tool("ffmpeg"), *QUIET, "-f", "lavfi", "-i", "sine=frequency=440:duration=1",
                    "-c:a", "aac", str(dst)], check=True, capture_output=True)
    return dst.read_bytes()


def test_damaged_video_is_an_error_naming_the_row_and_the_server_keeps_serving(clips, tmp_path):
    import pushdown

    _, rows = clips
    by_name = {name: data for name, data in rows.values()}
    mp4, mkv = by_name["h264-mp4"], by_name["hevc-mkv"]
    rng = np.random.default_rng(7)
    every = ["decode_frames", "video_info", "video_seconds"]
    cases = {
        # The MP4's index (moov) is at its end: half of it has none.
        "truncated_mp4": (mp4[: len(mp4) // 2], every),
        # Matroska's header comes first and promises 4 s; the clusters of the first 1.6 s
        # follow. Its metadata reads (no frame decoded); its frames stop early.
        "truncated_mkv": (mkv[: len(mkv) // 2], ["decode_frames"]),
        "audio_only": (audio_only(tmp_path), every),
        "magic": (b"RIFX\x00\x00not a video" + mp4[16:400], every),
        "random": (rng.integers(0, 256, 4096, dtype=np.uint8).tobytes(), every),
        "empty": (b"", every),
    }
    data_root = tmp_path / "root"
    for case, (bad, _) in cases.items():
        folder = data_root / case
        folder.mkdir(parents=True)
        pq.write_table(pa.table({
            "video": pa.array([mp4, bad], type=pa.binary()),
            "id": pa.array([0, 1], type=pa.int64()),
        }), folder / "part-0.parquet")
    served = Served(data_root)
    try:
        url = f"http://{served.addr}"
        for case, (_, ops) in cases.items():
            for op in ops:
                call = f"{op}(video, 4, 64, 64)" if op == "decode_frames" else f"{op}(video)"
                loader = pushdown.Loader(url, sql=f"SELECT id, {call} AS out FROM {case}", max_retries=0)
                with pytest.raises(Exception) as err:
                    list(loader)
                message = str(err.value)
                assert "row 1" in message and op in message, f"{case} ({op}): {message}"
                assert served.alive(), f"{case} ({op}): the server died"
        ok = list(pushdown.Loader(url, sql="SELECT id, decode_frames(video, 2, 32, 32) AS f FROM magic "
                                           "WHERE id = 0"))
        assert sum(len(b["id"]) for b in ok) == 1, "the server keeps serving"
        assert ok[0]["f"].shape == (1, 2, 32, 32, 3), ok[0]["f"].shape
    finally:
        served.stop()


@pytest.mark.parametrize("table,shape", SHAPES)
def test_decode_frames_turns_rotated_clips_upright_as_players_show_them(clips, table, shape):
    # Its own test, last in the file: a server that does not turn frames upright fails here alone.
    root, rows = clips
    turned = {name for name, *_ in ROTATED}
    check_decode_frames(root, {i: row for i, row in rows.items() if row[0] in turned}, table, shape)


def test_random_clips_in_the_trainer_are_strided_runs_of_the_servers_frames(clips):
    """The recipe of the README: `video_frames` at the server (4 frames a second), then in the
    trainer `random_clip` (4 frames, 2 apart, from a start drawn per row) and `to_chw`: each
    clip is a run of the server's frames, `[B, 4, 3, H, W]`, and the starts vary over rows and
    epochs' seeds."""
    root, rows = clips
    served = Served(root)
    url = f"http://{served.addr}"
    try:
        import pushdown

        frames = {}
        for batch in pushdown.Loader(url, sql="SELECT id, video_frames(video, 4, 32, 48) AS f FROM plain",
                                     batch_size=4):
            cols = dict(batch.items())
            for j, i in enumerate(cols["id"].tolist()):
                # A list of frames per clip (Arrow's list of fixed-size lists).
                frames[i] = cols["f"][j].values.flatten().to_numpy().reshape(-1, 32, 48, 3)
        # One frame each quarter second, for as long as the clip lasts.
        for i, (name, data) in rows.items():
            start, duration, tb = timeline(data)
            want = sum(1 for k in range(64) if k * 0.25 < float(duration * tb) - 1e-9)
            assert len(frames[i]) == want, (name, len(frames[i]), want)
        starts = set()
        for seed in (1, 2):
            pipeline = {
                "dataset": "plain",
                "steps": [
                    {"op": "map", "call": "video_frames", "input": "video", "params": [4, 32, 48],
                     "output": "frames"},
                    {"op": "map", "call": "random_clip", "input": "frames", "params": [4, 2],
                     "output": "clip"},
                    {"op": "map", "call": "to_chw", "input": "clip"},
                    {"op": "select", "columns": ["id", "clip"]},
                ],
            }
            for batch in pushdown.Loader(url, pipeline=pipeline, batch_size=4, seed=seed):
                cols = dict(batch.items())
                clip = np.asarray(cols["clip"])
                assert clip.shape[1:] == (4, 3, 32, 48) and clip.dtype == np.uint8, clip.shape
                for j, i in enumerate(cols["id"].tolist()):
                    got = clip[j].transpose(0, 2, 3, 1)  # [T, H, W, C]
                    run = frames[i]
                    found = [s0 for s0 in range(len(run))
                             if all(np.array_equal(got[k], run[min(s0 + 2 * k, len(run) - 1)]) for k in range(4))]
                    nearest = [min(range(len(run)), key=lambda m: mad(got[k], run[m])) for k in range(4)]
                    assert found, (rows[i][0], "not a run of the server's frames: nearest", nearest)
                    starts.add((i, found[0]))
        assert len({s0 for _, s0 in starts}) > 2, starts
    finally:
        served.stop()
