"""A replica's own HTTP server: the websockets the ingress (``realtime.scale.ingress``) relays.

Serve's HTTP proxy reaches a replica through Ray calls, three per websocket round trip; the
ingress instead relays a websocket's bytes to this server. It serves the replica's app itself (the
same app object, on the event loop Serve runs it on: the same sessions, capacity and guard) with
the single server's protocols (``realtime.server.uvicorn_config``: the per-route message limit
from the frame header, the connection limit, keepalive pings), on the replica's node address at a
port the OS picks, in plain HTTP (the ingress terminates TLS). Started by the first
:meth:`DirectServer.address` call; the replica's process owns it until it exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket

import uvicorn
from starlette.applications import Starlette

from realtime.config import DeployConfig
from realtime.server import uvicorn_config

STARTUP_POLL_S = 0.01


class DirectServer:
    """The replica's own server for ``app`` on ``host`` (module docstring)."""

    def __init__(self, app: Starlette, config: DeployConfig, host: str) -> None:
        self._app = app
        self._config = config
        self._host = host
        self._started: asyncio.Task[str] | None = None
        self._server: uvicorn.Server | None = None

    async def address(self) -> str:
        """``host:port`` of the server, started on the first call (on the app's event loop)."""
        if self._started is None or (self._started.done() and self._started.exception() is not None):
            self._started = asyncio.ensure_future(self._start())
        return await asyncio.shield(self._started)

    @property
    def started_address(self) -> str | None:
        """``host:port`` once the server listens, else ``None``."""
        done = self._started is not None and self._started.done() and not self._started.cancelled()
        return self._started.result() if done and self._started.exception() is None else None

    async def _start(self) -> str:
        sock = socket.socket(socket.AF_INET6 if ":" in self._host else socket.AF_INET, socket.SOCK_STREAM)
        sock.bind((self._host, 0))
        server = self._server = uvicorn.Server(
            uvicorn_config(self._app, self._config, self._host, 0, replica=True)
        )
        server.capture_signals = contextlib.nullcontext  # the replica's signals are Ray's
        serving = asyncio.ensure_future(server.serve(sockets=[sock]))
        while not server.started:
            if serving.done():  # it could not start: its error, to the caller
                serving.result()
                raise RuntimeError("the replica's own server exited while starting")
            await asyncio.sleep(STARTUP_POLL_S)
        port = sock.getsockname()[1]
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"{host}:{port}"

    def stop_listening(self) -> None:
        """Accept no new connection (drain); the open ones stay until their sessions end."""
        if self._server is not None:
            for server in self._server.servers:
                server.close()
