#!/usr/bin/env bash
# The llm rows of docs/benchmarks.md's front table: the transformers LLM stage at the Qwen2.5-0.5B
# shape on one GPU. Its GPU test (at most 50 s), then one bench process at 1, 8 and 32
# conversations with as many steps at once (keys _1, _8, _32), then 8 and 32 with one step at once
# (_8_w1, _32_w1), budgeted to finish within BUDGET_S seconds in all (default 150).
# L_SMOKE=1 runs the same at the tiny shape on the CPU (about 55 s; no GPU needed).
source "$(dirname "$0")/env.sh"
start=$SECONDS
budget=${BUDGET_S:-150}
if [ -n "$L_SMOKE" ]; then
    export OMP_NUM_THREADS=1
    bench llm --device cpu --shape tiny --conversations 1 8 32 --workers 0 1 --replies 4 --seconds 37 2>&1 | tee "$OUT/llm_smoke.txt"
    exit
fi
require_cuda
timeout 50 python3 -m pytest -q -m gpu -p no:cacheprovider tests/voice/test_bench_llm.py 2>&1 | tee "$OUT/llm.txt"
left=$((budget - (SECONDS - start) - 6))
bench llm --device cuda --conversations 1 8 32 --workers 0 1 --replies 4 --seconds "$left" 2>&1 | tee -a "$OUT/llm.txt"
