"""FlashAttention-3's forward (the `fa3-fwd` wheel) against the world DiT's attention kernels, on
one GPU, at the world models' self-attention shapes: bf16 and FP8 (e4m3, one scale per batch row
and head) speed, and each one's error against a float32 reference.

Run on the device machine from the repo root, with the `fa3-fwd` wheel installed (env.sh installs
`.fa3/*.whl` where carried) and FlashAttention-4 where carried:
    python3 realtime/bench/gpu/world_attention.py
Prints one line per (shape, kernel) and ends with one JSON line.
"""

from __future__ import annotations

import json

import torch
import torch.nn.functional as F

HEADS, HEAD_DIM, TOKENS_PER_FRAME, BLOCK_FRAMES = 12, 128, 1560, 3
# name -> (batch, key frames): the Wan-shaped bench's 15-frame window, Self-Forcing's 21 frames
SHAPES = {"wan_1": (1, 15), "sf_1": (1, 21), "wan_4": (4, 15), "sf_3": (3, 21)}
E4M3_MAX = 448.0  # the largest finite float8_e4m3fn


def timed_ms(fn, repeats: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeats


def quantize(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``t [B, N, H, D]`` in e4m3 with one float32 scale per (batch row, head): (values, descale [B, H])."""
    amax = t.abs().amax(dim=(1, 3)).float().clamp(min=1e-12)
    scale = E4M3_MAX / amax
    return (t.float() * scale[:, None, :, None]).to(torch.float8_e4m3fn), (1.0 / scale).contiguous()


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: int = 512) -> torch.Tensor:
    """float32 attention of the first ``rows`` queries of batch row 0 (the error's sample)."""
    qs = q[:1, :rows].float().transpose(1, 2)
    out = F.scaled_dot_product_attention(qs, k[:1].float().transpose(1, 2), v[:1].float().transpose(1, 2))
    return out.transpose(1, 2)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    rows = ref.shape[1]
    diff = (out[:1, :rows].float() - ref).abs().max().item()
    return diff / ref.abs().max().item()


def measure(name: str, batch: int, key_frames: int, fa3, fa4, figures: dict[str, float]) -> None:
    """Times each kernel at one shape and records its time and error in ``figures``."""
    nq, nk = BLOCK_FRAMES * TOKENS_PER_FRAME, key_frames * TOKENS_PER_FRAME
    # roped, RMS-normed q/k have unit-scale entries; the DiT's values likewise
    q = torch.randn(batch, nq, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(batch, nk, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(batch, nk, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    flop = 4 * batch * HEADS * nq * nk * HEAD_DIM
    ref = reference(q, k, v)
    (q8, qd), (k8, kd), (v8, vd) = quantize(q), quantize(k), quantize(v)
    kernels = {
        "sdpa": lambda: F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        ).transpose(1, 2),
        "fa3_bf16": lambda: fa3(q, k, v),
        "fa3_fp8": lambda: fa3(q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd),
    }
    if fa4 is not None:
        kernels["fa4_bf16"] = lambda: fa4(q, k, v)[0]
    for kernel, fn in kernels.items():
        out = fn()
        out = out[0] if isinstance(out, tuple) else out
        ms = timed_ms(fn)
        err = rel_err(out, ref)
        figures[f"{name}_{kernel}_ms"] = round(ms, 3)
        figures[f"{name}_{kernel}_rel_err"] = float(f"{err:.3g}")
        print(
            f"{name:6s} B={batch} Nq={nq} Nk={nk} {kernel:9s} {ms:7.3f} ms {flop / ms / 1e9:7.1f} TFLOP/s max rel err {err:.2e}"
        )
    quant_ms = timed_ms(lambda: (quantize(q), quantize(k), quantize(v)))
    new_ms = timed_ms(lambda: (quantize(q), quantize(k[:, -nq:]), quantize(v[:, -nq:])))
    figures[f"{name}_quantize_all_ms"] = round(quant_ms, 3)
    figures[f"{name}_quantize_new_ms"] = round(new_ms, 3)
    print(
        f"{name:6s} quantize q,k,v: {quant_ms:.3f} ms (all keys), {new_ms:.3f} ms (the block's own keys only)"
    )


def main() -> None:
    from fa3_fwd_interface import flash_attn_func as fa3

    try:
        from flash_attn.cute import flash_attn_func as fa4
    except ImportError:
        fa4 = None
    torch.manual_seed(0)
    figures: dict[str, float] = {}
    for name, (batch, key_frames) in SHAPES.items():
        measure(name, batch, key_frames, fa3, fa4, figures)
        torch.cuda.empty_cache()
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
