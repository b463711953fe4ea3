"""Audio that other tools made, read as speech tutorials read it.

Speech synthesised by espeak-ng and signals made by sox (a chirp to 20 kHz, white noise,
silence, a clipped sine) are encoded by ffmpeg into every format the ops decode (WAV as
unsigned 8, 16, 24 and 32-bit PCM and 32-bit float, FLAC, MP3, Ogg Vorbis, Ogg Opus), mono
and stereo, at 8, 16, 22.05, 44.1 and 48 kHz, plus a few files sox encoded itself. Hugging
Face `datasets` writes them to Parquet under its `Audio` feature (`struct<bytes, path>`, the
feature in the file's metadata; the values are given as that struct, so no torchcodec
encode runs).

The oracles are the libraries tutorials use: libsndfile (`soundfile`) decoding plus soxr's
default (HQ) resampling for `decode_audio` (signal-to-error at least 40 dB for lossless
files, lengths within 1 sample per second for every file), `soundfile`'s duration for
`audio_seconds` (within 10 ms), and `transformers.WhisperFeatureExtractor` (its numpy path)
for `log_mel`, at 80 and 128 bins, on the server and in the trainer (at most 1e-3 apart on its
log scale).
"""

import io
import shutil
import subprocess

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import Served

sf = pytest.importorskip("soundfile")
soxr = pytest.importorskip("soxr")
datasets = pytest.importorskip("datasets")

RATE = 16000
RATES = [8000, 16000, 22050, 44100, 48000]

# (name, ffmpeg codec arguments, extension, lossless)
FORMATS = [
    ("wav-u8", ["-c:a", "pcm_u8"], "wav", True),
    ("wav-s16", ["-c:a", "pcm_s16le"], "wav", True),
    ("wav-s24", ["-c:a", "pcm_s24le"], "wav", True),
    ("wav-s32", ["-c:a", "pcm_s32le"], "wav", True),
    ("wav-f32", ["-c:a", "pcm_f32le"], "wav", True),
    ("flac", ["-c:a", "flac"], "flac", True),
    ("mp3", ["-c:a", "libmp3lame", "-q:a", "2"], "mp3", False),
    ("vorbis", ["-c:a", "libvorbis", "-q:a", "5"], "ogg", False),
    ("opus", ["-c:a", "libopus", "-b:a", "96k"], "opus", False),
]


def tool(name):
    path = shutil.which(name)
    assert path, f"{name} is missing: scripts/setup-media.sh installs it (Debian's package)"
    return path


def run(*args):
    subprocess.run([str(a) for a in args], check=True, capture_output=True)


def sources(tmp):
    """Speech from espeak-ng and signals from sox, as WAV files."""
    out = {}
    lines = [
        ("speech-us", "en-us", "The quick brown fox jumps over the lazy dog, twice before noon."),
        ("speech-gb", "en-gb", "Speech recognition models learn from thousands of hours of audio."),
    ]
    for name, voice, text in lines:
        out[name] = tmp / f"{name}.wav"
        run(tool("espeak-ng"), "-v", voice, "-w", out[name], text)
    sox = tool("sox")
    synth = {
        "chirp": ["synth", "2", "sine", "50-20000", "vol", "0.5"],
        "noise": ["synth", "1.5", "whitenoise", "vol", "0.3"],
        "silence": ["trim", "0", "1"],
        "clipped": ["synth", "1", "sine", "220", "vol", "2"],
    }
    for name, effect in synth.items():
        out[name] = tmp / f"{name}.wav"
        run(sox, "-V1", "-n", "-r", "48000", "-b", "16", "-c", "1", out[name], *effect)
    return out


def encode(src, dst, fmt_args, rate, channels):
    if "libopus" in fmt_args and rate not in (8000, 12000, 16000, 24000, 48000):
        rate = 48000  # libopus takes these rates only; ffmpeg resamples to it
    run(tool("ffmpeg"), "-hide_banner", "-loglevel", "error", "-y", "-i", src,
        "-ar", rate, "-ac", channels, *fmt_args, dst)


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    """(id → (format, lossless, bytes)) and the dataset root holding them as the Hub does."""
    tmp = tmp_path_factory.mktemp("audio")
    src = sources(tmp)
    names = sorted(src)
    rows = {}
    i = 0
    for f, (fmt, args, ext, lossless) in enumerate(FORMATS):
        for r, rate in enumerate(RATES):
            for channels in (1, 2):
                source = names[(f + r + channels) % len(names)]
                dst = tmp / f"{i}-{fmt}-{rate}-{channels}-{source}.{ext}"
                encode(src[source], dst, args, rate, channels)
                rows[i] = (f"{fmt}/{source}", lossless, dst.read_bytes())
                i += 1
    # Files sox encoded itself (its own FLAC, Vorbis and WAV writers).
    sox = tool("sox")
    for name, ext, lossless in [("speech-us", "flac", True), ("speech-gb", "ogg", False),
                                ("chirp", "wav", True)]:
        dst = tmp / f"{i}-sox-{name}.{ext}"
        run(sox, "-V1", src[name], "-r", "44100", "-c", "2", dst)
        rows[i] = (f"sox-{ext}/{name}", lossless, dst.read_bytes())
        i += 1
    root = tmp / "root"
    write_hub(root / "speech", rows)
    return root, rows


def write_hub(folder, rows):
    features = datasets.Features({"audio": datasets.Audio(), "id": datasets.Value("int64")})
    table = pa.table({
        "audio": pa.array([{"bytes": data, "path": f"{i}.audio"} for i, (_, _, data) in rows.items()],
                          type=features["audio"].pa_type),
        "id": pa.array(list(rows), type=pa.int64()),
    })
    folder.mkdir(parents=True)
    path = folder / "train-00000-of-00001.parquet"
    datasets.Dataset(table, info=datasets.DatasetInfo(features=features)).to_parquet(str(path))
    assert b"Audio" in pq.read_schema(path).metadata[b"huggingface"]


def oracle_pcm(data, rate=RATE):
    """libsndfile's decode, the channels' mean, soxr's HQ resampling."""
    x, sr = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
    mono = x.mean(axis=1, dtype=np.float64).astype(np.float32)
    return soxr.resample(mono, sr, rate) if sr != rate else mono, sr


def ser_db(ref, got):
    n = min(len(ref), len(got))
    ref, got = ref[:n].astype(np.float64), got[:n].astype(np.float64)
    err = float(np.sum((ref - got) ** 2))
    return np.inf if err == 0 else 10 * np.log10(float(np.sum(ref ** 2)) / err)


def load(served, sql, batch_size=8):
    import pushdown

    out = {}
    for batch in pushdown.Loader(f"http://{served.addr}", sql=sql, batch_size=batch_size):
        cols = {k: v for k, v in batch.items()}
        ids = cols.pop("id").tolist()
        for j, i in enumerate(ids):
            out[i] = {k: v[j] for k, v in cols.items()}
    return out


def test_decode_audio_and_durations_match_soundfile_and_soxr(clips):
    root, rows = clips
    served = Served(root)
    try:
        got = load(served, f"SELECT id, audio_seconds(audio) AS secs, "
                           f"decode_audio(audio, {RATE}) AS pcm FROM speech")
    finally:
        served.stop()
    assert sorted(got) == sorted(rows), "every clip once"
    worst_lossless, worst_lossy, report = np.inf, np.inf, {}
    for i, (name, lossless, data) in rows.items():
        ref, sr = oracle_pcm(data)
        pcm = got[i]["pcm"]
        pcm = np.asarray(pcm.values if hasattr(pcm, "values") else pcm, dtype=np.float32)
        seconds = len(ref) / RATE
        assert abs(len(pcm) - len(ref)) <= 1 + seconds, f"{name}: {len(pcm)} samples, soundfile+soxr {len(ref)}"
        info = sf.info(io.BytesIO(data))
        assert abs(float(got[i]["secs"]) - info.duration) <= 0.010, \
            f"{name}: audio_seconds {got[i]['secs']}, soundfile {info.duration}"
        if np.sqrt(np.mean(ref.astype(np.float64) ** 2)) < 1e-4:
            # Silence (a lossy codec's is not all zeros): its ratio to an error means
            # nothing; the samples must be as near silent as libsndfile's.
            assert np.max(np.abs(pcm[: len(ref)] - ref[: len(pcm)])) <= 1e-3, f"{name}: silence"
            continue
        ser = ser_db(ref, pcm)
        report[name] = round(min(ser, report.get(name, np.inf)), 1)
        if lossless:
            worst_lossless = min(worst_lossless, ser)
            assert ser >= 40.0, f"{name} (lossless): signal-to-error {ser:.1f} dB against soundfile+soxr"
        else:
            worst_lossy = min(worst_lossy, ser)
            assert ser >= 20.0, f"{name} (lossy): {ser:.1f} dB: not the same audio as libsndfile decodes"
    print(f"worst signal-to-error: lossless {worst_lossless:.1f} dB, lossy {worst_lossy:.1f} dB; per clip {report}")


def whisper(feature_size):
    transformers = pytest.importorskip("transformers")
    return transformers.WhisperFeatureExtractor(feature_size=feature_size)


@pytest.mark.parametrize("n_mels", [80, 128])
def test_log_mel_matches_whisper_feature_extractor_on_server_and_trainer(clips, n_mels):
    import pushdown

    root, rows = clips
    extractor = whisper(n_mels)
    # Files at 16 kHz that decode exactly (lossless): the oracle sees the same samples.
    exact = {i for i, (name, lossless, data) in rows.items()
             if lossless and sf.info(io.BytesIO(data)).samplerate == RATE}
    assert len(exact) >= 6, exact
    served = Served(root)
    try:
        url = f"http://{served.addr}"
        got = {}
        pipeline = {
            "dataset": "speech",
            "steps": [
                {"op": "map", "call": "log_mel", "input": "audio", "params": [RATE, n_mels]},
                {"op": "select", "columns": ["id", "audio"]},
                {"op": "batch", "size": 4},
            ],
        }
        for placement in ["server", "trainer"]:
            for batch in pushdown.Loader(url, pipeline=pipeline, placement=placement):
                assert batch["audio"].shape[1:] == (n_mels, 3000), batch["audio"].shape
                assert batch["audio"].dtype == np.float32
                for i, mel in zip(batch["id"].tolist(), batch["audio"]):
                    got[(placement, i)] = mel
        # The PCM path: log-mel of decode_audio's output, in SQL.
        for batch in pushdown.Loader(url, sql=f"SELECT id, log_mel(decode_audio(audio, {RATE}), {RATE}, {n_mels}) "
                                              f"AS mel FROM speech", batch_size=8):
            for i, mel in zip(batch["id"].tolist(), batch["mel"]):
                got[("pcm", i)] = mel
    finally:
        served.stop()
    worst = 0.0
    for i in exact:
        x, _ = oracle_pcm(rows[i][2])
        want = extractor(x, sampling_rate=RATE, return_tensors="np").input_features[0]
        for where in ["server", "trainer", "pcm"]:
            diff = float(np.max(np.abs(got[(where, i)] - want)))
            worst = max(worst, diff)
            assert diff <= 1e-3, f"{rows[i][0]} ({where}): max |Δ| {diff:.2e} against WhisperFeatureExtractor"
    for i in set(rows) - exact:
        assert np.array_equal(got[("server", i)], got[("trainer", i)]), "bit-identical at both ends"
    print(f"{n_mels} bins: worst max |Δ| {worst:.2e} over {len(exact)} clips × 3 placements")


def test_float16_features_and_fixed_shapes_arrive_as_tensors(clips):
    import pushdown

    root, rows = clips
    served = Served(root)
    try:
        batches = list(pushdown.Loader(
            f"http://{served.addr}",
            sql=f"SELECT id, log_mel(audio, {RATE}, 80, 400, 160, 10, 'float16') AS mel FROM speech "
                f"WHERE audio_seconds(audio) BETWEEN 2.5 AND 20",
            batch_size=8))
    finally:
        served.stop()
    kept = {i for b in batches for i in b["id"].tolist()}
    want = {i for i, (_, _, data) in rows.items() if 2.5 <= sf.info(io.BytesIO(data)).duration <= 20}
    assert kept == want and 0 < len(kept) < len(rows), (len(kept), len(rows))
    assert all(b["mel"].dtype == np.float16 and b["mel"].shape[1:] == (80, 1000) for b in batches)


def test_damaged_audio_is_an_error_naming_the_row_and_the_server_keeps_serving(clips, tmp_path):
    import pushdown

    _, rows = clips
    flac = next(data for name, lossless, data in rows.values() if name.startswith("flac/speech"))
    cases = {
        "truncated": flac[: len(flac) // 2],
        "magic": b"ID4\x00not audio at all" + flac[20:200],
        "empty": b"",
    }
    for case, bad in cases.items():
        folder = tmp_path / case
        folder.mkdir()
        pq.write_table(pa.table({
            "audio": pa.array([flac, bad], type=pa.binary()),
            "id": pa.array([0, 1], type=pa.int64()),
        }), folder / "part-0.parquet")
    served = Served(tmp_path)
    try:
        url = f"http://{served.addr}"
        for case in cases:
            loader = pushdown.Loader(url, sql=f"SELECT id, decode_audio(audio, {RATE}) AS pcm FROM {case}",
                                     max_retries=0)
            with pytest.raises(Exception) as err:
                list(loader)
            message = str(err.value)
            assert "row 1" in message and "decode_audio" in message, f"{case}: {message}"
            assert served.alive(), f"{case}: the server died"
        ok = list(pushdown.Loader(url, sql="SELECT id, audio_seconds(audio) AS s FROM truncated WHERE id = 0"))
        assert sum(len(b["id"]) for b in ok) == 1, "the server keeps serving"
    finally:
        served.stop()
