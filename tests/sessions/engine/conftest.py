from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
from prometheus_client import CollectorRegistry

from sessions.engine import StageEngine, StreamingStageEngine


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


def _closing(factory, registry):
    @contextlib.asynccontextmanager
    async def make(stage, **kwargs):
        engine = factory(stage, registry=registry, **kwargs)
        try:
            yield engine
        finally:
            await engine.close()

    return make


@pytest.fixture
def make_engine(registry):
    """``async with make_engine(stage, **limits) as engine``: a ``StageEngine`` closed afterwards."""
    return _closing(StageEngine, registry)


@pytest.fixture
def make_streaming(registry):
    """``async with make_streaming(stage, **limits) as engine``: a ``StreamingStageEngine``."""
    return _closing(StreamingStageEngine, registry)


def metric(registry: CollectorRegistry, name: str, **labels) -> float:
    value = registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


async def wait_until(predicate, timeout_s: float = 5.0) -> None:
    """Poll ``predicate`` every 5 ms; fail the test if it is not true within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.005)


async def settled(counter, quiet_s: float = 0.1, timeout_s: float = 5.0) -> int:
    """Wait until ``counter()`` stops changing for ``quiet_s`` (a producer paused); its value."""
    deadline = time.monotonic() + timeout_s
    value = counter()
    while True:
        await asyncio.sleep(quiet_s)
        now = counter()
        if now == value:
            return value
        assert time.monotonic() < deadline, "the counter never settled"
        value = now


def live_tasks(prefix: str) -> list[asyncio.Task]:
    """Unfinished tasks of the running loop whose name starts with ``prefix`` (relays, pumps)."""
    return [t for t in asyncio.all_tasks() if t.get_name().startswith(prefix) and not t.done()]
