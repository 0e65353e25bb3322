"""The conversation-load mode of ``realtime bench voice``: N users, each in a spoken conversation.

Each session is a real GA client (the ``openai`` SDK's ``client.realtime.connect``; its raw frames
are read with ``recv_bytes`` so the client's parsing does not load the in-process server) running a
loop: stream a question at real-time pace (200 ms appends; 0.5 s silence before the words, 1 s
after, so server VAD ends the turn), receive the whole response, "play" it (a player that starts
at the first audio delta, plays in real time and stalls when the next delta is late), wait a
think time drawn uniformly from ``think_s``, speak the next question. Sessions start at offsets
drawn uniformly over one cycle, so their turns end at unrelated moments as real users' do. All
draws come from one ``random.Random(seed)``.

Per turn: **TTFA** (``input_audio_buffer.speech_stopped`` -> the response's first
``response.output_audio.delta``) and **stall** (how long the player waited for late audio after
the first delta: what pacing the reply's generation must not cause). The first turn of every
session is a warm-up and is not counted.
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
import time
from dataclasses import dataclass

APPEND_MS = 200
PCM_BYTES_PER_S = 24_000 * 2
TURN_TIMEOUT_S = 180.0  # one turn's bound: speaking, the whole response and its playback
API_KEY = "bench"  # the bench's server has no keys configured; the SDK wants one


@dataclass(frozen=True, slots=True)
class TurnTiming:
    """One measured turn: ``ttfa_ms``, the player's ``stall_ms`` and the reply's ``audio_s``;
    ``failed``: the response failed (or brought no audio); the timings are then 0 and not counted."""

    ttfa_ms: float
    stall_ms: float
    audio_s: float
    failed: bool = False


@dataclass(frozen=True, slots=True)
class LoadPlan:
    """``sessions`` conversations of ``turns`` turns each (the first a warm-up), starting within
    ``spread_s``; think times uniform in ``think_s``; every draw from ``seed``."""

    sessions: int
    turns: int
    spread_s: float
    think_s: tuple[float, float] = (1.0, 3.0)
    seed: int = 0


class Player:
    """A client's audio player: playback starts at the first delta and runs in real time; a
    delta that arrives after the audio before it has played out stalls playback until it does."""

    def __init__(self) -> None:
        self.first_at: float | None = None
        self.ends_at = 0.0  # when everything received so far has played
        self.stall_s = 0.0
        self.audio_s = 0.0

    def receive(self, at: float, seconds: float) -> None:
        if self.first_at is None:
            self.first_at = self.ends_at = at
        elif at > self.ends_at:
            self.stall_s += at - self.ends_at
            self.ends_at = at
        self.ends_at += seconds
        self.audio_s += seconds


async def speak(conn: object, pcm: bytes) -> None:
    """``pcm`` as 200 ms appends at real-time pace."""
    step = PCM_BYTES_PER_S * APPEND_MS // 1000
    start = time.perf_counter()
    for n, offset in enumerate(range(0, len(pcm), step)):
        await conn.input_audio_buffer.append(audio=base64.b64encode(pcm[offset : offset + step]).decode())
        await asyncio.sleep(max(0.0, start + (n + 1) * APPEND_MS / 1000 - time.perf_counter()))


async def listen(conn: object) -> tuple[float | None, Player, str]:
    """Events until the turn's ``response.done``: the ``speech_stopped`` time, the player and the
    response's status (``failed`` for a response without ``speech_stopped`` before it or audio)."""
    stopped: float | None = None
    player = Player()
    while True:
        event = json.loads(await conn.recv_bytes())
        kind, now = event["type"], time.perf_counter()
        if kind == "input_audio_buffer.speech_stopped":
            stopped = now
        elif kind == "response.output_audio.delta":
            player.receive(now, len(base64.b64decode(event["delta"])) / PCM_BYTES_PER_S)
        elif kind == "error":
            raise RuntimeError(f"server error: {event['error']}")
        elif kind == "response.done":
            status = event["response"]["status"]
            return stopped, player, status if stopped and player.first_at else "failed"


async def conversation(
    url: str, questions: list[bytes], plan: LoadPlan, start_s: float, think: list[float]
) -> list[TurnTiming]:
    """One user: ``plan.turns`` turns over one GA connection, the first after ``start_s``."""
    from openai import AsyncOpenAI

    await asyncio.sleep(start_s)
    client = AsyncOpenAI(websocket_base_url=url.removesuffix("/realtime"), api_key=API_KEY)  # it appends that
    out: list[TurnTiming] = []
    async with client.realtime.connect(model="gpt-realtime") as conn:
        for turn in range(plan.turns):
            async with asyncio.timeout(TURN_TIMEOUT_S):
                listener = asyncio.create_task(listen(conn))
                await speak(conn, questions[turn % len(questions)])
                stopped, player, status = await listener
                await asyncio.sleep(max(0.0, player.ends_at - time.perf_counter()))  # the user listens
            if turn and status in ("completed", "incomplete"):  # the first turn warms the session up
                assert stopped is not None and player.first_at is not None
                ttfa_ms = (player.first_at - stopped) * 1000
                out.append(TurnTiming(ttfa_ms, player.stall_s * 1000, player.audio_s))
            elif turn:
                out.append(TurnTiming(0.0, 0.0, 0.0, failed=True))
            await asyncio.sleep(think[turn])
    return out


async def conversation_load(url: str, questions: list[bytes], plan: LoadPlan) -> list[TurnTiming]:
    """Every measured turn of ``plan.sessions`` concurrent conversations (see the module docstring).

    Session ``i`` asks the questions in order starting at ``questions[i % len]``.
    """
    rng = random.Random(plan.seed)
    starts = sorted(rng.uniform(0, plan.spread_s) for _ in range(plan.sessions))
    thinks = [[rng.uniform(*plan.think_s) for _ in range(plan.turns)] for _ in range(plan.sessions)]
    runs = [
        conversation(url, questions[i % len(questions) :] + questions[: i % len(questions)], plan, s, t)
        for i, (s, t) in enumerate(zip(starts, thinks, strict=True))
    ]
    return [timing for timings in await asyncio.gather(*runs) for timing in timings]


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, linearly interpolated."""
    ordered = sorted(values)
    at = q * (len(ordered) - 1)
    low = int(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)
