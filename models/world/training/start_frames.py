"""Render start frames (``models.world.start_frames``) and add them to a model file.

``K`` latents, each the encoding of a frame rendered by ``models/world/training/env.py`` at a
random spot of a random maze, with the prompt word (theme) it was rendered under.
``python -m models.world.training.start_frames --autoencoder AE.safetensors --weights
W.safetensors`` adds them to a trained model file (the training script does the same at the end
of a run).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import safe_open
from torch import Tensor

from models.world.configs import WorldModelConfig, read_config, save_model_weights
from models.world.prompts import tokenize
from models.world.start_frames import StartFrames
from models.world.training.env import THEMES, MazeEnv

# the maze seed start frames are rendered from: row i of a model's start frames is frame 0 of
# ``MazeEnv(K, seed=START_SEED, themes=...)``'s i-th maze (``models.world.training.drift`` replays them)
START_SEED = 1234


def start_mazes(
    size: int, per_theme: int, seed: int = START_SEED, device: str | torch.device = "cpu"
) -> MazeEnv:
    """The mazes start frames are rendered from, ``per_theme`` per theme in theme order."""
    themes = [t for t in range(len(THEMES)) for _ in range(per_theme)]
    return MazeEnv(len(themes), size=size, seed=seed, themes=themes, device=device)


@torch.no_grad()
def render_start_frames(
    cfg: WorldModelConfig,
    encode: Callable[[Tensor], Tensor],
    tokenize: Callable[[str], Tensor],
    per_theme: int = 16,
    seed: int = START_SEED,
    device: str | torch.device = "cpu",
) -> StartFrames:
    """``per_theme`` start latents per theme: frame 0 of fresh mazes (random spot and heading),
    through ``encode`` (frames ``[B, 1, 3, H, W]`` -> normalised latents ``[B, 1, C, h, w]``)."""
    env = start_mazes(cfg.frame_height, per_theme, seed, device)
    themes = env.theme.tolist()
    latents = encode(env.render()[:, None])[:, 0].float().cpu()
    tokens = torch.stack([tokenize(THEMES[t]) for t in themes])
    return StartFrames(latents, tokens)


def add_to_weights(path: Path, starts: StartFrames) -> None:
    """Rewrite a model file with ``starts`` (replacing any it had), keeping its tensors' dtypes."""
    with safe_open(str(path), "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys() if not k.startswith("start.")}
    dtype = tensors["dit.head.head.weight"].dtype if "dit.head.head.weight" in tensors else None
    tensors.update(
        {"start.latents": starts.latents.to(dtype or torch.float32), "start.tokens": starts.tokens}
    )
    save_model_weights(path, read_config(path), tensors)


def main(argv: list[str] | None = None) -> int:
    from models.world.training.train import load_autoencoder, normalised_encoder

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--weights", type=Path, required=True, help="model file to add the start frames to")
    p.add_argument(
        "--autoencoder", type=Path, required=True, help="the --save-autoencoder file it was trained on"
    )
    p.add_argument("--per-theme", type=int, default=16)
    p.add_argument("--seed", type=int, default=START_SEED)
    args = p.parse_args(argv)
    cfg = read_config(args.weights)
    enc, dec = load_autoencoder(args.autoencoder, cfg, "cpu")
    starts = render_start_frames(
        cfg, normalised_encoder(enc, dec), lambda w: tokenize(w, cfg), args.per_theme, args.seed
    )
    add_to_weights(args.weights, starts)
    print(f"{args.weights}: {starts.latents.shape[0]} start frames added", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
