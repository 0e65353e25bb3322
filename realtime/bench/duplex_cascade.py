"""``realtime bench duplex-cascade``: the duplex default that converses, timed through the protocol.

Runs the real server in this process (the duplex kind only, ``duplex.model: duplex-cascade``)
and drives it with ``N`` plain websocket clients on ``/v1/duplex``, for ``N`` in ``--sessions``.
Each client is a live microphone: 80 ms of pcm16 every 80 ms, the hibari voice speaking a
question (``QUESTIONS`` in turn), then the silence a microphone sends until the answer is over
and one more second; ``--turns`` questions per session, the sessions' first questions spread
over one turn's length. Per turn: **end of speech -> first audio**, from the moment the client
sent the question's last frame (the voice's end: its trailing quiet is cut) to the first ``response.output_audio.delta`` it received, and
whether the answer's transcript holds the expected word. A session's first turn is a warm-up
(not timed). During each run the duplex kind's frame clock counts its late and missed steps.

Last line: JSON with ``eos_to_audio_ms_p50_N`` / ``eos_to_audio_ms_p95_N`` (ms),
``answered_N`` (share of timed turns whose answer held the expected word), ``late_steps_N`` /
``missed_steps_N`` / ``steps_N``, ``step_ms_at_slots`` (the kind's measured silence step at
full batch) and ``load_avg_1m`` (the machine's load when the run ended: these figures are the
shared box's, not a quiet machine's).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import statistics
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import websockets

from realtime.bench.voice import kind_server
from realtime.config import config_from_mapping

FRAME_SAMPLES = 1920  # 80 ms at 24 kHz: one duplex frame
PERIOD_S = 0.08
QUESTIONS = (
    ("What is the capital of France?", ("paris",)),
    ("How many legs does a spider have?", ("8", "eight")),
    ("What is the capital of Germany?", ("berlin",)),
)


@dataclass(frozen=True)
class Turn:
    session: int
    index: int
    eos_to_audio_ms: float | None  # None: no answer within the turn's deadline
    answered: bool


def speech_frames(tts: Any, text: str) -> list[bytes]:
    """``text`` by the hibari voice as 80 ms pcm16 frames (the last one zero-padded), cut 20 ms
    after its last sample over 1 % of full scale: the voice's own trailing quiet (about 0.45 s)
    would otherwise count as speech, so the end of the frames is the end of the voice."""
    from models.voice.audio import float_to_pcm16

    audio = tts.synthesize(text, seed=0)
    audio = audio[: int(np.nonzero(np.abs(audio) > 0.01)[0][-1]) + 480]
    padded = np.zeros(-(-len(audio) // FRAME_SAMPLES) * FRAME_SAMPLES, np.float32)
    padded[: len(audio)] = audio
    return [float_to_pcm16(f) for f in padded.reshape(-1, FRAME_SAMPLES)]


class Speaker:
    """One session's microphone: a frame every 80 ms, speech when queued, else silence."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.queue: list[bytes] = []
        self.done_at: float | None = None  # when the queued speech's last frame went out

    def say(self, frames: list[bytes]) -> None:
        self.queue, self.done_at = list(frames), None

    async def run(self) -> None:
        silence = bytes(2 * FRAME_SAMPLES)
        start = time.monotonic()
        for n in range(10**9):
            await asyncio.sleep(max(0.0, start + n * PERIOD_S - time.monotonic()))
            frame = self.queue.pop(0) if self.queue else silence
            audio = base64.b64encode(frame).decode()
            await self.ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": audio}))
            if frame is not silence and not self.queue:
                self.done_at = time.monotonic()


async def one_session(
    url: str, index: int, questions: list[tuple[list[bytes], tuple[str, ...]]], turns: int, delay_s: float
) -> list[Turn]:
    await asyncio.sleep(delay_s)
    out: list[Turn] = []
    async with websockets.connect(url, max_size=None) as ws:
        speaker = Speaker(ws)
        mic = asyncio.create_task(speaker.run())
        try:
            for t in range(turns):
                frames, words = questions[(index + t) % len(questions)]
                speaker.say(frames)
                first, text = await answer(ws, speaker)
                eos = speaker.done_at
                ms = None if first is None or eos is None else 1000 * (first - eos)
                out.append(Turn(index, t, ms, any(w in text.lower() for w in words)))
                await asyncio.sleep(1.0)
        finally:
            mic.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await mic
    return out


async def answer(ws: Any, speaker: Speaker, deadline_s: float = 60.0) -> tuple[float | None, str]:
    """Read until the answer to the question being spoken is done: (first audio time, transcript)."""
    first, text = None, ""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            raw = await asyncio.wait_for(ws.recv(), max(0.01, end - time.monotonic()))
        except TimeoutError:
            break
        event = json.loads(raw)
        kind = event.get("type")
        if speaker.done_at is None:  # still speaking: nothing said now answers this question
            continue
        if kind == "response.output_audio.delta" and first is None:
            first = time.monotonic()
        elif kind == "response.output_audio_transcript.done":
            text = event.get("transcript", "")
        elif kind == "response.done" and first is not None:
            return first, text
    return first, text


@contextlib.asynccontextmanager
async def cascade_server(sessions: int, threads: int) -> AsyncIterator[tuple[str, Any]]:
    config = config_from_mapping(
        {
            "robot": {"enabled": False},
            "world": {"enabled": False},
            "voice": {"enabled": False},
            "server": {"log_level": "warning", "start_timeout_s": 600},
            "duplex": {
                "enabled": True,
                "model": "duplex-cascade",
                "max_sessions": sessions,
                "torch_threads": threads,
            },
        }
    )
    async with kind_server(config, "duplex") as (url, service):
        yield url.replace("http://", "ws://") + "/v1/duplex", service


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from models.voice.tts import HibariTts

    tts = HibariTts()
    questions = [(speech_frames(tts, q), words) for q, words in QUESTIONS]
    turn_s = 6.0  # about one question and its answer: the spread of the sessions' starts
    figures: dict[str, Any] = {}
    async with cascade_server(max(args.sessions), args.threads) as (url, service):
        figures["step_ms_at_slots"] = round(1000 * service.step_seconds[max(service.step_seconds)], 2)
        for n in args.sessions:
            clock = service.clock
            before = (clock.steps, clock.late_steps, clock.missed_steps)
            runs = [one_session(url, i, questions, args.turns, i * turn_s / n) for i in range(n)]
            turns = [t for ts in await asyncio.gather(*runs) for t in ts if t.index > 0]
            timed = [t.eos_to_audio_ms for t in turns if t.eos_to_audio_ms is not None]
            p50 = statistics.median(timed) if timed else None
            p95 = sorted(timed)[min(len(timed) - 1, int(0.95 * len(timed)))] if timed else None
            figures[f"eos_to_audio_ms_p50_{n}"] = None if p50 is None else round(p50)
            figures[f"eos_to_audio_ms_p95_{n}"] = None if p95 is None else round(p95)
            figures[f"answered_{n}"] = round(sum(t.answered for t in turns) / max(1, len(turns)), 2)
            figures[f"steps_{n}"] = clock.steps - before[0]
            figures[f"late_steps_{n}"] = clock.late_steps - before[1]
            figures[f"missed_steps_{n}"] = clock.missed_steps - before[2]
            print(
                f"{n} session(s): end of speech -> first audio p50 {p50 and round(p50)} ms, p95 "
                f"{p95 and round(p95)} ms over {len(timed)} turns; answered {figures[f'answered_{n}']}; "
                f"late steps {figures[f'late_steps_{n}']} of {figures[f'steps_{n}']}"
            )
    figures["load_avg_1m"] = round(os.getloadavg()[0], 2)
    return figures


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="realtime bench duplex-cascade", description=__doc__.splitlines()[0])
    p.add_argument("--sessions", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2])
    p.add_argument("--turns", type=int, default=4, help="questions per session (the first is a warm-up)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (duplex.torch_threads)")
    args = p.parse_args(argv)
    print(
        f"duplex-cascade on the CPU: sessions {args.sessions}, {args.turns} turns each; load {os.getloadavg()}"
    )
    print(json.dumps(asyncio.run(run(args))))
    return 0
