"""The skeleton's child tasks and last word: a child the connection cancels before its first step
leaves no coroutine never awaited (issue 26 item 10: the warning named ``_VoiceHandler._pump``, a
child the voice kind spawned as a connection opened); once the runtime ends the session, the kind's
goodbye is the last thing the client hears (a voice append refused by the expiring session once
answered after ``session_expired``).

A unit test of one layer: the websocket is a stand-in that never delivers a frame, the manager
a real one over no stage."""

from __future__ import annotations

import asyncio
import gc
import warnings

import pytest
from starlette.websockets import WebSocketState

from realtime.connection import Close, Connection
from sessions.manager import SessionManager

pytestmark = pytest.mark.timeout(30)


class _QuietSocket:
    """Accepted; delivers only the text frames put in ``incoming``; records the close."""

    application_state = client_state = WebSocketState.CONNECTED
    scope: dict = {}

    def __init__(self) -> None:
        self.closed: tuple[int, str] | None = None
        self.incoming: asyncio.Queue[str] = asyncio.Queue()

    async def receive(self) -> dict:
        return {"type": "websocket.receive", "text": await self.incoming.get()}

    async def close(self, code: int, reason: str) -> None:
        self.closed = (code, reason)
        self.application_state = WebSocketState.DISCONNECTED


class _SpawnThenEnd:
    """Spawns slow work while opening, then ends the connection before the child ever runs."""

    inline = False

    def __init__(self) -> None:
        self.outcomes: list[object] = []

    async def opened(self, conn: Connection) -> None:
        conn.spawn(self._work(), lambda result, error: self.outcomes.append((result, error)))
        conn.end("protocol", "bye")

    async def _work(self) -> str:
        await asyncio.sleep(10)
        return "never"

    async def decode(self, message):  # noqa: ANN001, ANN201 (the KindHandler interface)
        return message

    async def handle(self, conn, item) -> None:  # noqa: ANN001
        self.outcomes.append(item)

    async def session_ended(self, conn, reason):  # noqa: ANN001, ANN201
        raise AssertionError("no session here")


class _Executor:
    async def execute(self, snapshot):  # noqa: ANN001, ANN201
        raise AssertionError("no ticks here")

    def stream(self, snapshot):  # noqa: ANN001, ANN201
        raise AssertionError("no ticks here")

    def fence(self, session_id: str, epoch: int) -> None:
        return None


def _connection(ws: _QuietSocket, handler: object, manager: SessionManager) -> Connection:
    return Connection(
        ws,  # type: ignore[arg-type]
        handler,  # type: ignore[arg-type]
        manager,
        kind="test",
        mailbox_items=4,
        max_outbound_items=4,
        max_outbound_bytes=1024,
        start_timeout_s=0,
    )


async def test_a_child_cancelled_before_it_starts_leaves_no_coroutine_never_awaited() -> None:
    ws, handler = _QuietSocket(), _SpawnThenEnd()
    conn = _connection(ws, handler, SessionManager("test", executor=_Executor(), capacity=1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        await conn.run()
        gc.collect()
    never_awaited = [
        w for w in caught if issubclass(w.category, RuntimeWarning) and "never awaited" in str(w.message)
    ]
    assert never_awaited == []
    assert ws.closed is not None and ws.closed[0] == 1008 and handler.outcomes == []


class _SlowGoodbye:
    """Opens a session; records each frame it handles and its goodbye, which takes a while to send."""

    inline = False

    def __init__(self) -> None:
        self.heard: list[str] = []

    async def opened(self, conn: Connection) -> None:
        await conn.create_session()

    async def decode(self, message):  # noqa: ANN001, ANN201 (the KindHandler interface)
        return message

    async def handle(self, conn, item) -> None:  # noqa: ANN001
        self.heard.append(item)

    async def session_ended(self, conn, reason):  # noqa: ANN001, ANN201
        await asyncio.sleep(0.2)  # a send to a client that reads slowly
        self.heard.append(f"goodbye ({reason})")
        return Close(reason)


async def test_nothing_is_handled_after_the_runtime_ended_the_session() -> None:
    ws, handler = _QuietSocket(), _SlowGoodbye()
    manager = SessionManager("test", executor=_Executor(), capacity=1)
    conn = _connection(ws, handler, manager)
    running = asyncio.create_task(conn.run())
    ws.incoming.put_nowait("before")
    while conn.session is None or not handler.heard:
        await asyncio.sleep(0.01)
    await manager.expire(conn.session.session_id, "lifetime")
    ws.incoming.put_nowait("after")  # read while the goodbye is being said
    await asyncio.wait_for(running, 5)
    assert handler.heard == ["before", "goodbye (lifetime)"]
    assert ws.closed == (1008, "maximum session lifetime reached")
