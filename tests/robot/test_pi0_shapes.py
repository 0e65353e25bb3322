"""pi0 and pi0.5 at their real shapes, and the CUDA-graph replay of the policy forward."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from models.cuda_graphs import buckets
from models.policy.checkpoint import model_config
from models.policy.checkpoint_writer import openpi_state_dict
from models.policy.pi0 import PI0, PI0_TINY, PI05, Pi0
from models.policy.pi0_policy import Pi0Policy, prompt_widths
from realtime.bench import examples


@pytest.mark.parametrize("config", [PI0, PI05], ids=["pi0", "pi0.5"])
def test_real_sizes_have_pi0s_parameter_counts(config):
    """So400m (~0.4B) + Gemma-2B (~2B + a 0.53B embedding) + Gemma-300M (~0.3B): openpi's 3.3B."""
    with torch.device("meta"):
        model = Pi0(config)
    vision = sum(p.numel() for p in model.vision.parameters())
    prefix = sum(p.numel() for p in model.prefix_layers.parameters())
    expert = sum(p.numel() for p in model.expert_layers.parameters())
    assert 0.38e9 < vision < 0.45e9
    assert 1.9e9 < prefix < 2.1e9
    assert 0.25e9 < expert < 0.35e9 + (0.12e9 if config.pi05 else 0)  # adaRMS: 2 x 1024 x 3072 a layer
    assert model.token_embedding.weight.shape == (257152, 2048)
    assert config.n_patches == 256  # 3 cameras x 256 + 48 (pi0) or 200 (pi0.5) prompt tokens


SMALL_VISION = replace(PI0_TINY, patch_size=16, vision_width=72, vision_heads=1, vision_depth=2)


@pytest.mark.parametrize("pi05", [False, True], ids=["pi0", "pi0.5"])
def test_batch_rows_are_independent(pi05):
    policy = Pi0Policy(replace(SMALL_VISION, pi05=pi05), preset="libero")
    observations = [examples.libero(seed=s) for s in range(3)]
    observations[2]["prompt"] = "stack the blocks " * 8  # the batch's prompts at their widest
    together = policy.infer([policy.prepare(o) for o in observations], [None] * 3)
    alone = [policy.infer([policy.prepare(o)], [None])[0] for o in observations]
    for a, b in zip(together, alone, strict=True):
        assert a.shape == (50, 7) and np.isfinite(a).all()
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    assert not np.allclose(together[0], together[1])


def test_a_batch_carries_the_narrowest_prompt_width_that_holds_its_longest_prompt():
    assert prompt_widths(48) == (16, 32, 48)  # pi0
    assert prompt_widths(200) == (16, 32, 64, 128, 200)  # pi0.5
    assert prompt_widths(16) == (16,)
    policy = Pi0Policy(SMALL_VISION, preset="libero")
    short, long = (policy.prepare(examples.libero(prompt=p)) for p in ("go", "stack the blocks " * 8))
    assert policy.collate([short]).tokens.shape[1] == 16
    assert policy.collate([short, long]).tokens.shape[1] == SMALL_VISION.prompt_len


def test_the_attention_kernel_on_the_cpu_is_sdpa_and_a_named_flash_kernel_fails_the_load():
    assert Pi0Policy(SMALL_VISION, preset="libero").model.attention_kernel() == "sdpa"
    with pytest.raises(ValueError, match="attention kernel flash2 needs"):
        Pi0Policy(SMALL_VISION, preset="libero", attention="flash2")


def test_flash3_is_no_robot_attention_kernel():
    """FlashAttention-3 was withdrawn from pi0 (it failed its GPU equivalence test against the
    masked kernel, docs/models.md): naming it fails the load, listing the kernels there are."""
    with pytest.raises(ValueError, match=r"must be one of \('auto', 'flash2', 'sdpa'\), not 'flash3'"):
        Pi0Policy(SMALL_VISION, preset="libero", attention="flash3")


def test_buckets_are_powers_of_two_up_to_max_batch():
    assert buckets(1) == (1,)
    assert buckets(8) == (1, 2, 4, 8)
    assert buckets(6) == (1, 2, 4, 6)
    assert buckets(32) == (1, 2, 4, 8, 16, 32)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("pi05", [False, True], ids=["pi0", "pi0.5"])
def test_cuda_graph_replay_equals_the_eager_forward(pi05):
    config = replace(PI0_TINY, pi05=pi05)
    graphed = Pi0Policy(config, preset="libero", device="cuda")
    eager = Pi0Policy(config, preset="libero", device="cuda", cuda_graphs=False)
    graphed.warmup(8)
    assert graphed.graphs is not None
    observations = [examples.libero(seed=s) for s in range(3)]  # padded to the bucket of 4
    got = graphed.infer([graphed.prepare(o) for o in observations], [None] * 3)
    want = eager.infer([eager.prepare(o) for o in observations], [None] * 3)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("pi05", [False, True], ids=["pi0", "pi0.5"])
def test_compiled_layers_under_cuda_graphs_equal_the_eager_forward(pi05):
    """``robot.compile``: the compiled layers replayed from CUDA graphs give the eager chunks,
    at a padded bucket and at batch 1, and an RTC-guided batch runs (eagerly) as before."""
    config = replace(PI0_TINY, pi05=pi05)
    compiled = Pi0Policy(config, preset="libero", device="cuda", compile=True)
    eager = Pi0Policy(config, preset="libero", device="cuda", cuda_graphs=False)
    compiled.warmup(8)
    for seeds in (range(3), range(1)):
        observations = [examples.libero(seed=s) for s in seeds]
        got = compiled.infer([compiled.prepare(o) for o in observations], [None] * len(observations))
        want = eager.infer([eager.prepare(o) for o in observations], [None] * len(observations))
        for a, b in zip(got, want, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
    state = compiled.new_state()
    state.commit(got[0], 0.05, now=0.0)
    prepared = compiled.prepare({**examples.libero(seed=0), "rtc": {"executed_steps": 5}})
    guided = compiled.infer([prepared], [state.snapshot(prepared, now=0.1)])[0]
    assert guided.shape == got[0].shape and np.isfinite(guided).all()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("pi05", [False, True], ids=["pi0", "pi0.5"])
def test_flash_attention_over_packed_keys_equals_the_masked_kernel(pi05):
    """In bf16 on a GPU the layers take FlashAttention-2's variable-length kernel over each row's
    run of keys (no mask), which gives the masked SDPA kernel's chunks, eagerly and compiled
    under CUDA graphs, for rows with a camera missing and prompts of every length."""
    config = replace(PI0_TINY, pi05=pi05, dtype="bfloat16")
    try:
        compiled = Pi0Policy(config, preset="libero", device="cuda", compile=True, attention="flash2")
    except ValueError as exc:  # flash2 on a GPU older than sm80
        pytest.skip(str(exc))
    eager = Pi0Policy(config, preset="libero", device="cuda", cuda_graphs=False, attention="flash2")
    masked = Pi0Policy(config, preset="libero", device="cuda", cuda_graphs=False, attention="sdpa")
    assert eager.model.attention_kernel() == "flash2" and masked.model.attention_kernel() == "sdpa"
    compiled.warmup(8)
    observations = [examples.libero(seed=s) for s in range(3)]
    observations[1] = {**observations[1], "prompt": "pick " * 40}  # cut at the prompt length
    observations[2] = {**observations[2], "prompt": ""}
    want = masked.infer([masked.prepare(o) for o in observations], [None] * 3)
    for policy in (compiled, eager):
        got = policy.infer([policy.prepare(o) for o in observations], [None] * 3)
        for a, b in zip(got, want, strict=True):
            assert np.abs(a - b).max() <= 2e-2 * np.abs(b).max()
    state = compiled.new_state()  # an RTC-guided batch (autograd: the masked kernel) still runs
    state.commit(want[0], 0.05, now=0.0)
    prepared = compiled.prepare({**examples.libero(seed=0), "rtc": {"executed_steps": 5}})
    guided = compiled.infer([prepared], [state.snapshot(prepared, now=0.1)])[0]
    assert guided.shape == want[0].shape and np.isfinite(guided).all()


@pytest.mark.parametrize("config", [PI0, PI05], ids=["pi0", "pi0.5"])
def test_a_real_size_checkpoint_layout_spells_back_the_real_config(config):
    """openpi's parameter names and shapes at the real sizes (on the meta device: no memory)
    are what ``inspect`` reads back as pi0 / pi0.5 (heads, widths, depths, vocabulary)."""
    with torch.device("meta"):
        tensors = openpi_state_dict(Pi0(config))
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    assert shapes["paligemma_with_expert.gemma_expert.lm_head.weight"] == (257152, 1024)
    read = model_config(shapes, config.pi05, Path("model.safetensors"))
    assert read == config
