"""Uvicorn runner with a graceful drain.

On SIGTERM/SIGINT uvicorn stops accepting connections; before it tears connections down
(uvicorn itself would close websockets with 1012), :class:`GracefulServer` closes every session's
websocket with 1001 and a reason and waits for their handlers, bounded by
``server.shutdown_timeout_s``. The process then exits 0 (uvicorn's default re-raises the signal).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import uvicorn
from starlette.applications import Starlette

from realtime.app import create_app
from realtime.config import DeployConfig

log = logging.getLogger("realtime.server")


class GracefulServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, app: Starlette) -> None:
        super().__init__(config)
        self.rt_app = app
        self.fatal_error: str | None = None
        app.state.rt.on_fatal = self._on_fatal

    def _on_fatal(self, message: str) -> None:
        self.fatal_error = message
        self.should_exit = True

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # uvicorn re-raises a captured SIGTERM after a graceful shutdown, which would end the
        # process with status -15; a drained shutdown is a success, so the process exits 0.
        with super().capture_signals():
            yield
            self._captured_signals.clear()

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        if self.started:
            for server in self.servers:
                for sock in server.sockets:
                    host, port = sock.getsockname()[:2]
                    state = self.rt_app.state.rt
                    state.url = f"http://{host}:{port}"
                    log.info("listening", extra={"url": state.url})
                    state.announce_ready()

    async def shutdown(self, sockets=None) -> None:
        for server in self.servers:
            server.close()
        undrained = await self.rt_app.state.rt.drain()
        log.info("drained websockets", extra={"undrained": undrained})
        await super().shutdown(sockets)


def build_server(config: DeployConfig, host: str | None = None, port: int | None = None) -> GracefulServer:
    app = create_app(config)
    server_cfg = config.server
    uv_config = uvicorn.Config(
        app,
        host=host or server_cfg.host,
        port=server_cfg.port if port is None else port,
        log_config=None,
        ws="websockets-sansio",
        ws_max_size=server_cfg.max_message_bytes,
        ws_ping_interval=server_cfg.ws_ping_interval_s,
        ws_ping_timeout=server_cfg.ws_ping_timeout_s,
        ws_per_message_deflate=False,
        timeout_graceful_shutdown=server_cfg.shutdown_timeout_s,
        lifespan="on",
    )
    return GracefulServer(uv_config, app)
