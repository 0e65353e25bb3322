#!/usr/bin/env bash
# The duplex row of docs/benchmarks.md's front table, on one GPU: the embedded duplex architecture
# at Moshi-7B shapes, lockstep vs serial, with the CUDA-graph step (max_sessions_80ms), the
# temporal KV in bf16 and in FP8 (duplex.kv_cache: fp8), each up to what the card's memory holds
# (an H200's 141 GB: 64 bf16 / 144 FP8 sessions; an H100's 80 GB: 36 / 72), then (`... duplex.sh
# eager`) the bf16 step eager for comparison. About 6 minutes on an H200.
source "$(dirname "$0")/env.sh"
require_cuda
python3 -m pytest -q -m gpu -p no:cacheprovider tests/duplex/test_model_graphs.py tests/duplex/test_kv_fp8.py 2>&1 | tee "$OUT/duplex_gpu_tests.txt"
total_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [ "$total_mib" -ge 140000 ]; then
    BF16="1,16,32,48,64"; FP8="1,32,64,96,128,144"
else
    BF16="1,16,32,36"; FP8="1,16,32,48,64,72"
fi
run() {  # run NAME SIZES EXTRA...
    local name=$1 sizes=$2; shift 2
    bench duplex --model moshi-7b-shaped --device cuda --max-sessions "${sizes##*,}" --sizes "$sizes" \
        --periods 15 --serial-max 1 "$@" 2>&1 | tee "$OUT/duplex_$name.txt"
}
run graphs "$BF16" --cuda-graphs on
run graphs_fp8 "$FP8" --cuda-graphs on --kv-cache fp8
if [ "$1" = eager ]; then
    run eager "$BF16" --cuda-graphs off
fi
