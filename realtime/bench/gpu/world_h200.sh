#!/usr/bin/env bash
# The world rows of issues 25 and 30 that need this tree only, by step (default: all, in this order):
# `checkpoints`: random weights of the real size in Self-Forcing's and CausVid's layouts (skipped
# where already written); `causvid`: the CausVid checkpoint with TAEHV's decoder and
# FlashAttention-3, one session end to end (fps_1, ttff_ms, mfu: three denoising passes and the
# clean pass, against Self-Forcing's four and one); `sessions`: the Wan-2.1-1.3B-shaped DiT at 1 to
# 4 sessions in one batch (fps_each_4, sessions_at_16fps, fps_at_bf16_peak); `taehv`: TAEHV's
# decoder alone (realtime/bench/gpu/taehv_decode.py); `ffn`: the FFN's GELU in cuBLASLt's epilogue and
# one q/k/v matmul, timed alone (realtime/bench/gpu/world_ffn.py).
# A fresh machine needs two carries (one call carries at most 64 MiB): first
# [".whlb", ".whl/av-18.1.0-cp311-abi3-manylinux_2_28_x86_64.whl"] running `... checkpoints`, then
# at once, on the warm machine, [".fa3"] running the others.
source "$(dirname "$0")/env.sh"
require_cuda
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$OUT/gpu.txt"
SF=/tmp/self-forcing-random
CV=/tmp/causvid-random
for step in ${*:-checkpoints causvid sessions taehv ffn}; do
    case $step in
    checkpoints)
        [ -e "$SF/taew2_1.pth" ] || bench world --model self-forcing --write-random-checkpoint "$SF" 2>&1 | tail -3
        [ -e "$CV/taew2_1.pth" ] || bench world --model causvid --write-random-checkpoint "$CV" 2>&1 | tail -3
        ;;
    causvid)
        bench world --e2e --model causvid --checkpoint "$CV/model.pt" --decoder taehv --vae "$CV/taew2_1.pth" \
            --prompt-embeddings "$CV/prompts.safetensors" --device cuda --dtype bfloat16 --e2e-seconds 10 \
            --e2e-warmup-s 3 --e2e-sessions 1 --e2e-batched-only --cuda-graphs on --attention flash3 2>&1 \
            | tee "$OUT/world_causvid.txt"
        ;;
    sessions)
        bench world --e2e --model wan2.1-1.3b-causal --device cuda --dtype bfloat16 --e2e-seconds 10 \
            --e2e-warmup-s 3 --e2e-sessions 1 2 3 4 --e2e-batched-only --cuda-graphs on --attention flash3 2>&1 \
            | tee "$OUT/world_wan_sessions.txt"
        ;;
    taehv)
        python3 "$(dirname "$0")/taehv_decode.py" "$SF/taew2_1.pth" 2>&1 | tee "$OUT/taehv_decode.txt"
        ;;
    ffn)
        python3 "$(dirname "$0")/world_ffn.py" 2>&1 | tee "$OUT/world_ffn.txt"
        ;;
    *) echo "world_h200.sh: unknown step $step (checkpoints, causvid, sessions, taehv, ffn)"; exit 2 ;;
    esac
done
