#!/usr/bin/env bash
# The world rows of docs/benchmarks.md's front table, on one GPU: the GPU tests of the DiT's CUDA
# graphs, attention and streams, then the Wan-2.1-1.3B-shaped DiT end to end through the server at
# 1 and 4 sessions (fps_1, ttff_ms, aggregate_ratio_4, mfu), batched and time-sliced. About 6
# minutes on an H200. `--attention auto` takes FlashAttention-4 where it imports (the recorded
# figures had it: FA4_PATH names its unpacked wheels, docs/benchmarks-log.md "FlashAttention-4"),
# else SDPA. `bash realtime/bench/gpu/world.sh graphs-off` adds the same run with CUDA graphs off.
source "$(dirname "$0")/env.sh"
require_cuda
python3 -m pytest -q -m gpu -p no:cacheprovider tests/world/test_graphs.py tests/world/test_attention.py \
    tests/world/test_stage_streams.py 2>&1 | tee "$OUT/world_gpu_tests.txt"
bench world --e2e --model wan2.1-1.3b-causal --device cuda --dtype bfloat16 --e2e-seconds 10 --e2e-warmup-s 3 --e2e-sessions 1 4 --cuda-graphs on 2>&1 | tee "$OUT/world_e2e.txt"
if [ "$1" = graphs-off ]; then
    bench world --e2e --model wan2.1-1.3b-causal --device cuda --dtype bfloat16 --e2e-seconds 10 --e2e-warmup-s 3 --e2e-sessions 1 4 --e2e-batched-only --cuda-graphs off 2>&1 | tee "$OUT/world_e2e_graphs_off.txt"
fi
