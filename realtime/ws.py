"""Websocket plumbing shared by every session kind: close codes, the accept path, a quiet close.

Close codes follow architecture invariant 6: 1008 policy or limit, 1011 internal error, 1013 try
again later, 1001 going away on shutdown, 1000 a normal end the client asked for.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from enum import IntEnum
from typing import TYPE_CHECKING

from starlette.websockets import WebSocket, WebSocketState

if TYPE_CHECKING:  # the server context imports the connection registry, which uses CloseCode
    from realtime.kinds.base import ServerContext

MAX_CLOSE_REASON_BYTES = 123  # RFC 6455: a close frame's payload is at most 125 bytes


class CloseCode(IntEnum):
    NORMAL = 1000
    GOING_AWAY = 1001
    INVALID_DATA = 1007
    POLICY_VIOLATION = 1008
    MESSAGE_TOO_BIG = 1009
    INTERNAL_ERROR = 1011
    SERVICE_RESTART = 1012
    TRY_AGAIN_LATER = 1013


def close_reason(text: str) -> str:
    """``text`` cut to what fits a close frame, never splitting a UTF-8 character."""
    return text.encode()[:MAX_CLOSE_REASON_BYTES].decode(errors="ignore")


async def close_quietly(websocket: WebSocket, code: int, reason: str) -> None:
    """Close if both sides are still open; a client that closed at the same moment is fine."""
    if (
        websocket.application_state == WebSocketState.CONNECTED
        and websocket.client_state == WebSocketState.CONNECTED
    ):
        try:
            await websocket.close(code=code, reason=close_reason(reason))
        except RuntimeError:
            pass


async def serve_websocket(
    websocket: WebSocket,
    ctx: ServerContext,
    kind: str,
    handler: Callable[[], Awaitable[None]],
    *,
    subprotocol: str | None = None,
    headers: Iterable[tuple[bytes, bytes]] | None = None,
) -> None:
    """A kind's endpoint: accept (answering ``subprotocol`` and adding ``headers`` to the 101
    response when given), then run ``handler`` tracked by the connection registry so shutdown
    can close it with 1001. API key and ``Origin`` were already checked, before accept, by the
    app's guard middleware (``realtime.auth.check_request``)."""
    await websocket.accept(subprotocol=subprotocol, headers=headers)
    async with ctx.connections.track(websocket, kind):
        await handler()
