"""``world.compile`` keeps one graph per shape class, warmed before serving (issue 16).

The key length never changes (``KVPool.gather`` pads the past to the whole sink + window under a
mask) and the batch dimension is dynamic from 2 on, so the load-time warm-up
(``measure_step_seconds``) compiles every graph there is: sessions then run from block 0 past
the window, alone and batched at sizes the warm-up never ran, without one more compilation."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounter

from models.world.configs import TEST
from models.world.model import WorldModel, WorldTick
from realtime.kinds.world import measure_step_seconds
from tests.world.helpers import action

TOL = 1e-10  # float64


def _serve(model: WorldModel, batches: list[list[str]], blocks: int) -> dict[str, list[torch.Tensor]]:
    """Each group of sessions ticks together from block 0 for ``blocks`` blocks; their latents."""
    out: dict[str, list[torch.Tensor]] = {}
    for group in batches:
        for seed, sid in enumerate(group):
            model.open(sid, seed=seed + 1)
        for b in range(blocks):
            x0 = model.generate(
                [WorldTick(sid, b, "stone maze", action(b + i)) for i, sid in enumerate(group)]
            )
            for i, sid in enumerate(group):
                out.setdefault(sid, []).append(x0[i])
        for sid in group:
            model.release(sid)
    return out


def test_no_compilation_after_the_warm_up_as_windows_fill_at_any_batch_size():
    compiled = WorldModel.build(TEST, slots=4, dtype=torch.float64)
    counter = CompileCounter()
    compiled.dit.compile_blocks(backend=counter)
    measure_step_seconds(compiled, max_batch=4)  # the world kind's load: batches 1, 2, 4
    warmed = counter.frame_count
    assert warmed == 6  # {batch 1, batch >= 2} x {no past, filling window, full window}
    blocks = compiled.pool.geometry.steady_block + 3  # past the window: eviction under way
    groups = [["a"], ["b", "c", "d"], ["e", "f"]]  # batch 3 never ran in the warm-up
    got = _serve(compiled, groups, blocks)
    assert counter.frame_count == warmed, "a session compiled while it was served"
    eager = _serve(WorldModel.build(TEST, slots=4, dtype=torch.float64), groups, blocks)
    for sid, latents in eager.items():
        for b, (x, y) in enumerate(zip(latents, got[sid], strict=True)):
            assert float((x - y).abs().max()) < TOL, (sid, b)


def test_a_first_block_without_past_equals_attending_to_the_padded_masked_window():
    model = WorldModel.build(TEST, slots=2, dtype=torch.float64)
    cfg = model.cfg
    model.open("s", seed=1)
    room = cfg.frames_per_block * cfg.tokens_per_frame
    assert model.pool.gather(["s"], [0], room=room) == (None, None)  # nothing visible: no past
    # the padded form of the same block: the whole (empty) window gathered, every past key masked
    resident = model.pool.k.shape[2]
    buffer = (1, resident + room, cfg.heads, cfg.head_dim)
    # garbage in every past row, which the mask must hide
    past = [
        (torch.randn(buffer, dtype=torch.float64), torch.randn(buffer, dtype=torch.float64))
        for _ in range(cfg.depth)
    ]
    mask = torch.cat([torch.zeros(1, resident, dtype=torch.bool), torch.ones(1, room, dtype=torch.bool)], 1)
    shape = (1, cfg.frames_per_block, cfg.latent_channels, cfg.latent_height, cfg.latent_width)
    x = torch.randn(shape, dtype=torch.float64)
    pos = torch.arange(cfg.frames_per_block)[None]
    sigma = torch.full((1, cfg.frames_per_block), 0.5, dtype=torch.float64)
    acts = action(0).expand(1, cfg.frames_per_block, -1).to(torch.float64)
    cross = model.pool.cross(["s"])
    alone, kv_alone = model.dit(x, pos, sigma, acts, cross, None, None)
    padded, kv_padded = model.dit(x, pos, sigma, acts, cross, mask[:, None, None], past)
    assert float((alone - padded).abs().max()) < TOL
    for (ka, va), (kp, vp) in zip(kv_alone, kv_padded, strict=True):  # what the clean pass commits
        assert float((ka - kp).abs().max()) < TOL and float((va - vp).abs().max()) < TOL


@pytest.mark.slow
def test_inductor_compiled_blocks_match_eager_and_never_recompile_in_service():
    """The real backend on the CPU (needs a C++ toolchain; ~1 min on the shared 2-core box)."""
    torch._dynamo.reset()
    compiled = WorldModel.build(TEST, slots=4)
    compiled.dit.compile_blocks()
    measure_step_seconds(compiled, max_batch=4)
    groups, blocks = [["a"], ["b", "c", "d"]], compiled.pool.geometry.steady_block + 2
    frames_before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    got = _serve(compiled, groups, blocks)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == frames_before
    eager = _serve(WorldModel.build(TEST, slots=4), groups, blocks)
    for sid, latents in eager.items():
        for x, y in zip(latents, got[sid], strict=True):
            assert float((x - y).abs().max()) < 1e-4
