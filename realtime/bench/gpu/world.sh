#!/usr/bin/env bash
# The world rows of docs/benchmarks.md's front table, on one GPU: the GPU tests of the DiT's CUDA
# graphs, attention and streams, then the Wan-2.1-1.3B-shaped DiT end to end through the server at
# 1 and 4 sessions (fps_1, ttff_ms, aggregate_ratio_4, mfu), batched and time-sliced. About 6
# minutes on an H200. `--attention auto` takes FlashAttention-4 where it imports (the recorded
# figures had it: FA4_PATH names its unpacked wheels, or env.sh joins the two carried parts,
# docs/benchmarks-log.md "FlashAttention-4"), else SDPA. `bash realtime/bench/gpu/world.sh graphs-off` adds the same run with CUDA graphs off;
# `... world.sh self-forcing` adds the Self-Forcing checkpoint path on random weights of the real size,
# with Wan's VAE decoder and again with TAEHV's (taew2_1.pth, world.decoder: taehv).
# SESSIONS (default "1 4"): the session counts; an 80 GB card admits 3 Self-Forcing sessions.
source "$(dirname "$0")/env.sh"
require_cuda
SESSIONS="${SESSIONS:-1 4}"
python3 -m pytest -q -m gpu -p no:cacheprovider tests/world/test_graphs.py tests/world/test_attention.py \
    tests/world/test_stage_streams.py 2>&1 | tee "$OUT/world_gpu_tests.txt"
bench world --e2e --model wan2.1-1.3b-causal --device cuda --dtype bfloat16 --e2e-seconds 10 --e2e-warmup-s 3 --e2e-sessions $SESSIONS --cuda-graphs on 2>&1 | tee "$OUT/world_e2e.txt"
if [ "$1" = graphs-off ]; then
    bench world --e2e --model wan2.1-1.3b-causal --device cuda --dtype bfloat16 --e2e-seconds 10 --e2e-warmup-s 3 --e2e-sessions $SESSIONS --e2e-batched-only --cuda-graphs off 2>&1 | tee "$OUT/world_e2e_graphs_off.txt"
fi
if [ "$1" = self-forcing ]; then
    # the Self-Forcing checkpoint path (docs/models.md, "World"): random weights of the real size in
    # Self-Forcing's layout, Wan's VAE and precomputed prompt embeddings, written first (~3 GB)
    CKPT="${CKPT:-/tmp/self-forcing-random}"
    bench world --model self-forcing --write-random-checkpoint "$CKPT"
    python3 -m pytest -q -m gpu -p no:cacheprovider tests/world/test_wan_vae.py tests/world/test_taehv.py 2>&1 | tee "$OUT/world_sf_gpu_tests.txt"
    bench world --e2e --model self-forcing --checkpoint "$CKPT/self_forcing_dmd.pt" --vae "$CKPT/Wan2.1_VAE.pth" \
        --prompt-embeddings "$CKPT/prompts.safetensors" --device cuda --dtype bfloat16 --e2e-seconds 10 \
        --e2e-warmup-s 3 --e2e-sessions $SESSIONS --e2e-batched-only --cuda-graphs on 2>&1 | tee "$OUT/world_sf_e2e.txt"
    bench world --e2e --model self-forcing --checkpoint "$CKPT/self_forcing_dmd.pt" --decoder taehv \
        --vae "$CKPT/taew2_1.pth" --prompt-embeddings "$CKPT/prompts.safetensors" --device cuda --dtype bfloat16 \
        --e2e-seconds 10 --e2e-warmup-s 3 --e2e-sessions $SESSIONS --e2e-batched-only --cuda-graphs on 2>&1 \
        | tee "$OUT/world_sf_taehv_e2e.txt"
fi
