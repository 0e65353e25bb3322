"""The duplex kind's e2e tests' server side: one real server over loopback, the real embedded
test model, optionally with scripted turn-taking, and a JSON client that checks every frame.

:class:`Scripted` wraps the real model stage (its compute, slots and state all run) and replaces
only its listen/speak decision and text piece by a script, so a test knows when the model
speaks: ``speak(step)`` decides each frame. It also records every forward's sessions and input
kinds (client audio or silence), which the cadence and stall tests assert on.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
import time
from collections.abc import AsyncIterator, Callable

import numpy as np
import websockets

from models.duplex.stage import FRAME_SAMPLES, DuplexOutput
from realtime.config import config_from_mapping
from realtime.kinds import duplex as duplex_kind
from realtime.kinds import duplex_model
from realtime.protocols.oai_realtime import Dialect
from tests.serving import serve_in_process
from tests.voice.realtime_client import Events

Speak = Callable[[int], bool]


def always(step: int) -> bool:
    return True


class Scripted:
    """The real stage with scripted decisions (see the module docstring)."""

    def __init__(self, stage: object, speak: Speak) -> None:
        self.stage = stage
        self.speak = speak
        self.batches: list[tuple[float, tuple[str, ...], tuple[bool, ...]]] = []  # (time, sessions, silent)

    def __getattr__(self, name: str) -> object:
        return getattr(self.stage, name)

    def forward(self, items):  # noqa: ANN001, ANN201 (the stage interface)
        self.batches.append(
            (time.monotonic(), tuple(i.session_id for i in items), tuple(i.payload.silent for i in items))
        )
        outputs = self.stage.forward(items)
        return [
            dataclasses.replace(
                o, speaking=self.speak(o.step), text=f"w{o.step} " if self.speak(o.step) else ""
            )
            if isinstance(o, DuplexOutput)
            else o
            for o in outputs
        ]


@contextlib.asynccontextmanager
async def duplex_server(
    monkeypatch, speak: Speak | None = None, server: dict | None = None, **duplex: object
) -> AsyncIterator[tuple[str, object, Scripted | None]]:
    """``(ws base url, the duplex service, the scripted stage or None)`` of a server with only the
    duplex kind on (the ``duplex-test`` model); ``speak`` scripts its turn-taking."""
    scripted: list[Scripted] = []
    if speak is not None:
        real = duplex_model.build_stage

        def build(config, slots):  # noqa: ANN001, ANN202
            stage = Scripted(real(config, slots), speak)
            scripted.append(stage)
            return stage

        monkeypatch.setattr(duplex_kind, "build_stage", build)
    config = config_from_mapping(
        {
            "robot": {"enabled": False},
            "world": {"enabled": False},
            "voice": {"enabled": False},
            "server": {"start_timeout_s": 5, **(server or {})},
            "duplex": {"enabled": True, "model": "duplex-test", "max_sessions": 4, **duplex},
        }
    )
    async with serve_in_process(config) as (base, srv):
        service = next(k for k in srv.rt_app.state.rt.kinds if k.name == "duplex")
        yield base.replace("http://", "ws://"), service, (scripted[-1] if scripted else None)


class Client(Events):
    """One duplex socket; every frame must be JSON with ``epoch`` and ``server_event_seq``
    (``until`` is the voice tests' own)."""

    def __init__(self, ws: websockets.ClientConnection) -> None:
        super().__init__(ws, Dialect.GA)
        self.ws = ws

    async def next(self, timeout: float = 10.0) -> dict:
        frame = await asyncio.wait_for(self.ws.recv(), timeout)
        assert isinstance(frame, str), "pcm16 sessions get text frames only"
        event = json.loads(frame)
        assert isinstance(event["epoch"], int) and isinstance(event["server_event_seq"], int), event
        self.seen.append(event)
        return event

    async def during(self, seconds: float) -> list[dict]:
        """Everything that arrives within the next ``seconds`` (a duplex model never goes quiet)."""
        out, deadline = [], time.monotonic() + seconds
        with contextlib.suppress(TimeoutError):
            while True:
                out.append(await self.next(max(0.001, deadline - time.monotonic())))
        return out

    async def send(self, **event: object) -> None:
        await self.ws.send(json.dumps(event))

    async def start_clock(self) -> None:
        """A valid event (a heartbeat, answered): the session steps from now on, not only once
        ``duplex.probation_ms`` has passed (tests that compare sessions' batches need all stepping)."""
        await self.send(type="session.heartbeat")
        await self.until("session.heartbeat_ack")

    async def append(self, samples: np.ndarray) -> None:
        pcm = (np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes()
        await self.send(type="input_audio_buffer.append", audio=base64.b64encode(pcm).decode())


@contextlib.asynccontextmanager
async def connect(url: str) -> AsyncIterator[Client]:
    async with websockets.connect(url, max_size=None) as ws:
        yield Client(ws)


def loud(frames: int) -> np.ndarray:
    """``frames`` 80 ms frames of loud noise (speech to the barge-in detector)."""
    return (0.3 * np.random.default_rng(1).standard_normal(frames * FRAME_SAMPLES)).astype(np.float32)


def audio_steps(events: list[dict]) -> list[int]:
    """The response ids' delta order is the model's step order; the scripted text names the step."""
    return [int(e["delta"][1:]) for e in events if e["type"] == "response.output_audio_transcript.delta"]
