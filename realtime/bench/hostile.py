"""Hostile clients for ``realtime bench reliability``: a loopback fuzzer for every websocket route
and the floods of the isolation run. Real sockets, the ``websockets`` client; nothing here touches
the server but its public routes.

:func:`fuzz_connection` plays one client: it connects to a route, sends a random mix of the
route's own valid messages (in random order, so out of order too) and hostile frames (random
bytes and text, invalid UTF-8, truncated and deeply nested documents, wrong types,
``NaN``/``Infinity``, huge numbers, frames over the route's limit), then ends in one of several
ways (clean close, abrupt reset, or simply going away), and reports the frames it sent and the
close code it got. A close code of 1011 means the server failed; every other code is an honest
answer (1000, 1001, 1007 invalid UTF-8, 1008 policy, 1009 too big, 1013 full).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import json
import random
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

import msgpack
import numpy as np
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from realtime.protocols import openpi

Frame = str | bytes | tuple[str, bytes]  # ("text", raw bytes): a text frame sent unvalidated

WORLD = "/v1/realtime/world?protocol_version=1"
ROBOT = "/"
ECHO = "/v1/realtime/echo"
VOICE = "/v1/realtime"
DUPLEX = "/v1/duplex"
DUPLEX_ON_REALTIME = "/v1/realtime?mode=duplex"
#: route -> the kind whose websocket gauge it moves
ROUTE_KINDS = {ROBOT: "robot", WORLD: "world", ECHO: "echo", VOICE: "voice", DUPLEX: "duplex"}


@dataclass
class FuzzResult:
    """What one or many fuzz connections saw."""

    connections: int = 0
    frames: int = 0
    closes: dict[int | None, int] = field(default_factory=dict)
    refused: int = 0  # handshakes answered with an HTTP status (1013-style capacity, 503)
    held: int = 0  # connections the server held up past CONNECTION_S (reset by the client)

    def add(self, other: FuzzResult) -> None:
        self.connections += other.connections
        self.frames += other.frames
        self.refused += other.refused
        self.held += other.held
        for code, n in other.closes.items():
            self.closes[code] = self.closes.get(code, 0) + n

    @property
    def closes_1011(self) -> int:
        return self.closes.get(1011, 0)


# -- hostile frames every route gets ---------------------------------------------------------


def _random_bytes(rng: random.Random, n: int) -> bytes:
    return rng.randbytes(n)


@functools.cache
def _nested(depth: int, level: bytes | str) -> bytes | str:
    """``depth`` nested containers (built once: the attacker must not spend its CPU on them)."""
    if isinstance(level, str):
        return level * depth + "]" * depth
    return level * depth + b"\xc0"


def _json_nested(rng: random.Random) -> str:
    return _nested(rng.choice((40, 200, 999, 5000, 20000)), "[")  # type: ignore[return-value]


def _msgpack_nested(rng: random.Random) -> bytes:
    return _nested(rng.choice((40, 1000, 5000)), rng.choice((b"\x91", b"\x81\xa1a")))  # type: ignore[return-value]


@functools.cache
def _wide(n: int, as_json: bool) -> str | bytes:
    return "[" + "0," * n + "0]" if as_json else msgpack.packb({f"k{i}": i for i in range(n)})


def _many_values(rng: random.Random) -> str | bytes:
    return _wide(rng.choice((20_000, 100_000)), rng.random() < 0.5)


def _non_finite(rng: random.Random) -> str:
    value = rng.choice(("NaN", "Infinity", "-Infinity", "1e999", "9" * 5000, "-" + "9" * 30))
    kind = json.dumps(rng.choice(("session.ping", "session.event", "echo", "response.create")))
    return f'{{"type": {kind}, "data": {value}, "event_id": {value}}}'


def _wrong_types(rng: random.Random, types: tuple[str, ...]) -> str:
    junk = rng.choice((None, True, 3, -1, 2.5, "", "x" * 300, [], {}, [1, [2]], {"a": {"b": None}}))
    message = {"type": rng.choice((*types, junk)), rng.choice(("event_id", "data", "prompt", "audio")): junk}
    for key in rng.sample(("controls", "session", "item", "response", "text", "seed", "fps"), 2):
        message[key] = rng.choice((junk, None, -(2**63), 2**64, "\ud800" if rng.random() < 0.1 else "s"))
    return json.dumps(message)


def _invalid_utf8(rng: random.Random) -> tuple[str, bytes]:
    return ("text", b'{"type": "x", "data": "' + rng.choice((b"\xff", b"\xc3\x28", b"\xed\xa0\x80")) + b'"}')


def hostile(rng: random.Random, types: tuple[str, ...], limit: int) -> Frame:
    """One hostile frame for a route whose message types are ``types`` and limit ``limit``."""
    pick = rng.random()
    if pick < 0.12:
        return _random_bytes(rng, rng.choice((0, 1, 7, 64, 4096)))
    if pick < 0.22:
        return "".join(chr(rng.randrange(32, 0x2FFF)) for _ in range(rng.choice((0, 1, 30, 500))))
    if pick < 0.30:
        return _json_nested(rng)
    if pick < 0.36:
        return _msgpack_nested(rng)
    if pick < 0.40:
        return _many_values(rng)
    if pick < 0.52:
        return _non_finite(rng)
    if pick < 0.80:
        return _wrong_types(rng, types)
    if pick < 0.84:
        return _invalid_utf8(rng)
    if pick < 0.86:
        return b"\0" * (limit + 1) if rng.random() < 0.5 else "x" * (limit + 1)  # over the limit: 1009
    text = _wrong_types(rng, types)
    return text[: rng.randrange(len(text))]  # truncated


# -- each route's own messages ---------------------------------------------------------------


def _world(rng: random.Random, state: dict) -> Frame:
    state["event_id"] = state.get("event_id", 0) + rng.choice((1, 1, 1, 0, -3, 10**6))
    kind = rng.choice(("start", "event", "event", "event", "ping", "reset", "close", "start"))
    if kind == "start":
        body: dict = {"type": "session.start", "pacing": rng.choice(("fast", "realtime", "warp"))}
        for key, values in (
            ("fps", (1, 4, 16, 0, 999)),
            ("seed", (0, 7, -1)),
            ("prompt", ("a cat", "")),
            ("format", ("jpeg", "fmp4", "gif")),
        ):
            if rng.random() < 0.5:
                body[key] = rng.choice(values)
        return json.dumps(body)
    if kind == "event":
        controls = rng.choice(
            (
                [],
                [{"track": "keys", "schema": "world.keys.v1", "data": {"pressed": rng.sample("wasd", 2)}}],
                [{"track": "mouse", "schema": "world.mouse.v1", "data": {"dx": rng.uniform(-5, 5), "dy": 0}}],
                [{"track": "keys", "schema": "bogus", "data": None}],
            )
        )
        body = {"type": "session.event", "event_id": state["event_id"], "controls": controls}
        if rng.random() < 0.3:
            body["prompt"] = rng.choice(("a dog", "x" * 5000))
        return json.dumps(body)
    if kind == "ping":
        return json.dumps({"type": "session.ping", "data": rng.choice((1, "x", [1, {"a": 2}]))})
    return json.dumps({"type": f"session.{kind}"})


def _robot(rng: random.Random, state: dict) -> Frame:
    pick = rng.random()
    if pick < 0.5:
        obs = {
            "observation/state": np.zeros(rng.choice((8, 7, 0)), dtype=rng.choice((np.float32, np.float64))),
            "observation/image": np.zeros((rng.choice((224, 8)), 224, 3), dtype=np.uint8),
            "prompt": rng.choice(("pick up the cup", "", "x" * 3000)),
        }
        if rng.random() < 0.2:
            obs["session_id"] = rng.choice(("ep1", "ep2", "x" * 300))
        return openpi.packb(obs)
    if pick < 0.6:
        return openpi.packb({"endpoint": rng.choice(("reset", "infer", "bogus"))})
    if pick < 0.75:  # bad numpy markers
        return msgpack.packb(
            {
                "observation/state": {
                    b"__ndarray__": True,
                    b"data": rng.randbytes(rng.choice((0, 8, 9))),
                    b"dtype": rng.choice(("<f4", "O", "<i" + "0" * 100 + "8", "|V8", "<U2", 7)),
                    b"shape": rng.choice(([2], [-1], [1] * 40, "x", [2**40])),
                }
            }
        )
    if pick < 0.85:
        return msgpack.packb(
            {"nd": True, "type": "<f4", "kind": rng.choice(("", "O")), "shape": [1], "data": b"\0" * 4}
        )
    return msgpack.packb(rng.choice(([1, 2], "text", None, {1: 2}, {"a": [{"b": []}]})))


def _echo(rng: random.Random, state: dict) -> Frame:
    return json.dumps(
        rng.choice(({"type": "echo", "text": rng.choice(("hello world", "x " * 3000))}, {"type": "cancel"}))
    )


def _pcm(rng: random.Random) -> str:
    samples = rng.choice((0, 1, 480, 4800))
    return base64.b64encode(
        struct.pack(f"<{samples}h", *(rng.randrange(-3000, 3000) for _ in range(samples)))
    ).decode()


def _realtime(rng: random.Random, state: dict, duplex: bool) -> Frame:
    kinds = [
        "session.update",
        "input_audio_buffer.append",
        "input_audio_buffer.append",
        "input_audio_buffer.commit",
        "input_audio_buffer.clear",
        "conversation.item.create",
        "conversation.item.delete",
        "conversation.item.retrieve",
        "conversation.item.truncate",
        "response.create",
        "response.cancel",
        "output_audio_buffer.clear",
    ]
    if duplex:
        kinds += ["playback.ack", "session.resume", "session.event_ack", "session.heartbeat", "session.close"]
    kind = rng.choice(kinds)
    body: dict = {"type": kind}
    if rng.random() < 0.5:
        body["event_id"] = f"evt_{rng.randrange(10**6)}"
    if kind == "input_audio_buffer.append":
        body["audio"] = rng.choice((_pcm(rng), "not base64!", ""))
    elif kind == "session.update":
        body["session"] = rng.choice(
            (
                {"instructions": "be brief", "voice": "alloy"},
                {"turn_detection": None},
                {"turn_detection": {"type": "server_vad", "silence_duration_ms": rng.choice((200, -5))}},
                {"modalities": ["text"]},
                {"type": "realtime", "output_modalities": ["audio"]},
                {"tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}]},
            )
        )
    elif kind == "conversation.item.create":
        body["item"] = rng.choice(
            (
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
                {"type": "function_call_output", "call_id": "c1", "output": "{}"},
                {"type": "message", "role": "system", "content": "nope"},
            )
        )
    elif kind in ("conversation.item.delete", "conversation.item.retrieve", "conversation.item.truncate"):
        body["item_id"] = rng.choice(("item_1", "", "x" * 200))
        if kind.endswith("truncate"):
            body.update(content_index=0, audio_end_ms=rng.choice((0, 100, -1)))
    elif kind == "response.create":
        if rng.random() < 0.5:
            body["response"] = {"modalities": ["text"], "max_output_tokens": rng.choice((1, 4, "inf"))}
    elif kind == "playback.ack":
        body.update(response_id=f"resp_{rng.randrange(5)}", played_ms=rng.choice((0, 80, -1)))
    elif kind == "session.resume":
        body.update(
            session_id=f"sess_{rng.randrange(5)}",
            resume_token="t" * rng.choice((8, 200)),
            last_server_event_seq=3,
        )
    elif kind == "session.event_ack":
        body["server_event_seq"] = rng.choice((0, 5, 10**9))
    return json.dumps(body)


@dataclass(frozen=True)
class Route:
    """A websocket route to fuzz: its path, its own messages and message types, its limit."""

    path: str
    valid: Callable[[random.Random, dict], Frame]
    types: tuple[str, ...]
    limit: int


def routes(limits: dict[str, int]) -> dict[str, Route]:
    """Every fuzzed route by name; ``limits`` holds each kind's ``max_message_bytes``."""
    realtime_types = ("session.update", "input_audio_buffer.append", "response.create")
    return {
        "robot": Route(ROBOT, _robot, ("infer", "reset"), limits.get("robot", 1 << 26)),
        "world": Route(
            WORLD, _world, ("session.start", "session.event", "session.ping"), limits.get("world", 1 << 16)
        ),
        "echo": Route(ECHO, _echo, ("echo", "cancel"), limits.get("echo", 1 << 16)),
        "voice": Route(
            VOICE, lambda r, s: _realtime(r, s, False), realtime_types, limits.get("voice", 1 << 24)
        ),
        "duplex": Route(
            DUPLEX, lambda r, s: _realtime(r, s, True), realtime_types, limits.get("duplex", 1 << 20)
        ),
        "duplex_on_realtime": Route(
            DUPLEX_ON_REALTIME,
            lambda r, s: _realtime(r, s, True),
            realtime_types,
            limits.get("duplex", 1 << 20),
        ),
    }


# -- the client ------------------------------------------------------------------------------


async def _send(ws, frame: Frame) -> None:  # noqa: ANN001 (a websockets connection)
    if isinstance(frame, tuple):
        await ws.send(frame[1], text=True)  # bytes as a text frame: not validated by the client
    else:
        await ws.send(frame)


def _abort(ws) -> None:  # noqa: ANN001
    """Reset the TCP connection (no close frame): the client vanished."""
    transport = ws.transport
    with contextlib.suppress(OSError):
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


CONNECTION_S = 4.0  # a fuzz client's whole life; one the server holds up longer is reset


async def fuzz_connection(
    base_url: str, route: Route, rng: random.Random, max_frames: int = 40, valid_share: float = 0.55
) -> FuzzResult:
    """One fuzz client on ``route`` (see the module docstring), at most :data:`CONNECTION_S`:
    past that (the server stopped reading it: backpressure, or a start deadline not yet due) the
    client resets its connection, counted in ``held``. ``valid_share`` of the frames are the
    route's own messages (0: garbage only, no model work)."""
    result = FuzzResult(connections=1)
    state: dict = {}
    frames = [
        route.valid(rng, state) if rng.random() < valid_share else hostile(rng, route.types, route.limit)
        for _ in range(rng.randrange(1, max_frames))
    ]
    ending = rng.choice(("close", "close", "abort", "abort", "drop"))
    url = base_url.replace("http://", "ws://") + route.path
    ws = None
    try:
        async with asyncio.timeout(CONNECTION_S):
            async with connect(
                url, max_size=None, open_timeout=30, close_timeout=1, ping_interval=None
            ) as ws:
                reader = asyncio.create_task(_drain(ws))
                try:
                    for frame in frames:
                        await _send(ws, frame)
                        result.frames += 1
                        if rng.random() < 0.3:
                            await asyncio.sleep(rng.choice((0, 0.001, 0.02)))
                    if ending == "abort":
                        _abort(ws)
                    elif ending == "close":
                        await ws.close()
                    else:
                        await asyncio.sleep(rng.choice((0, 0.05, 0.3)))
                except (ConnectionClosed, OSError):
                    pass
                finally:
                    reader.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await reader
    except InvalidStatus:
        result.refused = 1
        return result
    except TimeoutError:
        result.held = 1
        if ws is not None:
            _abort(ws)
    except (OSError, ConnectionClosed):
        pass
    result.closes = {ws.protocol.close_rcvd.code if ws is not None and ws.protocol.close_rcvd else None: 1}
    return result


async def _drain(ws) -> None:  # noqa: ANN001
    with contextlib.suppress(ConnectionClosed):
        async for _ in ws:
            pass


async def fuzz(base_url: str, route: Route, seconds: float, seed: int, concurrency: int = 4) -> FuzzResult:
    """Fuzz ``route`` with ``concurrency`` clients at a time for ``seconds``."""
    total = FuzzResult()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds

    async def worker(n: int) -> None:
        rng = random.Random(seed * 1000 + n)
        while loop.time() < deadline:
            total.add(await fuzz_connection(base_url, route, rng))

    await asyncio.gather(*(worker(n) for n in range(concurrency)))
    return total
