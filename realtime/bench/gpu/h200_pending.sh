#!/usr/bin/env bash
# The H200-only measurements issues 25 and 30 wait on, by step (default: all, in this order):
# `world`: the Self-Forcing checkpoint with TAEHV's decoder and FlashAttention-3 (fps_1, ttff_ms,
# mfu); `robot`: pi0 served from a random-weight checkpoint of the real size in openpi's layout
# (latency_ms_1, throughput_ratio_8, p99_ratio_8), then pi0.5's latency_ms_1; `duplex`: the
# Moshi-7B shape past 128 sessions with the FP8 temporal KV (max_sessions_80ms; an 80 GB card
# admits 81).
# A fresh machine needs the packages of two carries (one call carries at most 64 MiB): first
# [".whlb", ".whl/av-18.1.0-cp311-abi3-manylinux_2_28_x86_64.whl"] (52 MB) running
# `bash realtime/bench/gpu/h200_pending.sh duplex robot` (~6 minutes), then at once, on the
# warm machine, [".fa3"] running `bash realtime/bench/gpu/h200_pending.sh world` (~2 minutes).
source "$(dirname "$0")/env.sh"
require_cuda
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
STEPS="${*:-world robot duplex}"
for step in $STEPS; do
    case $step in
    world)
        SF=/tmp/self-forcing-random
        [ -e "$SF/taew2_1.pth" ] || bench world --model self-forcing \
            --write-random-checkpoint "$SF" 2>&1 | tail -3
        bench world --e2e --model self-forcing --checkpoint "$SF/self_forcing_dmd.pt" \
            --decoder taehv --vae "$SF/taew2_1.pth" --prompt-embeddings "$SF/prompts.safetensors" --device cuda \
            --dtype bfloat16 --e2e-seconds 10 --e2e-warmup-s 3 --e2e-sessions 1 --e2e-batched-only --cuda-graphs on \
            --attention flash3 2>&1 | tee "$OUT/world_sf_taehv_flash3.txt"
        ;;
    robot)
        for policy in pi0 pi0.5; do
            ckpt="/tmp/$policy-random"
            write=""
            [ -e "$ckpt/model.safetensors" ] || write="--write-checkpoint"
            parts="a',b"
            [ "$policy" = pi0.5 ] && parts="a'"
            bench robot --device cuda --policy "$policy" --checkpoint "$ckpt" $write \
                --parts "$parts" --seconds 4 --policy-requests 40 2>&1 | tee "$OUT/robot_${policy}_checkpoint.txt"
        done
        ;;
    duplex)
        bench duplex --model moshi-7b-shaped --device cuda --max-sessions 144 \
            --sizes 1,128,144 --periods 15 --serial-max 1 --cuda-graphs on --kv-cache fp8 2>&1 | tee "$OUT/duplex_fp8_144.txt"
        ;;
    *) echo "h200_pending.sh: unknown step $step (world, robot, duplex)"; exit 2 ;;
    esac
done
