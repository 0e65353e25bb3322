#!/usr/bin/env bash
# The duplex row of docs/benchmarks.md's front table, on one GPU: the embedded duplex architecture
# at Moshi-7B shapes, lockstep vs serial, with the CUDA-graph step (max_sessions_80ms), then the
# same eager for comparison. About 4 minutes on an H200.
source "$(dirname "$0")/env.sh"
require_cuda
python3 -m pytest -q -m gpu -p no:cacheprovider tests/duplex/test_model_graphs.py 2>&1 | tee "$OUT/duplex_gpu_tests.txt"
bench duplex --model moshi-7b-shaped --device cuda --max-sessions 64 --sizes 1,8,16,32,48,56,64 --periods 15 --serial-max 1 --cuda-graphs on 2>&1 | tee "$OUT/duplex_graphs.txt"
bench duplex --model moshi-7b-shaped --device cuda --max-sessions 64 --sizes 1,8,16,32,48,56,64 --periods 15 --serial-max 1 --cuda-graphs off 2>&1 | tee "$OUT/duplex_eager.txt"
