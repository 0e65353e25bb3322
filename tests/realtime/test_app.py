"""The server shell over real loopback HTTP: health, readiness, metrics, models, load failures."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest

from realtime import kinds as kinds_registry
from realtime.app import create_app
from realtime.config import config_from_mapping
from realtime.progress import LoadCancelled, LoadProgress
from tests.serving import serve_in_process

NO_KINDS = config_from_mapping({"robot": {"enabled": False}, "world": {"enabled": False}})


async def test_health_ready_metrics_models_over_loopback():
    async with serve_in_process(NO_KINDS) as (base, _server), httpx.AsyncClient(base_url=base) as client:
        health = await client.get("/healthz")
        assert (health.status_code, health.text) == (200, "OK\n")
        assert (await client.get("/readyz")).status_code == 200
        metrics = await client.get("/metrics")
        assert metrics.status_code == 200
        assert metrics.headers["content-type"].startswith("text/plain")
        assert "realtime_ready 1.0" in metrics.text
        models = (await client.get("/v1/models")).json()
        assert models["object"] == "list"
        assert models["session_kinds"] == []


async def test_readyz_is_503_before_models_load():
    app = create_app(NO_KINDS)  # lifespan not run: nothing loaded yet
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        ready = await client.get("/readyz")
        assert ready.status_code == 503
        assert "loading models" in ready.text
        assert (await client.get("/healthz")).status_code == 200


class _SlowThenFailingKind:
    """A session kind whose load fails: the server must report it, not serve half-loaded."""

    name = "robot"

    def routes(self):
        return []

    def models(self):
        return []

    def load(self, progress):
        progress("weights", 0, 1)
        raise RuntimeError("weights file is corrupt")

    async def start(self):
        raise AssertionError("start must not run after a failed load")

    async def stop(self):
        return None


async def test_load_failure_is_fatal_and_visible(monkeypatch):
    import sys
    import types

    module = types.ModuleType("fake_failing_kind")
    module.build = lambda ctx: _SlowThenFailingKind()
    monkeypatch.setitem(sys.modules, "fake_failing_kind", module)
    monkeypatch.setitem(kinds_registry.KIND_FACTORIES, "robot", "fake_failing_kind:build")
    config = config_from_mapping({"robot": {"enabled": True}})
    async with serve_in_process(config, ready=False) as (base, server):
        for _ in range(200):
            if server.fatal_error:
                break
            await asyncio.sleep(0.02)
        assert server.fatal_error == "RuntimeError: weights file is corrupt"
        assert server.should_exit


class _LongLoadKind:
    """A session kind whose load reports a step every 50 ms for 30 s (a GPU compile's shape)."""

    name = "robot"

    def __init__(self) -> None:
        self.loading = threading.Event()
        self.left = threading.Event()
        self.raised: BaseException | None = None

    def routes(self):
        return []

    def models(self):
        return []

    def load(self, progress):
        try:
            for step in range(600):
                progress("compile", step, 600)
                self.loading.set()
                time.sleep(0.05)
        except BaseException as exc:
            self.raised = exc
            raise
        finally:
            self.left.set()

    async def start(self):
        raise AssertionError("a stopped load never starts its kind")

    async def stop(self):
        return None


async def test_stopping_during_a_long_load_ends_the_load_at_its_next_step(monkeypatch):
    """Ctrl-C while a kind loads: the server stops at once, and the load's worker thread (which
    the interpreter would join at exit) leaves at its next progress step, not after 30 s."""
    import sys
    import types

    kind = _LongLoadKind()
    module = types.ModuleType("fake_long_kind")
    module.build = lambda ctx: kind
    monkeypatch.setitem(sys.modules, "fake_long_kind", module)
    monkeypatch.setitem(kinds_registry.KIND_FACTORIES, "robot", "fake_long_kind:build")
    config = config_from_mapping({"robot": {"enabled": True}})
    async with serve_in_process(config, ready=False) as (_base, server):
        assert await asyncio.to_thread(kind.loading.wait, 10)
        t0 = time.monotonic()
    assert await asyncio.to_thread(kind.left.wait, 2)
    assert time.monotonic() - t0 < 2
    assert isinstance(kind.raised, LoadCancelled)
    assert not server.fatal_error  # a stop, not a load failure


def test_a_cancelled_progress_raises_on_its_next_call():
    progress = LoadProgress("world", use_bar=False)
    progress("plan capacity", 0, 3)
    progress.cancel()
    with pytest.raises(LoadCancelled, match="loading world stopped at 'load model'"):
        progress("load model", 1, 3)


@pytest.mark.parametrize("path", ["/nope", "/v1/nothing"])
async def test_unknown_paths_are_404(path):
    async with serve_in_process(NO_KINDS) as (base, _server), httpx.AsyncClient(base_url=base) as client:
        assert (await client.get(path)).status_code == 404
