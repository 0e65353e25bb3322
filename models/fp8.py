"""FP8 (e4m3) matmuls for the large linear layers: :class:`Fp8Linear` and :func:`convert_linears`.

Numerics contract of ``Fp8Linear`` (``y = x W^T + b``, ``W [N, K]``):

- **weight**: quantized once, at conversion, to ``torch.float8_e4m3fn`` with one float32 scale per
  output channel, ``s_w[n] = max_k |W[n, k]| / 448`` (448: e4m3's largest finite value), so
  ``W[n, k] ~= s_w[n] * Wq[n, k]``; the high-precision weight is dropped.
- **activations**: quantized on every call with one scale per row (token),
  ``s_x[m] = max_k |x[m, k]| / 448`` in ``x``'s dtype (then passed to the matmul as float32, the
  exact value ``x`` was divided by), computed on the device (no host sync: CUDA-graph capture and
  ``torch.compile`` trace it like any other op); an all-zero row gets a tiny scale, not NaN.
  Eager transient memory per call: one copy of ``x`` in its dtype, then 1 byte per element.
- **product**: ``torch._scaled_mm(xq, Wq^T, s_x [M, 1], s_w [1, N])`` (row-wise scaling on both
  operands; allowed on the CPU and on CUDA from sm89, where sm90 runs cuBLASLt's or CUTLASS's
  FP8 kernels), output in ``x``'s dtype; then the bias is added in that dtype. On CUDA the
  tensor cores accumulate with Hopper's fast FP8 accumulation (:data:`FAST_ACCUM`).
- **error**: e4m3 keeps 3 mantissa bits (relative rounding error <= 2^-4 per element, ~2.3 %
  RMS for Gaussian data), so a product's relative (Frobenius) error is ~3-4 % on random
  Gaussian operands; ``tests/test_fp8.py`` bounds it at 6 % on the CPU and on the H200.
- **autograd**: ``_scaled_mm`` has no derivative, so while autograd records a call (an input that
  requires grad under grad mode: RTC's guided flow steps) the layer multiplies by the
  dequantized weight ``s_w * Wq`` in ``x``'s dtype instead (the weight's quantization still
  applies, the activation's does not); the gradient flows to ``x`` only.

Shape limits (``_scaled_mm``'s): both dimensions of ``W`` multiples of 16; any number of rows.
"""

from __future__ import annotations

from collections.abc import Collection

import torch
import torch.nn.functional as F
from torch import Tensor, nn

FP8 = torch.float8_e4m3fn
E4M3_MAX = float(torch.finfo(FP8).max)  # 448
MIN_AMAX = 1e-12  # floor of a row's amax: an all-zero row quantizes to zeros, not NaN
FAST_ACCUM = True  # CUDA: Hopper's FP8 accumulation (torchao's default for forwards); the CPU ignores it


class Fp8Linear(nn.Module):
    """An ``nn.Linear`` whose matmul runs in FP8 (module docstring: the numerics contract).

    Buffers: ``weight_fp8 [N, K]`` (e4m3), ``weight_scale [1, N]`` (float32), ``bias [N]`` (the
    source layer's dtype) or None. Inference only: nothing here is a parameter. Convert *after* the
    model's last ``.to(dtype)`` (a later one would cast the FP8 buffers back up).
    """

    def __init__(self, weight_fp8: Tensor, weight_scale: Tensor, bias: Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight_fp8.shape
        self.register_buffer("weight_fp8", weight_fp8)
        self.register_buffer("weight_scale", weight_scale)
        self.register_buffer("bias", bias)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Fp8Linear:
        """Quantize ``linear``'s weight per output channel (dims must be multiples of 16)."""
        n, k = linear.weight.shape
        if n % 16 or k % 16:
            raise ValueError(f"FP8 matmuls need both dims multiples of 16, got weight [{n}, {k}]")
        _check_device(linear.weight.device)
        with torch.no_grad():
            w = linear.weight.detach().float()
            scale = w.abs().amax(dim=1).clamp(min=MIN_AMAX) / E4M3_MAX
            quantized = (w / scale[:, None]).clamp(-E4M3_MAX, E4M3_MAX).to(FP8)
            bias = None if linear.bias is None else linear.bias.detach().clone()
        return cls(quantized, scale[None, :].contiguous(), bias)

    def dequantized_weight(self, dtype: torch.dtype) -> Tensor:
        """``s_w * Wq`` ``[N, K]`` in ``dtype``: the weight this layer multiplies by."""
        return (self.weight_fp8.float() * self.weight_scale.t()).to(dtype)

    def forward(self, x: Tensor) -> Tensor:
        if torch.is_grad_enabled() and x.requires_grad:
            return F.linear(x, self.dequantized_weight(x.dtype), self.bias)
        rows = x.reshape(-1, self.in_features)
        # in x's dtype, one temporary at a time (eager: no float32 copy of a large activation)
        amax = torch.linalg.vector_norm(rows, ord=float("inf"), dim=1, keepdim=True)
        scale = amax.clamp(min=MIN_AMAX) / E4M3_MAX
        xq = (rows / scale).clamp_(-E4M3_MAX, E4M3_MAX).to(FP8)
        y = torch._scaled_mm(
            xq,
            self.weight_fp8.t(),  # [K, N] column-major, as _scaled_mm wants its second operand
            scale_a=scale.float(),  # the scale xq was divided by, exactly
            scale_b=self.weight_scale,
            out_dtype=x.dtype,
            use_fast_accum=FAST_ACCUM,
        )
        if self.bias is not None:
            y = y + self.bias
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"
        )


def _check_device(device: torch.device) -> None:
    """FP8 matmuls run on the CPU (slowly: no FP8 units) and on CUDA from compute capability 8.9."""
    if device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 9):
        raise ValueError(f"FP8 matmuls need CUDA compute capability >= 8.9 (Ada, Hopper); {device} has less")


def convert_linears(module: nn.Module, min_features: int = 16, skip: Collection[str] = ()) -> int:
    """Swap, in place, every ``nn.Linear`` under ``module`` whose two dims are multiples of 16
    and at least ``min_features`` for an :class:`Fp8Linear`; Linears under a child whose
    attribute name is in ``skip`` (at any depth) stay as they are. Returns how many were swapped.

    The callers pick the scope by the module they pass (a model's transformer layers, not its
    embeddings or output head) and name what must stay in high precision through ``skip``.
    """
    swapped = 0
    for name, child in list(module.named_children()):
        if name in skip:
            continue
        if type(child) is nn.Linear:
            n, k = child.weight.shape
            if n % 16 == 0 and k % 16 == 0 and min(n, k) >= min_features:
                setattr(module, name, Fp8Linear.from_linear(child))
                swapped += 1
        else:
            swapped += convert_linears(child, min_features, skip)
    return swapped
