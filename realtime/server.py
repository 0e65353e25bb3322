"""Uvicorn runner: bounded graceful drain, a total connection limit, per-route websocket limits.

Shutdown (SIGTERM/SIGINT): uvicorn stops accepting connections; before it tears connections down
(uvicorn itself would close websockets with 1012), :class:`GracefulServer` closes every session's
websocket with 1001 and a reason, concurrently, and waits for their handlers; sockets still busy
or unflushed when ``server.shutdown_timeout_s`` (the drain timeout) has passed are aborted
(``ConnectionRegistry.close_all``). What is left of the bound goes to uvicorn's own shutdown of
plain HTTP connections; then the kinds stop. The process exits 0 (uvicorn's default re-raises
the signal) whatever clients do: a client that never reads cannot hold the drain.

Connections: beyond ``server.max_connections`` open TCP connections (HTTP and websocket, as
uvicorn counts them) the app's guard answers every request but the probes with HTTP 503 and
``connection: close`` (websocket handshakes too, before any upgrade), so refused connections
never stay open. At that limit plus :data:`PROBE_RESERVE`, a new connection first makes room by
closing the oldest *idle* HTTP connection (no request in progress: one that never sent a
request, or a keep-alive one between requests); only when every connection is busy does the
HTTP protocol write a bare 503 and close at once, before reading anything. So no flood of idle
or refused connections can keep the probes from being answered, and none reaches the process's
fd limit (the configured limit is lowered, with a warning, to fit ``RLIMIT_NOFILE`` minus
:data:`FD_HEADROOM`). A connection must also finish its first request's headers within
:data:`FIRST_REQUEST_TIMEOUT_S`.

Websocket messages: :class:`RealtimeWebSocketProtocol` sets each connection's largest inbound
message from the handshake's route (``AppState.websocket_limit``: the kind's protocol limit,
``/v1/realtime?mode=duplex`` the duplex one), in the parser itself, the moment the request is
parsed and before the first frame header is read (:class:`RouteLimitedServerProtocol`), so
``websockets`` refuses an oversized frame from its header, before its payload is read or
assembled, and closes with 1009. It also stops reading from a peer while its outbound buffer is
over the high-water mark (a peer that does not read cannot make the server queue pongs without
bound), and exposes abort to the drain (``realtime.connections.TransportControl``). A text
message that is not valid UTF-8 closes the connection with 1007 and one INFO line a minute for
all such clients (``realtime.logs.log_limited``), never a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
from collections.abc import Callable, Generator, Iterator
from typing import Any, ClassVar
from urllib.parse import unquote

import uvicorn
from starlette.applications import Starlette
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.protocols.utils import ClientDisconnected
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.http11 import Request as WsRequest
from websockets.protocol import Protocol
from websockets.server import ServerProtocol

from realtime.app import create_app
from realtime.config import DeployConfig
from realtime.connections import TRANSPORT_EXTENSION, TransportControl
from realtime.logs import log_limited
from sessions.threads import default_workers, prestarted_pool

log = logging.getLogger("realtime.server")

PROBE_RESERVE = 16  # connections kept above server.max_connections for /healthz and /readyz
FD_HEADROOM = 256  # fds left for model files, worker pipes, logs when capping max_connections
INVALID_DATA = 1007  # RFC 6455: a text message that is not UTF-8
FIRST_REQUEST_TIMEOUT_S = 10.0  # a new connection must send its first request's headers by then
MIN_HTTP_SHUTDOWN_S = 0.5  # uvicorn's own shutdown gets at least this after the websocket drain
_SERVICE_UNAVAILABLE = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"content-length: 34\r\nconnection: close\r\n\r\nserver is at its connection limit\n"
)


class LimitedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a hard connection cap that evicts idle connections
    first, and a first-request deadline (module docstring)."""

    hard_limit: ClassVar[int]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._refused = False
        self._first_request_timer: asyncio.TimerHandle | None = None
        self.opened_at = 0.0

    def idle(self) -> bool:
        """No request in progress or queued (uvicorn's own shutdown test), and still open."""
        return (
            not self._refused
            and (self.cycle is None or self.cycle.response_complete)
            and not self.pipeline
            and not self.transport.is_closing()
        )

    def _make_room(self) -> bool:
        """Close the oldest idle HTTP connection; False if every connection is busy."""
        idle = [c for c in self.connections if isinstance(c, LimitedHttpProtocol) and c.idle()]
        if not idle:
            return False
        min(idle, key=lambda c: c.opened_at).transport.close()
        return True

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if len(self.connections) >= self.hard_limit and not self._make_room():
            self._refused = True
            self.transport = transport
            transport.write(_SERVICE_UNAVAILABLE)
            transport.close()
            return
        super().connection_made(transport)
        self.opened_at = self.loop.time()
        self._first_request_timer = self.loop.call_later(FIRST_REQUEST_TIMEOUT_S, self._first_request_late)

    def _first_request_late(self) -> None:
        self._first_request_timer = None
        if not self.transport.is_closing():
            self.transport.close()

    def _cancel_first_request_timer(self) -> None:
        if self._first_request_timer is not None:
            self._first_request_timer.cancel()
            self._first_request_timer = None

    def on_headers_complete(self) -> None:
        self._cancel_first_request_timer()
        super().on_headers_complete()

    def data_received(self, data: bytes) -> None:
        if not self._refused:
            super().data_received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_first_request_timer()
        if not self._refused:
            super().connection_lost(exc)


MessageLimit = Callable[[str, bytes], int]  # (percent-decoded path, query string) -> bytes


class _LimitFromRequest(Protocol):
    """Sits between ``ServerProtocol`` and ``Protocol`` in :class:`RouteLimitedServerProtocol`'s
    MRO. ``ServerProtocol.parse`` parses the handshake request, queues it as an event, then hands
    frame parsing to ``super().parse()``: this method, which sets ``max_message_size`` from the
    request before the first frame header is read, whoever handles the event and whenever."""

    message_limit: MessageLimit

    def parse(self) -> Generator[None]:
        request = next(event for event in reversed(self.events) if isinstance(event, WsRequest))
        path, _, query = request.path.partition("?")
        self.max_message_size = self.message_limit(unquote(path), query.encode("ascii", "replace"))
        yield from super().parse()


class RouteLimitedServerProtocol(ServerProtocol, _LimitFromRequest):
    """``websockets``' server protocol whose message limit is the handshake route's."""

    def __init__(self, message_limit: MessageLimit, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not hasattr(self, "max_message_size"):  # websockets < 16 reads max_size: never silently
            raise RuntimeError("per-route websocket message limits need websockets >= 16")
        self.message_limit = message_limit


class RealtimeWebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's websockets-sansio protocol with per-route message limits (module docstring)."""

    message_limit: ClassVar[MessageLimit]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.conn = RouteLimitedServerProtocol(  # the same arguments as uvicorn's, plus the limit
            self.message_limit,
            extensions=self.conn.available_extensions,
            max_size=self.config.ws_max_size,
            logger=self.conn.logger,
        )

    def handle_parser_exception(self) -> None:
        if self.conn.close_sent is None:
            # The parser failed before the handshake completed (a frame sent before the 101, which
            # RFC 6455 forbids, over the route's limit): no close frame can be sent yet, so the
            # connection just ends (uvicorn's own handler assumes a close frame was queued).
            self.queue.put_nowait({"type": "websocket.disconnect", "code": 1006})
            self.close_sent = True
            self.transport.close()
            return
        super().handle_parser_exception()

    def send_receive_event_to_app(self) -> None:
        """uvicorn's, but a text message that is not UTF-8 is a protocol error of the client:
        close 1007 and one rate-limited INFO line (uvicorn logs an ERROR with a traceback for each,
        and a second bad frame in the same segment raised on a closing connection)."""
        data = self.frames[0] if len(self.frames) == 1 else b"".join(self.frames)
        self.frames = []
        if self.close_sent:  # past websocket.close (or a refused frame): reads only wait for EOF
            return
        if self.curr_msg_data_type == "text":
            try:
                message: Any = {"type": "websocket.receive", "text": data.decode()}
            except UnicodeDecodeError as exc:
                log_limited(
                    log,
                    logging.INFO,
                    "invalid_utf8",
                    "invalid UTF-8 in a text message: closed 1007",
                    client=f"{self.client[0]}:{self.client[1]}" if self.client else "-",
                    position=exc.start,
                )
                self.conn.fail(INVALID_DATA, "invalid UTF-8 in a text message")
                self.handle_parser_exception()  # writes the close frame, ends the connection
                return
        else:
            message = {"type": "websocket.receive", "bytes": data}
        self.queue.put_nowait(message)
        if not self.read_paused:
            self.read_paused = True
            self.transport.pause_reading()

    async def send(self, message: Any) -> None:
        if message["type"] == "websocket.send" and self.close_sent and self.handshake_complete:
            # The transport ended the connection itself (a refused frame: 1009, 1007, 1002) while
            # the app was busy with an earlier message: its reply meets a closed connection, as
            # if the client had gone (uvicorn raises a RuntimeError, which reads as a bug).
            raise ClientDisconnected()
        await super().send(message)

    def handle_connect(self, event: WsRequest) -> None:
        super().handle_connect(event)
        scope = getattr(self, "scope", None)  # absent when the handshake itself was rejected
        if scope is not None:
            scope["extensions"][TRANSPORT_EXTENSION] = TransportControl(
                abort=self.transport.abort, buffered_bytes=self.transport.get_write_buffer_size
            )

    def pause_writing(self) -> None:
        super().pause_writing()
        self.transport.pause_reading()

    def resume_writing(self) -> None:
        super().resume_writing()
        if not self.read_paused and not self.transport.is_closing():
            self.transport.resume_reading()

    async def receive(self) -> Any:
        message = await super().receive()  # resumes reading once the app drained the queue ...
        if not self.writable.is_set() and not self.transport.is_closing():
            self.transport.pause_reading()  # ... but not while the peer leaves our writes unread
        return message


def connection_limit(configured: int) -> int:
    """``configured``, lowered to fit the process's fd limit (with a warning) when needed."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return configured
    fits = max(1, soft - FD_HEADROOM - PROBE_RESERVE)
    if configured > fits:
        log.warning(
            "server.max_connections lowered to fit the fd limit",
            extra={"configured": configured, "effective": fits, "rlimit_nofile": soft},
        )
        return fits
    return configured


class GracefulServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, app: Starlette) -> None:
        super().__init__(config)
        self.rt_app = app
        self.fatal_error: str | None = None
        state = app.state.rt
        state.on_fatal = self._on_fatal
        state.open_connections = lambda: len(self.server_state.connections)

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
        # asyncio.to_thread's pool, with every worker started: its thread count stays fixed
        asyncio.get_running_loop().set_default_executor(prestarted_pool(default_workers(), "realtime-io"))
        await super().startup(sockets)
        if self.started:
            for server in self.servers:
                for sock in server.sockets:
                    host, port = sock.getsockname()[:2]
                    state = self.rt_app.state.rt
                    scheme = "https" if self.config.is_ssl else "http"
                    state.url = f"{scheme}://{host}:{port}"
                    log.info("listening", extra={"url": state.url})
                    state.announce_ready()

    async def shutdown(self, sockets=None) -> None:
        loop = asyncio.get_running_loop()
        bound = self.rt_app.state.rt.config.server.shutdown_timeout_s
        deadline = loop.time() + bound
        for server in self.servers:
            server.close()
        result = await self.rt_app.state.rt.drain()
        log.info(
            "drained websockets",
            extra={"closed": result.closed, "aborted": result.aborted, "undrained": result.undrained},
        )
        self.config.timeout_graceful_shutdown = max(MIN_HTTP_SHUTDOWN_S, deadline - loop.time())
        await super().shutdown(sockets)


def uvicorn_config(
    app: Starlette, config: DeployConfig, host: str, port: int, *, replica: bool = False
) -> uvicorn.Config:
    """Uvicorn's config for serving ``app`` with this module's protocols and the ``server.*``
    limits (``build_server``). ``replica``: a replica's own server behind the ingress
    (``realtime.scale.direct``): no lifespan (Serve runs the app's) and plain HTTP (the ingress
    terminates TLS)."""
    server_cfg = config.server
    state = app.state.rt
    max_connections = connection_limit(server_cfg.max_connections)
    http = type("HttpProtocol", (LimitedHttpProtocol,), {"hard_limit": max_connections + PROBE_RESERVE})
    ws = type(
        "WebSocketProtocol",
        (RealtimeWebSocketProtocol,),
        {"message_limit": staticmethod(state.websocket_limit)},
    )
    state.max_connections = max_connections
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_config=None,
        http=http,
        ws=ws,
        ws_max_size=server_cfg.max_message_bytes,
        ws_ping_interval=server_cfg.ws_ping_interval_s,
        ws_ping_timeout=server_cfg.ws_ping_timeout_s,
        ws_per_message_deflate=False,
        timeout_graceful_shutdown=server_cfg.shutdown_timeout_s,
        lifespan="off" if replica else "on",
        ssl_certfile=None if replica else server_cfg.ssl_certfile or None,  # TLS: uvicorn's own
        ssl_keyfile=None if replica else server_cfg.ssl_keyfile or None,
    )


def build_server(config: DeployConfig, host: str | None = None, port: int | None = None) -> GracefulServer:
    app = create_app(config)
    server_cfg = config.server
    port = server_cfg.port if port is None else port
    return GracefulServer(uvicorn_config(app, config, host or server_cfg.host, port), app)
