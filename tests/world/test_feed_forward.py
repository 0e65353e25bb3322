"""``DiTBlock.feed_forward``: Wan's FFN (Linear, GELU tanh, Linear); on CUDA the GELU runs in
cuBLASLt's epilogue of the first matmul, elsewhere the modules run as they are."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from models.world.configs import TEST
from models.world.dit import DiTBlock


def _block(device: str, dtype: torch.dtype) -> DiTBlock:
    torch.manual_seed(0)
    cfg = dataclasses.replace(TEST, dim=256, ffn_dim=1024)
    block = DiTBlock(cfg)
    for p in block.ffn.parameters():  # biases of the size a trained FFN has, not zeros
        torch.nn.init.normal_(p, std=p.shape[-1] ** -0.5)
    return block.to(device, dtype)


def test_on_the_cpu_it_is_the_modules_ffn():
    block = _block("cpu", torch.float32)
    h = torch.randn(2, 30, 256)
    assert torch.equal(block.feed_forward(h), block.ffn(h))


@pytest.mark.gpu
def test_the_cuda_epilogue_is_the_tanh_gelu_ffn_within_bf16_rounding():
    """Against the FFN in float32, the epilogue's error is the bf16 FFN's or smaller (its GELU
    applies before the rounding)."""
    block = _block("cuda", torch.bfloat16)
    h = torch.randn(2, 3 * 64, 256, device="cuda", dtype=torch.bfloat16)
    reference = copy.deepcopy(block.ffn).float()(h.float())
    scale = reference.abs().max()

    def error(out: torch.Tensor) -> float:
        return float((out.float() - reference).abs().max() / scale)

    epilogue, modules = block.feed_forward(h), block.ffn(h)
    assert epilogue.shape == modules.shape == h.shape
    assert error(epilogue) <= max(error(modules), 4e-3)
