"""``world.fp8``: the DiT's block matmuls in FP8 (``CausalDiT.to_fp8``), on the test-sized model.

Bounds (float32 activations, random weights, 8 blocks: past the window, eviction under way):
each block's x0 within 2 % (relative, Frobenius) of the model without FP8 (measured ~0.5 %: x0 =
x - sigma * v and the DiT's velocity carries the FP8 error), the committed keys within 6 %
(~3.6 %: straight out of an FP8 projection), decoded frames within 2 of 255 levels.
"""

from __future__ import annotations

import pytest
import torch
from prometheus_client import CollectorRegistry
from torch import nn
from torch._dynamo.testing import CompileCounter

from models.fp8 import Fp8Linear
from models.world.configs import CONFIGS, TEST, WAN_1_3B
from models.world.memory import weight_bytes
from models.world.model import WorldModel, WorldTick
from realtime.config import config_from_mapping
from realtime.connections import ConnectionRegistry
from realtime.kinds.base import ServerContext
from realtime.kinds.world import build_world_service, measure_step_seconds
from tests.world.helpers import action

BLOCKS = 8


def _build(fp8: bool, slots: int = 1) -> WorldModel:
    return WorldModel.build(TEST, slots=slots, dtype=torch.float32, fp8=fp8)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def test_only_the_block_projections_are_fp8():
    dit = _build(True).dit
    fp8 = [name for name, m in dit.named_modules() if isinstance(m, Fp8Linear)]
    assert len(fp8) == 7 * TEST.depth  # qkv, out, cross q / kv / out, MLP in / out
    assert all(name.startswith("blocks.") and "modulation" not in name for name in fp8)
    assert all(type(blk.modulation) is nn.Linear for blk in dit.blocks)
    assert type(dit.patch_embed) is nn.Linear and type(dit.proj_out) is nn.Linear


def test_fp8_steps_stay_close_to_the_full_precision_model():
    ref, fp8 = _build(False), _build(True)
    for model in (ref, fp8):
        model.open("s", seed=1)
    for b in range(BLOCKS):
        ticks = [WorldTick("s", b, "stone maze", action(b))]
        x_ref, commit_ref = ref._generate(ticks)
        x_fp8, commit_fp8 = fp8._generate(ticks)
        assert _rel(x_fp8, x_ref) < 0.02, b
        frames_ref, frames_fp8 = ref.decode(["s"], x_ref), fp8.decode(["s"], x_fp8)
        commit_ref(), commit_fp8()
        assert int((frames_ref[0].int() - frames_fp8[0].int()).abs().max()) <= 2, b
        keys_ref, keys_fp8 = ref.pool.snapshot("s")[0], fp8.pool.snapshot("s")[0]
        assert _rel(keys_fp8, keys_ref) < 0.06, b
    assert fp8.next_block("s") == BLOCKS


def test_a_failed_step_commits_nothing_with_fp8(monkeypatch):
    """The transaction is the model's, not the layers': FP8 changes nothing about it."""
    model = _build(True)
    model.open("s", seed=1)
    model.step([WorldTick("s", 0, "stone maze", action(0))])
    before = model.pool.snapshot("s")

    def failing(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(model.decoder, "forward", failing)
    with pytest.raises(RuntimeError, match="boom"):
        model.step([WorldTick("s", 1, "stone maze", action(1))])
    assert all(torch.equal(x, y) for x, y in zip(before, model.pool.snapshot("s"), strict=True))
    assert model.next_block("s") == 1
    with pytest.raises(ValueError, match="expected 1"):
        model.generate([WorldTick("s", 2, None, action(2))])


def test_compiled_fp8_blocks_warm_every_graph_at_load_and_match_eager():
    compiled, eager = _build(True, slots=2), _build(True, slots=2)
    counter = CompileCounter()
    compiled.dit.compile_blocks(backend=counter)
    measure_step_seconds(compiled, max_batch=2)
    assert counter.frame_count == 5  # as without FP8 (tests/world/test_compile.py)
    for model in (compiled, eager):
        model.open("a", seed=1)
    for b in range(3):
        ticks = [WorldTick("a", b, "stone maze", action(b))]
        assert torch.equal(compiled.generate(ticks), eager.generate(ticks)), b
    assert counter.frame_count == 5


@pytest.mark.parametrize("cfg", [TEST, WAN_1_3B])
def test_the_memory_plan_counts_the_fp8_weights(cfg):
    bf16, fp8 = weight_bytes(cfg, torch.bfloat16), weight_bytes(cfg, torch.bfloat16, fp8=True)
    if cfg is TEST:
        model = WorldModel.build(cfg, slots=1, dtype=torch.bfloat16, fp8=True)
        tensors = [t for m in (model.dit, model.decoder) for t in (*m.parameters(), *m.buffers())]
        assert fp8 == sum(t.numel() * t.element_size() for t in tensors)
    else:  # Wan-1.3B: the blocks' 7 projections go from 2 bytes to 1 per weight (+ float32 scales)
        d, f = cfg.dim, cfg.ffn_dim
        weights = cfg.depth * (3 * d * d + d * d + d * d + 2 * d * d + d * d + 2 * d * f)
        scales = cfg.depth * (3 * d + d + d + 2 * d + d + f + d) * 4
        assert bf16 - fp8 == weights - scales


def test_the_world_kind_loads_world_fp8_and_plans_its_smaller_weights():
    plans = {}
    for fp8 in (False, True):
        raw = {"world": {"enabled": True, "model": "world-test", "max_batch": 2, "fp8": fp8}}
        service = build_world_service(
            ServerContext(config_from_mapping(raw), CollectorRegistry(), ConnectionRegistry())
        )
        service.load(lambda *a: None)
        assert any(isinstance(m, Fp8Linear) for m in service.model.dit.modules()) is fp8
        plans[fp8] = service.plan.scratch_bytes
    model = "world-test"
    saved = weight_bytes(CONFIGS[model], torch.float32) - weight_bytes(
        CONFIGS[model], torch.float32, fp8=True
    )
    assert plans[False] - plans[True] == saved > 0


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9), reason="needs CUDA sm89+"
)
def test_cuda_bf16_fp8_steps_stay_close():
    ref, fp8 = (
        WorldModel.build(TEST, slots=1, device="cuda", dtype=torch.bfloat16, fp8=f) for f in (False, True)
    )
    for model in (ref, fp8):
        model.open("s", seed=1)
    for b in range(BLOCKS):
        ticks = [WorldTick("s", b, "stone maze", action(b))]
        x_ref, x_fp8 = ref.generate(ticks), fp8.generate(ticks)
        assert _rel(x_fp8.float(), x_ref.float()) < 0.03, b  # bf16 adds its own ~0.4 %
