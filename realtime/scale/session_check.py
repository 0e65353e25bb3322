"""Inside a replica, behind the app's guard: a request naming a session that another replica
allocated is answered ``session_not_found`` at once.

The session router sends a request naming a session to the replica that owns it while that
replica is live, so one arriving here means the owner is gone (it died, or was scaled down): the
session's state went with it. A websocket is accepted and closed 1008 with the reason
``session_not_found: <id> (its replica is gone)``; an HTTP request gets 404 with the same code as
JSON. (Phase 2 of docs/scaling.md resumes such a session here from the checkpoint store instead.)
Requests naming no session, a session of this replica, or text no replica issued pass through.
"""

from __future__ import annotations

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from realtime.scale.affinity import named_session, owner_of
from realtime.ws import CloseCode, close_reason

CODE = "session_not_found"


class SessionCheck:
    def __init__(self, app: ASGIApp, tag: str) -> None:
        self.app = app
        self.tag = tag

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            name = named_session(scope)
            owner = owner_of(name)
            if owner is not None and owner != self.tag:
                await _not_found(scope, receive, send, f"{CODE}: {name} (its replica is gone)")
                return
        await self.app(scope, receive, send)


async def _not_found(scope: Scope, receive: Receive, send: Send, message: str) -> None:
    if scope["type"] == "http":
        body = {"error": {"type": "invalid_request_error", "code": CODE, "message": message}}
        await JSONResponse(body, status_code=404)(scope, receive, send)
        return
    await receive()  # websocket.connect
    await send({"type": "websocket.accept"})
    await send(
        {"type": "websocket.close", "code": CloseCode.POLICY_VIOLATION, "reason": close_reason(message)}
    )
