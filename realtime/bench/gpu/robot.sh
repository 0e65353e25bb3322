#!/usr/bin/env bash
# The robot rows of docs/benchmarks.md's front table, on one GPU: the GPU tests, pi0 at its real
# shapes through the OpenPI endpoint ((a') and (b) at 8 and 32 clients: latency_ms_1,
# throughput_ratio_8, p99_ratio_8), then the trivial policy's round trip over 5 rounds of fresh
# server pairs (overhead_ratio_libero / _aloha), and pi0 / pi0.5 served from random-weight
# checkpoints at the real size in openpi's layout (written first to /tmp; the same keys), and pi0's
# forward alone, compiled and not, with its kernel split (section f: forward_ms_N, mfu_N). About
# 11 minutes on an H200 (the checkpoint runs need the sentencepiece wheel, docs/benchmarks.md).
# Usage, from the repo root: bash realtime/bench/gpu/robot.sh
source "$(dirname "$0")/env.sh"
require_cuda
python3 -m pytest -q -m gpu -p no:cacheprovider tests/robot/test_device.py tests/robot/test_pi0_shapes.py \
    tests/robot/test_checkpoints.py tests/sessions/engine/test_worker.py 2>&1 | tee "$OUT/robot_gpu_tests.txt"
bench robot --device cuda --policy pi0-shaped --parts "a',b" --clients 8,32 --max-batch 32 --seconds 4 --policy-requests 40 2>&1 | tee "$OUT/robot_pi0_shaped.txt"
bench robot --device cuda --parts a --requests 750 --rounds 5 2>&1 | tee "$OUT/robot_overhead.txt"
bench robot --device cuda --policy pi0 --checkpoint /tmp/pi0-random --write-checkpoint --parts "a',b" --seconds 4 --policy-requests 40 2>&1 | tee "$OUT/robot_pi0_checkpoint.txt"
bench robot --device cuda --policy pi0 --checkpoint /tmp/pi0-random --parts f --profile 2>&1 | tee "$OUT/robot_pi0_forward.txt"
bench robot --device cuda --policy pi0.5 --checkpoint /tmp/pi05-random --write-checkpoint --parts "a',b" --seconds 4 --policy-requests 40 2>&1 | tee "$OUT/robot_pi05_checkpoint.txt"
