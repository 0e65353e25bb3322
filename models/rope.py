"""Rotary position embedding over one position axis, rotate-half layout (the duplex LM and its KV
cache): the halves ``(x1, x2)`` of a head rotate by the token's position times ``theta ** (-i / half)``.

(The world DiT has Wan's own RoPE: three axes, interleaved pairs; ``models/world/dit.py``.)
"""

from __future__ import annotations

import torch
from torch import Tensor


def rope_angles(positions: Tensor, head_dim: int, theta: float, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """cos and sin ``[B, N, 1, head_dim]`` of the rotation for the position of each token
    ``positions [B, N]``, computed once per forward (every layer rotates by the same angles).

    Angles are computed in float64 from the integer positions, so any position (no table horizon)
    gives the same values in the cached and the recompute path.
    """
    half = head_dim // 2
    freqs = theta ** (-torch.arange(half, dtype=torch.float64, device=positions.device) / half)
    angles = positions.to(torch.float64)[..., None] * freqs  # [B, N, half]
    cos, sin = angles.cos(), angles.sin()
    # full width, so a rotation is x * cos + swap_halves(x) * sin: fewer kernels per call
    return torch.cat([cos, cos], -1).to(dtype)[:, :, None, :], torch.cat([-sin, sin], -1).to(dtype)[
        :, :, None, :
    ]


def rope(x: Tensor, positions: Tensor, theta: float) -> Tensor:
    """Rotate ``x [B, N, H, D]`` by the position of each token ``positions [B, N]``."""
    return apply_rope(x, rope_angles(positions, x.shape[-1], theta, x.dtype))


def apply_rope(x: Tensor, angles: tuple[Tensor, Tensor]) -> Tensor:
    """Rotate ``x [B, N, H, D]`` by precomputed :func:`rope_angles`: the halves ``(x1, x2)``
    become ``(x1 cos - x2 sin, x2 cos + x1 sin)``."""
    cos, sin = angles
    half = x.shape[-1] // 2
    return torch.addcmul(x * cos, torch.cat([x[..., half:], x[..., :half]], dim=-1), sin)
