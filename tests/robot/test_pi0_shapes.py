"""pi0 at its real shapes (``PI0_SHAPED``) and the CUDA-graph replay of the policy forward."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from models.cuda_graphs import buckets
from models.policy.pi0_tiny import PI0_SHAPED, Pi0Tiny, Pi0TinyConfig, Pi0TinyPolicy
from realtime.bench import examples


def test_pi0_shaped_has_pi0s_parameter_count():
    """So400m (~0.4B) + Gemma-2B (~2B) + Gemma-300M (~0.3B): openpi reports pi0 at 3.3B."""
    with torch.device("meta"):
        model = Pi0Tiny(PI0_SHAPED)
    vision = sum(p.numel() for p in model.vision_layers.parameters())
    prefix = sum(p.numel() for p in model.prefix_layers.parameters())
    expert = sum(p.numel() for p in model.expert_layers.parameters())
    assert 0.38e9 < vision < 0.45e9
    assert 1.9e9 < prefix < 2.1e9
    assert 0.25e9 < expert < 0.35e9
    assert model.config.n_patches == 256  # 3 cameras x 256 + 48 prompt + 1 state = 817 prefix tokens


SMALL_GEMMA_LIKE = replace(
    Pi0TinyConfig(),
    pool=2,
    patch_size=16,
    n_kv_head=1,
    gated_mlp=True,
    mlp_width=96,
    vision_depth=1,
    vision_width=48,
    vision_heads=2,
    vision_head_dim=24,
    vision_mlp_width=64,
)


def test_vision_tower_and_shared_kv_heads_keep_rows_independent():
    policy = Pi0TinyPolicy(SMALL_GEMMA_LIKE, preset="libero")
    observations = [examples.libero(seed=s) for s in range(3)]
    together = policy.infer([policy.prepare(o) for o in observations], [None] * 3)
    alone = [policy.infer([policy.prepare(o)], [None])[0] for o in observations]
    for a, b in zip(together, alone, strict=True):
        assert a.shape == (50, 7) and np.isfinite(a).all()
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    assert not np.allclose(together[0], together[1])


def test_buckets_are_powers_of_two_up_to_max_batch():
    assert buckets(1) == (1,)
    assert buckets(8) == (1, 2, 4, 8)
    assert buckets(6) == (1, 2, 4, 6)
    assert buckets(32) == (1, 2, 4, 8, 16, 32)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_graph_replay_equals_the_eager_forward():
    graphed = Pi0TinyPolicy(Pi0TinyConfig(), preset="libero", device="cuda")
    eager = Pi0TinyPolicy(Pi0TinyConfig(), preset="libero", device="cuda", cuda_graphs=False)
    graphed.warmup(8)
    assert graphed.graphs is not None
    observations = [examples.libero(seed=s) for s in range(3)]  # padded to the bucket of 4
    got = graphed.infer([graphed.prepare(o) for o in observations], [None] * 3)
    want = eager.infer([eager.prepare(o) for o in observations], [None] * 3)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
