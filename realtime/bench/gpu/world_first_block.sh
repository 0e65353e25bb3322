#!/usr/bin/env bash
# The world's time to first frame and decoder cost, this tree beside an older one, by step
# (default: all, in this order):
# `tests`: the GPU tests of the DiT's CUDA graphs (first-block and steady), its streams, TAEHV's
# decoder and the attention kernels; `sf`: the Self-Forcing checkpoint (random weights, real size)
# with TAEHV's decoder and FlashAttention-3, one session end to end (fps_1, ttff_ms, mfu, and the
# stage means: launch, denoise, decode); `wan`: the Wan-2.1-1.3B-shaped DiT, the same way.
# BASELINE (optional): a folder holding an older tree's packages, made where git is with
# `mkdir -p baseline && git archive <commit> realtime sessions models clients | tar -x -C baseline`
# and carried with the call (an untracked folder travels); each bench step then runs there first,
# on the same machine and checkpoint, so the two trees' figures stand side by side in one run.
# A fresh machine needs two carries (one call carries at most 64 MiB): first
# [".whlb", ".whl/av-18.1.0-cp311-abi3-manylinux_2_28_x86_64.whl"] running `... tests`, then at
# once, on the warm machine, [".fa3"] running `... sf` and `... wan`.
source "$(dirname "$0")/env.sh"
require_cuda
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$OUT/gpu.txt"
SF=/tmp/self-forcing-random
TREES=". "
[ -n "$BASELINE" ] && TREES="$BASELINE ."
for step in ${*:-tests sf wan}; do
    case $step in
    tests)
        python3 -m pytest -q -m gpu -p no:cacheprovider tests/world/test_graphs.py tests/world/test_stage_streams.py \
            tests/world/test_taehv.py tests/world/test_attention.py 2>&1 | tee "$OUT/world_gpu_tests.txt"
        ;;
    sf)
        [ -e "$SF/taew2_1.pth" ] || bench world --model self-forcing --write-random-checkpoint "$SF" 2>&1 | tail -3
        for tree in $TREES; do
            name=$([ "$tree" = . ] && echo this || echo baseline)
            pushd "$tree" >/dev/null || exit 1
            bench world --e2e --model self-forcing --checkpoint "$SF/self_forcing_dmd.pt" --decoder taehv \
                --vae "$SF/taew2_1.pth" --prompt-embeddings "$SF/prompts.safetensors" --device cuda --dtype bfloat16 \
                --e2e-seconds 10 --e2e-warmup-s 3 --e2e-sessions 1 --e2e-batched-only --cuda-graphs on \
                --attention flash3 2>&1 | tee "$OUT/world_sf_$name.txt"
            popd >/dev/null || exit 1
        done
        ;;
    wan)
        for tree in $TREES; do
            name=$([ "$tree" = . ] && echo this || echo baseline)
            pushd "$tree" >/dev/null || exit 1
            bench world --e2e --model wan2.1-1.3b-causal --device cuda --dtype bfloat16 --e2e-seconds 10 \
                --e2e-warmup-s 3 --e2e-sessions 1 --e2e-batched-only --cuda-graphs on --attention flash3 2>&1 \
                | tee "$OUT/world_wan_$name.txt"
            popd >/dev/null || exit 1
        done
        ;;
    *) echo "world_first_block.sh: unknown step $step (tests, sf, wan)"; exit 2 ;;
    esac
done
