#!/usr/bin/env bash
# The H200-only measurements issues 25 and 30 still wait on, in one device call (about 8 minutes),
# most wanted first: the Self-Forcing checkpoint with TAEHV's decoder and FlashAttention-3 (fps_1,
# ttff_ms, mfu), pi0 served from a random-weight checkpoint of the real size in openpi's layout
# (latency_ms_1, throughput_ratio_8, p99_ratio_8), then duplex at the Moshi-7B shape past 128
# sessions with the FP8 temporal KV (max_sessions_80ms; an 80 GB card admits 81).
# Carry .whlb (or .whl) and .fa3.
# Each step is bounded so that a slow one cannot take the later ones' time.
# Usage, from the repo root: bash realtime/bench/gpu/h200_pending.sh
source "$(dirname "$0")/env.sh"
require_cuda
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
SF=/tmp/self-forcing-random
timeout 90 python3 -m realtime.cli bench world --model self-forcing --write-random-checkpoint "$SF" 2>&1 | tail -3
timeout 200 python3 -m realtime.cli bench world --e2e --model self-forcing --checkpoint "$SF/self_forcing_dmd.pt" \
    --decoder taehv --vae "$SF/taew2_1.pth" --prompt-embeddings "$SF/prompts.safetensors" --device cuda \
    --dtype bfloat16 --e2e-seconds 10 --e2e-warmup-s 3 --e2e-sessions 1 --e2e-batched-only --cuda-graphs on \
    --attention flash3 2>&1 | tee "$OUT/world_sf_taehv_flash3.txt"
timeout 150 python3 -m realtime.cli bench robot --device cuda --policy pi0 --checkpoint /tmp/pi0-random --write-checkpoint \
    --parts "a',b" --seconds 4 --policy-requests 40 2>&1 | tee "$OUT/robot_pi0_checkpoint.txt"
timeout 200 python3 -m realtime.cli bench duplex --model moshi-7b-shaped --device cuda --max-sessions 144 \
    --sizes 1,128,144 --periods 15 --serial-max 1 --cuda-graphs on --kv-cache fp8 2>&1 | tee "$OUT/duplex_fp8_144.txt"
