"""Configs: Wan-2.1-1.3B geometry, safetensors round trip of the architecture."""

from __future__ import annotations

import torch

from models.world.configs import TEST, WAN_1_3B, read_config, save_model_weights
from models.world.kv_cache import KVGeometry
from models.world.model import WorldModel
from tests.world.helpers import tick


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
    tensors = {f"dit.{k}": v for k, v in a.dit.state_dict().items()}
    tensors.update({f"decoder.{k}": v for k, v in a.decoder.state_dict().items()})
    path = tmp_path / "w.safetensors"
    save_model_weights(path, TEST, tensors)
    assert read_config(path) == TEST
    b = WorldModel.from_weights(path, slots=1, seed=99)  # the seed of random init must not matter
    for m in (a, b):
        m.open("s", seed=0)
    fa = a.step([tick(a, "s", 0)])[0]
    fb = b.step([tick(b, "s", 0)])[0]
    assert torch.equal(fa, fb)
