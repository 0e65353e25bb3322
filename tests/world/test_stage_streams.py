"""On CUDA the decode stage runs on its own stream, ordered after the DiT forward by an event:
its frames must equal the model's own ``step`` (one stream), block after block, landing in pinned
host memory with the stage timings read from CUDA events."""

import pytest
import torch

from models.stage import StageItem
from models.world.configs import TEST
from models.world.model import WorldModel, WorldTick
from models.world.stage import WorldBlockInput, WorldBlockStage, WorldDecodeStage

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_decode_on_its_own_stream_equals_the_single_stream_step():
    staged = WorldModel.build(TEST, slots=2, device="cuda", seed=3)
    direct = WorldModel.build(TEST, slots=2, device="cuda", seed=3)
    dit, decode = WorldBlockStage(staged, device="cuda"), WorldDecodeStage(staged, device="cuda")
    assert decode._stream is not None
    ids = ["a", "b"]
    for slot, sid in enumerate(ids):
        dit.open_state(sid, slot)
        decode.open_state(sid, slot)
        direct.open(sid, seed=slot)
    action = torch.zeros(TEST.action_dim)
    for block in range(4):
        ticks = [WorldTick(sid, block, "stone", action) for sid in ids]
        items = [
            StageItem(sid, 0, WorldBlockInput(t, seed=slot), slot=slot)
            for slot, (sid, t) in enumerate(zip(ids, ticks, strict=True))
        ]
        latents = dit.forward(items)
        assert all(b.ready is not None for b in latents)
        frames = decode.forward(
            [StageItem(sid, 0, b, slot=slot) for slot, (sid, b) in enumerate(zip(ids, latents, strict=True))]
        )
        expected = direct.step(ticks)
        for got, want in zip(frames, expected, strict=True):
            assert torch.equal(got.frames, want)
            assert got.frames.is_pinned() and got.frames.is_contiguous()
            t = got.timings
            assert t is not None and min(t.denoise_ms, t.clean_ms, t.decode_ms) > 0 and t.d2h_ms >= 0
