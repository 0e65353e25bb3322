"""The e2e voice tests' client side: the real ``openai`` SDK over loopback, every frame checked.

:func:`voice_server` runs one real server with the voice kind for a test module.
:func:`connect` opens the SDK's GA (``client.realtime.connect``) or beta
(``client.beta.realtime.connect``) connection; :class:`Events` reads its raw frames, validates each
one against the SDK's pydantic model for its type in that dialect
(``tests/protocols/oai_realtime/sdk_models.py``: strict, no undeclared keys, under 1 MiB) and
returns them as dicts.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import AsyncIterator

from openai import AsyncOpenAI

from realtime.config import config_from_mapping
from realtime.protocols.oai_realtime import Dialect
from tests.protocols.oai_realtime.sdk_models import validate_server_frame
from tests.serving import serve_in_process, wait_ready

API_KEY = "voice-test-key"
APPEND_BYTES = 9600  # 200 ms of pcm16 at 24 kHz per append, as browser clients send
MODELS = {Dialect.GA: "gpt-realtime", Dialect.BETA: "gpt-4o-realtime-preview"}


@contextlib.asynccontextmanager
async def voice_server(
    runtime: dict | None = None, ready_timeout_s: float = 120.0, webrtc: dict | None = None, **voice: object
) -> AsyncIterator[tuple[str, object]]:
    """``(ws base url "ws://127.0.0.1:PORT/v1", the voice service)`` of a server with only voice on,
    once ready (within ``ready_timeout_s``); ``voice``, ``runtime`` and ``webrtc`` override those
    config sections' fields."""
    config = config_from_mapping(
        {
            "robot": {"enabled": False},
            "world": {"enabled": False},
            "runtime": runtime or {},
            "server": {"api_keys": [API_KEY], "start_timeout_s": 5},
            "voice": {"enabled": True, "max_sessions": 4, **voice},
            "webrtc": webrtc or {},
        }
    )
    async with serve_in_process(config, ready=False) as (base, server):
        await wait_ready(base, ready_timeout_s)
        service = next(k for k in server.rt_app.state.rt.kinds if k.name == "voice")
        yield base.replace("http://", "ws://") + "/v1", service


class Events:
    """Raw server frames of one SDK connection, each validated for its dialect before it is returned."""

    def __init__(self, conn: object, dialect: Dialect) -> None:
        self.conn = conn
        self.dialect = dialect
        self.seen: list[dict] = []

    async def next(self, timeout: float = 30.0) -> dict:
        raw = await asyncio.wait_for(self.conn.recv_bytes(), timeout)
        frame = raw.decode()
        validate_server_frame(frame, self.dialect)
        event = json.loads(frame)
        self.seen.append(event)
        return event

    async def until(self, kind: str, timeout: float = 60.0) -> list[dict]:
        """Every event up to and including the first of type ``kind``."""
        out = []
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            event = await self.next(deadline - asyncio.get_running_loop().time())
            out.append(event)
            if event["type"] == kind:
                return out

    async def quiet(self, seconds: float) -> list[dict]:
        """Whatever arrives within ``seconds``."""
        out = []
        with contextlib.suppress(TimeoutError):
            while True:
                out.append(await self.next(seconds))
        return out


@contextlib.asynccontextmanager
async def connect(url: str, dialect: Dialect) -> AsyncIterator[tuple[object, Events]]:
    """An SDK connection in ``dialect`` and its :class:`Events`, after ``session.created``."""
    client = AsyncOpenAI(websocket_base_url=url, api_key=API_KEY)
    realtime = client.realtime if dialect is Dialect.GA else client.beta.realtime
    async with realtime.connect(model=MODELS[dialect]) as conn:
        events = Events(conn, dialect)
        first = await events.next()
        assert first["type"] == "session.created"
        yield conn, events


async def append_audio(conn: object, pcm: bytes) -> None:
    """``pcm`` as 200 ms appends, faster than real time (the server does not pace input)."""
    for start in range(0, len(pcm), APPEND_BYTES):
        await conn.input_audio_buffer.append(
            audio=base64.b64encode(pcm[start : start + APPEND_BYTES]).decode()
        )


def types(events: list[dict]) -> list[str]:
    return [e["type"] for e in events]


def response_text(events: list[dict], dialect: Dialect) -> str:
    delta = (
        "response.output_audio_transcript.delta"
        if dialect is Dialect.GA
        else "response.audio_transcript.delta"
    )
    return "".join(e["delta"] for e in events if e["type"] == delta)
