"""Inside a replica, behind the app's guard: a request naming a session that another replica
allocated is resumed here from its checkpoint, or answered ``session_not_found`` at once.

The session router sends a request naming a session to the replica that owns it while that
replica is live and not draining, so one arriving here means the owner is gone (it died, was
scaled down, or is draining). The session check asks the cluster's checkpoint store for the
session (bounded by ``replicas.peer_timeout_s``): found, the request goes on to the app with the
checkpoint in its scope (``realtime.scale.resume.restoring``), and the kind restores the session
under its id. Not found, a websocket is accepted and closed 1008 with the reason
``session_not_found: <id> (its replica is gone)``; an HTTP request gets 404 with the same code as
JSON. Requests naming no session, a session of this replica, or text no replica issued pass through.
"""

from __future__ import annotations

import asyncio

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from realtime.scale.affinity import named_session, owner_of
from realtime.scale.resume import CHECKPOINT_SCOPE_KEY, Checkpoint, CheckpointStore
from realtime.ws import CloseCode, close_reason

CODE = "session_not_found"


class SessionCheck:
    def __init__(
        self, app: ASGIApp, tag: str, store: CheckpointStore | None = None, timeout_s: float = 5.0
    ) -> None:
        self.app = app
        self.tag = tag
        self.store = store
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            name = named_session(scope)
            owner = owner_of(name)
            if name is not None and owner is not None and owner != self.tag:
                checkpoint = await self._checkpoint(name) if scope["type"] == "websocket" else None
                if checkpoint is None:
                    await _not_found(scope, receive, send, f"{CODE}: {name} (its replica is gone)")
                    return
                scope = {**scope, CHECKPOINT_SCOPE_KEY: checkpoint}
        await self.app(scope, receive, send)

    async def _checkpoint(self, name: str) -> Checkpoint | None:
        if self.store is None:
            return None
        try:
            return await asyncio.wait_for(self.store.get(name), self.timeout_s)
        except Exception:  # noqa: BLE001 - no answer from the store: as if it held nothing
            return None


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
