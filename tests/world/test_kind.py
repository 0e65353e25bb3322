"""The world kind's load: capacity from the memory budget, typed startup failure."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from models.world.kv_cache import KVPool
from models.world.model import WorldModel
from realtime.config import config_from_mapping
from realtime.connections import ConnectionRegistry
from realtime.kinds import runtime
from realtime.kinds.base import ServerContext
from realtime.kinds.world import build_world_service
from sessions.errors import CapacityError


def _service(available: int, model: str = "world-test"):
    config = config_from_mapping(
        {"runtime": {"memory_available_bytes": available, "memory_budget_fraction": 1.0},
         "world": {"enabled": True, "model": model, "max_batch": 2}}
    )  # fmt: skip
    return build_world_service(ServerContext(config, CollectorRegistry(), ConnectionRegistry()))


def test_pool_is_sized_from_the_memory_budget():
    probe = _service(2**30)
    probe.load(lambda *a: None)
    per_session = probe.plan.per_session_bytes
    scratch = probe.plan.scratch_bytes
    service = _service(scratch + 3 * per_session + per_session // 2)
    service.load(lambda *a: None)
    assert service.model.pool.slots == 3 == service.plan.capacity
    assert service.model.pool.resident_bytes == 3 * service.model.pool.geometry.bytes_per_session


async def test_wan_shaped_world_admits_what_its_pool_holds_with_memory_measured(monkeypatch):
    """Capacity is planned once, from memory measured before the pools exist: a device whose free
    memory shrinks as the KV pool is allocated (as a GPU's does) must not shrink admission."""
    pools: list[KVPool] = []
    measured: list[str] = []
    real_init = KVPool.__init__

    def tracked_init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        pools.append(self)

    def free_memory(device: str = "cpu") -> int:
        measured.append(device)
        return 100 * 2**30 - sum(p.resident_bytes for p in pools)

    monkeypatch.setattr(KVPool, "__init__", tracked_init)
    monkeypatch.setattr(runtime, "available_memory_bytes", free_memory)
    monkeypatch.setattr(WorldModel, "step", lambda self, ticks: [])  # no warm-up forward on meta tensors
    # max_batch 4: the fixed share of 8 batched Wan ticks is ~87 GiB (models/world/memory.py)
    config = config_from_mapping(
        {"runtime": {"memory_budget_fraction": 0.9},
         "world": {"enabled": True, "model": "wan2.1-1.3b-causal", "device": "meta", "dtype": "bfloat16",
                   "max_batch": 4}}
    )  # fmt: skip
    assert config.runtime.memory_available_bytes is None  # measured, as in production
    service = build_world_service(ServerContext(config, CollectorRegistry(), ConnectionRegistry()))
    service.load(lambda *a: None)
    await service.start()
    try:
        slots = service.model.pool.slots
        assert slots > 2 and service.manager.capacity == slots == service.plan.capacity
        assert measured == ["meta"]  # one plan
        per_session = service.pipeline.per_session_bytes
        assert per_session == service.plan.per_session_bytes == service.model.bytes_per_session
    finally:
        await service.stop()


def test_budget_below_one_session_fails_startup_naming_bytes():
    with pytest.raises(CapacityError, match="required"):
        _service(1000).load(lambda *a: None)
