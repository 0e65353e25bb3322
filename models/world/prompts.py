"""Prompt conditioning: prompts -> the DiT's text context ``[B, text_len, text_dim]``.

One callable type (:data:`PromptContext`) with two kinds of source:

- :class:`WordEmbedding` (configs with ``text_vocab > 0``: world-tiny, and the random
  ``wan2.1-1.3b-causal``): lowercase words hashed into the vocabulary (:func:`tokenize`, 0 = padding)
  and embedded by a table trained with the model (stored as ``text.*`` in the model file);
- umT5 embeddings for the Wan checkpoints (``models.world.text_encoder.PromptEmbedder``: Wan's own
  text encoder, or a file of embeddings precomputed once per prompt), zero beyond each prompt's tokens.

A ``None`` prompt is the empty prompt. The DiT turns the context into each block's cross-attention
K/V once per prompt (``CausalDiT.cross_kv``); the pool keeps them per session.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from models.world.configs import WorldModelConfig

PromptContext = Callable[[Sequence[str | None]], Tensor]  # prompts -> [B, text_len, text_dim]


def tokenize(prompt: str | None, cfg: WorldModelConfig) -> Tensor:
    """Prompt -> ``text_len`` token ids: lowercase words hashed into the vocabulary, 0 = pad."""
    words = "".join(ch if ch.isalnum() else " " for ch in (prompt or "").lower()).split()
    ids = [1 + zlib.crc32(w.encode()) % (cfg.text_vocab - 1) for w in words[: cfg.text_len]]
    return torch.tensor(ids + [0] * (cfg.text_len - len(ids)), dtype=torch.long)


class WordEmbedding(nn.Module):
    """The hashed words of each prompt, embedded: ``[B, text_len, text_dim]``."""

    def __init__(self, cfg: WorldModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embedding = nn.Embedding(cfg.text_vocab, cfg.text_dim)

    def forward(self, prompts: Sequence[str | None]) -> Tensor:
        tokens = torch.stack([tokenize(p, self.cfg) for p in prompts]).to(self.embedding.weight.device)
        return self.embedding(tokens)
