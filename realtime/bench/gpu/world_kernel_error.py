"""How far each attention kernel moves the Self-Forcing checkpoint's denoised latents, on one GPU:
the same random checkpoint (``realtime bench world --write-random-checkpoint DIR``), seed, prompt
and blocks through ``WorldModel.generate`` with SDPA in float32 (the reference) and, in bf16,
with SDPA and each kernel named; per kernel the largest ``max |x - ref| / max |ref|`` over the
blocks (the first blocks fill the 21-frame window, the last ones attend all of it). bf16 SDPA's
figure is what bf16 rounding alone costs: issue 25's equivalence bound.

Run on the device machine from the repo root (after env.sh; FA3 and FA4 where carried):
    python3 realtime/bench/gpu/world_kernel_error.py DIR [--blocks 9] [--kernels flash4 flash3 flash3-fp8]
Ends with one JSON line: ``{kernel: worst relative error}``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from models.world.attention import kernel_usable
from models.world.configs import CHECKPOINT_MODELS
from models.world.model import WorldModel, WorldTick
from models.world.text_encoder import PrecomputedEmbeddings, PromptEmbedder

PROMPT = "stone"  # one of realtime.bench.world_checkpoint.BENCH_PROMPTS


def latents(folder: Path, kernel: str, dtype: torch.dtype, blocks: int) -> list[torch.Tensor]:
    """Each block's denoised latents (float32, on the GPU) from one session of the checkpoint."""
    cfg = CHECKPOINT_MODELS["self-forcing"]
    prompts = PromptEmbedder(
        PrecomputedEmbeddings.load(folder / "prompts.safetensors", cfg.text_dim, "cuda", dtype, cfg.text_len),
        cfg.text_len,
    )
    model = WorldModel.build(
        cfg, slots=1, device="cuda", dtype=dtype, attention=kernel,
        checkpoint=folder / "self_forcing_dmd.pt", prompts=prompts,
    )  # fmt: skip
    model.open("s", seed=0)
    action = torch.zeros(cfg.action_dim)
    out = [model.generate([WorldTick("s", b, PROMPT, action)]).float() for b in range(blocks)]
    del model
    torch.cuda.empty_cache()
    return out


def worst_relative_error(got: list[torch.Tensor], ref: list[torch.Tensor]) -> float:
    return max(((g - r).abs().max() / r.abs().max()).item() for g, r in zip(got, ref, strict=True))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder", type=Path)
    p.add_argument("--blocks", type=int, default=9)
    p.add_argument("--kernels", nargs="+", default=["flash4", "flash3", "flash3-fp8"])
    args = p.parse_args()
    ref = latents(args.folder, "sdpa", torch.float32, args.blocks)
    errors = {"sdpa": worst_relative_error(latents(args.folder, "sdpa", torch.bfloat16, args.blocks), ref)}
    for kernel in args.kernels:
        if not kernel_usable(kernel, torch.device("cuda"), torch.bfloat16):
            print(f"{kernel}: not installed here, skipped")
            continue
        errors[kernel] = worst_relative_error(latents(args.folder, kernel, torch.bfloat16, args.blocks), ref)
    for kernel, err in errors.items():
        print(f"{kernel:11s} bf16 inputs{' (FP8 attention)' if 'fp8' in kernel else ''}: worst block's "
              f"max |x - ref| / max |ref| = {err:.3e} (ref: SDPA in float32)")  # fmt: skip
    print(json.dumps({k: float(f"{v:.4g}") for k, v in errors.items()}))


if __name__ == "__main__":
    main()
