"""Client events as the openai SDK serialises them parse into the right commands, in both dialects;
every malformed input is a typed Rejected and the codec goes on; a bounded fuzz finds no exception."""

from __future__ import annotations

import base64
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai.resources.beta.realtime.realtime import RealtimeConnection as BetaConnection
from openai.resources.realtime.realtime import RealtimeConnection
from openai.types.realtime import SessionUpdateEvent

from realtime.protocols.oai_realtime import CodecOptions, Dialect, RealtimeCodec, Rejected, SessionConfig
from realtime.protocols.oai_realtime import client_events as ce
from realtime.protocols.oai_realtime.items import (
    FunctionCall,
    FunctionCallOutput,
    InputAudio,
    InputText,
    Message,
    OutputText,
)
from realtime.protocols.oai_realtime.limits import MAX_APPEND_BYTES, Limits
from realtime.protocols.oai_realtime.responses import ItemReference
from realtime.protocols.oai_realtime.server_events import ErrorEvent, render
from realtime.protocols.oai_realtime.session_config import AudioFormat, ServerVad, Transcription

from .sdk_models import validate_server_frame

PCM = b"\x10\x00" * 480
B64 = base64.b64encode(PCM).decode()
CONFIG = SessionConfig(model="gpt-4o-realtime-preview")


class CapturedSocket:
    """Stands in for the SDK's websocket: keeps what ``RealtimeConnection.send`` writes."""

    def __init__(self) -> None:
        self.frames: list[str] = []

    def send(self, data, *args, **kwargs) -> None:
        self.frames.append(data)

    def close(self, *args, **kwargs) -> None:
        pass


def sdk_frames(dialect: Dialect, drive) -> list[str]:
    socket = CapturedSocket()
    connection = (RealtimeConnection if dialect is Dialect.GA else BetaConnection)(socket)
    drive(connection)
    return socket.frames


def parse_all(dialect: Dialect, frames: list[str]) -> list:
    codec = RealtimeCodec(dialect, CONFIG)
    return [codec.receive_text(f) for f in frames]


def drive_common(conn) -> None:
    conn.input_audio_buffer.append(audio=B64, event_id="evt_1")
    conn.input_audio_buffer.commit()
    conn.input_audio_buffer.clear(event_id="evt_2")
    conn.conversation.item.delete(item_id="item_1")
    conn.conversation.item.retrieve(item_id="item_2", event_id="evt_3")
    conn.conversation.item.truncate(item_id="item_3", content_index=0, audio_end_ms=1500)
    conn.response.cancel()
    conn.response.cancel(response_id="resp_9", event_id="evt_4")
    conn.output_audio_buffer.clear()


def assert_common(commands: list) -> None:
    assert commands == [
        ce.AudioAppend("evt_1", PCM),
        ce.AudioCommit(None),
        ce.AudioClear("evt_2"),
        ce.ItemDelete(None, "item_1"),
        ce.ItemRetrieve("evt_3", "item_2"),
        ce.ItemTruncate(None, "item_3", 0, 1500),
        ce.ResponseCancel(None, None),
        ce.ResponseCancel("evt_4", "resp_9"),
        ce.OutputAudioClear(None),
    ]


@pytest.mark.parametrize("dialect", list(Dialect))
def test_sdk_buffer_item_and_response_events(dialect):
    assert_common(parse_all(dialect, sdk_frames(dialect, drive_common)))


def test_sdk_ga_session_update_as_openai_agents_sends_it():
    session = {
        "type": "realtime",
        "model": "gpt-realtime",
        "output_modalities": ["audio"],
        "instructions": "Be brief.",
        "audio": {
            "input": {
                "format": {"type": "audio/pcm", "rate": 24000},
                "transcription": {"model": "gpt-4o-mini-transcribe"},
                "turn_detection": {
                    "type": "server_vad",
                    "interrupt_response": True,
                    "silence_duration_ms": 400,
                },
                "noise_reduction": None,
            },
            "output": {"format": {"type": "audio/pcm", "rate": 24000}, "voice": "ash", "speed": 1.0},
        },
        "tools": [
            {"type": "function", "name": "get_time", "description": "now", "parameters": {"type": "object"}}
        ],
        "tool_choice": "auto",
        "tracing": "auto",
        "max_output_tokens": "inf",
    }
    frames = sdk_frames(Dialect.GA, lambda c: c.session.update(session=session, event_id="evt_s"))
    frames += sdk_frames(
        Dialect.GA,
        lambda c: c.send(SessionUpdateEvent.model_validate({"type": "session.update", "session": session})),
    )
    for command in parse_all(Dialect.GA, frames):
        assert isinstance(command, ce.SessionUpdate), command
        config = command.config
        assert config.instructions == "Be brief." and config.voice == "ash" and config.tracing == "auto"
        assert config.turn_detection == ServerVad(silence_duration_ms=400)
        assert config.transcription == Transcription(model="gpt-4o-mini-transcribe")
        assert config.tools[0].name == "get_time" and config.model == CONFIG.model
    assert command.event_id is None and parse_all(Dialect.GA, frames[:1])[0].event_id == "evt_s"


def test_sdk_beta_session_update_as_the_legacy_console_sends_it():
    session = {
        "modalities": ["text", "audio"],
        "instructions": "Be brief.",
        "voice": "verse",
        "input_audio_format": "pcm16",
        "output_audio_format": "pcm16",
        "input_audio_transcription": {"model": "whisper-1"},
        "turn_detection": None,
        "tools": [],
        "tool_choice": "auto",
        "temperature": 0.8,
        "max_response_output_tokens": 4096,
    }
    (command,) = parse_all(
        Dialect.BETA, sdk_frames(Dialect.BETA, lambda c: c.session.update(session=session))
    )
    config = command.config
    assert config.audio_output and config.voice == "verse" and config.turn_detection is None
    assert config.max_output_tokens == 4096 and config.input_format is AudioFormat.PCM16


def drive_items(dialect: Dialect):
    assistant_part = "output_text" if dialect is Dialect.GA else "text"

    def drive(conn) -> None:
        create = conn.conversation.item.create
        create(item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]})
        create(
            item={
                "id": "item_a1",
                "type": "message",
                "role": "user",
                "content": [{"type": "input_audio", "audio": B64}],
            },
            previous_item_id="root",
        )
        create(
            item={
                "type": "message",
                "role": "assistant",
                "content": [{"type": assistant_part, "text": "hello"}],
            }
        )
        create(
            item={"type": "message", "role": "system", "content": [{"type": "input_text", "text": "be kind"}]}
        )
        create(item={"type": "function_call", "call_id": "call_1", "name": "get_time", "arguments": "{}"})
        create(
            item={"type": "function_call_output", "call_id": "call_1", "output": '{"t":"noon"}'},
            event_id="evt_o",
        )

    return drive


@pytest.mark.parametrize("dialect", list(Dialect))
def test_sdk_item_create_in_each_spelling(dialect):
    commands = parse_all(dialect, sdk_frames(dialect, drive_items(dialect)))
    assert all(isinstance(c, ce.ItemCreate) for c in commands), commands
    items = [c.item for c in commands]
    assert (
        isinstance(items[0], Message) and items[0].content == (InputText("hi"),) and items[0].role == "user"
    )
    assert items[0].id.startswith("item_") and len(items[0].id) == 26  # generated when absent
    assert items[1] == Message("item_a1", "user", (InputAudio(PCM, None),))
    assert commands[1].previous_item_id == "root"
    assert items[2].content == (OutputText("hello"),) and items[2].role == "assistant"
    assert items[3].role == "system"
    assert isinstance(items[4], FunctionCall) and (items[4].call_id, items[4].name) == ("call_1", "get_time")
    assert items[5] == FunctionCallOutput(items[5].id, "call_1", '{"t":"noon"}')
    assert commands[5].event_id == "evt_o"


def test_sdk_response_create_overrides_ga():
    response = {
        "instructions": "Answer in one word.",
        "output_modalities": ["text"],
        "audio": {"output": {"format": {"type": "audio/pcmu"}, "voice": "marin"}},
        "max_output_tokens": 20,
        "conversation": "none",
        "metadata": {"purpose": "classify"},
        "tool_choice": "none",
        "input": [
            {"type": "item_reference", "id": "item_1"},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "classify this"}]},
        ],
    }
    frames = sdk_frames(Dialect.GA, lambda c: (c.response.create(response=response), c.response.create()))
    with_options, bare = parse_all(Dialect.GA, frames)
    settings_ = with_options.options.resolve(CONFIG)
    assert settings_.instructions == "Answer in one word." and not settings_.audio_output
    assert settings_.voice == "marin" and settings_.output_format is AudioFormat.G711_ULAW
    assert settings_.max_output_tokens == 20 and settings_.conversation == "none"
    assert settings_.metadata == {"purpose": "classify"} and settings_.tool_choice == "none"
    assert settings_.input[0] == ItemReference("item_1") and isinstance(settings_.input[1], Message)
    assert bare.options.resolve(CONFIG).instructions == CONFIG.instructions


def test_sdk_response_create_overrides_beta():
    response = {
        "modalities": ["text"],
        "voice": "sage",
        "temperature": 1.0,
        "max_response_output_tokens": "inf",
    }
    (command,) = parse_all(
        Dialect.BETA, sdk_frames(Dialect.BETA, lambda c: c.response.create(response=response))
    )
    resolved = command.options.resolve(SessionConfig(model="m", max_output_tokens=100))
    assert (resolved.voice, resolved.temperature, resolved.max_output_tokens) == ("sage", 1.0, None)


GA_BAD = [
    ('{"type":"input_audio_buffer.append"', "invalid_json", None),
    ('{"type":"x","type":"y"}', "invalid_json", None),
    ('{"type":"response.create","response":{"max_output_tokens":NaN}}', "invalid_json", None),
    ('{"type":"response.create","response":{"max_output_tokens":Infinity}}', "invalid_json", None),
    ('{"type":"response.create","response":{"max_output_tokens":1e400}}', "invalid_json", None),
    (
        '{"type":"response.create","response":{"max_output_tokens":123456789012345678901234567890}}',
        "invalid_json",
        None,
    ),
    ("[" * 5000 + "]" * 5000, "invalid_json", None),
    ("[]", "invalid_event", None),
    ('"session.update"', "invalid_event", None),
    ("{}", "missing_required_parameter", "type"),
    ('{"type":5}', "invalid_type", "type"),
    ('{"type":"no.such.event"}', "invalid_value", "type"),
    ('{"type":"response.audio.delta"}', "invalid_value", "type"),  # a server event name
    ('{"type":"transcription_session.update","session":{}}', "unsupported_feature", "type"),
    ('{"type":"input_audio_buffer.commit","event_id":7}', "invalid_type", "event_id"),
    ('{"type":"input_audio_buffer.commit","final":true}', "unknown_parameter", "final"),
    ('{"type":"input_audio_buffer.append"}', "missing_required_parameter", "audio"),
    ('{"type":"input_audio_buffer.append","audio":12}', "invalid_type", "audio"),
    ('{"type":"input_audio_buffer.append","audio":"not-valid-base64!!!"}', "invalid_audio_base64", "audio"),
    ('{"type":"input_audio_buffer.append","audio":"AAA"}', "invalid_audio_base64", "audio"),
    ('{"type":"input_audio_buffer.append","audio":"AA AA"}', "invalid_audio_base64", "audio"),
    ('{"type":"input_audio_buffer.append","audio":"ÄÄÄÄ"}', "invalid_audio_base64", "audio"),
    ('{"type":"conversation.item.create"}', "missing_required_parameter", "item"),
    (
        '{"type":"conversation.item.create","item":{"role":"user","content":[]}}',
        "missing_required_parameter",
        "item.type",
    ),
    (
        '{"type":"conversation.item.create","item":{"type":"message","role":"robot","content":[]}}',
        "invalid_value",
        "item.role",
    ),
    (
        '{"type":"conversation.item.create","item":{"type":"message","role":"user","content":[{"type":"input_image","image_url":"data:"}]}}',
        "unsupported_feature",
        "item.content[0].type",
    ),
    (
        '{"type":"conversation.item.create","item":{"type":"message","role":"assistant","content":[{"type":"output_audio","audio":"AAAA"}]}}',
        "unsupported_feature",
        "item.content[0].type",
    ),
    (
        '{"type":"conversation.item.create","item":{"type":"message","role":"assistant","content":[{"type":"text","text":"beta spelling"}]}}',
        "invalid_value",
        "item.content[0].type",
    ),
    (
        '{"type":"conversation.item.create","item":{"type":"message","role":"user","content":[{"type":"input_text"}]}}',
        "missing_required_parameter",
        "item.content[0].text",
    ),
    (
        '{"type":"conversation.item.create","item":{"type":"mcp_call","id":"x"}}',
        "unsupported_feature",
        "item.type",
    ),
    (
        '{"type":"conversation.item.create","item":{"type":"function_call","name":"f"}}',
        "missing_required_parameter",
        "item.arguments",
    ),
    (
        '{"type":"conversation.item.create","item":{"type":"function_call_output","output":"x"}}',
        "missing_required_parameter",
        "item.call_id",
    ),
    (
        '{"type":"conversation.item.create","item":{"type":"message","role":"user","content":[],"id":""}}',
        "string_below_min_length",
        "item.id",
    ),
    ('{"type":"conversation.item.delete"}', "missing_required_parameter", "item_id"),
    (
        '{"type":"conversation.item.truncate","item_id":"i","content_index":0,"audio_end_ms":-5}',
        "integer_below_min_value",
        "audio_end_ms",
    ),
    (
        '{"type":"conversation.item.truncate","item_id":"i","content_index":"0","audio_end_ms":5}',
        "invalid_type",
        "content_index",
    ),
    (
        '{"type":"conversation.item.truncate","item_id":"i","audio_end_ms":5}',
        "missing_required_parameter",
        "content_index",
    ),
    (
        '{"type":"response.create","response":{"conversation":"other"}}',
        "invalid_value",
        "response.conversation",
    ),
    (
        '{"type":"response.create","response":{"modalities":["text"]}}',
        "unknown_parameter",
        "response.modalities",
    ),
    ('{"type":"response.create","response":{"prompt":{"id":"p"}}}', "unsupported_feature", "response.prompt"),
    ('{"type":"response.create","response":{"metadata":{"k":5}}}', "invalid_type", "response.metadata.k"),
    (
        '{"type":"response.create","response":{"input":[{"type":"item_reference"}]}}',
        "missing_required_parameter",
        "response.input[0].id",
    ),
    ('{"type":"response.cancel","response_id":["r"]}', "invalid_type", "response_id"),
]


@pytest.mark.parametrize(("text", "code", "param"), GA_BAD)
def test_malformed_input_is_a_typed_rejection_and_the_codec_goes_on(text, code, param):
    codec = RealtimeCodec(Dialect.GA, CONFIG)
    result = codec.receive_text(text)
    assert isinstance(result, Rejected), result
    assert (result.type, result.code, result.param) == ("invalid_request_error", code, param)
    validate_server_frame(render(ErrorEvent(result), Dialect.GA), Dialect.GA)
    assert codec.receive_text('{"type":"input_audio_buffer.commit","event_id":"evt_ok"}') == ce.AudioCommit(
        "evt_ok"
    )


def test_the_client_event_id_is_echoed_in_its_error():
    codec = RealtimeCodec(Dialect.BETA, CONFIG)
    result = codec.receive_text('{"type":"input_audio_buffer.append","audio":"@@","event_id":"evt_42"}')
    assert result.event_id == "evt_42"
    frame = json.loads(render(ErrorEvent(result), Dialect.BETA))
    assert frame["error"]["event_id"] == "evt_42" and frame["error"]["param"] == "audio"


def test_beta_spells_assistant_text_as_text():
    codec = RealtimeCodec(Dialect.BETA, CONFIG)
    bad = codec.receive_text(
        '{"type":"conversation.item.create","item":{"type":"message","role":"assistant","content":[{"type":"output_text","text":"x"}]}}'
    )
    assert (bad.code, bad.param) == ("invalid_value", "item.content[0].type")
    item = codec.receive_text(
        '{"type":"conversation.item.create","item":{"role":"user","content":[{"type":"input_text","text":"x"}]}}'
    )
    assert isinstance(item.item, Message)  # beta: the type is optional


def test_appends_up_to_15_mib_are_accepted_and_larger_ones_refused():
    codec = RealtimeCodec(Dialect.GA, CONFIG)
    audio = b"\x00" * MAX_APPEND_BYTES
    ok = codec.receive_text(
        json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(audio).decode()})
    )
    assert isinstance(ok, ce.AudioAppend) and len(ok.audio) == MAX_APPEND_BYTES
    small = RealtimeCodec(Dialect.GA, CONFIG, CodecOptions(limits=Limits(max_append_bytes=1000)))
    too_big = small.receive_text(
        json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(b"\x00" * 1001).decode()})
    )
    assert (too_big.code, too_big.param) == ("audio_append_too_large", "audio")


def test_oversized_frames_and_binary_frames_are_refused():
    codec = RealtimeCodec(Dialect.GA, CONFIG, CodecOptions(limits=Limits(max_event_bytes=100)))
    assert (
        codec.receive_text('{"type":"input_audio_buffer.append","audio":"' + "A" * 200 + '"}').code
        == "message_too_large"
    )
    assert (
        codec.receive_text('{"type":"input_audio_buffer.clear","event_id":"' + "é" * 60 + '"}').code
        == "message_too_large"
    )
    assert codec.receive_bytes(b"\x00\x01").code == "unexpected_binary"
    assert codec.receive_text('{"type":"input_audio_buffer.clear"}') == ce.AudioClear(None)


# ------------------------------------------------------------------------------------- fuzz

KNOWN_TYPES = [*ce.PARSERS, "session.update"]
KEYS = [
    "type", "event_id", "audio", "item", "item_id", "content_index", "audio_end_ms", "response", "response_id",
    "session", "previous_item_id", "role", "content", "text", "instructions", "turn_detection", "tools", "name",
    "modalities", "output_modalities", "voice", "format", "threshold", "input", "metadata", "id", "call_id",
]  # fmt: skip
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.sampled_from(KEYS), children, max_size=5)
    ),
    max_leaves=20,
)
events = st.builds(
    lambda kind, body: {**body, "type": kind},
    st.sampled_from(KNOWN_TYPES) | st.text(max_size=12),
    st.dictionaries(st.sampled_from(KEYS), json_values, max_size=6),
)
COMMAND_TYPES = (
    ce.SessionUpdate, ce.AudioAppend, ce.AudioCommit, ce.AudioClear, ce.ItemCreate, ce.ItemDelete,
    ce.ItemRetrieve, ce.ItemTruncate, ce.ResponseCreate, ce.ResponseCancel, ce.OutputAudioClear, Rejected,
)  # fmt: skip


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    dialect=st.sampled_from(list(Dialect)),
    text=st.one_of(
        st.text(max_size=60),
        json_values.map(lambda v: json.dumps(v, allow_nan=True)),
        events.map(json.dumps),
    ),
)
def test_fuzz_receive_text_returns_only_typed_results(dialect, text):
    codec = RealtimeCodec(dialect, CONFIG)
    result = codec.receive_text(text)
    assert isinstance(result, COMMAND_TYPES)
    if isinstance(result, Rejected):
        json.loads(render(ErrorEvent(result), dialect))  # always renders
    assert isinstance(codec.receive_text('{"type":"input_audio_buffer.commit"}'), ce.AudioCommit)
