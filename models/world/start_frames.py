"""Start frames: real maze frames, encoded, that a session's first block begins from.

A causal video model sampled in a few steps from pure noise draws the *mean* of every world it
could start in: a flat, blurred frame, and every later block continues from that blur. World
models are therefore started from a context frame (Oasis, GameNGen and DIAMOND from real game
frames). The embedded model ships its own: ``K`` latents, each the encoding of a frame rendered by
``models/world/env.py`` at a random spot of a random maze, with the prompt word (theme) it was
rendered under. A session's first block holds its first latent frame at the start latent its
prompt and seed choose (``sampler.pin_starts``), so the first frame is a real maze frame and every
later block continues from a sharp past, the situation the DiT was trained in (teacher forcing).

Stored in the model's safetensors file as ``start.latents [K, C, h, w]`` (normalised like the
DiT's latents) and ``start.tokens [K, text_len]`` (the prompt word's token ids); a file without
them (random-weight configs) starts from noise as before. ``python -m models.world.start_frames
--autoencoder AE.safetensors --weights W.safetensors`` adds them to a trained model file (the
training script does the same at the end of a run).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from torch import Tensor

from models.world.configs import WorldModelConfig, read_config, save_model_weights
from models.world.env import THEMES, MazeEnv


@dataclass(frozen=True)
class StartFrames:
    latents: Tensor  # [K, C, h, w]
    tokens: Tensor  # [K, text_len]: the prompt each latent was rendered under, tokenised

    def choose(self, prompt_tokens: Tensor, seed: int) -> Tensor:
        """The start latent for a session: among those whose prompt word is in ``prompt_tokens``
        (all of them when none is), the ``seed``-th (modulo their number)."""
        match = torch.isin(self.tokens[:, 0], prompt_tokens[prompt_tokens > 0]).nonzero().flatten().tolist()
        rows = match or list(range(self.latents.shape[0]))
        return self.latents[rows[seed % len(rows)]]

    def to(self, device: torch.device | str, dtype: torch.dtype) -> StartFrames:
        return StartFrames(self.latents.to(device=device, dtype=dtype), self.tokens)

    def tensors(self) -> dict[str, Tensor]:
        return {"start.latents": self.latents, "start.tokens": self.tokens}


def load_start_frames(path: Path) -> StartFrames | None:
    """The start frames of a model file, or ``None`` if it has none."""
    with safe_open(str(path), "pt") as f:
        if "start.latents" not in f.keys():
            return None
        return StartFrames(f.get_tensor("start.latents").float(), f.get_tensor("start.tokens").long())


@torch.no_grad()
def render_start_frames(
    cfg: WorldModelConfig,
    encode: Callable[[Tensor], Tensor],
    tokenize: Callable[[str], Tensor],
    per_theme: int = 16,
    seed: int = 1234,
    device: str | torch.device = "cpu",
) -> StartFrames:
    """``per_theme`` start latents per theme: frame 0 of fresh mazes (random spot and heading),
    through ``encode`` (frames ``[B, 1, 3, H, W]`` -> normalised latents ``[B, 1, C, h, w]``)."""
    themes = [t for t in range(len(THEMES)) for _ in range(per_theme)]
    env = MazeEnv(len(themes), size=cfg.frame_height, seed=seed, themes=themes, device=device)
    latents = encode(env.render()[:, None])[:, 0].float().cpu()
    tokens = torch.stack([tokenize(THEMES[t]) for t in themes])
    return StartFrames(latents, tokens)


def add_to_weights(path: Path, starts: StartFrames) -> None:
    """Rewrite a model file with ``starts`` (replacing any it had), keeping its tensors' dtypes."""
    with safe_open(str(path), "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys() if not k.startswith("start.")}
    dtype = tensors["dit.proj_out.weight"].dtype if "dit.proj_out.weight" in tensors else None
    tensors.update(
        {"start.latents": starts.latents.to(dtype or torch.float32), "start.tokens": starts.tokens}
    )
    save_model_weights(path, read_config(path), tensors)


def main(argv: list[str] | None = None) -> int:
    from models.world.model import tokenize
    from models.world.train import load_autoencoder, normalised_encoder

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--weights", type=Path, required=True, help="model file to add the start frames to")
    p.add_argument(
        "--autoencoder", type=Path, required=True, help="the --save-autoencoder file it was trained on"
    )
    p.add_argument("--per-theme", type=int, default=16)
    p.add_argument("--seed", type=int, default=1234)
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
