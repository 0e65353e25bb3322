"""Start frames: encoded real frames a session's first block begins from (serving side).

A causal video model sampled in a few steps from pure noise draws the *mean* of every world it
could start in: a flat, blurred frame, and every later block continues from that blur. World
models are therefore started from a context frame (Oasis, GameNGen and DIAMOND from real game
frames). The embedded model ships its own: ``K`` latents, each the encoding of a maze frame, with
the prompt word (theme) it was rendered under. A session's first block holds its first latent frame
at the start latent its prompt and seed choose (``sampler.pin_starts``), so the first frame is a
real maze frame and every later block continues from a sharp past, the situation the DiT was
trained in (teacher forcing).

Stored in the model's safetensors file as ``start.latents [K, C, h, w]`` (normalised like the
DiT's latents) and ``start.tokens [K, text_len]`` (the prompt word's token ids); a file without
them (random-weight configs, real checkpoints) starts from noise. They are rendered and added to a
model file by ``models.world.training.start_frames``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from torch import Tensor


@dataclass(frozen=True)
class StartFrames:
    latents: Tensor  # [K, C, h, w]
    tokens: Tensor  # [K, text_len]: the prompt each latent was rendered under, tokenised

    def index(self, prompt_tokens: Tensor, seed: int) -> int:
        """The row of the start latent for a session: among those whose prompt word is in
        ``prompt_tokens`` (all of them when none is), the ``seed``-th (modulo their number)."""
        match = torch.isin(self.tokens[:, 0], prompt_tokens[prompt_tokens > 0]).nonzero().flatten().tolist()
        rows = match or list(range(self.latents.shape[0]))
        return rows[seed % len(rows)]

    def choose(self, prompt_tokens: Tensor, seed: int) -> Tensor:
        """The start latent for a session (:meth:`index`)."""
        return self.latents[self.index(prompt_tokens, seed)]

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
