"""The voice protocol's state machines, sans-I/O: a response's output events
(``output.ResponseOutput``) and the conversation's answers to item events (``conversation``)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from realtime.protocols.oai_realtime import server_events as ev
from realtime.protocols.oai_realtime.conversation import Conversation, untranscribed_audio
from realtime.protocols.oai_realtime.errors import Rejected
from realtime.protocols.oai_realtime.items import InputAudio, InputText, Message, OutputAudio
from realtime.protocols.oai_realtime.output import ResponseOutput, refusal
from realtime.protocols.oai_realtime.responses import ItemReference, ResponseSettings
from realtime.protocols.oai_realtime.session_config import (
    AudioFormat,
    FunctionTool,
    SessionConfig,
    ToolChoiceFunction,
)

SETTINGS = ResponseSettings.of_session(SessionConfig(model="m"))


def _response(settings: ResponseSettings = SETTINGS, delta_ms: int = 200) -> ResponseOutput:
    return ResponseOutput(ev.ResponseState("resp_1", settings), delta_ms)


def _names(events: list) -> list[str]:
    return [type(e).__name__ for e in events]


def test_a_spoken_response_opens_streams_and_closes_into_the_conversation() -> None:
    items = Conversation(8)
    items.insert(Message("u", "user", (InputText("hi"),)), None)
    out = _response()
    assert _names(out.open(items, message=True)) == ["OutputItemAdded", "ItemAdded", "ContentPartAdded"]
    assert out.started and items.last_id() == out.item_id and out.after_id == out.item_id
    assert _names(out.text_delta("Hello")) == ["TranscriptDelta"]
    second = np.zeros(24_000, np.float32)  # 1 s of pcm16 at 24 kHz: five 200 ms deltas
    deltas = out.audio(second)
    assert _names(deltas) == ["AudioDelta"] * 5 and {len(d.audio) for d in deltas} == {9600}
    assert out.audio_ms == 1000 and len(out.kept) == 48_000
    closing = out.finish(items, failure=None, usage=ev.Usage(10, 0, 0, 3), max_output_tokens=100)
    assert _names(closing)[-2:] == ["ResponseDone", "RateLimitsUpdated"]
    assert _names(closing)[:5] == [
        "AudioDone",
        "TranscriptDone",
        "ContentPartDone",
        "OutputItemDone",
        "ItemDone",
    ]
    done = closing[-2].response
    assert done.status == "completed" and done.output[0].content[0].transcript == "Hello"
    assert items.get(out.item_id).audio_ms == 1000 and items.previous_of(out.item_id) == "u"


def test_the_status_follows_the_cancel_the_failure_or_the_token_cap() -> None:
    items = Conversation(8)
    cancelled = _response()
    cancelled.open(items, message=True)
    assert cancelled.cancel("turn_detected") == [] and not cancelled.cancellable  # started: stop the model
    done = cancelled.finish(items, failure=None, usage=None, max_output_tokens=9)[-2].response
    assert (done.status, done.reason) == ("cancelled", "turn_detected")
    failed = _response()
    failed.open(items, message=True)
    done = failed.finish(items, failure="stage_item_failed", usage=None, max_output_tokens=9)[-2].response
    assert done.status == "failed" and done.error.code == "stage_item_failed"
    capped = _response()
    capped.open(items, message=True)
    done = capped.finish(items, failure=None, usage=ev.Usage(1, 0, 0, 9), max_output_tokens=9)[-2].response
    assert (done.status, done.reason) == ("incomplete", "max_output_tokens")


def test_a_response_cancelled_before_it_started_is_done_at_once() -> None:
    out = _response()
    (done,) = out.cancel("client_cancelled")
    assert isinstance(done, ev.ResponseDone) and done.response.status == "cancelled"


def test_forced_tool_calls_have_no_message_and_a_call_cut_short_closes_incomplete() -> None:
    items = Conversation(8)
    tools = (FunctionTool("weather"),)
    settings = replace(SETTINGS, tools=tools, tool_choice=ToolChoiceFunction("weather"))
    out = _response(settings)
    assert out.open(items, message=False) == [] and out.item_id == ""
    started = out.call_started(0, "weather")
    assert _names(started) == ["OutputItemAdded", "ItemAdded"] and started[0].output_index == 0
    assert _names(out.call_arguments(0, '{"city":')) == ["FunctionArgumentsDelta"]
    assert _names(out.call_done(0, '{"city": "Paris"}')) == [
        "FunctionArgumentsDone",
        "OutputItemDone",
        "ItemDone",
    ]
    out.call_started(1, "weather")  # cut short by the cancel below
    out.cancel("client_cancelled")
    closing = out.finish(items, failure=None, usage=None, max_output_tokens=9)
    calls = closing[-2].response.output
    assert [c.status for c in calls] == ["completed", "incomplete"] and "OutputItemDone" in _names(closing)
    assert [i.id for i in items.items()] == [c.id for c in calls]


def test_a_response_create_is_refused_for_a_missing_reference_or_an_unoffered_tool() -> None:
    items = Conversation(8)
    missing = replace(SETTINGS, input=(ItemReference("gone"),))
    assert refusal(missing, items).code == "item_not_found"
    forced = replace(SETTINGS, tool_choice=ToolChoiceFunction("nope"))
    assert refusal(forced, items).code == "invalid_value"
    assert refusal(SETTINGS, items) is None


def test_the_conversation_answers_item_events_with_events_or_refusals() -> None:
    items = Conversation(8)
    user = Message("a", "user", (InputAudio(b"\0" * (ev.MAX_RETRIEVED_AUDIO_BYTES + 2), None),))
    assert untranscribed_audio(user)  # the ASR makes its transcript
    assert _names(items.create(user, None)) == ["ItemAdded", "ItemDone"]
    assert items.get("a").item.content[0].audio is None  # too big to ever retrieve: not kept
    assert items.create(user, None).code == "item_id_already_exists"
    assert items.create(replace(user, id="b"), "nowhere").code == "item_not_found"
    assert isinstance(items.retrieve("a"), ev.ItemRetrieved) and isinstance(items.retrieve("x"), Rejected)
    assert isinstance(items.truncate("a", 0, 10, AudioFormat.PCM16), Rejected)  # not assistant audio
    items.insert(Message("s", "assistant", (OutputAudio("said", b"\1" * 4800),)), None)
    items.get("s").audio_ms = 100
    assert isinstance(items.truncate("s", 0, 200, AudioFormat.PCM16), Rejected)  # past what was made
    truncated = items.truncate("s", 0, 50, AudioFormat.PCM16)
    assert isinstance(truncated, ev.ItemTruncated)
    part = items.get("s").item.content[0]
    assert part.transcript == "" and len(part.audio) == 2400  # 50 ms of pcm16 at 24 kHz
    assert isinstance(items.remove("s"), ev.ItemDeleted) and isinstance(items.remove("s"), Rejected)


def test_committed_audio_and_its_transcript() -> None:
    items = Conversation(8)
    assert _names(items.commit_audio("u")) == ["AudioCommitted", "ItemAdded", "ItemDone"]
    assert items.transcribed("u", "hello", 1.23456, announce=False) == []
    assert items.get("u").item.content[0].transcript == "hello"
    (completed,) = items.transcribed("u", "hello", 1.23456, announce=True)
    assert isinstance(completed, ev.TranscriptionCompleted) and completed.usage.seconds == 1.235
    (failed,) = items.transcribed("u", None, 0.0, announce=True)
    assert isinstance(failed, ev.TranscriptionFailed) and items.get("u").item.content[0].transcript == ""
