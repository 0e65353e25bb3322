from __future__ import annotations

import contextlib

import pytest
from prometheus_client import CollectorRegistry

from sessions.engine import StageEngine


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def make_engine(registry):
    """``async with make_engine(stage, **limits) as engine``: an engine closed afterwards."""

    @contextlib.asynccontextmanager
    async def make(stage, **kwargs):
        engine = StageEngine(stage, registry=registry, **kwargs)
        try:
            yield engine
        finally:
            await engine.close()

    return make


def metric(registry: CollectorRegistry, name: str, **labels) -> float:
    value = registry.get_sample_value(name, labels)
    return 0.0 if value is None else value
