#!/usr/bin/env bash
# Installs, from Debian's packages, the media tools the audio and video tests and the
# harness make their data with: ffmpeg (encodes WAV, FLAC, MP3, Vorbis, Opus, H.264, HEVC,
# VP9, AV1), sox (signals, its own encoders) and espeak-ng (speech); and FFmpeg's libraries
# with their headers, pkg-config and libclang, which the video ops (pushdown-ops' `video`
# feature, ffmpeg-next) build against. Idempotent: installs only what is missing.
set -euo pipefail
missing=()
for tool in ffmpeg:ffmpeg sox:sox espeak-ng:espeak-ng; do
  command -v "${tool%%:*}" >/dev/null 2>&1 || missing+=("${tool#*:}")
done
# sox's MP3 and Ogg writers come with its format libraries.
if command -v sox >/dev/null 2>&1 && ! sox -h 2>/dev/null | grep -q 'AUDIO FILE FORMATS:.* ogg'; then
  missing+=(libsox-fmt-all)
fi
# FFmpeg's development files (and what ffmpeg-sys-next's bindgen needs to read them).
for lib in libavcodec libavformat libavutil libswscale; do
  pkg-config --exists "$lib" 2>/dev/null || missing+=("$lib-dev")
done
command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
ls /usr/lib/llvm-*/lib/libclang*.so* >/dev/null 2>&1 || ls /usr/lib/*/libclang*.so* >/dev/null 2>&1 || missing+=(libclang-dev)
[[ ${#missing[@]} -eq 0 ]] && exit 0
sudo=""
[[ $(id -u) -ne 0 ]] && sudo="sudo"
echo "installing ${missing[*]} (Debian packages)" >&2
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
  "${missing[@]}" libsox-fmt-all >/dev/null
