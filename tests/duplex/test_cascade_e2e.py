"""The default duplex model (``duplex-cascade``) converses, end to end: the real server over
loopback with the offline voice parts (Silero VAD, Whisper-base, SmolLM2-135M, hibari), a
question spoken by the hibari voice at real-time pace (80 ms appends, then the silence a live
microphone sends), the answer's audio transcribed by the bundled Whisper; and the demo page in
headless Chromium, whose fake microphone asks the same question. One server for the module: the
weights load once."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
from collections.abc import AsyncIterator, Callable

import numpy as np
import pytest
import soxr
from openai import AsyncOpenAI

from models.duplex.stage import FRAME_SAMPLES, SAMPLE_RATE
from models.voice.audio import float_to_pcm16, pcm16_to_float
from tests.browser.conftest import browser, open_page  # noqa: F401 (the headless Chromium fixture)
from tests.duplex.kind_server import connect, duplex_server
from tests.voice.speech import QUESTION, spoken_24k

pytestmark = [pytest.mark.timeout(300), pytest.mark.asyncio(loop_scope="session")]

STORY = "Tell me a long story about a dragon."
INTERRUPTION = "What is the capital of Germany?"
PERIOD_S = FRAME_SAMPLES / SAMPLE_RATE


@pytest.fixture(scope="module")
async def cascade():
    async with duplex_server(None, server={"start_timeout_s": 600}, model="duplex-cascade") as (
        base,
        service,
        _,
    ):
        yield base, service


class Microphone:
    """A live microphone's stream: 80 ms frames every 80 ms, silence unless ``say`` queued speech.
    ``spoke_at`` is when the last frame of the last utterance went out."""

    def __init__(self, send: Callable[[str], object]) -> None:
        self.send = send
        self.queue: list[np.ndarray] = []
        self.spoke_at: float | None = None

    def say(self, text: str) -> None:
        audio = spoken_24k(text, 0.0, 0.0)
        audio = audio[: int(np.nonzero(np.abs(audio) > 0.01)[0][-1]) + 480]  # the voice ends here
        frames = -(-len(audio) // FRAME_SAMPLES)
        padded = np.zeros(frames * FRAME_SAMPLES, np.float32)
        padded[: len(audio)] = audio
        self.queue += list(padded.reshape(frames, FRAME_SAMPLES))
        self.spoke_at = None

    async def run(self) -> None:
        start = time.monotonic()
        for frame in range(1_000_000):
            await asyncio.sleep(max(0.0, start + frame * PERIOD_S - time.monotonic()))
            speech = self.queue.pop(0) if self.queue else np.zeros(FRAME_SAMPLES, np.float32)
            await self.send(base64.b64encode(float_to_pcm16(speech)).decode())
            if self.queue == [] and self.spoke_at is None and speech.any():
                self.spoke_at = time.monotonic()


@contextlib.asynccontextmanager
async def live(mic: Microphone) -> AsyncIterator[Microphone]:
    task = asyncio.create_task(mic.run())
    try:
        yield mic
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def transcribe(service, pcm16: bytes) -> str:
    """The bundled Whisper (the server's own instance: the weights load once) on 24 kHz pcm16."""
    audio = soxr.resample(pcm16_to_float(pcm16), SAMPLE_RATE, 16_000).astype(np.float32)
    return service.stage.parts.asr.transcribe(audio).text


async def test_a_stock_openai_client_asks_a_question_and_hears_the_answer(cascade) -> None:
    base, service = cascade
    client = AsyncOpenAI(websocket_base_url=f"{base}/v1", api_key="unused")
    async with client.realtime.connect(model="gpt-realtime", extra_query={"mode": "duplex"}) as conn:
        created = await asyncio.wait_for(conn.recv(), 30)
        assert created.type == "session.created"
        mic = Microphone(lambda audio: conn.input_audio_buffer.append(audio=audio))
        mic.say(QUESTION)
        audio, transcripts, first_audio_at = b"", [], None
        async with live(mic):
            while True:
                event = await asyncio.wait_for(conn.recv(), 60)
                if event.type == "response.output_audio.delta":
                    assert mic.spoke_at is not None, "the model spoke over the question"
                    first_audio_at = first_audio_at or time.monotonic()
                    audio += base64.b64decode(event.delta)
                elif event.type == "response.output_audio_transcript.done":
                    transcripts.append(event.transcript)
                elif event.type == "response.done":
                    assert event.response.status == "completed", event.response
                    break
        heard = transcribe(service, audio)
        assert "paris" in heard.lower(), heard
        assert "paris" in transcripts[0].lower(), transcripts
        assert len(audio) >= 2 * SAMPLE_RATE  # about a second of speech, at least
        latency_ms = 1000 * (first_audio_at - mic.spoke_at)
        print(f"end of speech -> first audio: {latency_ms:.0f} ms; heard {heard!r}")


async def test_barge_in_stops_the_reply_within_a_frame_and_the_interruption_is_answered(cascade) -> None:
    base, service = cascade
    async with connect(f"{base}/v1/duplex") as c:
        created = await c.next()
        sid = created["session"]["id"]
        mic = Microphone(lambda audio: c.send(type="input_audio_buffer.append", audio=audio))
        mic.say(STORY)
        async with live(mic):
            story = await c.until("response.speak", timeout=60)
            story_id = story[-1]["response_id"]
            deltas = 0
            while deltas < 12:  # a second of the story
                event = await c.next(30)
                deltas += event["type"] == "response.output_audio.delta"
            epoch = event["epoch"]
            mic.say(INTERRUPTION)
            after: list[tuple[float, dict]] = []
            while not any(e["type"] == "response.done" and e["response"]["id"] != story_id for _, e in after):
                event = await c.next(60)
                after.append((time.monotonic(), event))
        at = next(i for i, (_, e) in enumerate(after) if e["epoch"] > epoch)
        bumped_at, bump = after[at]
        assert bump["type"] == "input_audio_buffer.speech_started" and bump["epoch"] == epoch + 1
        audio = [(t, e) for t, e in after if e["type"] == "response.output_audio.delta"]
        assert [e for t, e in audio if e["epoch"] <= epoch and t > bumped_at + PERIOD_S] == []
        assert [e for _, e in after[at:] if e.get("response_id") == story_id and "delta" in e] == []
        done = next(e for _, e in after if e["type"] == "response.done" and e["response"]["id"] == story_id)
        assert done["response"]["status"] == "cancelled"
        assert done["response"]["status_details"]["reason"] == "turn_detected"
        answers = [e for _, e in after if e["type"] == "response.output_audio_transcript.done"]
        answer = next(e for e in answers if e["response_id"] != story_id)
        assert "berlin" in answer["transcript"].lower(), answer
        history = service.stage.sessions[_slot(service, sid)].history
        assert [m.role for m in history] == ["user", "assistant", "user", "assistant"]
        assert "germany" in history[2].content.lower()
        told = history[1].content
        assert told and len(told) < 200, told  # what was heard of the story: cut at the barge-in


def _slot(service, session_id: str) -> int:
    return next(
        i for i, s in enumerate(service.stage.sessions) if s is not None and s.session_id == session_id
    )


async def test_the_demo_page_is_answered(cascade, browser, tmp_path) -> None:  # noqa: F811 (fixture)
    """``/demo/duplex`` as a person uses it: "start talking", the (fake) microphone asks "What is
    the capital of France?", the page plays the answer and shows its transcript."""
    base, service = cascade
    http = base.replace("ws://", "http://")
    async with open_page(browser, tmp_path / "duplex-cascade-page.png") as (page, console):
        await page.goto(f"{http}/demo/duplex")
        await page.click("#start")
        answered = "Object.values(window.duplexStats.finalTranscripts).some((t) => /paris/i.test(t))"
        await page.wait_for_function(answered, timeout=90_000)
        stats = await page.evaluate("window.duplexStats")
        await page.click("#stop")
        await page.wait_for_function("window.duplexStats.state === 'closed'", timeout=10_000)
    assert stats["audioDeltas"] > 10 and stats["ackedMs"] > 0, stats  # the answer arrived and played
    assert {"speaking", "listening"} <= set(stats["indicator"])
    assert stats["errors"] == [] and console.errors == [], (stats["errors"], console.errors)
