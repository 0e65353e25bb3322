"""A world session rebuilt from the blocks its KV held (``WorldModel.restore``; the stages'
restore and decoder warm-up), as a replica that resumes a lost replica's session rebuilds it:
exact while no frame had left the window, within 0.5 % after."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from models.stage import StageItem
from models.world.configs import SELF_FORCING, TEST
from models.world.model import HeldBlock, WorldModel, WorldTick, resident_blocks, restorable
from models.world.stage import WorldBlockInput, WorldBlockStage, WorldDecodeStage
from tests.world.helpers import action, make_model, tick


def test_the_resident_blocks_are_the_sinks_then_the_windows():
    # TEST: 2 frames per block, a sink of 1 frame, a window of 4 frames
    assert [resident_blocks(TEST, n) for n in range(7)] == [
        (),
        (0,),
        (0, 1),
        (0, 1, 2),
        (0, 2, 3),
        (0, 3, 4),
        (0, 4, 5),
    ]
    # Self-Forcing: 3-frame blocks, the first block as sink, 15 frames of window
    assert resident_blocks(SELF_FORCING, 10) == (0, 5, 6, 7, 8, 9)


def _rollout(model: WorldModel, sid: str, n: int, prompts: list[str]) -> list[HeldBlock]:
    """``n`` blocks of session ``sid``, each as a checkpoint holds it."""
    held = []
    for i in range(n):
        t = tick(model, sid, i, prompts[i])
        held.append(HeldBlock(i, model.generate([t])[0].cpu(), t.action, t.prompt))  # host, as checkpointed
    return held


@pytest.mark.parametrize(("blocks", "exact"), [(3, True), (8, False)])
def test_a_restored_session_goes_on_as_the_one_it_was_rebuilt_from(blocks, exact):
    model = make_model(slots=3)
    model.open("there", seed=7)
    prompts = ["stone maze"] * 2 + ["ice cave"] * (blocks - 2)  # held blocks under two prompts
    history = _rollout(model, "there", blocks, prompts)
    model.open("here", seed=0)
    model.restore("here", 7, [history[b] for b in resident_blocks(model.cfg, blocks)])
    assert model.next_block("here") == blocks
    next_there = model.generate([tick(model, "there", blocks, "ice cave")])[0]
    next_here = model.generate([tick(model, "here", blocks, "ice cave")])[0]
    error = ((next_here - next_there).norm() / next_there.norm()).item()
    if exact:  # every held block saw, when it was made, only blocks that are held
        assert error == 0.0
        for a, b in zip(model.pool.snapshot("there"), model.pool.snapshot("here"), strict=True):
            assert torch.equal(a, b)
    else:  # the window's oldest blocks were made against blocks no longer held
        assert 0.0 < error < 5e-3


def _item(sid: str, payload: object, slot: int) -> StageItem:
    return StageItem(sid, 0, payload, slot=slot)


def test_the_stages_rebuild_the_kv_and_the_decoders_cache_of_a_moved_session():
    """Block stage then decode stage, as the world pipeline runs them: a session restored from
    blocks 0..2 (nothing left the window yet) decodes block 3 to the same frames as the session
    that never moved."""
    model = make_model(slots=2)
    dit, decoder = WorldBlockStage(model), WorldDecodeStage(model)
    for sid, slot in (("there", 0), ("here", 1)):
        dit.open_state(sid, slot)
        decoder.open_state(sid, slot)
    held = []
    for i in range(3):
        t = WorldTick("there", i, "stone maze", action(i))
        (block,) = dit.forward([_item("there", WorldBlockInput(t, 5), 0)])
        (frames,) = decoder.forward([_item("there", block, 0)])
        held.append(frames.held)
    assert [h.block for h in held] == [0, 1, 2] and all(h.latent.shape[0] == 2 for h in held)
    t3 = WorldTick("there", 3, "stone maze", action(3))
    (there,) = decoder.forward(
        [_item("there", dit.forward([_item("there", WorldBlockInput(t3, 5), 0)])[0], 0)]
    )
    moved = WorldBlockInput(WorldTick("here", 3, "stone maze", action(3)), 5, restore=tuple(held))
    (block,) = dit.forward([_item("here", moved, 1)])
    assert len(block.warmup) == 3  # blocks 0..2 run on: the decoder's cache starts from block 0
    (here,) = decoder.forward([_item("here", block, 1)])
    assert here.frames.shape[0] == model.cfg.frames_for_block(False)  # a later block's frames
    assert torch.equal(here.frames, there.frames)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_restore_on_cuda_with_graphs_rebuilds_what_the_graphed_session_holds():
    """bf16 on the GPU with the steady pass replayed from CUDA graphs: the restore's clean passes
    (eager while the window fills, replayed once it is full) rebuild the same KV as the ticks."""
    model = WorldModel.build(TEST, slots=3, device="cuda", dtype=torch.bfloat16, seed=5)
    model.capture_graphs(2)
    model.open("there", seed=7)
    history = _rollout(model, "there", 3, ["stone maze"] * 3)
    model.open("here", seed=0)
    model.restore("here", 7, [h for h in history if h.block in resident_blocks(model.cfg, 3)])
    for a, b in zip(model.pool.snapshot("there"), model.pool.snapshot("here"), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    next_there = model.generate([tick(model, "there", 3, "stone maze")])[0]
    next_here = model.generate([tick(model, "here", 3, "stone maze")])[0]
    torch.testing.assert_close(next_here, next_there, rtol=0, atol=0)


def test_only_the_resident_blocks_of_the_models_shape_are_restorable():
    model = make_model(slots=1)
    model.open("there", seed=1)
    history = _rollout(model, "there", 4, ["stone maze"] * 4)
    kept = [history[b] for b in resident_blocks(model.cfg, 4)]
    assert restorable(model.cfg, kept)
    assert not restorable(model.cfg, [])
    assert not restorable(model.cfg, history)  # block 1 had left the window
    other = dataclasses.replace(model.cfg, latent_channels=model.cfg.latent_channels + 1)
    assert not restorable(other, kept)  # written by a replica serving another shape
