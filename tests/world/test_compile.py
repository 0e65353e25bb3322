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
from tests.world.helpers import action, block_inputs

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
    assert warmed == 4  # batch 1 x {past}, batch >= 2 x {the room alone, past, masked past}
    blocks = compiled.pool.geometry.steady_block + 3  # past the window: eviction under way
    groups = [["a"], ["b", "c", "d"], ["e", "f"]]  # batch 3 never ran in the warm-up
    got = _serve(compiled, groups, blocks)
    assert counter.frame_count == warmed, "a session compiled while it was served"
    eager = _serve(WorldModel.build(TEST, slots=4, dtype=torch.float64), groups, blocks)
    for sid, latents in eager.items():
        for b, (x, y) in enumerate(zip(latents, got[sid], strict=True)):
            assert float((x - y).abs().max()) < TOL, (sid, b)


def test_gathered_past_equals_attending_to_the_whole_padded_window_under_a_mask():
    """Structure: what ``gather`` hands the DiT (no past for a first block, the filled prefix of a
    filling window, the whole window once full) attends exactly like the whole sink + window
    gathered at full length with every frame the block must not see masked (garbage there)."""
    model = WorldModel.build(TEST, slots=2, dtype=torch.float64)
    cfg, g = model.cfg, model.pool.geometry
    model.open("s", seed=1)
    room, tpf = cfg.frames_per_block * cfg.tokens_per_frame, cfg.tokens_per_frame
    cross = model.pool.cross(["s"])
    lengths = []
    for b in range(g.steady_block + 2):
        start = b * cfg.frames_per_block
        past, key_mask = model.pool.gather(["s"], [start], room=room)
        assert key_mask is None  # one session: never a mask
        lengths.append(0 if past is None else past[0][0].shape[1] - room)
        pos_of_slot = model.pool.frame_pos[0]
        seen = (pos_of_slot >= 0) & (pos_of_slot < start)
        seen &= (pos_of_slot < cfg.sink_frames) | (pos_of_slot >= start - cfg.window_frames)
        mask = torch.cat([seen.repeat_interleave(tpf), torch.ones(room, dtype=torch.bool)])[None, None, None]
        padded = []
        for layer in range(cfg.depth):
            k, v = (
                torch.randn(1, g.resident_frames * tpf + room, cfg.heads, cfg.head_dim, dtype=torch.float64)
                for _ in "kv"
            )
            k[0, : g.resident_frames * tpf], v[0, : g.resident_frames * tpf] = (
                model.pool.k[layer, 0],
                model.pool.v[layer, 0],
            )
            k[0, : g.resident_frames * tpf][~seen.repeat_interleave(tpf)] = 1e3  # garbage the mask hides
            padded.append((k, v))
        x, pos, timesteps, acts = block_inputs(cfg, b)
        got, kv_got = model.dit(x, pos, timesteps, acts, cross, None, past)
        want, kv_want = model.dit(x, pos, timesteps, acts, cross, mask, padded)
        assert float((got - want).abs().max()) < TOL, b
        for (kg, vg), (kw, vw) in zip(kv_got, kv_want, strict=True):  # what the clean pass commits
            assert float((kg - kw).abs().max()) < TOL and float((vg - vw).abs().max()) < TOL
        model.generate([WorldTick("s", b, None, action(b))])
    frames = [n // tpf for n in lengths]  # no past, then the window filling, then all of it
    assert frames[0] == 0 and frames[-1] == g.resident_frames and frames == sorted(frames)
    assert len(set(frames)) > 2


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
