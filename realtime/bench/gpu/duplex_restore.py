"""What a duplex session's resume on another replica costs on the GPU (docs/scaling.md, "Resume on
another replica"): rebuilding a Moshi-shaped model's context from a checkpoint's token rows, one
batched prefill of the temporal transformer (``DuplexStage`` restore), against stepping the same
frames one by one.

Usage, on the device machine after ``source realtime/bench/gpu/env.sh``:
``python realtime/bench/gpu/duplex_restore.py [--model moshi-7b-shaped] [--frames 250,1000,3000]
[--kv-cache bf16|fp8]``. Random weights, one slot, eager steps. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from models.duplex.configs import CONFIGS
from models.duplex.context import FrameTokens, TokenLog
from models.duplex.stage import build_duplex_stage
from models.stage import StageItem


def random_log(cfg, frames: int, rng: np.random.Generator) -> TokenLog:  # noqa: ANN001 - a DuplexModelConfig
    """A token log of ``frames`` steps of random in-vocabulary tokens."""
    log = TokenLog(cfg.sink, cfg.window, 1 + 2 * cfg.n_q)
    high = np.array([cfg.text_vocab] + [cfg.codebook_size] * (2 * cfg.n_q))
    for _ in range(frames):
        row = rng.integers(0, high)
        log.add(FrameTokens(row.astype(np.int32), row[: 1 + cfg.n_q].astype(np.int32)))
    return log


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="moshi-7b-shaped")
    parser.add_argument("--frames", default="250,1000,3000")
    parser.add_argument("--kv-cache", choices=("bf16", "fp8"), default="bf16")
    args = parser.parse_args()
    cfg = CONFIGS[args.model]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    stage = build_duplex_stage(cfg, device, 1, seed=0, step_mode="eager", kv_fp8=args.kv_cache == "fp8")
    stage.open_state("bench", 0)
    rng = np.random.default_rng(0)
    restore_ms = {}
    for frames in (int(f) for f in args.frames.split(",")):
        context = random_log(cfg, frames, rng).snapshot(1 << 30)
        for _ in range(2):  # the first builds the kernels of this length
            if device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            stage._restore(0, context)
            if device == "cuda":
                torch.cuda.synchronize()
            restore_ms[frames] = round(1000 * (time.perf_counter() - t0), 1)
    silence = stage.silence()
    steps = []
    for _ in range(12):
        t0 = time.perf_counter()
        stage.forward([StageItem("bench", 0, silence, slot=0)])
        steps.append(time.perf_counter() - t0)
    step_ms = 1000 * sorted(steps[2:])[len(steps[2:]) // 2]
    figures = {
        "model": cfg.name,
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "kv_cache": args.kv_cache,
        "restore_ms_by_frames": restore_ms,
        "step_ms": round(step_ms, 1),
        "stepping_ms_by_frames": {f: round(f * step_ms, 0) for f in restore_ms},
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
