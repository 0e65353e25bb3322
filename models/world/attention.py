"""Attention of a DiT block: its kernel, and its keys split to fill the GPU's SMs.

Why: Hopper's fused attention kernels (cuDNN's, which SDPA picks on an H200) run one CTA per
(batch row, head, 128-query tile). One Wan-1.3B session's block has 12 heads x ceil(4680 / 128) =
444 tiles: 3.36 waves on the H200's 132 SMs, so the fourth wave runs a third full and the call
reaches 543 TFLOP/s where a whole number of waves reaches 645 (`docs/benchmarks.md`, "world: the
attention's waves"). Splitting the keys into ``S`` equal parts, run as one call of ``S`` times the
batch, makes ``S`` times the tiles (888: 6.7 waves, 96 % full), each over ``1 / S`` of the keys;
the partial outputs merge exactly by their log-sum-exps (softmax over the parts' LSEs weighs each
part's normalised output: flash-decoding's combine). Measured at that shape: 1.487 -> 1.331 ms
per call (compiled, merge included).

Two kernels (``world.attention``), for the self- and the cross-attention: ``sdpa`` (PyTorch's
SDPA; cuDNN's kernel on the H200) and ``flash4`` (FlashAttention-4's CuTe DSL forward for sm90,
the optional ``flash4`` extra): 652 against 546 TFLOP/s at one Wan session's shape, 318 against
347 ms per DiT block (``docs/benchmarks.md``, "world: FlashAttention-4"). ``auto`` takes
``flash4`` on a Hopper GPU where it is installed and the dtype is bf16 or fp16, else ``sdpa``.

Contract of :func:`attend` (``q [B, H, Nq, D]``, ``k``, ``v`` ``[B, H, Nk, D]``, as views of
``[B, N, H, D]`` memory, the DiT's layout): the result equals
``F.scaled_dot_product_attention(q, k, v, attn_mask=mask)`` up to float rounding. It splits only
without a mask, on CUDA, when :func:`key_splits` says the split fills the waves better; under a
mask it is always SDPA's call.
"""

from __future__ import annotations

import functools
import logging
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.flop_counter import register_flop_formula

from models.attention_kernels import OPTIONAL_KERNELS, kernel_usable

QUERY_TILE = 128  # query rows per CTA of the sm90 fused attention kernels (cuDNN's and FA4's at D=128)
MIN_GAIN = 0.05  # a split must raise the last-wave fill by this much to pay for its merge

log = logging.getLogger(__name__)

Kernel = Literal["sdpa", "flash4", "flash3"]
KERNEL_CHOICES = ("auto", "sdpa", "flash4", "flash3")


AUTO_ORDER = ("flash4", "flash3")  # what ``auto`` tries, in order


@functools.cache
def kernel_failure(kernel: str, device: torch.device, dtype: torch.dtype) -> str | None:
    """Why ``kernel`` does not run here (FA4's first call JIT-compiles a kernel, which needs the
    CuTe DSL's CUDA libraries to match the driver; FA3's library must load against this torch),
    or ``None`` once one small call ran."""
    try:
        q = torch.zeros(1, 128, 1, 128, device=device, dtype=dtype)  # head dim 128: the Wan DiT's kernel
        _attention_with_lse(q, q, q, kernel)  # type: ignore[arg-type]
        torch.cuda.synchronize(device)
    except Exception as exc:  # noqa: BLE001 - any failure means: use another kernel (auto) or say why
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
    return None


def resolve_kernel(choice: str, device: str | torch.device, dtype: torch.dtype) -> Kernel:
    """``world.attention`` resolved for ``device`` and ``dtype``: ``auto`` is the first of
    ``flash4``, ``flash3`` that :func:`kernel_usable` finds and whose probe call runs
    (:func:`kernel_failure`; a probe's failure is a warning), else ``sdpa``; a kernel named
    where either fails is an error saying why."""
    device = torch.device(device)
    if choice not in KERNEL_CHOICES:
        raise ValueError(f"attention kernel must be one of {KERNEL_CHOICES}, not {choice!r}")
    if choice == "sdpa":
        return "sdpa"
    if choice != "auto":
        if not kernel_usable(choice, device, dtype):
            names = " or ".join(
                str(dtype).removeprefix("torch.") for dtype in OPTIONAL_KERNELS[choice].dtypes
            )
            raise ValueError(
                f"attention kernel {choice} needs a Hopper (sm90) CUDA device, {names}, and "
                f"{OPTIONAL_KERNELS[choice].install}"
            )
        failure = kernel_failure(choice, device, dtype)
        if failure is not None:
            raise ValueError(f"attention kernel {choice} is installed but does not run here: {failure}")
        return choice  # type: ignore[return-value]
    for kernel in AUTO_ORDER:
        if kernel_usable(kernel, device, dtype):
            failure = kernel_failure(kernel, device, dtype)
            if failure is None:
                return kernel  # type: ignore[return-value]
            log.warning("world attention: %s does not run here (%s); trying the next kernel", kernel, failure)
    return "sdpa"


@torch.library.custom_op("realtime_world::flash4_attention", mutates_args=())
def flash4_attention(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """FlashAttention-4's forward: ``q [B, Nq, H, D]``, ``k``, ``v`` ``[B, Nk, H, D]`` (last dim
    contiguous) -> output ``[B, Nq, H, D]`` and the natural-log log-sum-exp ``[B, H, Nq]``
    (float32). A custom op so that compiled blocks call it as one opaque kernel."""
    from flash_attn.cute import flash_attn_func

    return flash_attn_func(q, k, v, return_lse=True)


@torch.library.custom_op("realtime_world::flash3_attention", mutates_args=())
def flash3_attention(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """FlashAttention-3's forward (the ``fa3-fwd`` wheel), as :func:`flash4_attention`: a custom
    op, so that compiled blocks call it as one opaque kernel."""
    from fa3_fwd_interface import flash_attn_func

    out, lse = flash_attn_func(q, k, v, return_attn_probs=True)
    return out, lse


def _flash_attention_shapes(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """Either op's fake (what ``torch.compile`` traces): output like ``q``, LSE ``[B, H, Nq]`` float32."""
    b, nq, h, _ = q.shape
    return q.new_empty(q.shape), q.new_empty((b, h, nq), dtype=torch.float32)


def _flash_attention_flops(q_shape, k_shape, v_shape, *args, **kwargs) -> int:
    """What FlopCounterMode counts for either op (as for SDPA: two matmuls, no softmax)."""
    b, nq, h, d = q_shape
    return 4 * b * h * nq * k_shape[1] * d


FLASH_OPS = {"flash4": flash4_attention, "flash3": flash3_attention}  # optional kernel -> its op
for _name, _op in FLASH_OPS.items():
    _op.register_fake(_flash_attention_shapes)
    register_flop_formula(getattr(torch.ops.realtime_world, f"{_name}_attention"))(_flash_attention_flops)


def _flash_kernel(q: Tensor, k: Tensor, v: Tensor, kernel: Kernel) -> tuple[Tensor, Tensor]:
    """One of the optional kernels on ``[B, N, H, D]`` tensors: output like ``q`` and LSE ``[B, H, Nq]``."""
    return FLASH_OPS[kernel](q, k, v)


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
    """:func:`key_splits` for a call's shapes on ``device`` (1 on the CPU or under a mask), for
    either kernel: FA4 tiles its queries by 128 too, and the split DiT is 3 % faster with it as
    with cuDNN. Decided outside the compiled blocks, which take it as a constant."""
    if masked or device.type != "cuda":
        return 1
    return key_splits(batch, heads, queries, keys, multiprocessors(device))


def _attention_with_lse(q: Tensor, k: Tensor, v: Tensor, kernel: Kernel) -> tuple[Tensor, Tensor]:
    """Output ``[B, H, Nq, D]`` and log-sum-exp of the scaled scores (natural log, ``[B, H, Nq]``)."""
    if kernel != "sdpa":
        out, lse = _flash_kernel(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), kernel)
        return out.transpose(1, 2), lse
    if q.device.type == "cuda":
        cudnn = torch.ops.aten._scaled_dot_product_cudnn_attention
        out, lse = cudnn(q, k, v, None, True, 0.0, False, False)[:2]  # attn_bias, compute_log_sumexp, ...
    else:  # the CPU's fused kernel (tests of the merge)
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v)[:2]
    return out, lse.reshape(*q.shape[:3])


def split_key_attention(q: Tensor, k: Tensor, v: Tensor, splits: int, kernel: Kernel = "sdpa") -> Tensor:
    """Attention over ``splits`` equal parts of the keys in one call of ``splits`` times the batch,
    merged by log-sum-exp. ``k`` and ``v`` must be views of ``[B, Nk, H, D]`` memory (the DiT's
    layout), so each part is a view, not a copy."""
    b, h, nq, d = q.shape
    part = k.shape[2] // splits

    def parts(t: Tensor) -> Tensor:  # [B, H, Nk, D] over [B, Nk, H, D] -> [B*S, H, Nk/S, D]
        return t.transpose(1, 2).reshape(b * splits, part, h, d).transpose(1, 2)

    # the copy of the queries for each part keeps the [B, N, H, D] layout both kernels read fastest
    queries = q.transpose(1, 2).unsqueeze(1).expand(b, splits, nq, h, d).reshape(b * splits, nq, h, d)
    out, lse = _attention_with_lse(queries.transpose(1, 2), parts(k), parts(v), kernel)
    weights = torch.softmax(lse.reshape(b, splits, h, nq).float(), dim=1)[..., None]
    return (out.reshape(b, splits, h, nq, d).float() * weights).sum(1).to(q.dtype)


def attend(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, splits: int = 1, kernel: Kernel = "sdpa"
) -> Tensor:
    """``F.scaled_dot_product_attention(q, k, v, attn_mask=mask)``, with the keys in ``splits``
    parts when ``splits > 1`` (the DiT passes :func:`splits_for`; a mask forbids a split), by
    ``kernel`` (:func:`resolve_kernel`; a masked call is always SDPA's)."""
    if splits > 1 and mask is not None:
        raise ValueError("a key split needs every key visible (no mask)")
    if splits > 1:
        return split_key_attention(q, k, v, splits, kernel)
    if kernel != "sdpa" and mask is None:
        return _flash_kernel(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), kernel)[0].transpose(
            1, 2
        )
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
