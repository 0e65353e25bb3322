"""The voice page (``clients/web/voice.html``) in headless Chromium against the real voice server
(Silero VAD, Whisper-base, SmolLM2, hibari) over loopback, with an API key configured.

Chromium's fake microphone plays the spoken question (``tests/browser/conftest.py``: hibari voice,
then silence, looped). The page connects with the ``realtime`` subprotocol and the key as the
``openai-insecure-api-key.<key>`` subprotocol, streams the microphone through its AudioWorklet,
and the server's VAD turn gets a spoken answer: the user transcript names the question's words,
the assistant transcript the answer's, audio deltas are played and the latency readout shows.
Then a typed request for a story plays while the microphone's next loop speaks over it (the
server has usually finished generating by then: the interruption is the page's): playback is
cleared at once, ``conversation.item.truncate`` is sent with what was heard, the server confirms
it and the line is marked interrupted. The console stays clean. One server for the module.
"""

from __future__ import annotations

import pytest

from tests.browser.conftest import mic_loop_s, open_page
from tests.voice.realtime_client import API_KEY

async_api = pytest.importorskip("playwright.async_api", reason="Python Playwright is not installed")
pytestmark = [pytest.mark.timeout(300), pytest.mark.asyncio(loop_scope="session")]

BARGE_IN_ATTEMPTS = 3
SEND_AHEAD_MS = 4000  # the story is asked for this long before the next loop: its audio is playing then


async def test_voice_page_answers_the_spoken_question_and_barge_in_truncates(browser, voice_base, tmp_path):
    async with open_page(browser, tmp_path / "voice-page.png") as (page, console):
        await page.goto(f"{voice_base}/demo/voice?api_key={API_KEY}")
        await page.click("#start")  # a user gesture: the AudioContext may start
        await page.wait_for_function("window.voiceStats?.state === 'listening'", timeout=30_000)
        await page.wait_for_function(
            "window.voiceStats.responses.some((r) => r.status === 'completed')", timeout=150_000
        )
        await page.wait_for_timeout(500)  # the answer is playing
        turn = await page.evaluate("window.voiceStats")
        transcript = await page.locator("#transcript").inner_text()
        readout = await page.locator("#latency").inner_text()

        # a story timed to be playing when the microphone's next loop speaks over it
        loop_ms = mic_loop_s() * 1000
        for _ in range(BARGE_IN_ATTEMPTS):
            await page.wait_for_function("window.voiceStats?.activeResponse === null", timeout=60_000)
            started = (await page.evaluate("window.voiceStats.speechStartedAt"))[-1]
            wait_ms = started + loop_ms - SEND_AHEAD_MS - await page.evaluate("performance.now()")
            await page.wait_for_timeout(max(0.0, wait_ms))
            await page.fill("#text", "Tell me a long story about a brave knight, a dragon and a castle.")
            await page.click("#send")
            try:
                await page.wait_for_function("window.voiceStats?.truncated.length >= 1", timeout=loop_ms)
                break
            except async_api.TimeoutError:
                continue
        cut = await page.evaluate("window.voiceStats")
        interrupted = await page.locator("#transcript li.cut").count()

    assert turn["appended"] > 20 and turn["speechStarted"] >= 1 and turn["speechStopped"] >= 1
    assert any(all(w in t.lower() for w in ("capital", "france")) for t in turn["userTranscripts"]), turn
    answers = " ".join(turn["assistantTranscripts"].values()).lower()
    assert "paris" in answers, answers
    assert turn["audioDeltas"] > 0 and 0 < turn["firstAudioMs"][0] < 60_000
    assert turn["firstPlaybackMs"][0] >= turn["firstAudioMs"][0]
    assert "capital" in transcript.lower() and "ms" in readout
    # barge-in: playback cleared at once, truncate sent with what was heard and confirmed
    assert cut["bargeIns"] >= 1 and cut["queuedAfterClearMs"] == 0
    sent = cut["truncates"][0]
    assert (
        sent["audio_end_ms"] >= 0
        and {"item_id": sent["item_id"], "audio_end_ms": sent["audio_end_ms"]} in cut["truncated"]
    )
    assert interrupted >= 1
    assert cut["errors"] == [] and console.errors == [], (cut["errors"], console.errors)
    assert (tmp_path / "voice-page.png").stat().st_size > 0


async def test_a_typed_message_is_answered_without_the_microphone(browser, voice_base, tmp_path):
    """Typing needs no "start talking": sending connects (audio out only) and the answer comes."""
    async with open_page(browser, tmp_path / "voice-typed.png") as (page, console):
        await page.goto(f"{voice_base}/demo/voice?api_key={API_KEY}")
        await page.wait_for_function("window.voiceStats !== undefined", timeout=30_000)
        assert await page.locator("#send").is_enabled() and await page.locator("#text").is_enabled()
        await page.fill("#text", "What is the capital of France?")
        await page.click("#send")
        await page.wait_for_function(
            "window.voiceStats.responses.some((r) => r.status === 'completed')", timeout=150_000
        )
        stats = await page.evaluate("window.voiceStats")
        transcript = await page.locator("#transcript").inner_text()
        start_enabled = await page.locator("#start").is_enabled()
    assert stats["appended"] == 0 and stats["speechStarted"] == 0, "the microphone was never started"
    answer = " ".join(stats["assistantTranscripts"].values())
    assert answer.strip() and stats["errors"] == [], stats
    assert "What is the capital of France?" in transcript and answer.strip()[:20] in transcript
    assert start_enabled, "the microphone can still be added"
    assert console.errors == []
