"""The block and decode stages against the model's own ``step``: equal frames, block after block
(the first block, a window filling, the full window), as contiguous host tensors carrying the
stage timings. On CUDA the decode stage runs on its own stream, ordered after the DiT forward by
an event, and its frames land in pinned host memory; the timings come from CUDA events."""

import time

import pytest
import torch

from models.stage import StageItem
from models.world.attention import kernel_usable
from models.world.configs import TEST
from models.world.model import WorldModel, WorldTick
from models.world.profiling import BlockTimings, DeviceProfiler
from models.world.stage import WorldBlockInput, WorldBlockStage, WorldDecodeStage

CUDA = pytest.param(
    "cuda",
    marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")],
)


@pytest.mark.parametrize("device", ["cpu", CUDA])
def test_staged_frames_equal_the_models_step_with_stage_timings(device):
    staged = WorldModel.build(TEST, slots=2, device=device, seed=3, profiler=DeviceProfiler(device == "cuda"))
    direct = WorldModel.build(TEST, slots=2, device=device, seed=3)
    dit = WorldBlockStage(staged, device=device)
    decode = WorldDecodeStage(staged, device=device)
    assert (decode._stream is not None) == (device == "cuda")
    ids = ["a", "b"]
    for slot, sid in enumerate(ids):
        dit.open_state(sid, slot)
        decode.open_state(sid, slot)
        direct.open(sid, seed=slot)
    action = torch.zeros(TEST.action_dim)
    for block in range(staged.pool.geometry.steady_block + 1):
        ticks = [WorldTick(sid, block, "stone", action) for sid in ids]
        items = [
            StageItem(sid, 0, WorldBlockInput(t, seed=slot), slot=slot)
            for slot, (sid, t) in enumerate(zip(ids, ticks, strict=True))
        ]
        before = time.monotonic()
        latents = dit.forward(items)
        assert all((b.ready is not None) == (device == "cuda") for b in latents)
        frames = decode.forward(
            [StageItem(sid, 0, b, slot=slot) for slot, (sid, b) in enumerate(zip(ids, latents, strict=True))]
        )
        expected = direct.step(ticks)
        for got, want in zip(frames, expected, strict=True):
            assert torch.equal(got.frames, want) and got.frames.is_contiguous()
            assert got.frames.is_pinned() == (device == "cuda")
            t = got.timings
            assert isinstance(t, BlockTimings) and before <= t.started_at <= time.monotonic()
            assert min(t.denoise_ms, t.clean_ms, t.decode_ms) > 0 and t.d2h_ms >= 0
            # the DiT stream between forwards: none before the stage's first; then the commit, the
            # next gather and (here) the decode and the direct model's step the test runs between
            assert (t.gap_ms == 0) if block == 0 else (t.gap_ms > 0)
            assert t.launch_ms == got.forward_ms > 0
            if device == "cpu":  # host clocks: the DiT's passes lie inside the stage's forward
                assert t.denoise_ms + t.clean_ms <= got.forward_ms


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(
    "attention,dtype",
    [
        ("sdpa", torch.float32),
        pytest.param(
            "flash4",
            torch.bfloat16,
            marks=pytest.mark.skipif(
                not (torch.cuda.is_available() and kernel_usable("flash4", torch.device("cuda"))),
                reason="needs a Hopper GPU and the flash4 extra",
            ),
        ),
    ],
)
def test_a_block_is_queued_without_a_host_wait(attention, dtype):
    """Generating a block (its inputs, noise, gathered past and cross-attention K/V, five
    passes, the commit) never makes the host wait for the GPU, so the block stage can launch
    block k + 1 while block k runs: any synchronising call raises under sync debug mode. Also
    with FlashAttention-4's kernels (``world.attention: flash4``)."""
    model = WorldModel.build(TEST, slots=2, device="cuda", dtype=dtype, attention=attention)
    model.open("s", seed=1)
    model.open("t", seed=2)
    act = torch.zeros(TEST.action_dim)
    for block in range(model.pool.geometry.steady_block + 1):
        model.generate([WorldTick("s", block, "a maze", act), WorldTick("t", block, "a maze", act)])
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        block = model.next_block("s")
        model.generate([WorldTick("s", block, "a maze", act), WorldTick("t", block, "a maze", act)])
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
