"""The WebRTC voice page (``clients/web/voice-webrtc.html``) in headless Chromium against the real
voice server (Silero VAD, Whisper-base, SmolLM2, hibari) over loopback, with an API key configured.

The page is OpenAI's browser recipe with OpenAI's own code: it mints an ephemeral client secret
from this server (``POST /v1/realtime/client_secrets`` with the key as ``Authorization: Bearer``),
then the real ``@openai/agents-realtime`` package (vendored, ``clients/web/agents-realtime.mjs``)
places a WebRTC call with it: ``RealtimeSession(agent, {transport: "webrtc"})`` and
``session.connect({apiKey: secret, url: <server>/v1/realtime/calls})``, nothing else changed. The
SDK opens Chromium's fake microphone (``tests/browser/conftest.py``: the spoken question, then
silence, looped), sends it as Opus on the media track and speaks OpenAI Realtime events on the
``oai-events`` data channel. Checked: the secret was minted and the call answered (a call id
from ``Location``), the SDK's history holds the user's transcript of the question and an assistant
answer, the remote audio track received audio with energy (``inbound-rtp`` stats), hang-up closes
it, and the console stays clean. Skipped where ``aiortc`` (the server's WebRTC stack) is absent.
"""

from __future__ import annotations

import pytest

from tests.browser.conftest import open_page
from tests.voice.realtime_client import API_KEY

pytest.importorskip(
    "aiortc", reason="aiortc (the server's WebRTC stack) is not installed (pip install -e '.[webrtc]')"
)
async_api = pytest.importorskip("playwright.async_api", reason="Python Playwright is not installed")
pytestmark = [pytest.mark.timeout(300), pytest.mark.asyncio(loop_scope="session")]

ANSWERED = (
    "window.webrtcDemo.history.some((i) => i.role === 'assistant' && i.status === 'completed' && i.text)"
    " && window.webrtcDemo.audioReceived"
)


async def test_the_agents_sdk_holds_a_spoken_exchange_over_webrtc(browser, voice_base, tmp_path):
    async with open_page(browser, tmp_path / "voice-webrtc.png") as (page, console):
        await page.goto(f"{voice_base}/demo/voice-webrtc?api_key={API_KEY}")
        await page.wait_for_function("window.webrtcDemo !== undefined", timeout=30_000)
        await page.click("#call")  # a user gesture: the SDK's audio element may play
        await page.wait_for_function(
            "['connected', 'closed'].includes(window.webrtcDemo.state)", timeout=30_000
        )
        await page.wait_for_function(f"{ANSWERED} || window.webrtcDemo.state === 'closed'", timeout=150_000)
        demo = await page.evaluate("window.webrtcDemo")
        transcript = await page.locator("#transcript").inner_text()
        await page.click("#call")  # hang up
        await page.wait_for_function("window.webrtcDemo.state === 'closed'", timeout=10_000)
        button = await page.locator("#call").inner_text()

    assert demo["errors"] == [] and demo["secretMinted"] and demo["callId"], demo
    users = [i["text"].lower() for i in demo["history"] if i["role"] == "user"]
    assert any(all(w in t for w in ("capital", "france")) for t in users), demo["history"]
    answers = [i["text"] for i in demo["history"] if i["role"] == "assistant" and i["status"] == "completed"]
    assert any(a.strip() for a in answers), demo["history"]
    # the answer came as Opus on the media track and played out with energy
    audio = demo["audio"]
    assert audio["packetsReceived"] > 0 and audio["totalSamplesReceived"] > 0, audio
    assert audio["totalAudioEnergy"] > 0 and demo["audioReceived"], audio
    # the events came on the oai-events data channel, as OpenAI sends them over WebRTC
    events = demo["events"]
    assert events.get("session.created") == 1 and events.get("response.done", 0) >= 1, events
    assert events.get("output_audio_buffer.started", 0) >= 1, events
    assert "capital" in transcript.lower() and button == "connect"
    assert console.errors == [], console.errors
    assert (tmp_path / "voice-webrtc.png").stat().st_size > 0
