"""WebRTC calls (issue 31): a Python aiortc client places calls on the real server over loopback.

It speaks the question (synthesized by the hibari voice) into its microphone track, hears the
answer as Opus on the server's track and transcribes it with the bundled Whisper; the events
come on the ``oai-events`` data channel, audio never does. Also: a barge-in cuts the assistant's
audio and its item at what was heard, client secrets place one call each, the multipart form
starts the call with its session, the beta form speaks beta, hang-up ends the session, and bad
offers get OpenAI's typed errors.
"""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import pytest

pytest.importorskip("aiortc", reason="the webrtc extra is not installed (pip install -e '.[webrtc]')")

from clients.webrtc_call import RealtimeCall  # noqa: E402
from tests.voice.realtime_client import API_KEY, voice_server  # noqa: E402
from tests.voice.speech import spoken_24k  # noqa: E402

pytestmark = [pytest.mark.timeout(180), pytest.mark.asyncio(loop_scope="session")]
MAX_CALLS = 3
LONG_QUESTION = "Tell me about the city of Paris."


@pytest.fixture(scope="module")
async def server():
    webrtc = {"host_addresses": ["127.0.0.1"], "max_calls": MAX_CALLS, "connect_timeout_s": 5}
    async with voice_server(webrtc=webrtc) as (url, service):
        yield url.replace("ws://", "http://").removesuffix("/v1"), service


async def _released(service, timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while service.manager.occupied or len(service.calls):
        assert asyncio.get_running_loop().time() < deadline, "the call's session was not released"
        await asyncio.sleep(0.05)


async def _call(base: str, key: str = API_KEY, **kwargs) -> RealtimeCall:
    call = RealtimeCall(base, key, **kwargs)
    await call.connect()
    return call


async def test_a_spoken_question_is_answered_in_speech_on_the_track(server, spoken_question):
    base, service = server
    call = await _call(base)
    try:
        created = await call.next_event("session.created", 10)
        assert created["session"]["id"].startswith("voice-")
        call.speak(spoken_24k(spoken_question.text, 0.3, 1.5))
        await call.next_event("input_audio_buffer.speech_stopped", 30)
        transcript = await call.next_event("conversation.item.input_audio_transcription.completed", 30)
        assert all(w in transcript["transcript"].lower() for w in spoken_question.transcript_words)
        done = await call.next_event("response.done", 60)
        assert done["response"]["status"] == "completed"
        started = await call.next_event("output_audio_buffer.started", 10)
        stopped = await call.next_event("output_audio_buffer.stopped", 30)
        assert started["response_id"] == stopped["response_id"] == done["response"]["id"]
        types = [e["type"] for e in call.events]
        assert "response.output_audio.delta" not in types  # audio is on the track only
        assert types.index("output_audio_buffer.started") < types.index("output_audio_buffer.stopped")
        heard = call.heard(16_000)
        text = service.models_loaded["asr"].transcribe(heard).text.lower()
        assert any(w in text for w in spoken_question.answer_words), text
        said = done["response"]["output"][0]["content"][0]["transcript"].lower()
        assert "paris" in said, said
    finally:
        await call.close()
    await _released(service)


async def test_speaking_over_the_answer_clears_the_unplayed_audio_and_cuts_the_item(server):
    base, service = server
    call = await _call(base)
    try:
        call.speak(spoken_24k(LONG_QUESTION, 0.3, 1.5))
        started = await call.next_event("output_audio_buffer.started", 60)
        await asyncio.sleep(1.0)  # about a second of the answer plays
        mark = len(call.events)
        call.speak(spoken_24k("Stop, please.", 0.0, 1.5))
        await call.next_event("input_audio_buffer.speech_started", 30, after=mark)
        cleared = await call.next_event("output_audio_buffer.cleared", 10, after=mark)
        assert cleared["response_id"] == started["response_id"]
        truncated = await call.next_event("conversation.item.truncated", 30, after=mark)
        assert 500 <= truncated["audio_end_ms"] <= 5000, truncated
        item_id = truncated["item_id"]
        first = next(e for e in call.events if e["type"] == "response.output_item.added")
        assert item_id == first["item"]["id"]
        await asyncio.sleep(0.3)  # what arrives after the clear is silence (Opus's comfort level)
        tail = len(call.heard(48_000))
        await asyncio.sleep(0.5)
        after = call.heard(48_000)[tail:]
        assert len(after) and float(np.sqrt(np.mean(after**2))) < 0.01
    finally:
        await call.close()
    await _released(service)


async def test_a_client_secret_places_one_call_and_a_forged_one_none(server):
    base, service = server
    async with httpx.AsyncClient(base_url=base) as http:
        minted = await http.post(
            "/v1/realtime/client_secrets",
            json={"session": {"type": "realtime", "instructions": "Answer like a pirate."}},
            headers={"Authorization": f"Bearer {API_KEY}"},
        )
    secret = minted.json()["value"]
    call = await _call(base, secret)
    try:
        created = await call.next_event("session.created", 10)
        assert created["session"]["instructions"] == "Answer like a pirate."
    finally:
        await call.close()
    for key in (secret, "ek_" + "A" * 43):  # used, forged
        with pytest.raises(RuntimeError, match="401") as refused:
            await _call(base, key)
        assert "invalid_api_key" in str(refused.value)
    await _released(service)


async def test_the_multipart_form_starts_the_call_with_its_session(server):
    base, service = server
    session = {
        "type": "realtime",
        "instructions": "Answer in French.",
        "audio": {"output": {"voice": "verse"}},
    }
    call = await _call(base, session=session)
    try:
        created = await call.next_event("session.created", 10)
        assert created["session"]["instructions"] == "Answer in French."
        assert created["session"]["audio"]["output"]["voice"] == "verse"
    finally:
        await call.close()
    await _released(service)


async def test_the_beta_form_speaks_beta(server, spoken_question):
    base, service = server
    call = await _call(base, path="/v1/realtime?model=gpt-4o-realtime-preview")
    try:
        created = await call.next_event("session.created", 10)
        assert created["session"]["model"] == "gpt-4o-realtime-preview" and "voice" in created["session"]
        call.send(
            {
                "type": "conversation.item.create",
                "item": {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": spoken_question.text}],
                },
            }
        )
        call.send({"type": "response.create"})
        await call.next_event("response.audio_transcript.delta", 60)
        await call.next_event("response.done", 60)
        await call.next_event("output_audio_buffer.stopped", 30)
        assert "response.output_audio_transcript.delta" not in [e["type"] for e in call.events]
    finally:
        await call.close()
    await _released(service)


async def test_hang_up_ends_the_session_and_calls_are_bounded(server):
    base, service = server
    calls = [await _call(base) for _ in range(MAX_CALLS)]
    try:
        with pytest.raises(RuntimeError, match="429"):
            await _call(base)
        async with httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {API_KEY}"}) as http:
            for call in calls:
                assert (await http.post(f"/v1/realtime/calls/{call.call_id}/hangup")).status_code == 200
            assert (await http.post("/v1/realtime/calls/rtc_nope/hangup")).status_code == 404
    finally:
        for call in calls:
            await call.close()
    await _released(service)


async def test_bad_offers_get_typed_errors_and_hold_nothing(server):
    base, service = server
    async with httpx.AsyncClient(base_url=base) as http:
        auth = {"Authorization": f"Bearer {API_KEY}"}
        answers = {
            "not sdp": await http.post(
                "/v1/realtime/calls", content=b"hello", headers={**auth, "Content-Type": "application/sdp"}
            ),
            "json": await http.post("/v1/realtime/calls", json={"sdp": "v=0"}, headers=auth),
            "too large": await http.post(
                "/v1/realtime/calls",
                content=b"v=0\r\n" + b"a" * (300 * 1024),
                headers={**auth, "Content-Type": "application/sdp"},
            ),
            "no key": await http.post(
                "/v1/realtime/calls", content=b"v=0\r\n", headers={"Content-Type": "application/sdp"}
            ),
            "no ice": await http.post(
                "/v1/realtime/calls",
                content=b"v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\n",
                headers={**auth, "Content-Type": "application/sdp"},
            ),
        }
    status = {name: answer.status_code for name, answer in answers.items()}
    assert status == {"not sdp": 400, "json": 400, "too large": 413, "no key": 401, "no ice": 400}, status
    for name in ("not sdp", "json", "too large", "no ice"):
        error = answers[name].json()["error"]
        assert error["type"] == "invalid_request_error" and error["message"], (name, error)
    await _released(service)
