"""``robot.fp8``: pi0's layer matmuls in FP8 (``Pi0Tiny.to_fp8``), on pi0-tiny (float32, CPU).

Bound: a chunk within 6 % (relative, Frobenius) of the same policy without FP8 (measured ~2 %
over 10 flow steps through 2 prefix and 2 expert layers).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from torch import nn

from models.fp8 import Fp8Linear
from models.policy.pi0_tiny import Pi0TinyConfig, Pi0TinyPolicy
from realtime.bench.examples import libero
from realtime.config import RobotConfig
from realtime.kinds.robot import build_policy


@pytest.fixture(scope="module")
def policies() -> tuple[Pi0TinyPolicy, Pi0TinyPolicy]:
    return Pi0TinyPolicy(), Pi0TinyPolicy(fp8=True)


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def test_only_the_layers_projections_and_mlps_are_fp8(policies):
    model = policies[1].model
    fp8 = [name for name, m in model.named_modules() if isinstance(m, Fp8Linear)]
    assert len(fp8) == 4 * 2 * model.config.depth  # qkv, proj, MLP in / out; prefix and expert
    assert all(name.split(".")[0] in ("prefix_layers", "expert_layers") for name in fp8)
    assert all(type(m) is nn.Linear for m in (model.state_in, model.action_in, model.action_out))


def test_fp8_chunks_have_the_shape_and_stay_close_to_full_precision(policies):
    ref, fp8 = policies
    items = [libero(seed) for seed in range(3)]
    want = ref.infer([ref.prepare(o) for o in items], [None] * 3)
    got = fp8.infer([fp8.prepare(o) for o in items], [None] * 3)
    for g, w in zip(got, want, strict=True):
        assert g.shape == (50, 32) and g.dtype == np.float32 and np.isfinite(g).all()
        assert 0 < _rel(g, w) < 0.06


def test_rtc_guided_chunks_run_with_fp8(policies):
    """Guidance differentiates through the expert (the FP8 layers' autograd path)."""
    policy = policies[1]
    state = policy.new_state()
    (prev,) = policy.infer([policy.prepare(libero(0))], [None])
    state.commit(prev, latency_s=0.05, now=100.0)
    item = policy.prepare(libero(5, rtc={"executed_steps": 10, "inference_delay": 4}))
    (guided,) = policy.infer([item], [state.snapshot(item, now=100.2)])
    np.testing.assert_array_equal(guided[:4], prev[10:14])
    assert np.isfinite(guided).all()


def test_the_robot_kind_passes_robot_fp8_to_the_build():
    built = build_policy(RobotConfig(policy="pi0-tiny", device="cpu", fp8=True))
    assert any(isinstance(m, Fp8Linear) for m in built.model.modules())
    plain = build_policy(RobotConfig(policy="pi0-tiny", device="cpu"))
    assert not any(isinstance(m, Fp8Linear) for m in plain.model.modules())


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9), reason="needs CUDA sm89+"
)
def test_cuda_graphs_replay_the_fp8_policy():
    """The warm-up captures the whole FP8 forward (bf16, as pi0-shaped runs) as CUDA graphs;
    replays match the same policy's eager FP8 forward, and that stays near the bf16 policy
    without FP8 on the same device (one dtype, one device: only FP8's error between them)."""
    config = replace(Pi0TinyConfig(), dtype="bfloat16")
    graphed = Pi0TinyPolicy(config, device="cuda", fp8=True)
    eager = Pi0TinyPolicy(config, device="cuda", fp8=True, cuda_graphs=False)
    plain = Pi0TinyPolicy(config, device="cuda", cuda_graphs=False)
    graphed.warmup(2)
    assert graphed.graphs is not None
    items = [libero(seed) for seed in range(2)]
    got, want, bf16 = (p.infer([p.prepare(o) for o in items], [None] * 2) for p in (graphed, eager, plain))
    for g, w, b in zip(got, want, bf16, strict=True):
        assert _rel(g, w) < 0.02
        assert _rel(w, b) < 0.1
