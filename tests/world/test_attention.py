"""``models.world.attention``: the key split that fills the GPU's waves, and its exact merge."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from models.world import dit as dit_module
from models.world.attention import (
    attend,
    flash3_attention,
    flash4_attention,
    kernel_usable,
    key_splits,
    resolve_kernel,
    split_key_attention,
    wave_fill,
)
from models.world.configs import TEST
from models.world.model import WorldModel, WorldTick
from tests.world.helpers import action

H200_SMS = 132


def _dit_layout(b: int, n: int, h: int, d: int, dtype=torch.float32, device="cpu") -> torch.Tensor:
    """``[B, H, N, D]`` viewed over ``[B, N, H, D]`` memory, as the DiT passes q, k and v."""
    return torch.randn(b, n, h, d, dtype=dtype, device=device).transpose(1, 2)


def test_wave_fill():
    assert wave_fill(132, H200_SMS) == 1.0
    assert wave_fill(444, H200_SMS) == pytest.approx(444 / 528)
    assert wave_fill(888, H200_SMS) == pytest.approx(888 / 924)


def test_one_wan_session_splits_its_keys_and_batches_do_not():
    """Wan-1.3B (12 heads, 4,680 queries per block): 444 tiles fill 84 % of 4 waves, 888 fill
    96 % of 7. Batches of 2 to 8 sessions already fill >= 96 % (but 3: 92 %, split 96 %, under
    the gain that pays for the merge)."""
    keys = 18 * 1560
    assert key_splits(1, 12, 4680, keys, H200_SMS) == 2
    assert key_splits(1, 12, 4680, 4680, H200_SMS) == 2  # a first block, no past
    assert [key_splits(b, 12, 4680, keys, H200_SMS) for b in range(2, 9)] == [1] * 7
    assert key_splits(1, 12, 4680, keys + 1, H200_SMS) == 1  # keys must halve evenly
    assert key_splits(1, 2, 64, 128, H200_SMS) == 1  # under one wave: nothing to fill


@pytest.mark.parametrize("splits", [2, 3])
@pytest.mark.parametrize("keys", [96, 240])
def test_split_attention_equals_one_call(splits, keys):
    q, k, v = _dit_layout(2, 40, 4, 32), _dit_layout(2, keys, 4, 32), _dit_layout(2, keys, 4, 32)
    want = F.scaled_dot_product_attention(q, k, v)
    got = split_key_attention(q, k, v, splits)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_a_split_refuses_a_mask():
    q = _dit_layout(1, 8, 2, 16)
    mask = torch.ones(1, 1, 8, 8, dtype=torch.bool)
    torch.testing.assert_close(attend(q, q, q, mask), F.scaled_dot_product_attention(q, q, q, attn_mask=mask))
    with pytest.raises(ValueError, match="mask"):
        attend(q, q, q, mask, splits=2)


def test_the_dit_with_split_keys_renders_the_same_blocks(monkeypatch):
    """The DiT passes its split to every block: forcing 2 (as on an H200) changes no block's x0
    or committed keys beyond float rounding, through a filling window and the steady state."""

    def run() -> tuple[list[torch.Tensor], torch.Tensor]:
        model = WorldModel.build(TEST, slots=1, dtype=torch.float32)
        torch.manual_seed(0)
        for p in model.dit.parameters():
            p.data.normal_(0, 0.2)
        model.open("s", seed=3)
        x0 = [model.generate([WorldTick("s", b, "a maze", action(b))]) for b in range(6)]
        return x0, model.pool.k.clone()

    want_x0, want_k = run()
    seen: list[int] = []

    def forced(*args) -> int:
        seen.append(2)
        return 2

    monkeypatch.setattr(dit_module, "splits_for", forced)
    got_x0, got_k = run()
    assert len(seen) >= 6 * (len(TEST.sigmas) + 1)  # every pass of every block split
    for g, w in zip(got_x0, want_x0, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got_k, want_k, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cudnn_split_at_the_wan_shape_matches_sdpa():
    """The CUDA path (cuDNN's kernel with its log-sum-exp) at one Wan-1.3B session's steady
    shape, bf16: the split output within bf16 rounding of SDPA's."""
    q = _dit_layout(1, 4680, 12, 128, torch.bfloat16, "cuda")
    k, v = (_dit_layout(1, 18 * 1560, 12, 128, torch.bfloat16, "cuda") for _ in range(2))
    want = F.scaled_dot_product_attention(q, k, v)
    got = split_key_attention(q, k, v, 2)
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-3)


def test_the_kernel_choice_resolves_per_device_and_dtype():
    assert resolve_kernel("auto", "cpu", torch.bfloat16) == "sdpa"
    assert resolve_kernel("sdpa", "cpu", torch.bfloat16) == "sdpa"
    with pytest.raises(ValueError, match="Hopper"):
        resolve_kernel("flash4", "cpu", torch.bfloat16)
    with pytest.raises(ValueError, match=r"Hopper \(sm90\) CUDA device, bfloat16, and the flash3 extra"):
        resolve_kernel("flash3", "cpu", torch.bfloat16)
    with pytest.raises(ValueError, match="one of"):
        resolve_kernel("flash2", "cpu", torch.bfloat16)
    assert not kernel_usable("flash4", torch.device("cuda"), torch.float32)  # FA4 takes bf16 and fp16 only
    assert not kernel_usable("flash3", torch.device("cuda"), torch.float16)  # fa3-fwd leaves out fp16
    assert not kernel_usable("flash4", torch.device("cpu"), torch.bfloat16)


def test_auto_takes_the_first_kernel_that_runs_and_says_why_it_skipped_one(monkeypatch, caplog):
    """A Hopper box with both extras whose FA4 cannot JIT its kernels (say, CUDA libraries that do
    not match the driver): ``auto`` serves with FA3 and says why in one line; with neither
    running, SDPA; ``flash4`` named fails the load with the reason. (Usability and the probes'
    failures are stubbed: this box has no Hopper GPU.)"""
    from models.world import attention

    failures = {"flash4": "RuntimeError: no ptxas for sm_90a", "flash3": None}
    monkeypatch.setattr(attention, "kernel_usable", lambda kernel, device, dtype: True)
    monkeypatch.setattr(attention, "kernel_failure", lambda kernel, device, dtype: failures[kernel])
    with caplog.at_level("WARNING", logger="models.world.attention"):
        assert resolve_kernel("auto", "cpu", torch.bfloat16) == "flash3"
    assert "flash4 does not run here (RuntimeError: no ptxas for sm_90a)" in caplog.text
    assert "Traceback" not in caplog.text
    with pytest.raises(ValueError, match="flash4 is installed but does not run here: RuntimeError: no ptxas"):
        resolve_kernel("flash4", "cpu", torch.bfloat16)
    failures["flash3"] = "OSError: libcudart.so.13: cannot open shared object file"
    assert resolve_kernel("auto", "cpu", torch.bfloat16) == "sdpa"
    failures["flash4"] = None
    assert resolve_kernel("auto", "cpu", torch.bfloat16) == "flash4"
    with pytest.raises(ValueError, match="flash3 is installed but does not run here: OSError: libcudart"):
        resolve_kernel("flash3", "cpu", torch.bfloat16)


def test_a_probe_reports_a_failure_as_one_line():
    """On this box each probe's call fails (no FA4, no FA3, no GPU): a reason, not an exception."""
    from models.world.attention import kernel_failure

    for kernel in ("flash4", "flash3"):
        reason = kernel_failure(kernel, torch.device("cpu"), torch.bfloat16)
        assert reason is not None and "\n" not in reason and len(reason) <= 300


@pytest.mark.parametrize("op", [flash4_attention, flash3_attention], ids=["flash4", "flash3"])
def test_each_optional_kernel_s_op_states_its_shapes_and_flops(op):
    """A custom op's fake (what ``torch.compile`` traces): output like q, LSE [B, H, Nq] float32;
    and FlopCounterMode counts it as it counts SDPA on the GPU, two matmuls (the bench's MFU does
    not depend on the kernel)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode

    with FakeTensorMode():
        q, k = (
            torch.empty(2, 40, 4, 32, dtype=torch.bfloat16),
            torch.empty(2, 96, 4, 32, dtype=torch.bfloat16),
        )
        with FlopCounterMode(display=False) as counter:
            out, lse = op(q, k, k)
    assert out.shape == q.shape and out.dtype == torch.bfloat16
    assert lse.shape == (2, 4, 40) and lse.dtype == torch.float32
    assert counter.get_total_flops() == 2 * (2 * 2 * 4 * 40 * 96 * 32)  # QK^T and PV


needs_flash4 = pytest.mark.skipif(
    not (torch.cuda.is_available() and kernel_usable("flash4", torch.device("cuda"))),
    reason="needs a Hopper GPU and the flash4 extra",
)
needs_flash3 = pytest.mark.skipif(
    not (torch.cuda.is_available() and kernel_usable("flash3", torch.device("cuda"))),
    reason="needs a Hopper GPU and the flash3 extra",
)


OPTIONAL = [pytest.param("flash4", marks=needs_flash4), pytest.param("flash3", marks=needs_flash3)]


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", OPTIONAL)
@pytest.mark.parametrize("splits", [1, 2])
def test_an_optional_kernel_at_the_wan_shape_matches_sdpa(kernel, splits):
    """FlashAttention-4 / -3 through :func:`attend` (one call, or the split with its LSE merge) at
    one Wan-1.3B session's steady shape, bf16: within bf16 rounding of SDPA's."""
    q = _dit_layout(1, 4680, 12, 128, torch.bfloat16, "cuda")
    k, v = (_dit_layout(1, 18 * 1560, 12, 128, torch.bfloat16, "cuda") for _ in range(2))
    want = F.scaled_dot_product_attention(q, k, v)
    got = attend(q, k, v, splits=splits, kernel=kernel)
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", OPTIONAL)
def test_the_compiled_dit_renders_the_same_blocks(kernel):
    """``world.attention: flash4`` / ``flash3`` under ``torch.compile`` (the custom ops are opaque
    to inductor): the blocks of a filling window and the steady state within bf16 rounding of SDPA's."""

    def run(kernel: str) -> list[torch.Tensor]:
        model = WorldModel.build(TEST, slots=1, device="cuda", dtype=torch.bfloat16, attention=kernel)
        model.dit.compile_blocks()
        model.open("s", seed=3)
        return [model.generate([WorldTick("s", b, "a maze", action(b))]).float() for b in range(5)]

    for got, want in zip(run(kernel), run("sdpa"), strict=True):
        torch.testing.assert_close(got, want, rtol=5e-2, atol=5e-2)
