"""One-off: rewrite a world-tiny model file from the DiT's former layout into the Wan layout.

``python -m models.world.training.convert_to_wan_layout models/world/weights/world-tiny.safetensors``

The DiT became Wan 2.1's (``models/world/dit.py``); world-tiny keeps the variant its weights were
trained under (per-head q/k norms, a Linear adaLN per block, a learned spatial embedding, RoPE over
the frame index alone). Renames, plus three exact rearrangements (float16 values only move):

- q and k rows (and the per-head norm weights) from rotate-half pairs ``(i, i + D/2)`` to Wan's
  interleaved pairs ``(2i, 2i + 1)``: the same rotations, the same dot products;
- the fused ``qkv`` / cross ``kv`` projections split into Wan's ``q``, ``k``, ``v``;
- the output head's rows from ``(channel, row, column)`` to Wan's ``(row, column, channel)``; and
  ``text_embedding.2`` (Wan's second text layer, absent before) is the identity.

The word table ``dit.text_embed`` becomes the prompt encoder's ``text.embedding``.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import torch
from safetensors import safe_open

from models.world.configs import WorldModelConfig, save_model_weights


def _interleave(rows: torch.Tensor, heads: int) -> torch.Tensor:
    """Per head, rows ``(i, i + half)`` -> ``(2i, 2i + 1)`` (any trailing shape)."""
    hd = rows.shape[0] // heads
    half = hd // 2
    perm = torch.tensor([j // 2 + (j % 2) * half for j in range(hd)])
    index = torch.cat([h * hd + perm for h in range(heads)])
    return rows[index]


def convert(old: dict[str, torch.Tensor], cfg: WorldModelConfig) -> dict[str, torch.Tensor]:
    d, heads, c, p = cfg.dim, cfg.heads, cfg.latent_channels, cfg.patch
    new: dict[str, torch.Tensor] = {}
    for key, value in old.items():
        if not key.startswith("dit."):
            new[key] = value
    g = {k.removeprefix("dit."): v for k, v in old.items() if k.startswith("dit.")}
    new["dit.patch_embedding.weight"] = g["patch_embed.weight"].view(d, c, 1, p, p)
    new["dit.patch_embedding.bias"] = g["patch_embed.bias"]
    new["dit.pos_embedding"] = g["pos_embed"]
    for old_name, new_name in (("time_embed", "time_embedding"), ("action_embed", "action_embedding")):
        for part in ("0.weight", "0.bias", "2.weight", "2.bias"):
            new[f"dit.{new_name}.{part}"] = g[f"{old_name}.{part}"]
    new["text.embedding.weight"] = g["text_embed.weight"]
    new["dit.text_embedding.0.weight"] = g["text_proj.0.weight"]
    new["dit.text_embedding.0.bias"] = g["text_proj.0.bias"]
    dtype = g["text_proj.0.weight"].dtype
    new["dit.text_embedding.2.weight"] = torch.eye(d, dtype=dtype)
    new["dit.text_embedding.2.bias"] = torch.zeros(d, dtype=dtype)
    for i in range(cfg.depth):
        b, n = f"blocks.{i}.", f"dit.blocks.{i}."
        for part in ("weight", "bias"):
            q, k, v = g[f"{b}attn.qkv.{part}"].chunk(3)
            new[f"{n}self_attn.q.{part}"] = _interleave(q, heads)
            new[f"{n}self_attn.k.{part}"] = _interleave(k, heads)
            new[f"{n}self_attn.v.{part}"] = v
            new[f"{n}self_attn.o.{part}"] = g[f"{b}attn.out.{part}"]
            new[f"{n}norm3.{part}"] = g[f"{b}norm_cross.{part}"]
            new[f"{n}cross_attn.q.{part}"] = g[f"{b}cross.q.{part}"]
            ck, cv = g[f"{b}cross.kv.{part}"].chunk(2)
            new[f"{n}cross_attn.k.{part}"], new[f"{n}cross_attn.v.{part}"] = ck, cv
            new[f"{n}cross_attn.o.{part}"] = g[f"{b}cross.out.{part}"]
            for j in (0, 2):
                new[f"{n}ffn.{j}.{part}"] = g[f"{b}mlp.{j}.{part}"]
            new[f"{n}adaln.{part}"] = g[f"{b}modulation.{part}"]
        new[f"{n}self_attn.norm_q.weight"] = _interleave(g[f"{b}attn.q_norm.weight"], 1)
        new[f"{n}self_attn.norm_k.weight"] = _interleave(g[f"{b}attn.k_norm.weight"], 1)
    # head rows: old (channel, row, column), Wan (row, column, channel)
    order = torch.arange(c * p * p).view(c, p, p).permute(1, 2, 0).reshape(-1)
    for part in ("weight", "bias"):
        new[f"dit.head.head.{part}"] = g[f"proj_out.{part}"][order]
        new[f"dit.head.adaln.{part}"] = g[f"mod_out.{part}"]
    return new


def main(path: str) -> int:
    with safe_open(path, "pt") as f:
        old = {k: f.get_tensor(k) for k in f.keys()}
        meta = f.metadata()
    raw = WorldModelConfig.from_json(meta["config"])
    cfg = dataclasses.replace(
        raw, qk_norm="head", adaln="per_block", pos_embed=True, rope_dims=(raw.head_dim, 0, 0)
    )
    new = convert(old, cfg)
    save_model_weights(Path(path), cfg, new)
    print(f"{path}: {len(old)} tensors -> {len(new)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
