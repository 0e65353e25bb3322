"""Deploy config -> SessionManager mapping (realtime/kinds/runtime.py)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from realtime.config import config_from_mapping
from realtime.connections import ConnectionRegistry
from realtime.kinds.base import ServerContext
from realtime.kinds.runtime import build_session_manager, capacity_plan
from sessions.capacity import MemoryDeclaration
from sessions.errors import CapacityError, SessionLimitError
from sessions.lifecycle import NullLifecycle
from sessions.tick import TickOutput


class Echo:
    async def execute(self, snapshot):
        return TickOutput(snapshot.metadata, None)


DECLARATION = MemoryDeclaration(100, scratch_bytes=50)


def build(runtime: dict, world: dict | None = None):
    config = config_from_mapping({"runtime": runtime, "world": world or {}})
    return build_session_manager(
        "world",
        ctx=ServerContext(config, CollectorRegistry(), ConnectionRegistry()),
        kind_config=config.world,
        plan=capacity_plan(config.runtime, DECLARATION),
        executor=Echo(),
        lifecycle=NullLifecycle(),
    )


async def test_config_limits_reach_the_manager():
    manager = build(
        {
            "memory_available_bytes": 1000,
            "memory_budget_fraction": 0.5,
            "over_capacity": "queue",
            "max_queued_sessions": 3,
            "admission_queue_timeout_s": 0.01,
            "release_timeout_s": 7,
        },
        {"idle_timeout_s": 2, "max_lifetime_s": 60},
    )
    assert manager.capacity == 4  # (500 - 50) // 100
    assert manager.plan.effective_budget_bytes == 500
    assert (manager.admission.max_queued, manager.admission.queue_timeout_s) == (3, 0.01)
    assert (manager.expiry.idle_timeout_s, manager.expiry.interval_s) == (2, 0.5)
    assert manager.expiry.lifetime_warning_s == 30
    for _ in range(4):
        await manager.create()
    with pytest.raises(SessionLimitError) as info:
        await manager.create()
    assert info.value.details["reason"] == "queue_timeout"


def test_a_model_that_cannot_fit_one_session_fails_startup():
    with pytest.raises(CapacityError, match="available=100 bytes, required=150 bytes"):
        build({"memory_available_bytes": 100})
