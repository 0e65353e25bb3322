"""Two candidate savings in a world DiT block's matmuls, timed on one GPU at the Wan-2.1-1.3B
shape (a block of 3 frames: 4,680 tokens of dim 1536, FFN 8960, bf16), before either goes in:

- the FFN's GELU (tanh) in cuBLASLt's epilogue (``torch._addmm_activation(..., use_gelu=True)``)
  instead of a compiled bias + GELU kernel after the matmul (one pass less over the 4680 x 8960
  intermediate), with its error against a float32 reference next to the compiled FFN's;
- the self-attention's q, k and v as one matmul of 3 x 1536 columns instead of three of 1536.

Run on the device machine from the repo root, after `source realtime/bench/gpu/env.sh`:
    python3 realtime/bench/gpu/world_ffn.py
Prints one line per figure and ends with one JSON line (ms per call, per batch of sessions).
"""

from __future__ import annotations

import json

import torch
import torch.nn.functional as F
from world_attention import timed_ms  # this folder's: the scripts run as files from the repo root

DIM, FFN, TOKENS = 1536, 8960, 3 * 1560


def ffn_compiled(x, w1, b1, w2, b2):  # noqa: ANN001, ANN201
    return F.linear(F.gelu(F.linear(x, w1, b1), approximate="tanh"), w2, b2)


def ffn_epilogue(x, w1, b1, w2, b2):  # noqa: ANN001, ANN201
    return F.linear(torch._addmm_activation(b1, x, w1.t(), use_gelu=True), w2, b2)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref).abs().max() / ref.abs().max()).item()


def main() -> None:
    figures: dict[str, float] = {}
    g = torch.Generator(device="cuda").manual_seed(0)

    def rand(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, device="cuda", generator=g) * scale).to(torch.bfloat16)

    w1, b1 = rand(FFN, DIM, scale=DIM**-0.5), rand(FFN, scale=0.1)
    w2, b2 = rand(DIM, FFN, scale=FFN**-0.5), rand(DIM, scale=0.1)
    wq, wk, wv = (rand(DIM, DIM, scale=DIM**-0.5) for _ in range(3))
    wqkv = torch.cat([wq, wk, wv])
    compiled = torch.compile(ffn_compiled, dynamic=False)
    for batch in (1, 4):
        x = rand(batch * TOKENS, DIM)
        ref = ffn_compiled(*(t.float() for t in (x, w1, b1, w2, b2)))
        with torch.no_grad():
            figures[f"ffn_compiled_ms_{batch}"] = timed_ms(lambda: compiled(x, w1, b1, w2, b2), 50)  # noqa: B023
            figures[f"ffn_epilogue_ms_{batch}"] = timed_ms(lambda: ffn_epilogue(x, w1, b1, w2, b2), 50)  # noqa: B023
            figures[f"ffn_compiled_rel_err_{batch}"] = rel_err(compiled(x, w1, b1, w2, b2), ref)
            figures[f"ffn_epilogue_rel_err_{batch}"] = rel_err(ffn_epilogue(x, w1, b1, w2, b2), ref)
            figures[f"qkv_three_ms_{batch}"] = timed_ms(lambda: [x @ w.t() for w in (wq, wk, wv)], 50)  # noqa: B023
            figures[f"qkv_one_ms_{batch}"] = timed_ms(lambda: x @ wqkv.t(), 50)  # noqa: B023
    figures = {k: round(v, 4 if "err" in k else 3) for k, v in figures.items()}
    for name, value in figures.items():
        print(f"{name:>28} {value:10.4g}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
