"""In Serve's HTTP proxy: a websocket whose replica died gets close 1012 ("service restart").

Ray Serve 2.60's proxy, when the replica serving an accepted websocket dies, ends the request
without a close frame (its error path sends nothing once a response started), so the client
sees an abnormal closure (1006) and no reason. :class:`ReplicaLossClose` wraps the proxy's app:
when the proxied app returns (or raises) after accepting a websocket that neither side closed,
it sends close 1012 with the reason :data:`LOST_REASON`. Normal ends pass untouched: the
replica's own closes (1000, 1001 on drain, 1008, 1011, 1013), and a client's disconnect.

Serve loads it through ``RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH=realtime.scale.proxy:middlewares``
in the environment of each node's proxy (``realtime serve --replicas`` sets it for the local Ray
instance it starts; docs/scaling.md says how to set it on a cluster).
"""

from __future__ import annotations

import contextlib

from starlette.middleware import Middleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

LOST_CODE = 1012  # RFC 6455 "service restart"
LOST_REASON = "service restart: the replica serving this session was lost"


class ReplicaLossClose:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "websocket":
            await self.app(scope, receive, send)
            return
        accepted = ended = False

        async def watched_send(message: Message) -> None:
            nonlocal accepted, ended
            if message["type"] == "websocket.accept":
                accepted = True
            elif message["type"] in ("websocket.close", "websocket.http.response.start"):
                ended = True
            await send(message)

        async def watched_receive() -> Message:
            nonlocal ended
            message = await receive()
            if message["type"] == "websocket.disconnect":
                ended = True
            return message

        try:
            await self.app(scope, watched_receive, watched_send)
        finally:
            if accepted and not ended:
                with contextlib.suppress(Exception):  # the client may be gone too
                    await send({"type": "websocket.close", "code": LOST_CODE, "reason": LOST_REASON})


def middlewares() -> list[Middleware]:
    """Serve's proxy callback (``RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH``)."""
    return [Middleware(ReplicaLossClose)]
