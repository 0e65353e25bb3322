"""FP8 storage for the temporal KV: half the bytes of bf16 per session, read by one fused kernel.

Each stored key or value vector (one head, one frame: ``head_dim`` numbers) is kept as
``float8_e4m3fn`` with its own float32 scale (``amax / 448``, e4m3's largest finite value), so no
vector saturates and a small one keeps its precision whatever its neighbours hold. Quantizing is
done where the vector is written (one small op per layer and step); nothing else is re-encoded.

Reading: :func:`attend` attends one query per row over a row's stored columns under the
visibility mask. On a CUDA device with Triton it is one kernel (:func:`_decode_kernel`: a
flash-decoding loop over the row's columns that reads the FP8 bytes and their scales, and skips
columns the row does not see; a step of few rows splits each row's columns into spans read by
programs of their own and merged after, :func:`split_columns`, so a lone session's step still
fills the GPU), so a step reads one byte per stored number instead of two; elsewhere
(the CPU, or no Triton) the rows are dequantized to the query's dtype and read by SDPA: the same
math, which is what the CPU tests hold the kernel to.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import Tensor

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
SCALE_BYTES = 4  # one float32 scale per stored vector


def quantize(x: Tensor) -> tuple[Tensor, Tensor]:
    """``x [..., head_dim]`` -> (FP8 values ``[..., head_dim]``, float32 scales ``[...]``)."""
    scale = x.abs().amax(dim=-1).float().clamp(min=1e-12) / FP8_MAX
    return (x.float() / scale[..., None]).to(FP8), scale


def dequantize(values: Tensor, scales: Tensor, dtype: torch.dtype) -> Tensor:
    return (values.float() * scales[..., None]).to(dtype)


@functools.cache
def _triton():
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None
    return triton, tl


def fused_available(device: torch.device) -> bool:
    """Whether :func:`attend` runs the fused kernel for tensors on ``device``."""
    return device.type == "cuda" and _triton() is not None


def attend(
    q: Tensor, keys: Tensor, values: Tensor, k_scale: Tensor, v_scale: Tensor, visible: Tensor
) -> Tensor:
    """``q [B, heads, 1, head_dim]`` over FP8 ``keys`` / ``values [B, heads, columns, head_dim]``
    with scales ``[B, heads, columns]``, where ``visible [B, 1, 1, columns]`` (True = attend;
    every row sees at least one column). Returns ``[B, heads, 1, head_dim]`` in ``q``'s dtype."""
    if fused_available(q.device):
        return _fused(q, keys, values, k_scale, v_scale, visible)
    return F.scaled_dot_product_attention(
        q, dequantize(keys, k_scale, q.dtype), dequantize(values, v_scale, q.dtype), attn_mask=visible
    )


def _fused(
    q: Tensor, keys: Tensor, values: Tensor, k_scale: Tensor, v_scale: Tensor, visible: Tensor
) -> Tensor:
    B, H, _, D = q.shape
    N = keys.shape[2]
    if keys.stride(3) != 1 or values.stride(3) != 1 or q.stride(3) != 1:
        raise ValueError("the head dimension must be contiguous")
    out = torch.empty_like(q)
    mask = visible[:, 0, 0, :].view(torch.uint8)
    splits, span = split_columns(B * H, N, _processors(q.device))
    # one split writes the answer; several write their running state (max, sum, weighted values) here
    partial = torch.empty(B, H, splits, D + 2, dtype=torch.float32, device=q.device) if splits > 1 else out
    _kernel()[(B, H, splits)](
        q, keys, values, k_scale, v_scale, mask, out, partial,
        q.stride(0), q.stride(1),
        keys.stride(0), keys.stride(1), keys.stride(2),
        values.stride(0), values.stride(1), values.stride(2),
        k_scale.stride(0), k_scale.stride(1), k_scale.stride(2),
        v_scale.stride(0), v_scale.stride(1), v_scale.stride(2),
        mask.stride(0), out.stride(0), out.stride(1),
        N, span, 1.0 / math.sqrt(D), D=D, BLOCK_N=BLOCK_N, SPLIT=splits > 1, num_warps=4,
    )  # fmt: skip
    if splits > 1:
        _merge_kernel()[(B, H)](
            partial, out, out.stride(0), out.stride(1), splits, D=D, S=_pow2(splits), num_warps=1
        )
    return out


BLOCK_N = 64  # columns per step of the kernel's loop
MAX_SPLITS = 16


def split_columns(programs: int, columns: int, processors: int) -> tuple[int, int]:
    """Flash-decoding's split: (splits, columns per split). A step of few rows has fewer (row,
    head) programs than the GPU has processors, so each row's columns are cut into up to
    :data:`MAX_SPLITS` spans of whole blocks, enough for about two programs per processor; each
    span is read by its own program and the spans' softmax states are merged after."""
    blocks = -(-columns // BLOCK_N)
    splits = max(1, min(MAX_SPLITS, blocks, -(-2 * processors // programs)))
    per_split = -(-blocks // splits)
    return -(-blocks // per_split), per_split * BLOCK_N


@functools.cache
def _processors(device: torch.device) -> int:
    if device.type != "cuda":
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count


def _pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


@functools.cache
def _kernel():
    triton, tl = _triton()

    @triton.jit
    def _decode_kernel(
        Q, K, V, KS, VS, M, Out, Part,
        sq_b, sq_h, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, sks_b, sks_h, sks_n, svs_b, svs_h, svs_n,
        sm_b, so_b, so_h,
        N, span, sm_scale, D: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr,
    ):  # fmt: skip
        """One (row, head, span of columns): an online softmax over the span's visible columns,
        block by block; the answer, or with ``SPLIT`` the running (max, sum, values) for the merge."""
        b = tl.program_id(0).to(tl.int64)  # 64-bit offsets: a pool of many sessions passes 2**31 bytes
        h = tl.program_id(1).to(tl.int64)
        part = tl.program_id(2)
        d = tl.arange(0, D)
        q = tl.load(Q + b * sq_b + h * sq_h + d).to(tl.float32) * sm_scale
        m_i = -1e30  # finite: a block the row does not see leaves the running state unchanged
        l_i = 0.0
        acc = tl.zeros([D], dtype=tl.float32)
        end = tl.minimum(N, (part + 1) * span)
        for start in range(part * span, end, BLOCK_N):
            n = start + tl.arange(0, BLOCK_N)
            seen = tl.load(M + b * sm_b + n, mask=n < end, other=0) != 0  # unseen columns are not read
            k = tl.load(
                K + b * sk_b + h * sk_h + n[:, None] * sk_n + d[None, :], mask=seen[:, None], other=0.0
            )
            k_scale = tl.load(KS + b * sks_b + h * sks_h + n * sks_n, mask=seen, other=0.0)
            s = tl.where(seen, tl.sum(k.to(tl.float32) * q[None, :], axis=1) * k_scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=0))
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(s - m_new)
            l_i = l_i * alpha + tl.sum(p, axis=0)
            v = tl.load(
                V + b * sv_b + h * sv_h + n[:, None] * sv_n + d[None, :], mask=seen[:, None], other=0.0
            )
            v_scale = tl.load(VS + b * svs_b + h * svs_h + n * svs_n, mask=seen, other=0.0)
            acc = acc * alpha + tl.sum((p * v_scale)[:, None] * v.to(tl.float32), axis=0)
            m_i = m_new
        if SPLIT:
            row = Part + ((b * tl.num_programs(1) + h) * tl.num_programs(2) + part) * (D + 2)
            tl.store(row + d, acc)
            tl.store(row + D, m_i)
            tl.store(row + D + 1, l_i)
        else:
            tl.store(Out + b * so_b + h * so_h + d, (acc / l_i).to(Out.dtype.element_ty))

    return _decode_kernel


@functools.cache
def _merge_kernel():
    triton, tl = _triton()

    @triton.jit
    def _merge(Part, Out, so_b, so_h, splits, D: tl.constexpr, S: tl.constexpr):
        """One (row, head): the spans' states rescaled to their common max and summed. A span the
        row did not see has max -1e30 and sum 0, so its weight is 0."""
        b = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1).to(tl.int64)
        s = tl.arange(0, S)
        d = tl.arange(0, D)
        rows = Part + ((b * tl.num_programs(1) + h) * splits + s) * (D + 2)
        m = tl.load(rows + D, mask=s < splits, other=-1e30)
        l_s = tl.load(rows + D + 1, mask=s < splits, other=0.0)
        acc = tl.load(rows[:, None] + d[None, :], mask=(s < splits)[:, None], other=0.0)
        w = tl.exp(m - tl.max(m, axis=0))
        out = tl.sum(w[:, None] * acc, axis=0) / tl.sum(w * l_s, axis=0)
        tl.store(Out + b * so_b + h * so_h + d, out.to(Out.dtype.element_ty))

    return _merge
