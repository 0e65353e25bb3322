"""pi0's attention calls alone, per kernel choice, on one GPU (docs/benchmarks-log.md, "pi0's attention").

A pi0 tick at batch 1 spends about a third of its device time in ~250 attention calls whose
problems are tiny (a LIBERO prefix: 8 query heads x 560 tokens over 560 keys of one K/V head,
head dim 256; an action step: 8 x 50 queries over 611 keys), so the kernel's parallelism, not
its FLOPs, sets the time. This times each candidate formulation on the real shapes (bf16, an
additive key-padding bias as the model builds it), median of CUDA-event timings over 200 calls:

- ``folded``: the query heads of the one K/V head folded into one head of 8T rows (today's model),
  SDPA choosing its backend, and the same with each backend forced (efficient, cudnn, math);
- ``gqa``: 8 heads over one K/V head with ``enable_gqa``; ``expanded``: K/V repeated to 8 heads;
- ``matmul``: scores, bias, float32 softmax and the value product written out, eager and compiled;
- ``nomask``: folded without the bias (FlashAttention's path): the floor a mask-free layout has;
- ``splitS efficient`` / ``splitS cudnn``: the keys (padded to a multiple of 64, masked) in S parts
  run as one call of S times the batch, merged by log-sum-exp (flash-decoding's split-KV), by
  the memory-efficient or the cuDNN kernel with the bias;
- ``flash2 varlen``: what the model runs today (``models.policy.pi0.attend``): FlashAttention-2's
  variable-length kernel in torch over the K/V buffers as they lie (``[B, L, 1, 256]``, each
  row's keys one run: ``cu_seqlens`` and ``seqused_k``, no mask);
- ``flash2 varlen splitS``: the same kernel with each row's keys in S parts run as S sequences
  of one call (the queries repeated per part) and merged by log-sum-exp (:func:`flash2_split`);
- ``flash3 varlen auto``: FlashAttention-3's own choice of both (``num_splits=0``,
  ``pack_gqa=None``); ``flash3 varlen sS [pack]``: FlashAttention-3's (the ``fa3-fwd`` wheel, where installed) over
  the same buffers, its keys in S splits merged by its own combine kernel, ``pack`` with the 8
  query heads of the one K/V head packed into its query tiles (``pack_gqa``). Candidates only:
  ``robot.attention: flash3`` was withdrawn from the model (docs/models.md).

``flash2 varlen splitS`` was the candidate for pi0's batch-1 latency (an action step's 8 CTAs):
built into ``models.policy.pi0.attend`` at commit ``dfdddc6`` (``key_splits``, with
``realtime/bench/gpu/pi0_splits.py`` to time the whole forward split and whole), then measured on
an H200 and not adopted: the compiled forward at batch 1 1.006x, at batch 8 0.965x
(docs/benchmarks-log.md, "pi0's keys split: measured, not adopted").

Each figure is the device time per call: 50 calls queued back to back between two CUDA events
(a single call between events measures the launch, not the kernel). FlexAttention candidates were
tried once and dropped: that run (2026-12-06, H100) printed nothing within 300 s.

Before the timings, ``layouts`` checks FlashAttention-3's variable-length kernel (where the
``fa3-fwd`` wheel is installed) over the model's own buffer layout, which the timings above do not
use: rows ``[actions | state | prefix]``, each batch row's keys starting at an offset into its
row (so the last ``cu_seqlens_k`` entry lies past the flattened buffer), one query for pi0's
state token, head dims 16 (pi0-tiny, the CI size) to 256 (the real one). It prints the max abs
error of each call against SDPA over exactly the keys the call must read.

Usage on the device machine: ``python3 realtime/bench/gpu/pi0_attention.py [--layouts-only]``.
"""

from __future__ import annotations

import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

HEADS, HEAD_DIM = 8, 256
SHAPES = {"prefix": (560, 560), "action step": (50, 611)}  # (queries, keys), LIBERO


def _time_us(fn, reps: int = 20, calls: int = 50) -> float:
    """Median over ``reps`` of the mean time of ``calls`` back-to-back calls (the host queues
    them far ahead of the GPU, so this is device time per call, as inside a CUDA graph)."""
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / calls)
    return statistics.median(times)


def split_attention(q, k, v, bias, splits: int, op: str):
    """Keys in ``splits`` equal parts run as one call of ``splits`` times the batch (more CTAs for
    a small problem), merged by the parts' log-sum-exps; a part whose keys are all masked gets
    weight 0. ``q [B, 1, M, D]``, ``k``/``v`` ``[B, 1, K, D]``, ``bias [B, 1, 1, K]``."""
    b, _, m, d = q.shape
    part = k.shape[2] // splits
    qs = q.expand(b, splits, m, d).reshape(b * splits, 1, m, d)
    ks, vs = k.reshape(b * splits, 1, part, d), v.reshape(b * splits, 1, part, d)
    bs = bias.reshape(b * splits, 1, 1, part).expand(b * splits, 1, m, part)
    if op == "efficient":
        out, lse = torch.ops.aten._scaled_dot_product_efficient_attention(qs, ks, vs, bs, True)[:2]
    else:
        out, lse = torch.ops.aten._scaled_dot_product_cudnn_attention(
            qs, ks, vs, bs, True, 0.0, False, False
        )[:2]
    lse = lse.reshape(b, splits, -1)[..., :m].float()
    weights = torch.softmax(lse, dim=1).nan_to_num(0.0)[..., None]
    out = out.reshape(b, splits, m, d).float().nan_to_num(0.0)
    return (out * weights).sum(1, keepdim=True).to(q.dtype)


def _matmul_attention(q, k, v, bias):
    scores = (q @ k.transpose(-1, -2)).float() * q.shape[-1] ** -0.5 + bias
    return (scores.softmax(-1).to(q.dtype)) @ v


def candidates(batch: int, queries: int, keys: int) -> dict[str, object]:
    dev, dt = "cuda", torch.bfloat16
    real, keys = keys, -(-keys // 64) * 64  # K/V padded to a multiple of 64 (masked): splits stay whole
    q = torch.randn(batch, HEADS, queries, HEAD_DIM, device=dev, dtype=dt)
    k = torch.randn(batch, 1, keys, HEAD_DIM, device=dev, dtype=dt)
    v = torch.randn(batch, 1, keys, HEAD_DIM, device=dev, dtype=dt)
    valid = (torch.arange(keys, device=dev) < real).expand(batch, keys).clone()
    valid[:, real - 60 : real - 50] = False  # padded prompt tokens, as a LIBERO prompt has
    bias = torch.zeros(batch, keys, dtype=dt, device=dev).masked_fill(~valid, float("-inf"))[:, None, None]
    qf = q.reshape(batch, 1, HEADS * queries, HEAD_DIM)
    ke, ve = k.expand(-1, HEADS, -1, -1).contiguous(), v.expand(-1, HEADS, -1, -1).contiguous()
    out = {
        "folded": lambda: F.scaled_dot_product_attention(qf, k, v, attn_mask=bias),
        "gqa": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=bias, enable_gqa=True),
        "expanded": lambda: F.scaled_dot_product_attention(q, ke, ve, attn_mask=bias),
        "matmul": lambda: _matmul_attention(qf, k, v, bias),
        "nomask": lambda: F.scaled_dot_product_attention(qf, k, v),
    }
    for splits in (2, 4, 8):
        for op in ("efficient", "cudnn"):
            out[f"split{splits} {op}"] = lambda s=splits, o=op: split_attention(qf, k, v, bias, s, o)
    for name, backend in (
        ("efficient", SDPBackend.EFFICIENT_ATTENTION),
        ("cudnn", SDPBackend.CUDNN_ATTENTION),
        ("math", SDPBackend.MATH),
    ):

        def forced(backend=backend, qq=qf):
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(qq, k, v, attn_mask=bias)

        out[f"folded {name}"] = forced

        def forced_expanded(backend=backend):
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(q, ke, ve, attn_mask=bias)

        out[f"expanded {name}"] = forced_expanded
    out.update(varlen_candidates(q, k, v, valid))
    reference = _matmul_attention(qf, k, v, bias).float()
    for name, fn in list(out.items()):
        if isinstance(fn, (str, _Checked)):
            continue
        try:
            got = fn().float().reshape(reference.shape)
            err = (got - reference).abs().max().item() if name != "nomask" else 0.0
            if err > 0.05:
                out[name] = f"wrong (max abs err {err:.3f})"
        except Exception as exc:  # noqa: BLE001 - a candidate that cannot run here is reported, not fatal
            out[name] = f"unavailable ({str(exc).splitlines()[0][:60]})"
    return out


def varlen_candidates(q, k, v, valid) -> dict[str, object]:
    """The FlashAttention variable-length calls over ``k``/``v`` viewed as the model's buffers
    ``[B * L, 1, D]``; each row attends its first ``valid.sum()`` keys. ``valid`` here has a
    hole (the padded prompt tokens), which the model packs away: these calls read the same count
    of keys from the row's start, so their output differs from the masked reference; they are
    checked against SDPA over exactly those keys instead."""
    batch, heads, queries, dim = q.shape
    keys = k.shape[2]
    used = valid.sum(1).to(torch.int32)
    rows = torch.arange(batch + 1, dtype=torch.int32, device=q.device)
    q_starts, k_starts = rows * queries, rows * keys
    qv = q.transpose(1, 2).reshape(batch * queries, heads, dim)
    kv, vv = (t.transpose(1, 2).reshape(batch * keys, 1, dim) for t in (k, v))
    out: dict[str, object] = {
        "flash2 varlen": lambda: torch.ops.aten._flash_attention_forward(
            qv, kv, vv, q_starts, k_starts, queries, keys, 0.0, False, False, seqused_k=used
        )[0]
    }
    for splits in (2, 4, 8):
        out[f"flash2 varlen split{splits}"] = lambda s=splits: flash2_split(qv, kv, vv, keys, used, s)
    try:
        from fa3_fwd_interface import flash_attn_varlen_func
    except ImportError:
        return out
    out["flash3 varlen auto"] = lambda: flash_attn_varlen_func(  # FA3's own split and packing heuristics
        qv, kv, vv, q_starts, k_starts, queries, keys, seqused_k=used, num_splits=0, pack_gqa=None
    )
    for splits in (1, 2, 4, 8, 16):
        for pack in (False, True):
            out[f"flash3 varlen s{splits}{' pack' if pack else ''}"] = lambda s=splits, p=pack: (
                flash_attn_varlen_func(
                    qv, kv, vv, q_starts, k_starts, queries, keys, seqused_k=used, num_splits=s, pack_gqa=p
                )
            )
    n = int(used[0])
    expected = F.scaled_dot_product_attention(q, k[:, :, :n], v[:, :, :n], enable_gqa=True).transpose(1, 2)
    for name, fn in list(out.items()):
        try:
            err = (fn().float().reshape(expected.shape) - expected.float()).abs().max().item()
            if err > 0.05:
                out[name] = f"wrong (max abs err {err:.3f})"
        except Exception as exc:  # noqa: BLE001 - a candidate that cannot run here is reported, not fatal
            out[name] = f"unavailable ({str(exc).splitlines()[0][:60]})"
    # already checked above: the masked reference does not apply to them
    return {name: (fn if isinstance(fn, str) else _Checked(fn)) for name, fn in out.items()}


def flash2_split(qv, kv, vv, rows: int, used, splits: int):
    """Flash-decoding's split-KV on FlashAttention-2's variable-length kernel in torch: each batch
    row's keys (``used[b]`` of its ``rows``-row run in ``kv``/``vv`` ``[B * rows, 1, D]``) cut
    into ``splits`` parts run as ``B * splits`` sequences of one call (the queries repeated per
    part: ``splits`` times the CTAs, each walking a part of the keys), the parts' outputs merged
    by their log-sum-exps. An empty part's log-sum-exp counts as minus infinity."""
    total, heads, dim = qv.shape
    batch = used.shape[0]
    queries, part = total // batch, -(-rows // splits)
    qs = qv.view(batch, 1, queries, heads, dim).expand(batch, splits, queries, heads, dim)
    qs = qs.reshape(batch * splits * queries, heads, dim)
    s = torch.arange(splits, dtype=torch.int32, device=qv.device)
    b = torch.arange(batch, dtype=torch.int32, device=qv.device)
    starts = (b[:, None] * rows + s[None] * part).reshape(-1)
    k_starts = torch.cat([starts, starts[-1:] + part])
    lengths = (used[:, None] - s[None] * part).clamp(0, part).to(torch.int32).reshape(-1)
    q_starts = torch.arange(batch * splits + 1, dtype=torch.int32, device=qv.device) * queries
    out, lse = torch.ops.aten._flash_attention_forward(
        qs, kv, vv, q_starts, k_starts, queries, part, 0.0, False, False, seqused_k=lengths
    )[:2]
    if lse.dim() == 2:  # [H, total queries] (unpadded)
        lse = lse.reshape(heads, batch, splits, queries).permute(1, 2, 3, 0)  # [B, S, T, H]
    else:  # [sequences, H, max queries]
        lse = lse.reshape(batch, splits, heads, queries).transpose(2, 3)
    lse = lse.masked_fill((lengths == 0).view(batch, splits, 1, 1), float("-inf"))
    weights = torch.softmax(lse.float(), dim=1)[..., None]
    merged = (out.view(batch, splits, queries, heads, dim).float() * weights).sum(1)
    return merged.to(qv.dtype).reshape(total, heads, dim)


class _Checked:
    """A candidate already checked against its own reference (see :func:`varlen_candidates`)."""

    def __init__(self, fn) -> None:  # noqa: ANN001
        self.fn = fn

    def __call__(self):  # noqa: ANN204
        return self.fn()


def layouts() -> None:
    """FlashAttention-3's variable-length kernel against SDPA over the model's buffer layout (see
    the module's docstring), for each head dim, query count, offset, split and packing choice."""
    try:
        from fa3_fwd_interface import flash_attn_varlen_func
    except ImportError:
        print("layouts: fa3-fwd not installed; skipped")
        return
    dev, dt, batch, H, S, P = "cuda", torch.bfloat16, 3, 50, 1, 130
    L = H + S + P
    lengths = torch.tensor([P - 40, P, 17], dtype=torch.int32, device=dev)
    for head_dim, heads in ((16, 4), (64, 8), (128, 8), (256, 8)):
        keys = torch.randn(batch, L, 1, head_dim, device=dev, dtype=dt)
        values = torch.randn(batch, L, 1, head_dim, device=dev, dtype=dt)
        errors = []
        for name, queries, offset, extra in (
            ("prefix", P, H + S, 0),
            ("state", S, H, S),
            ("actions", H, 0, H + S),
        ):
            used = lengths + extra
            q = torch.randn(batch, queries, heads, head_dim, device=dev, dtype=dt)
            rows = torch.arange(batch + 1, dtype=torch.int32, device=dev)
            expected = torch.cat(
                [
                    F.scaled_dot_product_attention(
                        q[b : b + 1].transpose(1, 2),
                        keys[b : b + 1, offset : offset + int(used[b])].transpose(1, 2),
                        values[b : b + 1, offset : offset + int(used[b])].transpose(1, 2),
                        enable_gqa=True,
                    ).transpose(1, 2)
                    for b in range(batch)
                ]
            ).float()
            for splits, pack in ((0, None), (1, False), (1, True), (4, True)):
                try:
                    got = flash_attn_varlen_func(
                        q.reshape(batch * queries, heads, head_dim),
                        keys.view(batch * L, 1, head_dim),
                        values.view(batch * L, 1, head_dim),
                        rows * queries,
                        rows * L + offset,
                        queries,
                        L - offset,
                        seqused_k=used,
                        num_splits=splits,
                        pack_gqa=pack,
                    )
                    got = (got[0] if isinstance(got, tuple) else got).float().view(expected.shape)
                    err = f"{(got - expected).abs().max().item():.4f}"
                except Exception as exc:  # noqa: BLE001 - reported, not fatal
                    err = f"raised {str(exc).splitlines()[0][:80]}"
                errors.append(f"{name} s{splits} pack={pack}: {err}")
        print(f"layouts head_dim {head_dim} x {heads} heads: " + "; ".join(errors), flush=True)


def main() -> None:
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}")
    layouts()
    if "--layouts-only" in sys.argv:
        return
    for batch in (1, 8):
        for shape, (queries, keys) in SHAPES.items():
            row = []
            for name, fn in candidates(batch, queries, keys).items():
                row.append(f"{name} {fn if isinstance(fn, str) else f'{_time_us(fn):.1f}'}")
            print(
                f"batch {batch} {shape} ({HEADS}x{queries} queries, {keys} keys), us: " + "; ".join(row),
                flush=True,
            )


if __name__ == "__main__":
    main()
