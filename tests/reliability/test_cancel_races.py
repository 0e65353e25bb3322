"""Cancels that land at the wrong moment cannot leak a connection or hold the shutdown drain.

Regression for issue 26 defect 6. Fuzzing the world route left connection handlers running with
no client (``/v1/status`` and the websocket gauge stayed above zero), and at SIGTERM the drain
timed out on them with ERROR tracebacks at ``sessions/runner.py``'s ``_mailbox.get``. The race
(found with ``realtime.bench.hostile`` on the world route, 4 leaks in 90 s): a client sends
``session.close`` and goes away; the runner is inside the session's release when the connection
cancels it; on Python 3.11 ``asyncio.wait_for`` swallows a cancel that lands as its awaitable
completes, so the runner carried on, waited for its next item on an empty mailbox, and the
connection waited for the runner forever.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import types

import pytest
from starlette.routing import WebSocketRoute
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from realtime import kinds as kinds_registry
from realtime.config import config_from_mapping
from realtime.ws import serve_websocket
from sessions.runner import SessionRunner
from tests.serving import serve_in_process
from tests.sessions.runtime.fakes import RecordingLifecycle, make_manager

pytestmark = pytest.mark.timeout(60)


async def test_a_close_cancelled_as_its_release_completes_is_still_cancelled():
    lifecycle = RecordingLifecycle()
    lifecycle.hang = asyncio.Event()
    manager = make_manager(lifecycle=lifecycle)
    session = await manager.create()
    closing = asyncio.create_task(manager.close(session.session_id))
    while not lifecycle.releases:
        await asyncio.sleep(0)
    lifecycle.hang.set()  # the release completes ...
    closing.cancel()  # ... in the same loop iteration as the caller's cancel lands
    await asyncio.gather(closing, return_exceptions=True)
    assert closing.cancelled(), "the cancel was swallowed: the caller ran on as if not cancelled"


async def test_a_runner_whose_handler_swallowed_the_cancel_still_ends():
    async def handle(item: object) -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            pass  # what 3.11's wait_for does when its awaitable completes as the cancel lands

    runner: SessionRunner[object] = SessionRunner(handle, mailbox_size=4)
    runner.start()
    await runner.put("item")
    await asyncio.sleep(0.01)  # the handler is running
    await asyncio.wait_for(runner.cancel(), 5)


class _StuckKind:
    """A kind whose websocket handler waits on something that never ends, whatever the socket
    does (as the leaked world handlers waited on their runner)."""

    name = "robot"

    def __init__(self, ctx) -> None:
        self.ctx = ctx
        self.entered = asyncio.Event()

    def routes(self):
        return [WebSocketRoute("/stuck", self._endpoint)]

    async def _endpoint(self, websocket):
        async def handler():
            self.entered.set()
            await asyncio.Event().wait()  # the drain's close of the socket does not reach it

        await serve_websocket(websocket, self.ctx, self.name, handler)

    def models(self):
        return []

    def load(self, progress):
        return None

    async def start(self):
        return None

    async def stop(self):
        return None


async def test_the_drain_bound_holds_with_a_stuck_handler_and_logs_no_error(monkeypatch, caplog):
    kind: list[_StuckKind] = []
    module = types.ModuleType("stuck_kind")
    module.build = lambda ctx: kind.append(_StuckKind(ctx)) or kind[-1]
    monkeypatch.setitem(sys.modules, "stuck_kind", module)
    monkeypatch.setitem(kinds_registry.KIND_FACTORIES, "robot", "stuck_kind:build")
    bound = 2.0
    config = config_from_mapping({"server": {"shutdown_timeout_s": bound}, "world": {"enabled": False}})
    with caplog.at_level(logging.INFO):
        async with serve_in_process(config) as (base, server):
            async with connect(base.replace("http://", "ws://") + "/stuck", open_timeout=10) as ws:
                await asyncio.wait_for(kind[0].entered.wait(), 10)
                loop = asyncio.get_running_loop()
                started = loop.time()
                result = await server.rt_app.state.rt.drain()
                elapsed = loop.time() - started
                with pytest.raises(ConnectionClosed):
                    await asyncio.wait_for(ws.recv(), 5)
            assert elapsed <= bound + 0.2, f"drain took {elapsed:.2f} s for a {bound} s bound"
            assert result.aborted == 1
            assert len(server.rt_app.state.rt.context.connections) == 0, "the stuck handler ended"
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]
