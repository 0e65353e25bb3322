"""Every server event the codec renders validates against the openai SDK's model, in both dialects."""

from __future__ import annotations

import base64
import inspect
import json

import pytest

from realtime.protocols.oai_realtime import errors
from realtime.protocols.oai_realtime import server_events as se
from realtime.protocols.oai_realtime.dialect import Dialect
from realtime.protocols.oai_realtime.errors import Rejected, active_response, cancel_not_active
from realtime.protocols.oai_realtime.items import (
    FunctionCall,
    FunctionCallOutput,
    InputAudio,
    InputText,
    Message,
    OutputAudio,
    OutputText,
)
from realtime.protocols.oai_realtime.responses import ResponseOptions, ResponseSettings
from realtime.protocols.oai_realtime.session_config import (
    AudioFormat,
    FunctionTool,
    NoiseReduction,
    SemanticVad,
    ServerVad,
    SessionConfig,
    ToolChoiceFunction,
    Transcription,
)

from .sdk_models import MODELS, validate_server_frame

PCM = b"\x01\x00" * 2400  # 100 ms of pcm16 at 24 kHz
REF = se.PartRef("resp_1", "item_a", 0, 0)

USER_AUDIO = Message("item_u", "user", (InputAudio(PCM, "what time is it"),))
USER_TEXT = Message("item_t", "user", (InputText("hello"),))
SYSTEM = Message("item_s", "system", (InputText("be brief"),))
ASSISTANT_AUDIO = Message("item_a", "assistant", (OutputAudio("it is noon", PCM),), status="in_progress")
ASSISTANT_TEXT = Message("item_b", "assistant", (OutputText("noon"),), status="incomplete")
CALL = FunctionCall("item_c", "call_1", "get_time", '{"tz":"UTC"}')
CALL_OUTPUT = FunctionCallOutput("item_o", "call_1", '{"time":"12:00"}')
ITEMS = (USER_AUDIO, USER_TEXT, SYSTEM, ASSISTANT_AUDIO, ASSISTANT_TEXT, CALL, CALL_OUTPUT)

TOOL = FunctionTool("get_time", "Current time", {"type": "object", "properties": {"tz": {"type": "string"}}})
CONFIGS = (
    SessionConfig(model="gpt-4o-realtime-preview"),
    SessionConfig(
        model="gpt-4o-realtime-preview",
        instructions="Answer briefly.",
        audio_output=False,
        voice="verse",
        speed=1.2,
        input_format=AudioFormat.G711_ULAW,
        output_format=AudioFormat.G711_ALAW,
        transcription=Transcription(model="whisper-1", language="en", prompt="names"),
        noise_reduction=NoiseReduction("near_field"),
        turn_detection=None,
        tools=(TOOL,),
        tool_choice=ToolChoiceFunction("get_time"),
        temperature=0.7,
        max_output_tokens=512,
        tracing={"workflow_name": "demo", "metadata": {"a": 1}},
    ),
    SessionConfig(
        model="gpt-4o-realtime-preview",
        turn_detection=SemanticVad("high"),
        tools=(TOOL,),
        tool_choice="required",
    ),
    SessionConfig(
        model="gpt-4o-realtime-preview", turn_detection=ServerVad(idle_timeout_ms=6000), tracing="auto"
    ),
)
GA_ONLY_CONFIGS = (
    SessionConfig(
        model="smollm2-135m-instruct",
        transcription=Transcription(
            model="whisper-base", delay="low", keywords=("Alice",), languages=("en",)
        ),
        noise_reduction=NoiseReduction("far_field", 0.5),
        include=("item.input_audio_transcription.logprobs",),
        truncation={
            "type": "retention_ratio",
            "retention_ratio": 0.8,
            "token_limits": {"post_instructions": 100},
        },
        reasoning={"effort": "low"},
        parallel_tool_calls=True,
    ),
)
SETTINGS = ResponseSettings.of_session(CONFIGS[0])
TEXT_SETTINGS = ResponseOptions(
    audio_output=False, max_output_tokens=64, metadata={"turn": "3"}, conversation="none"
).resolve(CONFIGS[1])
RESPONSES = (
    se.ResponseState("resp_1", SETTINGS, conversation_id="conv_1"),
    se.ResponseState(
        "resp_1",
        SETTINGS,
        "completed",
        output=(ASSISTANT_AUDIO, CALL),
        usage=se.Usage(10, 40, 8, 5, 50),
        conversation_id="conv_1",
    ),
    se.ResponseState("resp_2", SETTINGS, "cancelled", "turn_detected", output=(ASSISTANT_AUDIO,)),
    se.ResponseState("resp_3", TEXT_SETTINGS, "cancelled", "client_cancelled"),
    se.ResponseState("resp_4", TEXT_SETTINGS, "incomplete", "max_output_tokens", output=(ASSISTANT_TEXT,)),
    se.ResponseState(
        "resp_5", SETTINGS, "failed", error=Rejected("model_error", "the model failed", type="server_error")
    ),
)


def catalogue(dialect: Dialect) -> list[se.ServerEvent]:
    """At least one instance of every server event class, with the variants that change its shape."""
    configs = CONFIGS + (GA_ONLY_CONFIGS if dialect is Dialect.GA else ())
    events: list[se.ServerEvent] = []
    for config in configs:
        events += [
            se.SessionCreated("sess_1", 1_900_000_000, config),
            se.SessionUpdated("sess_1", 1_900_000_000, config),
        ]
    events += [
        se.ConversationCreated("conv_1"),
        se.ErrorEvent(Rejected("invalid_value", "bad", "session.voice", "evt_1")),
        se.ErrorEvent(active_response("resp_1")),
        se.ErrorEvent(cancel_not_active()),
        se.RateLimitsUpdated((se.RateLimit("requests", 100, 99, 1.5), se.RateLimit("tokens", 1000, 900, 60))),
        se.SpeechStarted("item_u", 1200),
        se.SpeechStopped("item_u", 2500),
        se.AudioCommitted("item_u", None),
        se.AudioCommitted("item_u", "item_t"),
        se.AudioCleared(),
        se.AudioTimeoutTriggered("item_u", 0, 6000),
        se.ItemDeleted("item_t"),
        se.ItemTruncated("item_a", 0, 1500),
        se.TranscriptionDelta("item_u", 0, "what"),
        se.TranscriptionCompleted("item_u", 0, "what time is it", se.DurationUsage(1.4)),
        se.TranscriptionCompleted("item_u", 0, "what time is it", se.TokenUsage(12, 5)),
        se.TranscriptionFailed(
            "item_u", 0, Rejected("transcription_failed", "ASR failed", type="server_error")
        ),
        se.OutputItemAdded("resp_1", 0, Message("item_a", "assistant", (), status="in_progress")),
        se.ContentPartAdded(REF, OutputAudio("")),
        se.ContentPartAdded(REF, OutputText("")),
        se.AudioDelta(REF, PCM),
        se.TranscriptDelta(REF, "it is"),
        se.TextDelta(REF, "noon"),
        se.AudioDone(REF),
        se.TranscriptDone(REF, "it is noon"),
        se.TextDone(REF, "noon"),
        se.ContentPartDone(REF, OutputAudio("it is noon")),
        se.ContentPartDone(REF, OutputText("noon")),
        se.FunctionArgumentsDelta("resp_1", "item_c", 1, "call_1", '{"tz":'),
        se.FunctionArgumentsDone("resp_1", "item_c", 1, "call_1", "get_time", '{"tz":"UTC"}'),
        se.OutputAudioStarted("resp_1"),
        se.OutputAudioStopped("resp_1"),
        se.OutputAudioCleared("resp_1"),
    ]
    for item in ITEMS:
        events += [
            se.ItemAdded(item, "item_prev"),
            se.ItemAdded(item, None),
            se.ItemDone(item, "item_prev"),
            se.ItemRetrieved(item),
            se.OutputItemDone("resp_1", 0, item),
        ]
    events += [se.ResponseCreated(r) for r in RESPONSES] + [se.ResponseDone(r) for r in RESPONSES]
    return events


def _event_classes() -> set[type]:
    return {
        cls
        for _, cls in inspect.getmembers(se, inspect.isclass)
        if issubclass(cls, se.ServerEvent) and cls is not se.ServerEvent
    }


def test_catalogue_covers_every_event_class():
    for dialect in Dialect:
        assert {type(e) for e in catalogue(dialect)} == _event_classes()


@pytest.mark.parametrize("dialect", list(Dialect))
def test_every_rendered_event_validates_strictly_against_the_sdk(dialect):
    rendered_types = set()
    for event in catalogue(dialect):
        frame = se.render(event, dialect)
        if frame is None:
            assert dialect is Dialect.BETA and event.TYPE in (
                "conversation.item.done",
                "input_audio_buffer.timeout_triggered",
            )
            continue
        model = validate_server_frame(frame, dialect)
        rendered_types.add(model.type)
    # every event type of the list reaches the client in this dialect
    expected = {se.type_name(cls.TYPE, dialect) for cls in _event_classes()} - {None}
    assert rendered_types == expected
    assert rendered_types <= set(MODELS[dialect])


def test_beta_spellings_and_ga_spellings_never_mix():
    ga_names = {se.type_name(c.TYPE, Dialect.GA) for c in _event_classes()}
    beta_names = {se.type_name(c.TYPE, Dialect.BETA) for c in _event_classes()} - {None}
    assert "response.output_audio.delta" in ga_names and "response.audio.delta" not in ga_names
    assert "conversation.item.added" in ga_names and "conversation.item.created" not in ga_names
    assert "response.audio.delta" in beta_names and "response.output_audio.delta" not in beta_names
    assert "conversation.item.created" in beta_names and "conversation.item.added" not in beta_names


def test_function_call_done_carries_name_in_ga_only():
    event = se.FunctionArgumentsDone("resp_1", "item_c", 0, "call_1", "get_time", "{}")
    assert json.loads(se.render(event, Dialect.GA))["name"] == "get_time"
    assert "name" not in json.loads(se.render(event, Dialect.BETA))


def test_audio_delta_is_base64_of_the_pcm():
    frame = json.loads(se.render(se.AudioDelta(REF, PCM), Dialect.GA))
    assert base64.b64decode(frame["delta"]) == PCM
    assert frame["response_id"] == "resp_1" and frame["item_id"] == "item_a"


def test_retrieved_item_carries_audio_unless_the_frame_would_be_too_big():
    small = json.loads(se.render(se.ItemRetrieved(USER_AUDIO), Dialect.GA))
    assert base64.b64decode(small["item"]["content"][0]["audio"]) == PCM
    big_pcm = b"\x00" * (se.MAX_RETRIEVED_AUDIO_BYTES + 2)
    big = se.render(se.ItemRetrieved(Message("item_x", "user", (InputAudio(big_pcm, "long"),))), Dialect.GA)
    part = json.loads(big)["item"]["content"][0]
    assert "audio" not in part and part["transcript"] == "long"
    # items announced by added/done never carry audio
    added = json.loads(se.render(se.ItemAdded(USER_AUDIO), Dialect.GA))
    assert "audio" not in added["item"]["content"][0]


def test_response_status_details():
    done = [json.loads(se.render(se.ResponseDone(r), Dialect.GA))["response"] for r in RESPONSES]
    assert [r["status"] for r in done] == [
        "in_progress",
        "completed",
        "cancelled",
        "cancelled",
        "incomplete",
        "failed",
    ]
    assert done[1]["status_details"] is None
    assert done[1]["usage"]["input_token_details"]["cached_tokens"] == 8
    assert done[1]["usage"]["total_tokens"] == 10 + 40 + 5 + 50
    assert done[2]["status_details"] == {"type": "cancelled", "reason": "turn_detected"}
    assert done[4]["status_details"] == {"type": "incomplete", "reason": "max_output_tokens"}
    assert done[5]["status_details"]["error"]["type"] == "server_error"
    text = done[3]
    assert (
        text["output_modalities"] == ["text"]
        and text["max_output_tokens"] == 64
        and text["metadata"] == {"turn": "3"}
    )


def test_ids_are_openai_style_and_fresh():
    frames = [json.loads(se.render(se.AudioCleared(), Dialect.GA)) for _ in range(50)]
    ids = {f["event_id"] for f in frames}
    assert len(ids) == 50
    assert all(i.startswith("event_") and len(i) == len("event_") + 21 and i[6:].isalnum() for i in ids)


@pytest.mark.parametrize(
    ("data", "dialect"),
    [
        (
            {
                "type": "response.audio.delta",
                "response_id": "r",
                "item_id": "i",
                "output_index": 0,
                "content_index": 0,
                "delta": "",
            },
            Dialect.GA,
        ),
        (
            {
                "type": "response.function_call_arguments.done",
                "response_id": "r",
                "item_id": "i",
                "output_index": 0,
                "call_id": "c",
                "arguments": "{}",
                "name": "x",
            },
            Dialect.BETA,
        ),
        (
            {
                "type": "response.function_call_arguments.done",
                "response_id": "r",
                "item_id": "i",
                "output_index": 0,
                "call_id": "c",
                "arguments": "{}",
            },
            Dialect.GA,
        ),
        (
            {
                "type": "conversation.item.added",
                "item": {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "x", "bogus": 1}],
                },
            },
            Dialect.GA,
        ),
        (
            {
                "type": "session.created",
                "session": {"type": "realtime", "id": "s", "object": "realtime.session", "temperature": 0.8},
            },
            Dialect.GA,
        ),
        ({"type": "input_audio_buffer.speech_started", "item_id": "i", "audio_start_ms": "5"}, Dialect.GA),
        (
            {
                "type": "response.done",
                "response": {"status_details": {"type": "cancelled", "reason": "because"}},
            },
            Dialect.GA,
        ),
    ],
)
def test_the_sdk_check_refuses_wrong_names_extras_missing_fields_and_coercions(data, dialect):
    frame = json.dumps({"event_id": "event_" + "x" * 21, **data})
    with pytest.raises((AssertionError, ValueError)):  # pydantic's ValidationError is a ValueError
        validate_server_frame(frame, dialect)


@pytest.mark.parametrize("dialect", list(Dialect))
def test_semantic_errors_for_the_voice_kind_render_valid_error_events(dialect):
    built = [
        errors.active_response("resp_1"),
        errors.cancel_not_active(),
        errors.commit_empty(40.0, 100),
        errors.item_not_found("item_9"),
        errors.item_id_in_use("item_9"),
        errors.truncate_beyond_audio(9250, 57340),
        errors.truncate_not_assistant_audio(),
        errors.session_expired(30),
        errors.invalid_api_key(),
    ]
    for rejected in built:
        model = validate_server_frame(
            se.render(se.ErrorEvent(rejected.with_event_id("evt_1")), dialect), dialect
        )
        assert model.error.code == rejected.code and model.error.event_id == "evt_1"
    assert built[0].message.startswith("Conversation already has an active response in progress: resp_1.")
    assert built[5].message == "Audio content of 9250ms is already shorter than 57340ms"
    assert built[2].message == (
        "Error committing input audio buffer: buffer too small. "
        "Expected at least 100ms of audio, but buffer only has 40.00ms of audio."
    )
