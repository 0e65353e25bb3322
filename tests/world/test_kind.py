"""The world kind's load: capacity from the memory budget, typed startup failure."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from realtime.config import config_from_mapping
from realtime.connections import ConnectionRegistry
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
    per_session = probe.declaration.per_session_bytes
    scratch = probe.declaration.scratch_bytes
    service = _service(scratch + 3 * per_session + per_session // 2)
    service.load(lambda *a: None)
    assert service.model.pool.slots == 3 == service.declaration.max_sessions
    assert service.model.pool.resident_bytes == 3 * service.model.pool.geometry.bytes_per_session


def test_budget_below_one_session_fails_startup_naming_bytes():
    with pytest.raises(CapacityError, match="required"):
        _service(1000).load(lambda *a: None)
