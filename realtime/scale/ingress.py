"""The ingress of ``realtime serve --replicas``: a websocket goes straight to its replica.

Through Serve's HTTP proxy every websocket message is a Ray call to the replica and every reply
a streamed Ray object back, three Ray RPCs and about six thread handoffs per round trip: 2-4 ms
added to a robot's round trip (docs/scaling.md, "The proxy's cost"). The ingress listens on the
server's address instead and relays bytes. Per TCP connection it reads the first request's head
(at most :data:`HEAD_LIMIT_BYTES`, within :data:`HEAD_TIMEOUT_S`):

- **a websocket handshake** asks where it goes with one Serve handle call
  (``RealtimeReplica.direct_address``) that the session router (``realtime.scale.router``) places
  exactly as Serve's proxy would have placed the handshake: the session it names (query
  ``session_id`` or the session header), the kind its path opens, free capacity. The chosen
  replica answers with the address of its own HTTP server (``realtime.scale.direct``), and the
  connection is relayed byte for byte to that server for its whole life: no Ray call per message;
- **everything else** (HTTP: probes, the cluster views, per-session HTTP routes, WebRTC calls),
  and a handshake the router could not place on a replica's own server (the call failed or timed
  out after :data:`CHOOSE_TIMEOUT_S`, the address refused the connection or did not take it within
  :data:`CONNECT_TIMEOUT_S`), is relayed to Serve's HTTP proxy, which routes it per request as
  before.

A relayed websocket whose replica went away without a close frame (its process died) gets close
1012 "service restart" (:data:`~realtime.scale.proxy.LOST_REASON`) from the ingress, as from
Serve's proxy, provided the replica's stream ended between two frames (:class:`FrameBoundary`);
mid-frame, the client's connection is closed (1006). The replica's own closes (1000, 1001 on drain,
1012 on ``realtime drain``, 1008, 1011, 1013) pass untouched.

Limits: beyond ``max_connections`` open client connections a new one gets a bare HTTP 503 and is
closed before anything is read; a head over :data:`HEAD_LIMIT_BYTES` gets 431, a malformed one 400,
a slow one is closed at :data:`HEAD_TIMEOUT_S`; each direction buffers at most
:data:`WRITE_HIGH_WATER_BYTES` before the other side's reading pauses. Every other limit is the
replica's (the same app and protocols as the single server). TLS (``server.ssl_certfile``) ends
here; the hops to the replicas and the proxy are plain TCP on the cluster's network.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import threading
from collections.abc import Awaitable, Callable
from typing import Any, cast
from urllib.parse import unquote

import h11

from realtime.logs import log_limited
from realtime.scale.proxy import LOST_CODE, LOST_REASON

log = logging.getLogger("realtime.scale.ingress")

HEAD_LIMIT_BYTES = 16 * 1024
HEAD_TIMEOUT_S = 10.0  # as the single server's first-request deadline
CHOOSE_TIMEOUT_S = 10.0
CONNECT_TIMEOUT_S = 5.0
WRITE_HIGH_WATER_BYTES = 1 << 20

Address = tuple[str, int]
Choose = Callable[[dict[str, Any]], Awaitable[str | None]]


def tls_context(certfile: str, keyfile: str) -> ssl.SSLContext | None:
    """The server-side TLS context of ``server.ssl_certfile`` / ``ssl_keyfile`` (``None``: plain)."""
    if not certfile:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certfile, keyfile)
    return context


def parse_address(text: str) -> Address:
    """``host:port`` or ``[v6]:port`` as a (host, port) pair."""
    host, _, port = text.rpartition(":")
    return host.strip("[]"), int(port)


def handshake_scope(head: bytes) -> dict[str, Any] | None:
    """The scope of a websocket handshake (``type``, ``path``, ``query_string``, ``headers``: what
    the session router reads of Serve's ASGI scope) from a request head ending in a blank line;
    ``None`` for any other request. Raises ``ValueError`` for a head that is not HTTP/1.1."""
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=HEAD_LIMIT_BYTES)
    conn.receive_data(head)
    try:
        event = conn.next_event()
    except h11.RemoteProtocolError as exc:
        raise ValueError(str(exc)) from None
    if not isinstance(event, h11.Request):
        raise ValueError("not a complete request head")
    headers = [(bytes(name), bytes(value)) for name, value in event.headers]
    upgrade = b",".join(value.lower() for name, value in headers if name == b"upgrade")
    if event.method != b"GET" or b"websocket" not in upgrade:
        return None
    path, _, query = bytes(event.target).partition(b"?")
    return {
        "type": "websocket",
        "path": unquote(path.decode("latin-1")),
        "query_string": query,
        "headers": headers,
    }


def close_frame(code: int, reason: str) -> bytes:
    """A server's websocket close frame (unmasked, ``reason`` at most 123 bytes)."""
    payload = code.to_bytes(2, "big") + reason.encode()
    return bytes([0x88, len(payload)]) + payload


def _refusal(status: str, reason: str) -> bytes:
    body = f"{reason}\n".encode()
    head = f"HTTP/1.1 {status}\r\ncontent-type: text/plain\r\ncontent-length: {len(body)}\r\nconnection: close\r\n\r\n"
    return head.encode() + body


class FrameBoundary:
    """Where the server's side of a relayed websocket stands (sans-I/O): :meth:`feed` it every byte
    the server sends toward the client, in order. It reads the handshake's response status, then
    the frames' headers only (their payloads are skipped by length)."""

    def __init__(self) -> None:
        self._head = bytearray()
        self.upgraded = False  # the server answered 101: frames follow
        self.refused = False  # it answered anything else: there is no websocket
        self.closed = False  # it sent a close frame
        self._header = bytearray()
        self._payload_left = 0

    def lost_mid_session(self) -> bool:
        """True when the stream ended inside an open websocket, between two frames: the client is
        owed a close frame."""
        return self.upgraded and not self.closed and not self._header and not self._payload_left

    def feed(self, data: bytes) -> None:
        view = memoryview(data)
        if not self.upgraded:
            if self.refused:
                return
            self._head += view
            end = self._head.find(b"\r\n\r\n")
            if end < 0:
                self.refused = len(self._head) > HEAD_LIMIT_BYTES
                return
            if not self._head.startswith(b"HTTP/1.1 101"):
                self.refused = True
                return
            self.upgraded = True
            view = memoryview(bytes(self._head[end + 4 :]))
            self._head.clear()
        while view:
            if self._payload_left:
                step = min(self._payload_left, len(view))
                self._payload_left -= step
                view = view[step:]
                continue
            take = self._header_size() - len(self._header)
            self._header += view[:take]
            view = view[take:]
            if len(self._header) == self._header_size():  # complete (the size grows with its 2nd byte)
                self._end_header()

    def _header_size(self) -> int:
        if len(self._header) < 2:
            return 2
        second = self._header[1]
        length = second & 0x7F
        return 2 + (2 if length == 126 else 8 if length == 127 else 0) + (4 if second & 0x80 else 0)

    def _end_header(self) -> None:
        header = self._header
        length = header[1] & 0x7F
        if length == 126:
            length = int.from_bytes(header[2:4], "big")
        elif length == 127:
            length = int.from_bytes(header[2:10], "big")
        if header[0] & 0x0F == 0x8:
            self.closed = True
        self._payload_left = length
        self._header.clear()


class _Upstream(asyncio.Protocol):
    """A relayed connection's side toward its server (a replica's own server or Serve's proxy)."""

    def __init__(self, client: _Client, frames: FrameBoundary | None) -> None:
        self.client = client
        self.frames = frames
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER_BYTES)

    def data_received(self, data: bytes) -> None:
        if self.frames is not None:
            self.frames.feed(data)
        self.client.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.client.upstream_lost(self.frames)

    def pause_writing(self) -> None:  # the server does not keep up: stop reading the client
        self.client.pause_reading()

    def resume_writing(self) -> None:
        self.client.resume_reading()


class _Client(asyncio.Protocol):
    """A client's connection: its head read and routed, then relayed (module docstring)."""

    def __init__(self, ingress: Ingress) -> None:
        self.ingress = ingress
        self.transport: asyncio.Transport | None = None
        self.upstream: _Upstream | None = None
        self._buffer = bytearray()
        self._routing: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass
        if len(self.ingress.clients) >= self.ingress.max_connections:
            self._refuse("503 Service Unavailable", "server is at its connection limit")
            return
        self.ingress.clients.add(self)
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER_BYTES)
        self._timer = asyncio.get_running_loop().call_later(HEAD_TIMEOUT_S, self.abort)

    def data_received(self, data: bytes) -> None:
        if self.upstream is not None:
            assert self.upstream.transport is not None
            self.upstream.transport.write(data)
            return
        self._buffer += data
        if self._routing is not None:
            return
        end = self._buffer.find(b"\r\n\r\n")
        if end >= 0:
            self.pause_reading()
            if self._timer is not None:
                self._timer.cancel()
            self._routing = asyncio.get_running_loop().create_task(
                self._route(bytes(self._buffer[: end + 4]))
            )
        elif len(self._buffer) > HEAD_LIMIT_BYTES:
            self._refuse("431 Request Header Fields Too Large", "request head too large")

    async def _route(self, head: bytes) -> None:
        try:
            scope = handshake_scope(head)
        except ValueError:
            self._refuse("400 Bad Request", "malformed request head")
            return
        ingress, frames = self.ingress, FrameBoundary() if scope is not None else None
        upstream = None
        if scope is not None and (address := await ingress.direct(scope)) is not None:
            upstream = await self._connect(address, frames)
        if upstream is None:
            upstream = await self._connect(ingress.proxy, frames)
        if upstream is None:
            self._refuse("502 Bad Gateway", "no replica could be reached")
            return
        assert self.transport is not None and upstream.transport is not None
        if self.transport.is_closing():  # the client left while it was routed
            upstream.transport.close()
            return
        self.upstream = upstream
        upstream.transport.write(bytes(self._buffer))
        self._buffer.clear()
        self.resume_reading()

    async def _connect(self, address: Address, frames: FrameBoundary | None) -> _Upstream | None:
        loop = asyncio.get_running_loop()
        try:
            connecting = loop.create_connection(lambda: _Upstream(self, frames), *address)
            _, upstream = await asyncio.wait_for(connecting, CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError) as exc:  # a replica just lost: the caller tries Serve's proxy
            where = f"{address[0]}:{address[1]}"
            log_limited(
                log,
                logging.WARNING,
                f"ingress-connect-{where}",
                "upstream refused the connection",
                upstream=where,
                error=str(exc),
            )
            return None
        return upstream

    def write(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)

    def pause_reading(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def pause_writing(self) -> None:  # the client does not read: stop reading its server
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.resume_reading()

    def upstream_lost(self, frames: FrameBoundary | None) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        if frames is not None and frames.lost_mid_session():
            self.transport.write(close_frame(LOST_CODE, LOST_REASON))
        self.transport.close()

    def _refuse(self, status: str, reason: str) -> None:
        assert self.transport is not None
        self.transport.write(_refusal(status, reason))
        self.transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.ingress.clients.discard(self)
        if self._timer is not None:
            self._timer.cancel()
        if self._routing is not None:
            self._routing.cancel()
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.close()


class Ingress:
    """The relay of the module docstring: ``choose(scope)`` answers a websocket handshake's
    replica address (``host:port``, or ``None``: Serve's proxy takes it); ``proxy`` is Serve's
    HTTP proxy."""

    def __init__(
        self,
        choose: Choose,
        proxy: Address,
        *,
        max_connections: int,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._choose = choose
        self.proxy = proxy
        self.max_connections = max_connections
        self._ssl = ssl_context
        self.clients: set[_Client] = set()
        self._server: asyncio.Server | None = None

    async def direct(self, scope: dict[str, Any]) -> Address | None:
        """The replica's own server for a handshake, or ``None`` (Serve's proxy takes it)."""
        try:
            address = await asyncio.wait_for(self._choose(scope), CHOOSE_TIMEOUT_S)
            return parse_address(address) if address else None
        except Exception as exc:  # noqa: BLE001 - a replica lost or starting: the proxy routes it
            why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            log_limited(
                log,
                logging.WARNING,
                "ingress-choose",
                "handshake relayed through Serve's proxy",
                path=scope["path"],
                error=why,
            )
            return None

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (0: a free port); returns the port."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Client(self), host, port, ssl=self._ssl, reuse_address=True
        )
        return self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        """Stop listening and drop every relayed connection (after the replicas drained theirs)."""
        if self._server is not None:
            self._server.close()
        for client in list(self.clients):
            client.abort()
        if self._server is not None:
            await self._server.wait_closed()


class IngressThread:
    """An :class:`Ingress` on an event loop of its own thread (uvloop where installed), for the
    ``realtime serve --replicas`` process whose main thread waits for signals."""

    def __init__(self, ingress: Ingress, host: str, port: int) -> None:
        self.ingress = ingress
        try:
            import uvloop

            self._loop = uvloop.new_event_loop()
        except ImportError:
            self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="realtime-ingress", daemon=True)
        self._thread.start()
        try:
            self.port = self.call(ingress.start(host, port))
        except OSError:  # the address is taken: no thread left behind
            self._end_loop()
            raise

    def call(self, coro: Awaitable[Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.call(asyncio.wait_for(self.ingress.close(), 5.0))
        self._end_loop()

    def _end_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5.0)
        if not self._loop.is_running():
            self._loop.close()
