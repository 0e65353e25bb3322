"""The world model's fixed memory share (weights + one batched tick), planned before allocation."""

import pytest
import torch

from models.world.configs import SELF_FORCING, TEST, TINY, WAN_1_3B
from models.world.kv_cache import KVGeometry
from models.world.memory import (
    ALLOCATOR_MARGIN,
    KERNEL_WORKSPACE_BYTES,
    decoder_activation_bytes,
    dit_activation_bytes,
    fixed_bytes,
    weight_bytes,
)
from models.world.model import WorldModel, WorldTick


@pytest.mark.parametrize("cfg", [TEST, TINY])
def test_weight_bytes_match_the_built_model(cfg):
    model = WorldModel.build(cfg, slots=1)
    parts = (model.dit, model.decoder, model.prompts)  # the word-prompt table too
    built = sum(t.numel() * 4 for m in parts for t in (*m.parameters(), *m.buffers()))
    assert weight_bytes(cfg, torch.float32) == built
    assert weight_bytes(cfg, torch.bfloat16) == built // 2


def test_a_checkpoint_config_counts_the_wan_vae_decoder_and_its_state():
    """Self-Forcing's config decodes through the Wan 2.1 VAE: its weights and its per-session
    temporal cache (1.76 GiB in bf16 at 480x832) are what the plan counts."""
    model = WorldModel.build(
        SELF_FORCING,
        slots=1,
        device="meta",
        dtype=torch.bfloat16,
        prompts=lambda p: torch.zeros(len(p), 512, 4096),
    )
    built = sum(t.numel() * 2 for m in (model.dit, model.decoder) for t in (*m.parameters(), *m.buffers()))
    assert weight_bytes(SELF_FORCING, torch.bfloat16) == built
    assert model.decoder_state_bytes == sum(c.numel() * 2 for c in model.decoder.init_state().caches)
    assert model.decoder_state_bytes == 1_888_573_440


def test_fixed_bytes_cover_weights_and_grow_with_the_batch():
    dtype = torch.bfloat16
    one, eight = fixed_bytes(WAN_1_3B, dtype, 1), fixed_bytes(WAN_1_3B, dtype, 8)
    assert one > weight_bytes(WAN_1_3B, dtype) + KVGeometry.of(WAN_1_3B, dtype).scratch_bytes(1)
    assert eight > one
    # at the Wan-1.3B shape the decoder's full-resolution levels dominate the activations: 8 blocks
    # of 12 frames at 480x832 with 64 + 2 x 64 channels at the last level
    assert decoder_activation_bytes(WAN_1_3B, dtype, 8) == 8 * 12 * 480 * 832 * (64 + 3 * 64) * 2
    assert dit_activation_bytes(WAN_1_3B, dtype, 8) > 8 * 3 * 1560 * 2 * 8960 * 2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_batched_tick_stays_inside_its_estimate_on_cuda():
    cfg, batch = TINY, 4
    model = WorldModel.build(cfg, slots=batch, device="cuda")
    ids = [f"s{i}" for i in range(batch)]
    for sid in ids:
        model.open(sid, seed=0)
    action = torch.zeros(cfg.action_dim)
    for block in range(cfg.sink_frames + cfg.window_frames + 2):  # fill the window: the largest gather
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        model.step([WorldTick(sid, block, None, action) for sid in ids])
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
    transient = (
        KVGeometry.of(cfg, torch.float32).scratch_bytes(batch)
        + dit_activation_bytes(cfg, torch.float32, batch)
        + decoder_activation_bytes(cfg, torch.float32, batch)
    )
    print(f"peak {peak} bytes, estimate {transient} (+ workspace {KERNEL_WORKSPACE_BYTES})")
    assert peak <= ALLOCATOR_MARGIN * transient + KERNEL_WORKSPACE_BYTES, (peak, transient)
