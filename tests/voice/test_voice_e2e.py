"""The voice kind end to end: the real ``openai`` SDK (GA and beta) over loopback against the real
server with the offline models (Silero VAD, Whisper-base, SmolLM2-135M, hibari). Every server
event received is validated against the SDK's pydantic model for its type in its dialect
(``tests/voice/realtime_client.py``). One server for the module."""

from __future__ import annotations

import asyncio
import base64
import json

import numpy as np
import pytest
import soxr
import websockets

from models.voice.audio import float_to_ulaw
from realtime.protocols.oai_realtime import Dialect
from tests.voice.realtime_client import append_audio, connect, response_text, types, voice_server

pytestmark = [pytest.mark.timeout(180), pytest.mark.asyncio(loop_scope="session")]

GA, BETA = Dialect.GA, Dialect.BETA
AUDIO_DELTA = {GA: "response.output_audio.delta", BETA: "response.audio.delta"}
ITEM_ADDED = {GA: "conversation.item.added", BETA: "conversation.item.created"}
MAX_DELTA_BYTES = 24_000 * 2 // 5  # 200 ms of pcm16 at 24 kHz


@pytest.fixture(scope="module")
async def server():
    async with voice_server() as running:
        yield running


def _text_item(text: str, role: str = "user") -> dict:
    return {"type": "message", "role": role, "content": [{"type": "input_text", "text": text}]}


def _closing_then_done(events: list[dict], dialect: Dialect, response_id: str) -> None:
    """The response's closing events all come before its one ``response.done``."""
    mine = [
        e
        for e in events
        if e.get("response_id") == response_id or e.get("response", {}).get("id") == response_id
    ]
    kinds = types(mine)
    assert kinds.count("response.done") == 1 and kinds[-1] == "response.done"
    audio_done = "response.output_audio.done" if dialect is GA else "response.audio.done"
    for closing in (audio_done, "response.content_part.done", "response.output_item.done"):
        assert kinds.index(closing) < kinds.index("response.done")


async def test_spoken_question_with_server_vad_is_transcribed_and_answered_ga(server, spoken_question):
    url, _ = server
    async with connect(url, GA) as (conn, events):
        assert events.seen[0]["session"]["audio"]["input"]["turn_detection"]["type"] == "server_vad"
        await append_audio(conn, spoken_question.pcm16_24k)
        got = await events.until("response.done", timeout=90)
        kinds = types(got)
        order = [
            "input_audio_buffer.speech_started",
            "input_audio_buffer.speech_stopped",
            "input_audio_buffer.committed",
            "response.created",
            "response.output_item.added",
            "response.content_part.added",
            AUDIO_DELTA[GA],
            "response.output_audio.done",
            "response.output_audio_transcript.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.done",
        ]
        assert [k for k in kinds if k in order] == sorted((k for k in kinds if k in order), key=order.index)
        transcript = next(e for e in got if e["type"].endswith("input_audio_transcription.completed"))
        assert all(w in transcript["transcript"].lower() for w in spoken_question.transcript_words)
        assert transcript["usage"]["type"] == "duration" and transcript["usage"]["seconds"] > 1
        answer = response_text(got, GA).lower()
        assert any(w in answer for w in spoken_question.answer_words), answer
        deltas = [base64.b64decode(e["delta"]) for e in got if e["type"] == AUDIO_DELTA[GA]]
        assert deltas and max(map(len, deltas)) <= MAX_DELTA_BYTES
        done = got[-1]["response"]
        assert done["status"] == "completed" and done["output"][0]["content"][0][
            "transcript"
        ] == response_text(got, GA)
        # the user item was announced (added + done) before the response
        assert kinds.index("conversation.item.done") < kinds.index("response.output_item.added")


async def test_spoken_question_beta_dialect_manual_commit(server, spoken_question):
    url, _ = server
    async with connect(url, BETA) as (conn, events):
        assert events.seen[0]["session"]["model"] == "gpt-4o-realtime-preview"
        await conn.session.update(session={"turn_detection": None})
        updated = await events.until("session.updated")
        assert updated[-1]["session"]["turn_detection"] is None
        await conn.input_audio_buffer.commit()  # nothing appended yet
        error = (await events.until("error"))[-1]["error"]
        assert error["code"] == "input_audio_buffer_commit_empty"
        await append_audio(conn, spoken_question.pcm16_24k)
        assert not [e for e in await events.quiet(1.0) if "speech" in e["type"]]  # no VAD now
        await conn.input_audio_buffer.commit()
        await conn.response.create()
        got = await events.until("response.done", timeout=90)
        kinds = types(got)
        assert "input_audio_buffer.committed" in kinds and ITEM_ADDED[BETA] in kinds
        assert "conversation.item.done" not in kinds and "response.output_audio.delta" not in kinds
        assert kinds.index(ITEM_ADDED[BETA], kinds.index("response.output_item.added")) < kinds.index(
            "response.content_part.added"
        )  # beta: the assistant item is created before its first content part
        assert any(w in response_text(got, BETA).lower() for w in spoken_question.answer_words), [
            (e["type"], e.get("transcript"), e.get("delta", "")[:20])
            for e in got
            if "audio.delta" not in e["type"]
        ]
        assert AUDIO_DELTA[BETA] in kinds


async def test_session_update_merges_and_errors_keep_the_socket_open(server):
    url, _ = server
    async with connect(url, GA) as (conn, events):
        await conn.session.update(
            session={
                "type": "realtime",
                "audio": {"input": {"turn_detection": {"type": "server_vad", "threshold": 0.8}}},
            }
        )
        vad = (await events.until("session.updated"))[-1]["session"]["audio"]["input"]["turn_detection"]
        assert vad["type"] == "server_vad" and vad["threshold"] == 0.8 and vad["silence_duration_ms"] == 500
        for raw, code in (
            ("{not json", "invalid_json"),
            ('{"type": "nope.nothing"}', "invalid_value"),
            ('{"type": "input_audio_buffer.append", "audio": "!!!"}', "invalid_audio_base64"),
            (
                '{"type": "conversation.item.delete", "item_id": "item_missing", "event_id": "e1"}',
                "item_not_found",
            ),
            ('{"type": "conversation.item.retrieve", "item_id": "item_missing"}', "item_not_found"),
            (
                '{"type": "session.update", "session": {"type": "realtime", "prompt": {"id": "pmpt_1"}}}',
                "unsupported_feature",
            ),
        ):
            await conn.send_raw(raw)
            error = (await events.until("error"))[-1]["error"]
            assert error["code"] == code, (raw, error)
        assert error["event_id"] is None
        await conn.response.cancel()
        assert (await events.until("error"))[-1]["error"]["code"] == "response_cancel_not_active"
        await conn.response.create(response={"input": [{"type": "item_reference", "id": "item_gone"}]})
        error = (await events.until("error"))[-1]["error"]
        assert error["code"] == "item_not_found" and error["param"] == "response.input"
        await conn.conversation.item.create(item=_text_item("Hello there."))
        added = await events.until("conversation.item.done")
        item_id = added[-1]["item"]["id"]
        await conn.conversation.item.retrieve(item_id=item_id)
        assert (await events.until("conversation.item.retrieved"))[-1]["item"]["id"] == item_id
        await conn.conversation.item.delete(item_id=item_id)
        assert (await events.until("conversation.item.deleted"))[-1]["item_id"] == item_id


async def test_cancel_races_and_one_active_response(server):
    url, _ = server
    async with connect(url, GA) as (conn, events):
        await conn.conversation.item.create(
            item=_text_item("Tell me a long story about a dragon and a knight.")
        )
        await events.until("conversation.item.done")
        # cancel sent right behind create, before the client saw response.created
        await conn.response.create()
        await conn.response.cancel()
        got = await events.until("response.done")
        response_id = got[-1]["response"]["id"]
        assert got[-1]["response"]["status"] == "cancelled"
        assert got[-1]["response"]["status_details"]["reason"] == "client_cancelled"
        assert types(got).count("response.created") == 1
        assert not [e for e in await events.quiet(0.5) if e.get("response_id") == response_id]
        # create while one is active, then a double cancel
        await conn.response.create()
        created = (await events.until("response.created"))[-1]["response"]["id"]
        await conn.response.create()
        error = (await events.until("error"))[-1]["error"]
        assert error["code"] == "conversation_already_has_active_response" and created in error["message"]
        await conn.response.cancel()
        await conn.response.cancel()
        got = await events.until("response.done")
        assert got[-1]["response"]["status"] == "cancelled"
        assert "response_cancel_not_active" in [e["error"]["code"] for e in got if e["type"] == "error"]
        _closing_then_done(got, GA, created)
        assert not [e for e in await events.quiet(0.5) if e.get("response_id") == created]


async def test_barge_in_cancels_the_response_and_nothing_of_it_follows(server, spoken_question):
    url, service = server
    aborted = service.llm.aborts
    async with connect(url, GA) as (conn, events):
        await conn.conversation.item.create(
            item=_text_item("Tell me a long story about a dragon and a knight.")
        )
        await events.until("conversation.item.done")
        await conn.response.create()
        first = await events.until("response.output_audio_transcript.delta")
        response_id = first[-1]["response_id"]
        await append_audio(conn, spoken_question.pcm16_24k)  # the user talks over the answer
        got = await events.until("response.done", timeout=60)
        assert "input_audio_buffer.speech_started" in types(got)
        assert service.llm.aborts > aborted  # the LLM's generation was stopped, not drained
        done = got[-1]["response"]
        assert done["id"] == response_id and done["status"] == "cancelled"
        assert done["status_details"]["reason"] == "turn_detected"
        _closing_then_done(first + got, GA, response_id)
        # the new turn is answered by a new response; nothing of the old one ever follows
        after = await events.until("response.done", timeout=90)
        assert not [e for e in after if e.get("response_id") == response_id]
        assert after[-1]["response"]["id"] != response_id and after[-1]["response"]["status"] == "completed"


async def test_truncate_is_clamped_to_generated_audio(server):
    url, _ = server
    async with connect(url, GA) as (conn, events):
        await conn.conversation.item.create(item=_text_item("What is the capital of France?"))
        await events.until("conversation.item.done")
        await conn.response.create()
        got = await events.until("response.done", timeout=60)
        item = got[-1]["response"]["output"][0]
        audio = sum(len(base64.b64decode(e["delta"])) for e in got if e["type"] == AUDIO_DELTA[GA])
        audio_ms = audio * 1000 // (24_000 * 2)
        await conn.conversation.item.truncate(
            item_id=item["id"], content_index=0, audio_end_ms=audio_ms + 5000
        )
        error = (await events.until("error"))[-1]["error"]
        assert error["code"] == "truncate_invalid"
        assert (
            error["message"] == f"Audio content of {audio_ms}ms is already shorter than {audio_ms + 5000}ms"
        )
        await conn.conversation.item.truncate(item_id=item["id"], content_index=0, audio_end_ms=audio_ms // 2)
        truncated = (await events.until("conversation.item.truncated"))[-1]
        assert truncated["audio_end_ms"] == audio_ms // 2
        await conn.conversation.item.retrieve(item_id=item["id"])
        retrieved = (await events.until("conversation.item.retrieved"))[-1]["item"]
        assert retrieved["content"][0]["transcript"] == ""  # what the user never heard is forgotten
        assert retrieved["role"] == "assistant" and retrieved["status"] == "completed"


async def test_second_turn_prefill_reuses_the_first_turns_kv(server):
    url, service = server
    before = {s.session_id for s in service.manager.list_sessions()}
    async with connect(url, GA) as (conn, events):
        (session,) = [s for s in service.manager.list_sessions() if s.session_id not in before]
        usages = []
        for question in ("What is the capital of France?", "And what is the capital of Italy?"):
            await conn.conversation.item.create(item=_text_item(question))
            await events.until("conversation.item.done")
            await conn.response.create(response={"output_modalities": ["text"]})
            got = await events.until("response.done", timeout=60)
            assert "response.output_text.delta" in types(got) and AUDIO_DELTA[GA] not in types(got)
            usages.append((service.llm.last_usage(session.session_id), got[-1]["response"]["usage"]))
        (first, _), (second, wire) = usages
        assert first.cached_tokens == 0
        # turn 2's prompt starts with turn 1's prompt and answer: all of it came from resident KV
        assert second.cached_tokens >= first.prompt_tokens + first.generated_tokens - 2
        assert wire["input_token_details"]["cached_tokens"] == second.cached_tokens
        assert wire["input_tokens"] == second.prompt_tokens


async def test_subprotocol_answered_served_model_header_and_unknown_paths_close_clearly(server):
    url, service = server
    async with websockets.connect(
        url + "/realtime?model=gpt-realtime",
        subprotocols=["realtime", "openai-insecure-api-key.voice-test-key"],
    ) as ws:
        assert ws.subprotocol == "realtime"
        assert ws.response.headers["x-served-model"] == service.config.served_model
        assert '"session.created"' in await asyncio.wait_for(ws.recv(), 10)
    async with websockets.connect(url + "/no/such/thing?api_key=voice-test-key") as ws:
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await asyncio.wait_for(ws.recv(), 10)
    assert (
        closed.value.rcvd.code == 1008 and closed.value.rcvd.reason == "no such endpoint: /v1/no/such/thing"
    )


async def test_g711_in_and_out_beta(server, spoken_question):
    url, _ = server
    pcm = np.frombuffer(spoken_question.pcm16_24k, "<i2").astype(np.float32) / 32768
    ulaw = float_to_ulaw(soxr.resample(pcm, 24_000, 8_000))
    async with connect(url, BETA) as (conn, events):
        await conn.session.update(
            session={"input_audio_format": "g711_ulaw", "output_audio_format": "g711_ulaw"}
        )
        session = (await events.until("session.updated"))[-1]["session"]
        assert session["input_audio_format"] == session["output_audio_format"] == "g711_ulaw"
        for start in range(0, len(ulaw), 1600):  # 200 ms of 8 kHz G.711 per append
            await conn.input_audio_buffer.append(audio=base64.b64encode(ulaw[start : start + 1600]).decode())
        got = await events.until("response.done", timeout=90)
        transcript = next(e for e in got if e["type"].endswith("input_audio_transcription.completed"))
        assert all(w in transcript["transcript"].lower() for w in spoken_question.transcript_words)
        deltas = [base64.b64decode(e["delta"]) for e in got if e["type"] == AUDIO_DELTA[BETA]]
        assert deltas and max(map(len, deltas)) <= 1600  # 200 ms of 8 kHz, one byte a sample
        assert got[-1]["response"]["output_audio_format"] == "g711_ulaw"


async def test_a_full_server_says_why_and_closes_1013(server):
    url, service = server
    key = "?api_key=voice-test-key"
    opened = []
    for _ in range(100):  # the previous tests' sessions are released once their sockets closed
        if not service.manager.list_sessions():
            break
        await asyncio.sleep(0.05)
    try:
        for _ in range(service.manager.capacity):
            ws = await websockets.connect(url + "/realtime" + key)
            opened.append(ws)
            assert '"session.created"' in await asyncio.wait_for(ws.recv(), 10)
        async with websockets.connect(url + "/realtime" + key) as ws:
            error = json.loads(await asyncio.wait_for(ws.recv(), 10))
            assert error["type"] == "error" and error["error"]["type"] == "server_error"
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await asyncio.wait_for(ws.recv(), 10)
        assert closed.value.rcvd.code == 1013
    finally:
        for ws in opened:
            await ws.close()


async def test_a_client_created_audio_item_is_transcribed_and_answered(server, spoken_question):
    url, _ = server
    async with connect(url, GA) as (conn, events):
        audio = base64.b64encode(spoken_question.pcm16_24k).decode()
        await conn.conversation.item.create(
            item={"type": "message", "role": "user", "content": [{"type": "input_audio", "audio": audio}]}
        )
        await conn.response.create()
        got = await events.until("response.done", timeout=90)
        kinds = types(got)
        transcript = next(e for e in got if e["type"].endswith("input_audio_transcription.completed"))
        assert all(w in transcript["transcript"].lower() for w in spoken_question.transcript_words)
        assert kinds.index("conversation.item.input_audio_transcription.completed") < kinds.index(
            "response.output_item.added"
        )  # the response waited for the transcript it needs
        assert any(w in response_text(got, GA).lower() for w in spoken_question.answer_words)


async def test_the_transcription_started_at_the_candidate_end_of_speech_is_reused(server, spoken_question):
    url, service = server
    started, used = service.asr_speculations, service.asr_speculations_used
    async with connect(url, GA) as (conn, events):
        await append_audio(conn, spoken_question.pcm16_24k)
        got = await events.until("response.done", timeout=90)
    assert service.asr_speculations == started + 1 and service.asr_speculations_used == used + 1
    transcript = next(e for e in got if e["type"].endswith("input_audio_transcription.completed"))
    assert all(w in transcript["transcript"].lower() for w in spoken_question.transcript_words)
    stopped = next(e for e in got if e["type"] == "input_audio_buffer.speech_stopped")
    started_at = next(e for e in got if e["type"] == "input_audio_buffer.speech_started")
    committed_s = (stopped["audio_end_ms"] - started_at["audio_start_ms"]) / 1000
    assert transcript["usage"]["seconds"] == pytest.approx(committed_s, abs=0.05)  # the committed audio's


async def test_a_long_reply_is_generated_no_further_ahead_of_playback_than_the_lead(server):
    url, service = server
    lead_s = service.config.llm_max_lead_s
    async with connect(url, GA) as (conn, events):
        await conn.conversation.item.create(
            item=_text_item("Tell me a long story about a dragon and a knight.")
        )
        await conn.response.create()
        first_at, audio_s, leads, previous = None, 0.0, [], ""
        while (event := await events.next(60))["type"] != "response.done":
            if event["type"] == AUDIO_DELTA[GA]:
                now = asyncio.get_running_loop().time()
                first_at = first_at or now
                if previous != AUDIO_DELTA[GA]:  # a clause's audio starts: how far ahead was the reply?
                    leads.append(audio_s - (now - first_at))
                audio_s += len(base64.b64decode(event["delta"])) / (24_000 * 2)
            previous = event["type"]
    assert audio_s > lead_s + 4, audio_s  # long enough to be paced
    # each clause was generated while the audio before it was at most lead_s ahead of playback;
    # unpaced, SmolLM2 runs several times faster than speech and the lead grows with the reply
    assert max(leads) <= lead_s + 1.0, leads
