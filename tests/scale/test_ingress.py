"""The ingress of ``realtime serve --replicas`` (``realtime.scale.ingress``), Ray-free: real sockets
on loopback, a real ``websockets`` client. The two upstreams are ``websockets`` servers standing in
for a replica's own server and Serve's proxy (the cluster tests, ``test_cluster.py``, run the
ingress in front of the real replicas)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import threading
from http import HTTPStatus

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.asyncio.server import serve
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.frames import Close, Frame, Opcode

from realtime.scale.ingress import (
    HEAD_LIMIT_BYTES,
    FrameBoundary,
    Ingress,
    IngressThread,
    close_frame,
    handshake_scope,
    tls_context,
)
from realtime.scale.proxy import LOST_CODE, LOST_REASON
from tests.realtime.test_security import self_signed

pytestmark = pytest.mark.timeout(60)


def _upstream(name: str):
    """A server answering plain HTTP with its name and echoing websocket messages with it; the
    message ``die`` drops the TCP connection between frames (a replica's process killed),
    ``bye`` closes with 1001."""

    def http(connection, request):
        if request.headers.get("upgrade", "").lower() != "websocket":
            return connection.respond(HTTPStatus.OK, f"{name}\n")
        return None

    async def handler(ws):
        async for message in ws:
            if message == "die":
                ws.transport.abort()
                return
            if message == "bye":
                await ws.close(1001, "server shutting down")
                return
            await ws.send(f"{name}:{message}")

    return serve(handler, "127.0.0.1", 0, process_request=http)


@contextlib.asynccontextmanager
async def _ingress(choose=None, max_connections: int = 8, tls: ssl.SSLContext | None = None):
    async with _upstream("replica") as replica, _upstream("proxy") as proxy:
        replica_port = replica.sockets[0].getsockname()[1]
        asked: list[dict] = []

        async def to_replica(scope):
            asked.append(scope)
            return f"127.0.0.1:{replica_port}"

        ingress = Ingress(
            choose or to_replica,
            ("127.0.0.1", proxy.sockets[0].getsockname()[1]),
            max_connections=max_connections,
            ssl_context=tls,
        )
        port = await ingress.start("127.0.0.1", 0)
        try:
            yield f"127.0.0.1:{port}", asked
        finally:
            await ingress.close()


async def test_a_websocket_is_relayed_to_the_replica_the_router_chose_with_what_it_names():
    async with _ingress() as (address, asked), connect(f"ws://{address}/v1/realtime?session_id=abc") as ws:
        for text in ("one", "two" * 100_000):  # a large message crosses in many reads
            await ws.send(text)
            assert await ws.recv() == f"replica:{text}"
    (scope,) = asked
    assert scope["type"] == "websocket" and scope["path"] == "/v1/realtime"
    assert scope["query_string"] == b"session_id=abc"
    assert (b"upgrade", b"websocket") in scope["headers"]


async def test_tls_ends_at_the_ingress(tmp_path):
    cert, key = self_signed(tmp_path)
    trust = ssl.create_default_context(cafile=cert)
    async with _ingress(tls=tls_context(cert, key)) as (address, _):
        port = address.rsplit(":", 1)[1]
        async with connect(f"wss://localhost:{port}/v1/realtime", ssl=trust) as ws:
            await ws.send("over tls")
            assert await ws.recv() == "replica:over tls"
        async with httpx.AsyncClient(verify=trust) as client:
            assert (await client.get(f"https://localhost:{port}/readyz")).text == "proxy\n"
    assert tls_context("", "") is None


async def test_http_goes_to_serves_proxy_and_so_does_a_websocket_the_router_cannot_place():
    async def fails(scope):
        raise RuntimeError("replica gone")

    async def no_address(scope):
        return None

    for choose in (fails, no_address):
        async with _ingress(choose) as (address, _):
            async with httpx.AsyncClient() as client:
                reply = await client.get(f"http://{address}/v1/status")
            assert reply.status_code == 200 and reply.text == "proxy\n"
            async with connect(f"ws://{address}/") as ws:
                await ws.send("x")
                assert await ws.recv() == "proxy:x"


async def test_a_replica_lost_between_frames_closes_its_clients_with_1012_and_its_own_closes_pass():
    async with _ingress() as (address, _):
        async with connect(f"ws://{address}/") as ws:
            await ws.send("die")
            with pytest.raises(ConnectionClosed) as closed:
                await ws.recv()
        assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (LOST_CODE, LOST_REASON)
        async with connect(f"ws://{address}/") as ws:
            await ws.send("bye")
            with pytest.raises(ConnectionClosed) as closed:
                await ws.recv()
        assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (1001, "server shutting down")


async def _raw(address: str, data: bytes) -> bytes:
    host, port = address.split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(data)
    reply = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return reply


async def test_bad_heads_get_a_status_and_a_close_and_past_the_limit_a_bare_503():
    async with _ingress(max_connections=1) as (address, _):
        assert (await _raw(address, b"NOT HTTP AT ALL\r\n\r\n")).startswith(b"HTTP/1.1 400 ")
        huge = b"GET / HTTP/1.1\r\nhost: x\r\nx-pad: " + b"a" * (HEAD_LIMIT_BYTES + 1)
        assert (await _raw(address, huge)).startswith(b"HTTP/1.1 431 ")
        async with connect(f"ws://{address}/") as ws:  # the one connection allowed
            assert (await _raw(address, b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")).startswith(b"HTTP/1.1 503 ")
            with pytest.raises(InvalidStatus):
                async with connect(f"ws://{address}/"):
                    pass
            await ws.send("still")
            assert await ws.recv() == "replica:still"


def _frame(opcode: Opcode, payload: bytes) -> bytes:
    """A server's frame, by ``websockets``' own encoder."""
    return Frame(opcode, payload).serialize(mask=False, extensions=[])


@pytest.mark.parametrize("size", [0, 125, 126, 65535, 65536])
def test_frame_boundaries_are_found_by_length_whatever_the_reads(size):
    response = b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\n\r\n"
    stream = response + _frame(Opcode.BINARY, b"x" * size) + _frame(Opcode.TEXT, b"after")
    frames = FrameBoundary()
    boundaries = []
    for i in range(len(stream)):  # one byte per read: every split of a header is crossed
        frames.feed(stream[i : i + 1])
        boundaries.append(frames.lost_mid_session())
    # between frames, and only there: after the handshake's response, after each frame
    assert [i for i, at in enumerate(boundaries) if at] == [
        len(response) - 1,
        len(stream) - 8,
        len(stream) - 1,
    ]
    frames.feed(_frame(Opcode.CLOSE, Close(1000, "done").serialize()))
    assert frames.closed and not frames.lost_mid_session()


def test_a_refused_handshake_is_not_a_websocket_and_the_close_frame_is_well_formed():
    frames = FrameBoundary()
    frames.feed(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n\x81\x00")
    assert frames.refused and not frames.lost_mid_session()
    frame = close_frame(LOST_CODE, LOST_REASON)
    assert frame == _frame(Opcode.CLOSE, Close(LOST_CODE, LOST_REASON).serialize())


def test_only_a_get_with_a_websocket_upgrade_is_a_handshake():
    head = b"GET /v1/duplex?session_id=d-1 HTTP/1.1\r\nHost: x\r\nUpgrade: WebSocket\r\nConnection: Upgrade\r\n\r\n"
    scope = handshake_scope(head)
    assert scope is not None and scope["path"] == "/v1/duplex" and scope["query_string"] == b"session_id=d-1"
    assert handshake_scope(b"GET /v1/status HTTP/1.1\r\nHost: x\r\n\r\n") is None
    assert (
        handshake_scope(
            b"POST /v1/duplex HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\ncontent-length: 0\r\n\r\n"
        )
        is None
    )
    with pytest.raises(ValueError):
        handshake_scope(b"GET / HTTP/1.1\r\n\r\n")  # HTTP/1.1 without a host


def test_an_ingress_on_a_taken_address_raises_and_leaves_no_thread():
    async def choose(scope):
        return None

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        before = threading.active_count()
        with pytest.raises(OSError):
            IngressThread(
                Ingress(choose, ("127.0.0.1", 1), max_connections=1), "127.0.0.1", taken.getsockname()[1]
            )
        assert threading.active_count() == before
    ingress = IngressThread(Ingress(choose, ("127.0.0.1", 1), max_connections=1), "127.0.0.1", 0)
    assert ingress.port > 0
    ingress.stop()
    assert threading.active_count() == before
