"""Shared browser fixtures: one headless Chromium (Debian's, at /usr/bin/chromium) per test session.

Python Playwright drives it with the launch flags that work on these machines, a fake camera and a
fake microphone that plays :data:`tests.voice.speech.QUESTION` (spoken offline by the hibari voice,
then silence; Chromium loops the file). Each test opens its pages in a fresh context through
:func:`open_page`, which records console errors and uncaught exceptions and saves a screenshot to
the test's tmp dir. Everything skips with a reason where Chromium or Playwright is absent.
"""

from __future__ import annotations

import contextlib
import wave
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import pytest_asyncio

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--use-fake-ui-for-media-stream",
    "--use-fake-device-for-media-stream",
    "--allow-loopback-in-peer-connection",  # WebRTC host candidates on 127.0.0.1 (a box may have no other)
]
# the fake microphone: the question, then a silence long enough for its answer to play out
MIC_LEAD_S, MIC_TAIL_S = 0.5, 12.0


def mic_loop_s() -> float:
    """Seconds between two loops of the fake microphone's question (the WAV's duration)."""
    from models.voice.tts import SAMPLE_RATE
    from tests.voice.speech import QUESTION, spoken_24k

    return len(spoken_24k(QUESTION, MIC_LEAD_S, MIC_TAIL_S)) / SAMPLE_RATE


def write_mic_wav(path: Path) -> Path:
    """The fake microphone's file: the spoken question as 16-bit mono 24 kHz WAV."""
    from models.voice.audio import float_to_pcm16
    from models.voice.tts import SAMPLE_RATE
    from tests.voice.speech import QUESTION, spoken_24k

    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(SAMPLE_RATE)
        out.writeframes(float_to_pcm16(spoken_24k(QUESTION, MIC_LEAD_S, MIC_TAIL_S)))
    return path


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def voice_base() -> AsyncIterator[str]:
    """An in-process voice server's base URL (``http://127.0.0.1:PORT``), one per test module, with
    an API key (``tests.voice.realtime_client.API_KEY``) and WebRTC calls on loopback candidates."""
    from tests.voice.realtime_client import voice_server

    async with voice_server(webrtc={"host_addresses": ["127.0.0.1"]}) as (url, _):
        yield url.replace("ws://", "http://").removesuffix("/v1")


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def browser(tmp_path_factory):
    if not CHROMIUM.exists():
        pytest.skip(
            "Debian's Chromium is not at /usr/bin/chromium (apt-get install -y chromium; .ci/run does it)"
        )
    async_api = pytest.importorskip(
        "playwright.async_api", reason="Python Playwright is not installed (pip install -e '.[test]')"
    )
    wav = write_mic_wav(tmp_path_factory.mktemp("mic") / "question.wav")
    async with async_api.async_playwright() as pw:
        chromium = await pw.chromium.launch(
            executable_path=str(CHROMIUM),
            headless=True,
            args=[*FLAGS, f"--use-file-for-fake-audio-capture={wav}"],
        )
        try:
            yield chromium
        finally:
            await chromium.close()


@dataclass
class Console:
    """What a page reported: console errors and uncaught exceptions (both must stay empty)."""

    errors: list[str] = field(default_factory=list)


@contextlib.asynccontextmanager
async def open_page(browser, screenshot: Path) -> AsyncIterator[tuple[object, Console]]:
    """A page in a fresh browser context; its screenshot is saved to ``screenshot`` on the way out."""
    context = await browser.new_context(viewport={"width": 1100, "height": 900})
    page = await context.new_page()
    console = Console()
    page.on("console", lambda m: console.errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: console.errors.append(str(e)))
    try:
        yield page, console
        await page.screenshot(path=str(screenshot), full_page=True)
    finally:
        await context.close()


def world_page_config():
    """The deploy config the world page tests serve: the world kind alone (world-tiny, one torch
    thread) with a fixed memory budget."""
    from realtime.config import config_from_mapping

    return config_from_mapping(
        {
            "robot": {"enabled": False},
            "runtime": {"memory_available_bytes": 2**30},
            "world": {"enabled": True, "torch_threads": 1},
        }
    )
