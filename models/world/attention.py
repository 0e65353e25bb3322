"""Self-attention of a DiT block against its keys, with the keys split to fill the GPU's SMs.

Why: Hopper's fused attention kernels (cuDNN's, which SDPA picks on an H200) run one CTA per
(batch row, head, 128-query tile). One Wan-1.3B session's block has 12 heads x ceil(4680 / 128) =
444 tiles: 3.36 waves on the H200's 132 SMs, so the fourth wave runs a third full and the call
reaches 543 TFLOP/s where a whole number of waves reaches 645 (`docs/benchmarks.md`, "world: the
attention's waves"). Splitting the keys into ``S`` equal parts, run as one call of ``S`` times the
batch, makes ``S`` times the tiles (888: 6.7 waves, 96 % full), each over ``1 / S`` of the keys;
the partial outputs merge exactly by their log-sum-exps (softmax over the parts' LSEs weighs each
part's normalised output: flash-decoding's combine). Measured at that shape: 1.487 -> 1.331 ms
per call (compiled, merge included).

Contract of :func:`attend` (``q [B, H, Nq, D]``, ``k``, ``v`` ``[B, H, Nk, D]``, any strides SDPA
takes): the result equals ``F.scaled_dot_product_attention(q, k, v, attn_mask=mask)`` up to
float rounding. It splits only without a mask, on CUDA, when :func:`key_splits` says the split
fills the waves better; otherwise it is that one SDPA call.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor

QUERY_TILE = 128  # query rows per CTA of the sm90 fused attention kernels
MIN_GAIN = 0.05  # a split must raise the last-wave fill by this much to pay for its merge


def wave_fill(tiles: int, sms: int) -> float:
    """The share of ``ceil(tiles / sms)`` full waves that ``tiles`` CTAs occupy."""
    return tiles / (-(-tiles // sms) * sms)


def key_splits(batch: int, heads: int, queries: int, keys: int, sms: int) -> int:
    """1 or 2: how many parts to split the keys into (2 when the keys split evenly, the call
    fills at least one wave, and doubling the tiles raises the wave fill by :data:`MIN_GAIN`)."""
    tiles = batch * heads * -(-queries // QUERY_TILE)
    if keys % 2 or tiles < sms:
        return 1
    return 2 if wave_fill(2 * tiles, sms) >= wave_fill(tiles, sms) + MIN_GAIN else 1


@functools.cache
def multiprocessors(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def splits_for(device: torch.device, batch: int, heads: int, queries: int, keys: int, masked: bool) -> int:
    """:func:`key_splits` for a call's shapes on ``device`` (1 on the CPU or under a mask).
    Decided outside the compiled blocks, which take it as a constant."""
    if masked or device.type != "cuda":
        return 1
    return key_splits(batch, heads, queries, keys, multiprocessors(device))


def _attention_with_lse(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """Output ``[B, H, Nq, D]`` and log-sum-exp of the scaled scores (natural log, ``[B, H, Nq]``)."""
    if q.device.type == "cuda":
        cudnn = torch.ops.aten._scaled_dot_product_cudnn_attention
        out, lse = cudnn(q, k, v, None, True, 0.0, False, False)[:2]  # attn_bias, compute_log_sumexp, ...
    else:  # the CPU's fused kernel (tests of the merge)
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v)[:2]
    return out, lse.reshape(*q.shape[:3])


def split_key_attention(q: Tensor, k: Tensor, v: Tensor, splits: int) -> Tensor:
    """Attention over ``splits`` equal parts of the keys in one call of ``splits`` times the batch,
    merged by log-sum-exp. ``k`` and ``v`` must be views of ``[B, Nk, H, D]`` memory (the DiT's
    layout), so each part is a view, not a copy."""
    b, h, nq, d = q.shape
    part = k.shape[2] // splits

    def parts(t: Tensor) -> Tensor:  # [B, H, Nk, D] over [B, Nk, H, D] -> [B*S, H, Nk/S, D]
        return t.transpose(1, 2).reshape(b * splits, part, h, d).transpose(1, 2)

    queries = q.unsqueeze(1).expand(b, splits, h, nq, d).reshape(b * splits, h, nq, d)
    out, lse = _attention_with_lse(queries, parts(k), parts(v))
    weights = torch.softmax(lse.reshape(b, splits, h, nq).float(), dim=1)[..., None]
    return (out.reshape(b, splits, h, nq, d).float() * weights).sum(1).to(q.dtype)


def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, splits: int = 1) -> Tensor:
    """``F.scaled_dot_product_attention(q, k, v, attn_mask=mask)``, with the keys in ``splits``
    parts when ``splits > 1`` (the DiT passes :func:`splits_for`; a mask forbids a split)."""
    if splits == 1:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    if mask is not None:
        raise ValueError("a key split needs every key visible (no mask)")
    return split_key_attention(q, k, v, splits)
