"""Live websocket connections, so that shutdown can close every one of them with 1001.

Route handlers wrap their whole lifetime in ``async with registry.track(websocket, kind)``.
``close_all`` sends close code 1001 with a reason to each tracked socket and waits (bounded) for
their handlers to finish releasing their sessions.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from starlette.websockets import WebSocket

from realtime.ws import CloseCode, close_quietly

log = logging.getLogger(__name__)


@dataclass(eq=False)
class _Tracked:
    websocket: WebSocket
    kind: str
    done: asyncio.Event = field(default_factory=asyncio.Event)


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
        entry = _Tracked(websocket, kind)
        self._live.add(entry)
        try:
            yield
        finally:
            self._live.discard(entry)
            entry.done.set()

    async def close_all(self, reason: str, timeout_s: float) -> int:
        """Close every live websocket with 1001 and wait up to ``timeout_s`` for handlers to end.

        Returns how many handlers had not finished by the deadline (0 on a clean drain).
        """
        self.accepting = False
        entries = list(self._live)
        for entry in entries:
            with contextlib.suppress(Exception):  # a peer vanishing mid-close must not stop the drain
                await close_quietly(entry.websocket, CloseCode.GOING_AWAY, reason)
        if not entries:
            return 0
        waits = [asyncio.create_task(e.done.wait()) for e in entries]
        _, pending = await asyncio.wait(waits, timeout=timeout_s)
        for task in pending:
            task.cancel()
        if pending:
            log.warning("shutdown drain timed out", extra={"undrained": len(pending)})
        return len(pending)
