"""The speech dataset of `harness audio`: espeak-ng reads sentences of Python's own
docstrings (varied voices and speeds, 2 to 15 s each), ffmpeg resamples them to 44.1 or
48 kHz and encodes half as FLAC (LibriSpeech's format) and half as MP3 (Common Voice's).
Written as Hugging Face `datasets` writes an `Audio` column (`struct<bytes, path>`), row
groups of 32 clips, with the transcript and a speaker id.

    python make_speech.py --out DIR/speech --clips 256
"""

import argparse
import ast
import os
import pathlib
import subprocess
import sysconfig
import tempfile

import pyarrow as pa
import pyarrow.parquet as pq

VOICES = ["en-us", "en-gb", "en-us+f3", "en-gb+m3", "en-us+m7", "en-gb-x-rp"]


def sentences(limit):
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    out = []
    for path in sorted(root.glob("*.py")):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                doc = ast.get_docstring(node, clean=True)
                if doc and 40 <= len(doc) <= 240 and doc.isascii():
                    out.append(" ".join(doc.split()))
                    if len(out) >= limit:
                        return out
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--clips", type=int, default=256)
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = {"audio": [], "text": [], "speaker": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i, text in enumerate(sentences(args.clips)):
            voice = VOICES[i % len(VOICES)]
            wav = os.path.join(tmp, "s.wav")
            subprocess.run(["espeak-ng", "-v", voice, "-s", str(140 + 10 * (i % 5)), "-w", wav, text],
                           check=True, capture_output=True)
            rate = 44100 if i % 2 else 48000
            ext, codec = ("flac", ["-c:a", "flac"]) if i % 4 < 2 else ("mp3", ["-c:a", "libmp3lame", "-q:a", "2"])
            dst = os.path.join(tmp, f"c.{ext}")
            subprocess.run(["ffmpeg", "-hide_banner", "-loglevel", "error", "-y", "-i", wav, "-ar", str(rate),
                            "-ac", "1", *codec, dst], check=True)
            rows["audio"].append({"bytes": pathlib.Path(dst).read_bytes(), "path": f"{i:05d}.{ext}"})
            rows["text"].append(text)
            rows["speaker"].append(i % len(VOICES))
    table = pa.table({
        "audio": pa.array(rows["audio"], type=pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
        "text": pa.array(rows["text"], type=pa.string()),
        "speaker": pa.array(rows["speaker"], type=pa.int64()),
    })
    meta = b'{"info": {"features": {"audio": {"_type": "Audio"}, "text": {"dtype": "string", "_type": "Value"}, ' \
           b'"speaker": {"dtype": "int64", "_type": "Value"}}}}'
    table = table.replace_schema_metadata({b"huggingface": meta})
    pq.write_table(table, out / "train-00000-of-00001.parquet", row_group_size=32)
    print(len(table))


if __name__ == "__main__":
    main()
