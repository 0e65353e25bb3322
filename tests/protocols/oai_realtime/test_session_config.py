"""session.update: deep merge, null clears, validation with OpenAI's codes/messages, both dialects."""

from __future__ import annotations

import json

import pytest

from realtime.protocols.oai_realtime import CodecOptions, Dialect, RealtimeCodec, Rejected, SessionConfig
from realtime.protocols.oai_realtime.client_events import SessionUpdate
from realtime.protocols.oai_realtime.errors import ParamError
from realtime.protocols.oai_realtime.limits import Limits
from realtime.protocols.oai_realtime.session_config import (
    AudioFormat,
    FunctionTool,
    SemanticVad,
    ServerVad,
    ToolChoiceFunction,
    Transcription,
    apply_update,
    to_wire,
)

from .test_server_events import CONFIGS, GA_ONLY_CONFIGS

DEFAULTS = SessionConfig(
    model="gpt-4o-realtime-preview",
    instructions="You are a helpful assistant.",
    voice="hibari",
    transcription=Transcription(model="whisper-base"),
)


def codec(dialect: Dialect, **options) -> RealtimeCodec:
    return RealtimeCodec(dialect, DEFAULTS, CodecOptions(**options))


def update(c: RealtimeCodec, session: dict, **extra) -> SessionUpdate | Rejected:
    return c.receive_text(json.dumps({"type": "session.update", "session": session, **extra}))


def ga_input(**fields) -> dict:
    return {"type": "realtime", "audio": {"input": fields}}


def test_partial_turn_detection_update_keeps_type_and_other_fields_in_both_dialects():
    ga = update(codec(Dialect.GA), ga_input(turn_detection={"threshold": 0.8}))
    beta = update(codec(Dialect.BETA), {"turn_detection": {"threshold": 0.8}})
    for result in (ga, beta):
        assert isinstance(result, SessionUpdate)
        assert result.config.turn_detection == ServerVad(threshold=0.8)
        assert result.previous.turn_detection == ServerVad()
        assert result.config.transcription == DEFAULTS.transcription  # untouched siblings stay


def test_nested_merges_compose_across_updates():
    c = codec(Dialect.GA)
    update(c, ga_input(turn_detection={"silence_duration_ms": 800}))
    update(c, {"type": "realtime", "audio": {"output": {"speed": 1.3}}})
    result = update(c, ga_input(transcription={"language": "de"}))
    assert result.config.turn_detection == ServerVad(silence_duration_ms=800)
    assert result.config.speed == 1.3
    assert result.config.transcription == Transcription(model="whisper-base", language="de")
    assert c.config is result.config


def test_changing_the_turn_detection_type_replaces_instead_of_merging():
    c = codec(Dialect.GA, semantic_vad=True)
    update(c, ga_input(turn_detection={"threshold": 0.9}))
    result = update(c, ga_input(turn_detection={"type": "semantic_vad", "eagerness": "low"}))
    assert result.config.turn_detection == SemanticVad(eagerness="low")
    # a server_vad field inside semantic_vad is unknown there (GA's SemanticVad model lacks it)
    bad = update(c, ga_input(turn_detection={"type": "semantic_vad", "threshold": 0.5}))
    assert (bad.code, bad.param) == ("unknown_parameter", "session.audio.input.turn_detection.threshold")


@pytest.mark.parametrize(
    ("dialect", "session", "field", "cleared"),
    [
        (Dialect.GA, ga_input(turn_detection=None), "turn_detection", None),
        (Dialect.BETA, {"turn_detection": None}, "turn_detection", None),
        (Dialect.GA, ga_input(transcription=None), "transcription", None),
        (Dialect.BETA, {"input_audio_transcription": None}, "transcription", None),
        (Dialect.GA, {"type": "realtime", "instructions": None}, "instructions", ""),
        (Dialect.BETA, {"tools": None}, "tools", ()),
        (Dialect.GA, {"type": "realtime", "max_output_tokens": None}, "max_output_tokens", None),
        (Dialect.BETA, {"voice": None}, "voice", "hibari"),  # a required field goes back to the default
        (Dialect.GA, {"type": "realtime", "audio": {"output": {"voice": None}}}, "voice", "hibari"),
        (Dialect.GA, ga_input(turn_detection={"threshold": None}), "turn_detection", ServerVad()),
        (Dialect.BETA, {"temperature": None}, "temperature", 0.8),
    ],
)
def test_explicit_null_clears(dialect, session, field, cleared):
    c = codec(dialect)
    tool = {"type": "function", "name": "f"}
    if dialect is Dialect.GA:  # first move every field away from its default
        first = {
            "type": "realtime",
            "instructions": "x",
            "max_output_tokens": 10,
            "tools": [tool],
            "audio": {"output": {"voice": "ash"}, "input": {"turn_detection": {"threshold": 0.9}}},
        }
    else:
        first = {
            "instructions": "x",
            "voice": "ash",
            "max_response_output_tokens": 10,
            "temperature": 1.0,
            "tools": [tool],
            "turn_detection": {"threshold": 0.9},
        }
    assert isinstance(update(c, first), SessionUpdate)
    result = update(c, session)
    assert isinstance(result, SessionUpdate), result
    assert getattr(result.config, field) == cleared


def test_turning_vad_back_on_after_null_needs_a_type_in_ga():
    c = codec(Dialect.GA)
    update(c, ga_input(turn_detection=None))
    bad = update(c, ga_input(turn_detection={"threshold": 0.8}))
    assert bad.code == "missing_required_parameter"
    assert bad.message == "Missing required parameter: 'session.audio.input.turn_detection.type'."
    ok = update(c, ga_input(turn_detection={"type": "server_vad", "threshold": 0.8}))
    assert ok.config.turn_detection == ServerVad(threshold=0.8)
    # beta's model has the type optional: server_vad
    b = codec(Dialect.BETA)
    update(b, {"turn_detection": None})
    assert update(b, {"turn_detection": {"threshold": 0.7}}).config.turn_detection == ServerVad(threshold=0.7)


def test_a_bad_update_changes_nothing_and_the_codec_goes_on():
    c = codec(Dialect.GA)
    before = c.config
    bad = update(
        c, {"type": "realtime", "instructions": "new", "audio": {"output": {"speed": 9}}}, event_id="evt_7"
    )
    assert isinstance(bad, Rejected)
    assert (bad.code, bad.param, bad.event_id) == (
        "decimal_above_max_value",
        "session.audio.output.speed",
        "evt_7",
    )
    assert bad.message == (
        "Invalid 'session.audio.output.speed': decimal above maximum value. Expected a value <= 1.5, but got 9 instead."
    )
    assert c.config is before
    assert update(c, {"type": "realtime", "instructions": "new"}).config.instructions == "new"


@pytest.mark.parametrize(
    ("dialect", "session", "code", "param", "message"),
    [
        (
            Dialect.GA,
            {"type": "realtime", "foo": 1},
            "unknown_parameter",
            "session.foo",
            "Unknown parameter: 'session.foo'.",
        ),
        (Dialect.GA, ga_input(bar=1), "unknown_parameter", "session.audio.input.bar", None),
        (
            Dialect.GA,
            {"type": "realtime", "temperature": 0.8},
            "unknown_parameter",
            "session.temperature",
            None,
        ),
        (
            Dialect.BETA,
            {"output_modalities": ["text"]},
            "unknown_parameter",
            "session.output_modalities",
            None,
        ),
        (
            Dialect.BETA,
            {"turn_detection": {"idle_timeout_ms": 5000}},
            "unknown_parameter",
            "session.turn_detection.idle_timeout_ms",
            None,
        ),
        (
            Dialect.GA,
            {"type": "realtime", "instructions": 5},
            "invalid_type",
            "session.instructions",
            "Invalid type for 'session.instructions': expected a string, but got an integer instead.",
        ),
        (Dialect.BETA, {"modalities": "audio"}, "invalid_type", "session.modalities", None),
        (Dialect.BETA, {"modalities": []}, "invalid_value", "session.modalities", None),
        (
            Dialect.GA,
            {"type": "realtime", "output_modalities": ["video"]},
            "invalid_value",
            "session.output_modalities[0]",
            None,
        ),
        (
            Dialect.BETA,
            {"input_audio_format": "mp3"},
            "invalid_value",
            "session.input_audio_format",
            "Invalid value: 'mp3'. Supported values are: 'pcm16', 'g711_ulaw', and 'g711_alaw'.",
        ),
        (
            Dialect.BETA,
            {"input_audio_format": {"type": "audio/pcm"}},
            "invalid_type",
            "session.input_audio_format",
            None,
        ),
        (Dialect.GA, ga_input(format="pcm16"), "invalid_type", "session.audio.input.format", None),
        (
            Dialect.GA,
            ga_input(format={"type": "audio/pcm", "rate": 16000}),
            "invalid_value",
            "session.audio.input.format.rate",
            None,
        ),
        (
            Dialect.GA,
            ga_input(format={"type": "audio/pcmu", "rate": 8000}),
            "unknown_parameter",
            "session.audio.input.format.rate",
            None,
        ),
        (Dialect.BETA, {"temperature": 2.0}, "decimal_above_max_value", "session.temperature", None),
        (Dialect.BETA, {"temperature": "hot"}, "invalid_type", "session.temperature", None),
        (
            Dialect.GA,
            ga_input(turn_detection={"type": "server_vad", "threshold": 1.5}),
            "decimal_above_max_value",
            "session.audio.input.turn_detection.threshold",
            None,
        ),
        (
            Dialect.BETA,
            {"turn_detection": {"silence_duration_ms": -1}},
            "integer_below_min_value",
            "session.turn_detection.silence_duration_ms",
            None,
        ),
        (
            Dialect.BETA,
            {"turn_detection": {"silence_duration_ms": 2.5}},
            "invalid_type",
            "session.turn_detection.silence_duration_ms",
            None,
        ),
        (
            Dialect.BETA,
            {"turn_detection": {"create_response": "yes"}},
            "invalid_type",
            "session.turn_detection.create_response",
            None,
        ),
        (
            Dialect.GA,
            {"type": "realtime", "max_output_tokens": 5000},
            "integer_above_max_value",
            "session.max_output_tokens",
            None,
        ),
        (
            Dialect.GA,
            {"type": "realtime", "max_output_tokens": "lots"},
            "invalid_value",
            "session.max_output_tokens",
            None,
        ),
        (Dialect.BETA, {"model": "my-local-model"}, "invalid_value", "session.model", None),
        (Dialect.GA, {"type": "transcription"}, "unsupported_feature", "session.type", None),
        (
            Dialect.GA,
            {"type": "realtime", "prompt": {"id": "pmpt_1"}},
            "unsupported_feature",
            "session.prompt",
            None,
        ),
        (
            Dialect.GA,
            ga_input(turn_detection={"type": "semantic_vad"}),
            "unsupported_feature",
            "session.audio.input.turn_detection.type",
            None,
        ),
        (
            Dialect.BETA,
            {"turn_detection": {"type": "semantic_vad"}},
            "unsupported_feature",
            "session.turn_detection.type",
            None,
        ),
        (
            Dialect.GA,
            {"type": "realtime", "tools": [{"type": "mcp", "server_label": "x"}]},
            "unsupported_feature",
            "session.tools[0].type",
            None,
        ),
        (
            Dialect.GA,
            {"type": "realtime", "tools": [{"type": "function"}]},
            "missing_required_parameter",
            "session.tools[0].name",
            None,
        ),
        (
            Dialect.GA,
            {"type": "realtime", "tools": [{"type": "function", "name": "no spaces"}]},
            "invalid_value",
            "session.tools[0].name",
            None,
        ),
        (
            Dialect.BETA,
            {"tools": [{"name": "f"}, {"name": "f"}]},
            "invalid_value",
            "session.tools[1].name",
            None,
        ),
        (
            Dialect.GA,
            {"type": "realtime", "tools": [{"type": "function", "name": "f", "description": "d" * 1025}]},
            "string_above_max_length",
            "session.tools[0].description",
            "Invalid 'session.tools[0].description': string too long. Expected a string with maximum length 1024, "
            "but got a string with length 1025 instead.",
        ),
        (
            Dialect.BETA,
            {"tools": [{"name": "f", "parameters": []}]},
            "invalid_type",
            "session.tools[0].parameters",
            None,
        ),
        (
            Dialect.GA,
            {"type": "realtime", "tool_choice": {"type": "mcp", "server_label": "x"}},
            "unsupported_feature",
            "session.tool_choice.type",
            None,
        ),
        (
            Dialect.BETA,
            {"tool_choice": {"type": "function", "name": "f"}},
            "invalid_type",
            "session.tool_choice",
            None,
        ),
        (Dialect.GA, {"type": "realtime", "tracing": "manual"}, "invalid_value", "session.tracing", None),
        (Dialect.GA, {"type": "realtime", "audio": None}, "invalid_type", "session.audio", None),
        (
            Dialect.GA,
            {"type": "realtime", "instructions": "x" * 32769},
            "string_above_max_length",
            "session.instructions",
            None,
        ),
        (Dialect.BETA, {"instructions": "\ud800"}, "invalid_value", "session.instructions", None),
    ],
)
def test_invalid_updates_get_openai_codes_and_params(dialect, session, code, param, message):
    c = codec(dialect)
    result = update(c, session, event_id="evt_1")
    assert isinstance(result, Rejected), result
    assert (result.type, result.code, result.param, result.event_id) == (
        "invalid_request_error",
        code,
        param,
        "evt_1",
    )
    if message is not None:
        assert result.message == message
    assert c.config is DEFAULTS


def test_session_must_be_an_object_and_present():
    c = codec(Dialect.GA)
    missing = c.receive_text('{"type":"session.update"}')
    assert (missing.code, missing.param) == ("missing_required_parameter", "session")
    wrong = c.receive_text('{"type":"session.update","session":[]}')
    assert (wrong.code, wrong.param) == ("invalid_type", "session")
    extra = c.receive_text('{"type":"session.update","session":{},"sessions":{}}')
    assert (extra.code, extra.param) == ("unknown_parameter", "sessions")


def test_ga_type_may_be_omitted_and_model_is_fixed():
    c = RealtimeCodec(Dialect.GA, SessionConfig(model="smollm2-135m-instruct"))
    result = update(c, {"model": "gpt-realtime", "instructions": "hi"})
    assert result.config.instructions == "hi"
    assert result.config.model == "smollm2-135m-instruct"  # GA shows the served model


def test_beta_model_is_echoed_when_the_sdk_accepts_it():
    c = codec(Dialect.BETA)
    assert update(c, {"model": "gpt-4o-mini-realtime-preview"}).config.model == "gpt-4o-mini-realtime-preview"


def test_formats_tools_and_choices_in_each_spelling():
    ga = update(
        codec(Dialect.GA),
        {
            "type": "realtime",
            "output_modalities": ["text"],
            "audio": {
                "input": {"format": {"type": "audio/pcmu"}},
                "output": {"format": {"type": "audio/pcma"}, "voice": {"id": "voice_1"}},
            },
            "tools": [{"type": "function", "name": "get_time", "parameters": {"type": "object"}}],
            "tool_choice": {"type": "function", "name": "get_time"},
        },
    ).config
    beta = update(
        codec(Dialect.BETA),
        {
            "modalities": ["text"],
            "input_audio_format": "g711_ulaw",
            "output_audio_format": "g711_alaw",
            "voice": "voice_1",
            "tools": [{"type": "function", "name": "get_time", "parameters": {"type": "object"}}],
            "tool_choice": "get_time",
        },
    ).config
    for config in (ga, beta):
        assert not config.audio_output
        assert (config.input_format, config.output_format) == (AudioFormat.G711_ULAW, AudioFormat.G711_ALAW)
        assert config.input_format.sample_rate == 8000 and AudioFormat.PCM16.sample_rate == 24000
        assert config.voice == "voice_1"
        assert config.tools == (FunctionTool("get_time", "", {"type": "object"}),)
        assert config.tool_choice == ToolChoiceFunction("get_time")
    assert to_wire(ga, Dialect.GA)["tool_choice"] == {"type": "function", "name": "get_time"}
    assert to_wire(beta, Dialect.BETA)["tool_choice"] == "get_time"
    assert to_wire(beta, Dialect.BETA)["modalities"] == ["text"]
    both = update(codec(Dialect.BETA), {"modalities": ["audio", "text"]}).config
    assert both.audio_output and to_wire(both, Dialect.GA)["output_modalities"] == ["audio"]


def test_voice_is_locked_after_assistant_audio():
    c = codec(Dialect.GA)
    c.lock_voice()
    bad = update(c, {"type": "realtime", "audio": {"output": {"voice": "ash"}}})
    assert (bad.code, bad.param) == ("cannot_update_voice", "session.audio.output.voice")
    assert isinstance(
        update(c, {"type": "realtime", "audio": {"output": {"voice": "hibari", "speed": 1.1}}}), SessionUpdate
    )
    b = codec(Dialect.BETA)
    b.lock_voice()
    assert update(b, {"voice": "ash"}).param == "session.voice"


@pytest.mark.parametrize("dialect", list(Dialect))
def test_wire_form_is_a_fixpoint_of_the_parser(dialect):
    """Sending back what the server echoed changes nothing (GA keeps its served model)."""
    configs = CONFIGS + (GA_ONLY_CONFIGS if dialect is Dialect.GA else ())
    for config in configs:
        wire = to_wire(config, dialect)
        parsed = apply_update(DEFAULTS, wire, dialect, defaults=DEFAULTS, limits=Limits(), semantic_vad=True)
        if dialect is Dialect.GA:
            wire["model"] = DEFAULTS.model
        assert to_wire(parsed, dialect) == wire


def test_apply_update_raises_param_error_directly():
    with pytest.raises(ParamError) as exc:
        apply_update(DEFAULTS, {"speed": "fast"}, Dialect.BETA, defaults=DEFAULTS, limits=Limits())
    assert exc.value.rejected.param == "session.speed"


@pytest.mark.parametrize("dialect", [Dialect.GA, Dialect.BETA])
def test_a_forcing_tool_choice_needs_the_tool_it_forces(dialect):
    c = codec(dialect)
    base = {"type": "realtime"} if dialect is Dialect.GA else {}
    named = {"type": "function", "name": "get_time"} if dialect is Dialect.GA else "get_time"
    for choice, message in (
        (named, "Tool choice 'function' with name 'get_time' not found in 'tools' parameter."),
        (
            "required",
            "Invalid value for 'session.tool_choice': 'required' needs at least one function in 'tools'.",
        ),
    ):
        rejected = update(c, {**base, "tool_choice": choice})
        assert isinstance(rejected, Rejected)
        assert (rejected.code, rejected.param, rejected.message) == (
            "invalid_value",
            "session.tool_choice",
            message,
        )
    tool = {"type": "function", "name": "get_time", "parameters": {"type": "object"}}
    accepted = update(c, {**base, "tools": [tool], "tool_choice": named})
    assert accepted.config.tool_choice == ToolChoiceFunction("get_time")
    assert isinstance(update(c, {**base, "tools": []}), Rejected)  # the forced tool cannot go away
    assert c.config.tools == (FunctionTool("get_time", "", {"type": "object"}),)


@pytest.mark.parametrize("dialect", [Dialect.GA, Dialect.BETA])
def test_semantic_vad_is_accepted_when_the_codec_serves_it(dialect):
    vad = {"type": "semantic_vad", "eagerness": "low"}
    session = ga_input(turn_detection=vad) if dialect is Dialect.GA else {"turn_detection": vad}
    assert update(codec(dialect), session).code == "unsupported_feature"
    config = update(codec(dialect, semantic_vad=True), session).config
    assert config.turn_detection == SemanticVad(eagerness="low")
