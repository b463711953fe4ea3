#!/usr/bin/env bash
# Installs the media tools the audio tests and `harness audio` make their data with, from
# Debian's packages: ffmpeg (encodes WAV, FLAC, MP3, Vorbis, Opus), sox (signals, its own
# encoders) and espeak-ng (speech). Idempotent: installs only what is missing.
set -euo pipefail
missing=()
for tool in ffmpeg:ffmpeg sox:sox espeak-ng:espeak-ng; do
  command -v "${tool%%:*}" >/dev/null 2>&1 || missing+=("${tool#*:}")
done
# sox's MP3 and Ogg writers come with its format libraries.
if command -v sox >/dev/null 2>&1 && ! sox -h 2>/dev/null | grep -q 'AUDIO FILE FORMATS:.* ogg'; then
  missing+=(libsox-fmt-all)
fi
[[ ${#missing[@]} -eq 0 ]] && exit 0
sudo=""
[[ $(id -u) -ne 0 ]] && sudo="sudo"
echo "installing ${missing[*]} (Debian packages)" >&2
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
  "${missing[@]}" libsox-fmt-all >/dev/null
