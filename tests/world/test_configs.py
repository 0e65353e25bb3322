"""Configs: Wan-2.1-1.3B geometry, safetensors round trip of the architecture."""

from __future__ import annotations

import dataclasses

import torch

from models.world.configs import TEST, WAN_1_3B, read_config, save_model_weights
from models.world.kv_cache import KVGeometry
from models.world.model import WorldModel, WorldTick
from tests.world.helpers import model_tensors, tick


def test_wan_shapes_and_kv_geometry():
    assert WAN_1_3B.tokens_per_frame == 1560 and WAN_1_3B.head_dim == 128
    g = KVGeometry.of(WAN_1_3B, torch.bfloat16)
    # K and V, 30 layers, 1560 tokens, 12 heads x 128, bf16: 2 * 30 * 1560 * 1536 * 2 bytes per frame
    assert g.bytes_per_frame == 2 * 30 * 1560 * 1536 * 2
    assert g.bytes_per_session == 15 * g.bytes_per_frame + 2 * 30 * 512 * 1536 * 2
    assert (
        g.capacity(budget_bytes=80 * 2**30, max_batch=4)
        == (80 * 2**30 - g.scratch_bytes(4)) // g.bytes_per_session
    )


def test_safetensors_round_trip_gives_identical_outputs(tmp_path):
    a = WorldModel.build(TEST, slots=1, seed=1)
    tensors = model_tensors(a)
    path = tmp_path / "w.safetensors"
    save_model_weights(path, TEST, tensors)
    assert read_config(path) == TEST
    b = WorldModel.from_weights(path, slots=1, seed=99)  # the seed of random init must not matter
    for m in (a, b):
        m.open("s", seed=0)
    fa = a.step([tick(a, "s", 0)])[0]
    fb = b.step([tick(b, "s", 0)])[0]
    assert torch.equal(fa, fb)


def test_float16_weights_load_into_float32_modules_as_the_rounded_parameters(tmp_path):
    a = WorldModel.build(TEST, slots=1, seed=1)
    tensors = model_tensors(a)
    half, full = tmp_path / "half.safetensors", tmp_path / "full.safetensors"
    save_model_weights(half, TEST, tensors, torch.float16)
    save_model_weights(full, TEST, {k: v.half().float() for k, v in tensors.items()})
    assert half.stat().st_size < 0.6 * full.stat().st_size
    b, c = (WorldModel.from_weights(p, slots=1) for p in (half, full))
    assert next(b.dit.parameters()).dtype == torch.float32
    for m in (b, c):
        m.open("s", seed=0)
    assert torch.equal(b.step([tick(b, "s", 0)])[0], c.step([tick(c, "s", 0)])[0])


def test_wan_1_3b_shapes_compose_at_full_size_on_the_meta_device():
    """Full-size shapes through pool, sampler (denoise + clean pass, a second block with the
    resident KV) and decoder. Meta tensors carry no data, so this checks shapes only (GPU
    figures: ``realtime bench world``); 2 of the 30 identical layers keep it fast."""
    model = WorldModel.build(
        dataclasses.replace(WAN_1_3B, depth=2), slots=2, device="meta", dtype=torch.bfloat16
    )
    model.open("a", seed=0, slot=0)
    model.open("b", seed=1, slot=1)
    for block in range(2):
        x0 = model.generate([WorldTick(s, block, "a prompt", torch.zeros(6)) for s in ("a", "b")])
        assert x0.shape == (2, 3, 16, 60, 104)
    frames, _ = model.decoder(x0, model.decoder.init_state(2))
    assert frames.shape == (2, 9, 3, 480, 832)  # first chunk of 3 latents: 1 + 4 * 2 frames
