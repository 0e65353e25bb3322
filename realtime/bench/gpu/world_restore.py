"""What a world session's resume on another replica costs on the GPU (docs/scaling.md, "Resume on
another replica"): the first block after ``WorldModel.restore`` (one clean DiT pass per held block,
then the decoder's cache rebuilt) against a steady block, through the world's two model stages.

Usage, on the device machine after ``source realtime/bench/gpu/env.sh``:
``python realtime/bench/gpu/world_restore.py [--model wan2.1-1.3b-causal] [--blocks 12]``.
Random weights at the named shape, bf16, CUDA graphs of the steady pass. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from models.stage import StageItem
from models.world.configs import CONFIGS
from models.world.model import WorldModel, WorldTick, resident_blocks
from models.world.stage import WorldBlockInput, WorldBlockStage, WorldDecodeStage

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _block(dit: WorldBlockStage, decoder: WorldDecodeStage, inp: WorldBlockInput, slot: int) -> tuple:
    """One block through both stages; (its frames' output, wall seconds to the frames on the host)."""
    t0 = time.perf_counter()
    (block,) = dit.forward([StageItem(inp.tick.session_id, 0, inp, slot=slot)])
    (frames,) = decoder.forward([StageItem(inp.tick.session_id, 0, block, slot=slot)])
    return frames, time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="wan2.1-1.3b-causal")
    parser.add_argument("--blocks", type=int, default=12, help="blocks generated before the move")
    args = parser.parse_args()
    cfg = CONFIGS[args.model]
    model = WorldModel.build(cfg, slots=2, device=DEVICE, dtype=torch.bfloat16, seed=0)
    if DEVICE == "cuda":
        model.capture_graphs(1)
    dit, decoder = WorldBlockStage(model), WorldDecodeStage(model)
    for sid, slot in (("there", 0), ("here", 1)):
        dit.open_state(sid, slot)
        decoder.open_state(sid, slot)
    action = torch.zeros(max(cfg.action_dim, 1))
    held, steady, there = [], [], None
    for i in range(args.blocks + 1):
        inp = WorldBlockInput(WorldTick("there", i, "a stone maze", action), 3)
        there, seconds = _block(dit, decoder, inp, 0)
        held.append(there.held)
        steady.append(seconds)
    kept = tuple(held[b] for b in resident_blocks(cfg, args.blocks))
    moved = WorldBlockInput(WorldTick("here", args.blocks, "a stone maze", action), 3, restore=kept)
    frames, restore_s = _block(dit, decoder, moved, 1)
    after = [
        _block(dit, decoder, WorldBlockInput(WorldTick("here", b, "a stone maze", action), 3), 1)[1]
        for b in range(args.blocks + 1, args.blocks + 4)
    ]
    pixels = (frames.frames.float() - there.frames.float()).abs()  # against the session that stayed
    steady_ms = 1000 * sorted(steady[-4:])[len(steady[-4:]) // 2]
    figures = {
        "model": cfg.name,
        "device": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu",
        "held_blocks": len(kept),
        "held_bytes": sum(h.latent.nbytes for h in kept),
        "steady_block_ms": round(steady_ms, 1),
        "first_block_after_restore_ms": round(1000 * restore_s, 1),
        "restore_added_ms": round(1000 * restore_s - steady_ms, 1),
        "blocks_after_restore_ms": [round(1000 * s, 1) for s in after],
        "pixel_diff_max": int(pixels.max()),
        "pixel_diff_mean": round(float(pixels.mean()), 3),
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
