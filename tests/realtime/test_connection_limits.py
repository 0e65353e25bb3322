"""Limits of the connection skeleton (``realtime/connection.py``) over a real server on loopback.

- ``server.start_timeout_s``: a world socket that never sends ``session.start`` is closed 1008
  ``no session started within N s`` at the deadline, also while it keeps pinging; one that started
  in time is not closed by it.
- ``server.max_outbound_bytes``: a client that never reads while the server has lots to send (an
  echo of a long text) ends with ``slow_consumer`` (close 1008, or the transport aborted when the
  close frame cannot be flushed), its session is released, and another client of the same server
  is served before, during and after.
- ``echo.max_message_bytes``: a larger frame is refused from its header, close 1009.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time

import pytest
import websockets
from websockets.frames import Frame, Opcode

from realtime.config import config_from_mapping
from realtime.connection import CLOSE_FLUSH_S
from tests.realtime.rawws import RawClient
from tests.serving import serve_in_process

pytestmark = [pytest.mark.timeout(120), pytest.mark.asyncio(loop_scope="session")]

START_TIMEOUT_S = 0.5
MAX_OUTBOUND_BYTES = 100_000
ECHO_MAX_MESSAGE_BYTES = 16 * 1024 * 1024
WORD = "x" * 60_000  # one echo delta of ~60 KB
WORDS = 200  # 12 MB to send: more than the socket buffers (up to 4 MB sent + 6 MB received) hold


@pytest.fixture(scope="module")
async def served():
    """(ws base URL, running server) with a small start deadline and outbound byte bound."""
    config = config_from_mapping(
        {
            "server": {"start_timeout_s": START_TIMEOUT_S, "max_outbound_bytes": MAX_OUTBOUND_BYTES},
            "runtime": {"memory_available_bytes": 2**30},
            "robot": {"enabled": False},
            "world": {"enabled": True, "model": "world-test", "torch_threads": 1},
            "echo": {
                "enabled": True,
                "max_text_chars": 16_000_000,
                "max_message_bytes": ECHO_MAX_MESSAGE_BYTES,
            },
        }
    )
    async with serve_in_process(config) as (base, server):
        yield base.replace("http://", "ws://"), server


def _kind(server, name: str):
    return next(k for k in server.rt_app.state.rt.kinds if k.name == name)


async def _recv_type(ws, kind: str, timeout: float = 10.0) -> dict:
    """The next JSON text message of type ``kind`` (skipping binary media and other types)."""

    async def loop() -> dict:
        while True:
            msg = await ws.recv()
            if isinstance(msg, str) and (parsed := json.loads(msg))["type"] == kind:
                return parsed

    return await asyncio.wait_for(loop(), timeout)


async def _echo_round_trip(url: str, ws=None) -> None:
    """One echo on a polite client: every word back, then ``echo.done``, within a bound."""

    async def run(sock) -> None:
        await sock.send(json.dumps({"type": "echo", "text": "still served"}))
        deltas = [await _recv_type(sock, "echo.delta", 5.0) for _ in range(2)]
        assert [d["text"] for d in deltas] == ["STILL", "SERVED"]
        assert (await _recv_type(sock, "echo.done", 5.0))["words"] == 2

    if ws is not None:
        await run(ws)
        return
    async with websockets.connect(url) as sock:
        await _recv_type(sock, "session.created")
        await run(sock)


# -- start deadline ----------------------------------------------------------------------


async def test_a_world_socket_that_never_starts_is_closed_1008_at_the_deadline(served):
    base, _ = served
    url = base + "/v1/realtime/world?protocol_version=1"
    silent = await websockets.connect(url)
    pinging = await websockets.connect(url)
    t0 = time.monotonic()

    async def keep_pinging() -> None:  # activity is not a start: the deadline still applies
        for i in range(100):
            await pinging.send(json.dumps({"type": "session.ping", "data": i}))
            assert (await _recv_type(pinging, "session.pong", 5.0))["data"] == i
            await asyncio.sleep(0.05)

    for ws, work in ((silent, silent.recv()), (pinging, keep_pinging())):
        with pytest.raises(websockets.ConnectionClosed) as info:
            await asyncio.wait_for(work, 5.0)
        elapsed = time.monotonic() - t0
        assert info.value.rcvd is not None, "the server sent no close frame"
        assert info.value.rcvd.code == 1008
        assert info.value.rcvd.reason == f"no session started within {START_TIMEOUT_S:g} s"
        assert START_TIMEOUT_S * 0.9 <= elapsed < START_TIMEOUT_S + 2.0, elapsed
        await ws.close()


async def test_a_world_session_started_in_time_outlives_the_start_deadline(served):
    base, server = served
    async with websockets.connect(base + "/v1/realtime/world?protocol_version=1") as ws:
        await ws.send(json.dumps({"type": "session.start", "format": "jpeg"}))
        created = await _recv_type(ws, "session.created")
        await asyncio.sleep(START_TIMEOUT_S * 2)
        await ws.send(json.dumps({"type": "session.ping", "data": "after the deadline"}))
        assert (await _recv_type(ws, "session.pong"))["data"] == "after the deadline"
        await ws.send(json.dumps({"type": "session.close"}))
        closed = await _recv_type(ws, "session.closed")
        assert closed["session_id"] == created["session_id"] and closed["reason"] == "client_close"
    assert created["session_id"] not in _kind(server, "world").manager


# -- slow consumer -----------------------------------------------------------------------


def _first_text(client: RawClient) -> dict:
    """Read up to the first text message (the echo greeting); blocking, for a worker thread."""
    events = client.pending
    client.pending = []
    while True:
        for event in events:
            if isinstance(event, Frame) and event.opcode is Opcode.TEXT:
                return json.loads(event.data)
        client.protocol.receive_data(client.sock.recv(65536))
        events = client.protocol.events_received()


def _read_to_the_end(client: RawClient, timeout_s: float) -> tuple[str, int | None]:
    """Read until the connection ends: ("eof" | "reset" | "timeout", the close code if one came)."""
    client.sock.settimeout(timeout_s)
    code = None
    while True:
        try:
            data = client.sock.recv(1 << 20)
        except ConnectionResetError:
            return "reset", code
        except TimeoutError:
            return "timeout", code
        if not data:
            return "eof", code
        client.protocol.receive_data(data)
        for event in client.protocol.events_received():
            if isinstance(event, Frame) and event.opcode is Opcode.CLOSE and client.protocol.close_rcvd:
                code = client.protocol.close_rcvd.code
        for reply in client.protocol.data_to_send():  # the close echo, as a real client sends it
            if reply:
                client.sock.sendall(reply)


async def _until(predicate, timeout_s: float) -> float:
    """Wait until ``predicate()``; returns the seconds it took (fails the test past ``timeout_s``)."""
    start = time.monotonic()
    while not predicate():
        assert time.monotonic() - start < timeout_s, "condition not reached in time"
        await asyncio.sleep(0.02)
    return time.monotonic() - start


async def test_a_client_that_never_reads_is_dropped_and_released_while_others_are_served(served, caplog):
    base, server = served
    echo = _kind(server, "echo")
    url = base + "/v1/realtime/echo"
    caplog.set_level(logging.INFO, logger="realtime.connection")
    async with websockets.connect(url) as polite:
        await _recv_type(polite, "session.created")
        await _echo_round_trip(url, polite)

        hog = await asyncio.to_thread(RawClient, url, rcvbuf=4096)
        try:
            sid = (await asyncio.to_thread(_first_text, hog))["session_id"]
            assert sid in echo.manager and echo.ctx.connections.count("echo") == 2
            text = json.dumps({"type": "echo", "text": " ".join([WORD] * WORDS)})
            # the bound is crossed by deltas piling up in the queue, not by one delta alone
            assert len(text) < ECHO_MAX_MESSAGE_BYTES and len(WORD) < MAX_OUTBOUND_BYTES
            await asyncio.to_thread(hog.send_text, text)  # ... and never read again

            await _echo_round_trip(url, polite)  # served while the hog's output piles up
            await _until(lambda: sid not in echo.manager, 10.0)  # released through the one path
            assert not echo.manager.tombstones()
            assert not any(runner.is_open(sid) for runner in echo.runner.runners)
            await _until(lambda: any(_closed_slow(r) for r in caplog.records), 5.0)
            (record,) = [r for r in caplog.records if _closed_slow(r)]
            assert record.reason == f"client is not reading: over {MAX_OUTBOUND_BYTES} bytes queued"
            await _echo_round_trip(url, polite)  # still served while the hog's close waits

            # The close frame cannot reach a client that does not read: the handler gives up after
            # the bounded close wait and aborts the transport.
            waited = await _until(lambda: echo.ctx.connections.count("echo") == 1, CLOSE_FLUSH_S + 5.0)
            assert waited <= CLOSE_FLUSH_S + 1.0, waited
            ended, code = await asyncio.to_thread(_read_to_the_end, hog, 10.0)
            assert ended in ("eof", "reset"), ended  # the connection is gone, not held open
            assert code in (None, 1008)
        finally:
            hog.close()
        await _echo_round_trip(url, polite)  # the same polite socket, still open
    await _echo_round_trip(url)  # and a new one


def _closed_slow(record: logging.LogRecord) -> bool:
    return (
        record.getMessage() == "closing websocket"
        and getattr(record, "code", None) == 1008
        and ("not reading" in getattr(record, "reason", ""))
    )


def _read_echo(client: RawClient) -> list[dict]:
    """Read one echo's messages up to its ``echo.done`` (blocking, for a worker thread)."""
    client.sock.settimeout(10.0)
    messages: list[dict] = []
    while True:
        client.protocol.receive_data(client.sock.recv(1 << 20))
        for event in client.protocol.events_received():
            if isinstance(event, Frame) and event.opcode is Opcode.TEXT:
                messages.append(json.loads(event.data))
                if messages[-1]["type"] == "echo.done":
                    return messages


async def test_a_full_outbound_queue_makes_the_handler_wait_and_loses_nothing():
    """``server.max_outbound_messages``: far below the byte bound, a client that does not read
    pauses its own session (no slow_consumer, nothing dropped); once it reads, everything arrives
    in order. ``echo.max_sessions`` meanwhile refuses a second session with 1013."""
    words = 120  # 7 MB of deltas: more than the socket buffers hold, far less than 8 MiB queued
    config = config_from_mapping(
        {
            "server": {"max_outbound_messages": 2},
            "robot": {"enabled": False},
            "world": {"enabled": False},
            "echo": {
                "enabled": True,
                "max_sessions": 1,
                "max_text_chars": 16_000_000,
                "max_message_bytes": ECHO_MAX_MESSAGE_BYTES,
            },
        }
    )
    async with serve_in_process(config) as (base, server):
        echo, url = _kind(server, "echo"), base.replace("http://", "ws://") + "/v1/realtime/echo"
        client = await asyncio.to_thread(RawClient, url, rcvbuf=4096)
        try:
            sid = (await asyncio.to_thread(_first_text, client))["session_id"]
            text = json.dumps({"type": "echo", "text": " ".join([WORD] * words)})
            await asyncio.to_thread(client.send_text, text)
            await asyncio.sleep(1.0)  # far longer than streaming 7 MB to a reader takes
            session = echo.manager.get(sid)
            assert session.status == "active" and session.chunk_index == 0  # waiting, not done
            assert echo.ctx.connections.count("echo") == 1  # and not dropped

            async with websockets.connect(url) as refused:  # the only session is taken
                error = await _recv_type(refused, "error")
                assert error["code"] == "session_limit_reached"
                with pytest.raises(websockets.ConnectionClosed) as info:
                    await asyncio.wait_for(refused.recv(), 5.0)
                assert info.value.rcvd is not None and info.value.rcvd.code == 1013

            messages = await asyncio.to_thread(_read_echo, client)  # the client reads at last
            deltas = [m for m in messages if m["type"] == "echo.delta"]
            assert [d["seq"] for d in deltas] == list(range(words))
            assert all(d["text"] == WORD.upper() for d in deltas)
            assert messages[-1] == {"type": "echo.done", "chunk_index": 0, "words": words}
        finally:
            client.close()
        await _until(lambda: sid not in echo.manager, 10.0)


# -- transport limit of the echo route ---------------------------------------------------


async def test_an_echo_frame_over_echo_max_message_bytes_is_refused_1009_from_its_header(served):
    base, _ = served

    def oversized() -> int | None:
        client = RawClient(base + "/v1/realtime/echo")
        try:
            client.send_frame_header(Opcode.TEXT, ECHO_MAX_MESSAGE_BYTES + 1)
            return client.close_code()
        finally:
            client.close()

    assert await asyncio.to_thread(oversized) == 1009
    await _echo_round_trip(base + "/v1/realtime/echo")


async def test_a_second_echo_while_one_streams_is_busy_and_the_first_completes(served):
    base, _ = served
    async with websockets.connect(base + "/v1/realtime/echo") as ws:
        await _recv_type(ws, "session.created")
        words = [f"w{i}" for i in range(50)]
        await ws.send(json.dumps({"type": "echo", "text": " ".join(words)}))
        await ws.send(json.dumps({"type": "echo", "text": "too soon"}))  # read while the first streams
        messages = []
        while (msg := json.loads(await asyncio.wait_for(ws.recv(), 10.0)))["type"] != "echo.done":
            messages.append(msg)
        busy = [m for m in messages if m["type"] == "error"]
        assert [m["code"] for m in busy] == ["busy"]
        assert [m["text"] for m in messages if m["type"] == "echo.delta"] == [w.upper() for w in words]
        assert msg == {"type": "echo.done", "chunk_index": 0, "words": len(words)}


# -- ends the runtime decides -------------------------------------------------------------------


async def test_an_idle_echo_session_is_closed_1008_naming_its_timeout():
    config = config_from_mapping(
        {
            "robot": {"enabled": False},
            "world": {"enabled": False},
            "echo": {"enabled": True, "idle_timeout_s": 0.5},
        }
    )
    async with serve_in_process(config) as (base, _server):
        async with websockets.connect(base.replace("http://", "ws://") + "/v1/realtime/echo") as ws:
            await _recv_type(ws, "session.created")
            with pytest.raises(websockets.ConnectionClosed) as info:
                await asyncio.wait_for(ws.recv(), 5.0)
    assert info.value.rcvd is not None, "the server sent no close frame"
    assert (info.value.rcvd.code, info.value.rcvd.reason) == (1008, "idle timeout: no request for 0.5 s")


async def test_a_session_the_runtime_closes_ends_its_connection_even_if_the_client_never_reads():
    config = config_from_mapping(
        {
            "server": {"max_outbound_messages": 4},  # 4 pongs of 60 KB: far below max_outbound_bytes
            "runtime": {"memory_available_bytes": 2**30},
            "robot": {"enabled": False},
            "world": {"enabled": True, "model": "world-test", "torch_threads": 1, "idle_timeout_s": 1.0},
        }
    )
    async with serve_in_process(config) as (base, server):
        world = _kind(server, "world")
        url = base.replace("http://", "ws://") + "/v1/realtime/world?protocol_version=1"
        client = await asyncio.to_thread(RawClient, url, rcvbuf=4096, timeout_s=2)
        stop = threading.Event()

        def flood() -> None:  # pongs pile up unread; the session itself sees no activity
            ping = json.dumps({"type": "session.ping", "data": "x" * 60_000})
            while not stop.is_set():
                try:
                    client.send_text(ping)
                except OSError:  # the server stopped reading, or went away
                    return

        try:
            client.send_text(json.dumps({"type": "session.start", "pacing": "fast"}))
            flooder = threading.Thread(target=flood, daemon=True)
            flooder.start()
            await _until(lambda: len(world.manager) == 1, 10.0)
            await _until(lambda: len(world.manager) == 0, 10.0)  # idle: closed by the reaper
            # goodbye (bounded flush) + close frame (bounded) or abort
            await _until(lambda: world.ctx.connections.count("world") == 0, 2 * CLOSE_FLUSH_S + 5.0)
        finally:
            stop.set()
            client.close()


async def test_a_client_that_reads_nothing_is_ended_by_the_send_wait_bound_even_with_small_messages():
    """Small messages never reach ``max_outbound_bytes``; ``server.max_send_wait_s`` ends it."""
    config = config_from_mapping(
        {
            "server": {"max_send_wait_s": 1.0},
            "runtime": {"memory_available_bytes": 2**30},
            "robot": {"enabled": False},
            "world": {"enabled": True, "model": "world-test", "torch_threads": 1},
        }
    )
    async with serve_in_process(config) as (base, server):
        world = _kind(server, "world")
        url = base.replace("http://", "ws://") + "/v1/realtime/world?protocol_version=1"
        client = await asyncio.to_thread(RawClient, url, rcvbuf=4096, timeout_s=2)
        try:
            client.send_text(json.dumps({"type": "session.start", "pacing": "fast", "format": "jpeg"}))
            await _until(lambda: len(world.manager) == 1, 10.0)
            # the socket buffers fill first (seconds at world-test's small chunks), then one send
            # waits 1 s: send_timeout, the session released, the transport aborted
            await _until(lambda: len(world.manager) == 0, 60.0)
            await _until(lambda: world.ctx.connections.count("world") == 0, 2 * CLOSE_FLUSH_S + 5.0)
            async with websockets.connect(url) as polite:  # the server goes on serving others
                await polite.send(json.dumps({"type": "session.start", "pacing": "fast"}))
                await _recv_type(polite, "chunk.metadata", 20.0)
        finally:
            client.close()
