"""Live websocket connections, so that shutdown can close every one of them with 1001.

Route handlers wrap their whole lifetime in ``async with registry.track(websocket, kind)``.

``close_all(reason, timeout_s)`` is bounded whatever the clients and the handlers do: it sends
close code 1001 with ``reason`` to every tracked socket **concurrently** (a client that does not
read cannot hold up the others: its close waits on its own write buffer), waits for the handlers
to finish releasing their sessions until :data:`CANCEL_GRACE_S` before ``timeout_s`` is up,
then aborts (RST, buffer dropped) the transport of every socket whose handler is still running
or whose close frame is still unflushed, and cancels the handlers still running (a handler stuck
on something that never ends); that cancel ends the handler quietly at ``track``'s boundary (no
ERROR from the server: the drain asked for it) and gets the rest of the bound to take effect. The server's websocket protocol exposes that abort through the ASGI scope extension
:data:`TRANSPORT_EXTENSION` (a :class:`TransportControl`); without it (in-memory test
transports) nothing can be aborted and such sockets are only counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from starlette.websockets import WebSocket

from realtime.ws import CloseCode, close_quietly

log = logging.getLogger(__name__)

TRANSPORT_EXTENSION = "realtime.transport"
CANCEL_GRACE_S = 0.5  # of the drain bound, kept for handlers cancelled at its end to unwind


@dataclass(frozen=True)
class TransportControl:
    """What the server lets the app do to a websocket's transport beyond the ASGI messages."""

    abort: Callable[[], None]
    buffered_bytes: Callable[[], int]


@dataclass(frozen=True)
class DrainResult:
    """Outcome of :meth:`ConnectionRegistry.close_all`: sockets that ended by themselves, aborted."""

    closed: int = 0
    aborted: int = 0
    undrained: int = 0  # still running at the deadline and not abortable


@dataclass(eq=False)
class _Tracked:
    websocket: WebSocket
    kind: str
    task: asyncio.Task | None
    done: asyncio.Event = field(default_factory=asyncio.Event)
    cancelled: bool = False  # by the drain, at its deadline

    @property
    def transport(self) -> TransportControl | None:
        return self.websocket.scope.get("extensions", {}).get(TRANSPORT_EXTENSION)

    def flushed(self) -> bool:
        transport = self.transport
        return transport is None or transport.buffered_bytes() == 0


class ConnectionRegistry:
    def __init__(self) -> None:
        self._live: set[_Tracked] = set()
        self.accepting = True

    def __len__(self) -> int:
        return len(self._live)

    def count(self, kind: str) -> int:
        return sum(1 for t in self._live if t.kind == kind)

    @contextlib.asynccontextmanager
    async def track(self, websocket: WebSocket, kind: str) -> AsyncIterator[None]:
        entry = _Tracked(websocket, kind, asyncio.current_task())
        self._live.add(entry)
        try:
            yield
        except asyncio.CancelledError:
            if not entry.cancelled or entry.task is None:
                raise
            entry.task.uncancel()  # the drain's own cancel of a stuck handler: ended quietly
        finally:
            self._live.discard(entry)
            entry.done.set()

    async def close_all(self, reason: str, timeout_s: float, code: int = CloseCode.GOING_AWAY) -> DrainResult:
        """Close every live websocket with ``code`` (1001; 1012 when a replica moves its sessions
        away), bounded by ``timeout_s`` in all (module docstring)."""
        self.accepting = False
        entries = list(self._live)
        if not entries:
            return DrainResult()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        closes = [asyncio.create_task(self._close(e, reason, code)) for e in entries]
        waits = [asyncio.create_task(e.done.wait()) for e in entries]
        await asyncio.wait(closes + waits, timeout=max(0.0, timeout_s - CANCEL_GRACE_S))
        for task in closes + waits:
            task.cancel()
        await asyncio.gather(*closes, *waits, return_exceptions=True)
        aborted = undrained = 0
        stuck = []
        for entry in entries:
            if entry.done.is_set() and entry.flushed():
                continue
            if not entry.done.is_set() and entry.task is not None:
                entry.cancelled = True
                entry.task.cancel()
                stuck.append(entry)
            transport = entry.transport
            if transport is None:
                undrained += 1
                continue
            transport.abort()
            aborted += 1
        if stuck:  # the cancelled handlers unwind within what is left of the bound
            unwound = [asyncio.create_task(e.done.wait()) for e in stuck]
            await asyncio.wait(unwound, timeout=max(0.0, deadline - loop.time()))
            for task in unwound:
                task.cancel()
        result = DrainResult(len(entries) - aborted - undrained, aborted, undrained)
        if aborted or undrained:
            log.warning(
                "shutdown drain timed out",
                extra={"timeout_s": timeout_s, "aborted": aborted, "undrained": undrained},
            )
        return result

    @staticmethod
    async def _close(entry: _Tracked, reason: str, code: int) -> None:
        with contextlib.suppress(Exception):  # a peer vanishing mid-close must not stop the drain
            await close_quietly(entry.websocket, code, reason)
