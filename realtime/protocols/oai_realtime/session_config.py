"""The session configuration of one Realtime connection: typed fields, both wire shapes, deep merge.

One dialect-neutral :class:`SessionConfig`; :func:`to_wire` writes it in the GA shape (nested:
``output_modalities``, ``audio.input.format {type: "audio/pcm", rate: 24000}``,
``audio.input.turn_detection``, ``audio.output.voice``) or the beta shape (flat: ``modalities``,
``input_audio_format: "pcm16"``, ``turn_detection``, ``voice``, ``temperature``), reference §1.5.

``session.update`` semantics (:func:`apply_update`): the update is deep-merged into the current
config's wire form, then the result is validated as a whole, so a bad update changes nothing.

- Nested objects merge key by key (``audio``, ``audio.input``, ``audio.output``, transcription,
  noise reduction, turn detection): ``{"turn_detection": {"threshold": 0.8}}`` keeps the type and
  the other fields (a shallow merge would drop the type and silently disable VAD). An object whose
  ``type`` changes (``server_vad`` -> ``semantic_vad``) replaces the old one instead.
- Lists (``tools``, modalities) and scalars replace.
- An explicit ``null`` clears: ``turn_detection`` -> manual commit, transcription and noise
  reduction -> off, ``tools`` -> ``[]``, ``instructions`` -> ``""``, ``max_output_tokens`` ->
  ``"inf"``, tracing -> off; a field that must have a value (voice, formats, modalities, speed,
  temperature, tool_choice, VAD numbers) goes back to its default.
- Unknown parameters, wrong types and out-of-range values are refused with OpenAI's codes and
  messages and the ``param`` path (``session.audio.input.turn_detection.threshold``).
- ``model``: GA keeps the served model (any string accepted, ignored); beta checks the name
  against the names the beta SDK accepts and echoes it (``dialect.py``).
- Accepted and echoed but not acted on by this server: ``tracing``, ``include``, ``truncation``,
  ``reasoning``, ``noise_reduction``; accepted, stored, not echoed (absent from the SDK's session
  model): ``parallel_tool_calls``; beta ``client_secret`` is accepted and dropped.
- Not supported (typed ``unsupported_feature``): GA ``session.type: "transcription"``,
  ``prompt`` (server-stored prompts), MCP tools and tool choices, ``semantic_vad`` unless the
  codec is built with ``semantic_vad=True``.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from . import fields as f
from .dialect import BETA_MODELS, Dialect
from .errors import ErrorCode, ParamError, quote, unsupported
from .fields import Obj
from .limits import Limits

PCM_RATE = 24_000
G711_RATE = 8_000
_TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]+$")
TOOL_CHOICE_MODES = ("auto", "none", "required")
EAGERNESS = ("low", "medium", "high", "auto")
TEMPERATURE_RANGE = (0.6, 1.2)  # OpenAI's documented range (beta; GA has no temperature)
SPEED_RANGE = (0.25, 1.5)


class AudioFormat(enum.StrEnum):
    """Audio on the wire: mono. ``pcm16`` is 16-bit little-endian at 24 kHz; G.711 is 8 kHz."""

    PCM16 = "pcm16"
    G711_ULAW = "g711_ulaw"
    G711_ALAW = "g711_alaw"

    @property
    def sample_rate(self) -> int:
        return PCM_RATE if self is AudioFormat.PCM16 else G711_RATE

    @property
    def bytes_per_sample(self) -> int:
        return 2 if self is AudioFormat.PCM16 else 1


_GA_FORMAT_TYPES = {
    AudioFormat.PCM16: "audio/pcm",
    AudioFormat.G711_ULAW: "audio/pcmu",
    AudioFormat.G711_ALAW: "audio/pcma",
}
_FORMAT_BY_GA_TYPE = {v: k for k, v in _GA_FORMAT_TYPES.items()}


@dataclass(frozen=True)
class ServerVad:
    """``server_vad``; the defaults are OpenAI's documented ones. ``idle_timeout_ms`` is GA only."""

    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500
    create_response: bool = True
    interrupt_response: bool = True
    idle_timeout_ms: int | None = None


@dataclass(frozen=True)
class SemanticVad:
    eagerness: str = "auto"
    create_response: bool = True
    interrupt_response: bool = True


TurnDetection = ServerVad | SemanticVad

# semantic_vad is served as server VAD whose end-of-turn silence follows ``eagerness``: OpenAI's
# "`low` will wait longer for the user to continue speaking, `high` will respond more quickly.
# `auto` is the default and is equivalent to `medium`" (its max timeouts 8 s / 4 s / 2 s bound
# the wait of a semantic model; these silences sit well inside them).
SEMANTIC_VAD_SILENCE_MS = {"low": 800, "medium": 500, "auto": 500, "high": 250}


def as_server_vad(td: TurnDetection) -> ServerVad:
    """The server VAD a turn detection is served with (``semantic_vad``: the default threshold
    and padding, the silence its ``eagerness`` asks for)."""
    if isinstance(td, ServerVad):
        return td
    return ServerVad(
        silence_duration_ms=SEMANTIC_VAD_SILENCE_MS[td.eagerness],
        create_response=td.create_response,
        interrupt_response=td.interrupt_response,
    )


@dataclass(frozen=True)
class Transcription:
    """Input transcription settings; ``delay``, ``keywords`` and ``languages`` exist in GA only."""

    model: str | None = None
    language: str | None = None
    prompt: str | None = None
    delay: str | None = None
    keywords: tuple[str, ...] | None = None
    languages: tuple[str, ...] | None = None


@dataclass(frozen=True)
class NoiseReduction:
    type: str | None = None  # "near_field" | "far_field"
    strength: float | None = None  # GA only


@dataclass(frozen=True)
class FunctionTool:
    name: str
    description: str = ""
    parameters: Mapping[str, Any] | None = None  # a JSON schema, kept as sent


@dataclass(frozen=True)
class ToolChoiceFunction:
    name: str


ToolChoice = str | ToolChoiceFunction  # a str is one of TOOL_CHOICE_MODES


@dataclass(frozen=True)
class SessionConfig:
    """The effective configuration of one session. ``model`` is the name shown to the client."""

    model: str
    instructions: str = ""
    audio_output: bool = True  # GA output_modalities ["audio"] / beta modalities ["text", "audio"]
    voice: str = "alloy"
    speed: float = 1.0
    input_format: AudioFormat = AudioFormat.PCM16
    output_format: AudioFormat = AudioFormat.PCM16
    transcription: Transcription | None = None
    noise_reduction: NoiseReduction | None = None
    turn_detection: TurnDetection | None = field(default_factory=ServerVad)  # None: manual commit
    tools: tuple[FunctionTool, ...] = ()
    tool_choice: ToolChoice = "auto"
    temperature: float = 0.8
    max_output_tokens: int | None = None  # None: "inf"
    tracing: str | Mapping[str, Any] | None = None
    include: tuple[str, ...] | None = None
    truncation: str | Mapping[str, Any] = "auto"
    reasoning: Mapping[str, Any] | None = None
    parallel_tool_calls: bool | None = None


# ----------------------------------------------------------------------------- field parsers
# Shared by session.update and response.create (client_events.py).


def parse_voice(value: Any, path: str, limits: Limits, dialect: Dialect) -> str:
    if dialect is Dialect.GA and isinstance(value, dict):  # GA custom voice {"id": "voice_..."}
        o = Obj(value, path)
        voice = o.read("id", lambda v, p: f.string(v, p, max_len=limits.max_name_chars, min_len=1))
        o.done()
        return voice
    return f.string(value, path, max_len=limits.max_name_chars, min_len=1)


def parse_modalities(value: Any, path: str) -> bool:
    """True when audio is requested. Both spellings accept ``["audio"]``, ``["text"]`` and both."""
    items = f.array(value, path, max_len=2)
    if not items:
        raise ParamError(
            ErrorCode.INVALID_VALUE, f"Invalid {quote(path)}: expected at least one modality.", path
        )
    chosen = {f.choice(v, f.child(path, i), ("text", "audio")) for i, v in enumerate(items)}
    return "audio" in chosen


def render_modalities(audio: bool, dialect: Dialect) -> list[str]:
    if dialect is Dialect.GA:
        return ["audio"] if audio else ["text"]
    return ["text", "audio"] if audio else ["text"]


def parse_format(value: Any, path: str, dialect: Dialect) -> AudioFormat:
    if dialect is Dialect.BETA:
        return AudioFormat(f.choice(value, path, tuple(AudioFormat)))
    o = Obj(value, path)
    fmt = _FORMAT_BY_GA_TYPE[
        o.read("type", lambda v, p: f.choice(v, p, tuple(_FORMAT_BY_GA_TYPE)), "audio/pcm")
    ]
    if fmt is AudioFormat.PCM16:
        rate = o.read("rate", lambda v, p: f.integer(v, p, lo=0, hi=2**31), PCM_RATE)
        if rate != PCM_RATE:
            raise ParamError(
                ErrorCode.INVALID_VALUE,
                f"Invalid value: {rate}. Supported values are: {PCM_RATE}.",
                o.at("rate"),
            )
    o.done()
    return fmt


def render_format(fmt: AudioFormat, dialect: Dialect) -> Any:
    if dialect is Dialect.BETA:
        return fmt.value
    if fmt is AudioFormat.PCM16:
        return {"type": "audio/pcm", "rate": PCM_RATE}
    return {"type": _GA_FORMAT_TYPES[fmt]}


def parse_tools(value: Any, path: str, limits: Limits) -> tuple[FunctionTool, ...]:
    tools = []
    names: set[str] = set()
    for i, raw in enumerate(f.array(value, path, max_len=limits.max_tools)):
        o = Obj(raw, f.child(path, i))
        if o.read("type", lambda v, p: f.choice(v, p, ("function", "mcp")), "function") == "mcp":
            raise unsupported("MCP tools are", o.at("type"))
        name = o.read("name", lambda v, p: f.string(v, p, max_len=limits.max_tool_name_chars, min_len=1))
        if not _TOOL_NAME.match(name):
            raise ParamError(
                ErrorCode.INVALID_VALUE,
                f"Invalid {quote(o.at('name'))}: string does not match pattern. "
                "Expected a string that matches the pattern '^[a-zA-Z0-9_-]+$'.",
                o.at("name"),
            )
        if name in names:
            raise ParamError(ErrorCode.INVALID_VALUE, f"Duplicate tool name {quote(name)}.", o.at("name"))
        names.add(name)
        description = o.optional(
            "description", lambda v, p: f.string(v, p, max_len=limits.max_tool_description_chars), "", ""
        )
        parameters = o.optional("parameters", lambda v, p: f.opaque(Obj(v, p).raw, p), None, None)
        o.done()
        tools.append(FunctionTool(name, description, parameters))
    return tuple(tools)


def render_tools(tools: tuple[FunctionTool, ...]) -> list[dict[str, Any]]:
    out = []
    for tool in tools:
        wire: dict[str, Any] = {"type": "function", "name": tool.name, "description": tool.description}
        if tool.parameters is not None:
            wire["parameters"] = tool.parameters
        out.append(wire)
    return out


def parse_tool_choice(value: Any, path: str, limits: Limits, dialect: Dialect) -> ToolChoice:
    if isinstance(value, str):
        if dialect is Dialect.BETA and value not in TOOL_CHOICE_MODES:  # beta names a function directly
            return ToolChoiceFunction(f.string(value, path, max_len=limits.max_tool_name_chars, min_len=1))
        return f.choice(value, path, TOOL_CHOICE_MODES)
    if dialect is Dialect.BETA:
        raise f.wrong_type(value, path, "a string")
    o = Obj(value, path)
    if o.read("type", lambda v, p: f.choice(v, p, ("function", "mcp"))) == "mcp":
        raise unsupported("MCP tool choices are", o.at("type"))
    name = o.read("name", lambda v, p: f.string(v, p, max_len=limits.max_tool_name_chars, min_len=1))
    o.done()
    return ToolChoiceFunction(name)


def check_tool_choice(tools: tuple[FunctionTool, ...], choice: ToolChoice, path: str) -> None:
    """A choice that forces a call needs a tool to call: ``"required"`` needs at least one, a
    named function must be one of ``tools`` (``invalid_value`` at ``path`` otherwise)."""
    if choice == "required" and not tools:
        raise ParamError(
            ErrorCode.INVALID_VALUE,
            f"Invalid value for {quote(path)}: 'required' needs at least one function in 'tools'.",
            path,
        )
    if isinstance(choice, ToolChoiceFunction) and choice.name not in {t.name for t in tools}:
        raise ParamError(
            ErrorCode.INVALID_VALUE,
            f"Tool choice 'function' with name {quote(choice.name)} not found in 'tools' parameter.",
            path,
        )


def render_tool_choice(choice: ToolChoice, dialect: Dialect) -> Any:
    if isinstance(choice, str):
        return choice
    return choice.name if dialect is Dialect.BETA else {"type": "function", "name": choice.name}


def parse_max_tokens(value: Any, path: str, limits: Limits) -> int | None:
    if value == "inf":
        return None
    if isinstance(value, str):
        raise ParamError(
            ErrorCode.INVALID_VALUE, f"Invalid value: {quote(value)}. Supported values are: 'inf'.", path
        )
    return f.integer(value, path, lo=1, hi=limits.max_output_tokens)


def parse_temperature(value: Any, path: str) -> float:
    return f.number(value, path, lo=TEMPERATURE_RANGE[0], hi=TEMPERATURE_RANGE[1])


def _tracing(value: Any, path: str) -> str | Mapping[str, Any]:
    if isinstance(value, str):
        return f.choice(value, path, ("auto",))
    o = Obj(value, path)
    o.optional("group_id", lambda v, p: f.string(v, p, max_len=256), None, None)
    o.optional("workflow_name", lambda v, p: f.string(v, p, max_len=256), None, None)
    o.optional("metadata", f.opaque, None, None)
    o.done()
    return o.raw


def _truncation(value: Any, path: str) -> str | Mapping[str, Any]:
    if isinstance(value, str):
        return f.choice(value, path, ("auto", "disabled"))
    o = Obj(value, path)
    o.read("type", lambda v, p: f.choice(v, p, ("retention_ratio",)))
    o.read("retention_ratio", lambda v, p: f.number(v, p, lo=0.0, hi=1.0))
    limits = o.optional("token_limits", Obj, None, None)
    if limits is not None:
        limits.optional("post_instructions", lambda v, p: f.integer(v, p, lo=0, hi=2**31), None, None)
        limits.done()
    o.done()
    return o.raw


def _reasoning(value: Any, path: str) -> Mapping[str, Any]:
    o = Obj(value, path)
    o.optional(
        "effort", lambda v, p: f.choice(v, p, ("minimal", "low", "medium", "high", "xhigh")), None, None
    )
    o.done()
    return o.raw


def _name(limits: Limits):
    return lambda v, p: f.string(v, p, max_len=limits.max_name_chars)


def _names(limits: Limits):
    def parse(value: Any, path: str) -> tuple[str, ...]:
        items = f.array(value, path, max_len=64)
        return tuple(
            f.string(v, f.child(path, i), max_len=limits.max_name_chars) for i, v in enumerate(items)
        )

    return parse


def _transcription(value: Any, path: str, dialect: Dialect, limits: Limits) -> Transcription:
    o = Obj(value, path)
    name = _name(limits)
    t = Transcription(
        model=o.optional("model", name, None, None),
        language=o.optional("language", name, None, None),
        prompt=o.optional("prompt", lambda v, p: f.string(v, p, max_len=limits.max_text_chars), None, None),
    )
    if dialect is Dialect.GA:
        t = replace(
            t,
            delay=o.optional(
                "delay",
                lambda v, p: f.choice(v, p, ("minimal", "low", "medium", "high", "xhigh")),
                None,
                None,
            ),
            keywords=o.optional("keywords", _names(limits), None, None),
            languages=o.optional("languages", _names(limits), None, None),
        )
    o.done()
    return t


def _render_transcription(t: Transcription | None, dialect: Dialect) -> dict[str, Any] | None:
    if t is None:
        return None
    wire: dict[str, Any] = {"model": t.model, "language": t.language, "prompt": t.prompt}
    if dialect is Dialect.GA:
        for key in ("delay", "keywords", "languages"):
            value = getattr(t, key)
            if value is not None:
                wire[key] = list(value) if isinstance(value, tuple) else value
    return wire


def _noise_reduction(value: Any, path: str, dialect: Dialect) -> NoiseReduction:
    o = Obj(value, path)
    nr = NoiseReduction(
        type=o.optional("type", lambda v, p: f.choice(v, p, ("near_field", "far_field")), None, None)
    )
    if dialect is Dialect.GA:
        nr = replace(
            nr, strength=o.optional("strength", lambda v, p: f.number(v, p, lo=0.0, hi=1.0), None, None)
        )
    o.done()
    return nr


def _render_noise_reduction(nr: NoiseReduction | None, dialect: Dialect) -> dict[str, Any] | None:
    if nr is None:
        return None
    wire: dict[str, Any] = {"type": nr.type}
    if dialect is Dialect.GA and nr.strength is not None:
        wire["strength"] = nr.strength
    return wire


def _turn_detection(
    value: Any, path: str, dialect: Dialect, limits: Limits, semantic_vad: bool
) -> TurnDetection:
    o = Obj(value, path)
    # GA's union needs the type; the beta model has it optional (server_vad then)
    default_type = f.MISSING if dialect is Dialect.GA else "server_vad"
    kind = o.read("type", lambda v, p: f.choice(v, p, ("server_vad", "semantic_vad")), default_type)
    flag = f.boolean
    if kind == "semantic_vad":
        if not semantic_vad:
            raise unsupported("Turn detection type 'semantic_vad' is", o.at("type"))
        d = SemanticVad()
        td: TurnDetection = SemanticVad(
            eagerness=o.optional(
                "eagerness", lambda v, p: f.choice(v, p, EAGERNESS), d.eagerness, d.eagerness
            ),
            create_response=o.optional("create_response", flag, d.create_response, d.create_response),
            interrupt_response=o.optional(
                "interrupt_response", flag, d.interrupt_response, d.interrupt_response
            ),
        )
        o.done()
        return td
    d = ServerVad()

    def ms(v: Any, p: str) -> int:
        return f.integer(v, p, lo=0, hi=limits.max_vad_ms)

    td = ServerVad(
        threshold=o.optional(
            "threshold", lambda v, p: f.number(v, p, lo=0.0, hi=1.0), d.threshold, d.threshold
        ),
        prefix_padding_ms=o.optional("prefix_padding_ms", ms, d.prefix_padding_ms, d.prefix_padding_ms),
        silence_duration_ms=o.optional(
            "silence_duration_ms", ms, d.silence_duration_ms, d.silence_duration_ms
        ),
        create_response=o.optional("create_response", flag, d.create_response, d.create_response),
        interrupt_response=o.optional("interrupt_response", flag, d.interrupt_response, d.interrupt_response),
    )
    if dialect is Dialect.GA:
        idle = o.optional(
            "idle_timeout_ms", lambda v, p: f.integer(v, p, lo=1, hi=limits.max_idle_timeout_ms), None, None
        )
        td = replace(td, idle_timeout_ms=idle)
    o.done()
    return td


def _render_turn_detection(td: TurnDetection | None, dialect: Dialect) -> dict[str, Any] | None:
    if td is None:
        return None
    if isinstance(td, SemanticVad):
        return {
            "type": "semantic_vad",
            "eagerness": td.eagerness,
            "create_response": td.create_response,
            "interrupt_response": td.interrupt_response,
        }
    wire: dict[str, Any] = {
        "type": "server_vad",
        "threshold": td.threshold,
        "prefix_padding_ms": td.prefix_padding_ms,
        "silence_duration_ms": td.silence_duration_ms,
        "create_response": td.create_response,
        "interrupt_response": td.interrupt_response,
    }
    if dialect is Dialect.GA:
        wire["idle_timeout_ms"] = td.idle_timeout_ms
    return wire


# ------------------------------------------------------------------------------ wire forms


def to_wire(config: SessionConfig, dialect: Dialect) -> dict[str, Any]:
    """The complete request-shaped form (what ``session.update`` could send to reach ``config``)."""
    c = config
    if dialect is Dialect.BETA:
        return {
            "model": c.model,
            "modalities": render_modalities(c.audio_output, dialect),
            "instructions": c.instructions,
            "voice": c.voice,
            "speed": c.speed,
            "input_audio_format": render_format(c.input_format, dialect),
            "output_audio_format": render_format(c.output_format, dialect),
            "input_audio_transcription": _render_transcription(c.transcription, dialect),
            "input_audio_noise_reduction": _render_noise_reduction(c.noise_reduction, dialect),
            "turn_detection": _render_turn_detection(c.turn_detection, dialect),
            "tools": render_tools(c.tools),
            "tool_choice": render_tool_choice(c.tool_choice, dialect),
            "temperature": c.temperature,
            "max_response_output_tokens": "inf" if c.max_output_tokens is None else c.max_output_tokens,
            "tracing": c.tracing,
        }
    return {
        "type": "realtime",
        "model": c.model,
        "output_modalities": render_modalities(c.audio_output, dialect),
        "instructions": c.instructions,
        "audio": {
            "input": {
                "format": render_format(c.input_format, dialect),
                "transcription": _render_transcription(c.transcription, dialect),
                "noise_reduction": _render_noise_reduction(c.noise_reduction, dialect),
                "turn_detection": _render_turn_detection(c.turn_detection, dialect),
            },
            "output": {"format": render_format(c.output_format, dialect), "voice": c.voice, "speed": c.speed},
        },
        "tools": render_tools(c.tools),
        "tool_choice": render_tool_choice(c.tool_choice, dialect),
        "max_output_tokens": "inf" if c.max_output_tokens is None else c.max_output_tokens,
        "tracing": c.tracing,
        "include": None if c.include is None else list(c.include),
        "truncation": c.truncation,
        "reasoning": c.reasoning,
        "parallel_tool_calls": c.parallel_tool_calls,
    }


_NOT_ECHOED = {Dialect.GA: ("parallel_tool_calls",), Dialect.BETA: ()}


def render_session(
    config: SessionConfig, dialect: Dialect, session_id: str, expires_at: int
) -> dict[str, Any]:
    """The ``session`` object of ``session.created`` / ``session.updated``."""
    wire = to_wire(config, dialect)
    for key in _NOT_ECHOED[dialect]:
        wire.pop(key)
    return {"id": session_id, "object": "realtime.session", "expires_at": expires_at, **wire}


_MERGEABLE = {
    Dialect.GA: frozenset(
        {
            "audio",
            "audio.input",
            "audio.output",
            "audio.input.transcription",
            "audio.input.noise_reduction",
            "audio.input.turn_detection",
        }
    ),
    Dialect.BETA: frozenset({"input_audio_transcription", "input_audio_noise_reduction", "turn_detection"}),
}


def deep_merge(
    base: Mapping[str, Any], update: Mapping[str, Any], mergeable: frozenset[str], path: str = ""
) -> dict[str, Any]:
    """``update`` over ``base``: mergeable objects merge unless their ``type`` changes; the rest replace."""
    out = dict(base)
    for key, value in update.items():
        here = f.child(path, key)
        old = out.get(key)
        if (
            here in mergeable
            and isinstance(value, dict)
            and isinstance(old, dict)
            and value.get("type", old.get("type")) == old.get("type")
        ):
            out[key] = deep_merge(old, value, mergeable, here)
        else:
            out[key] = value
    return out


def apply_update(
    current: SessionConfig,
    update: Any,
    dialect: Dialect,
    *,
    defaults: SessionConfig,
    limits: Limits,
    semantic_vad: bool = False,
) -> SessionConfig:
    """The config after ``session.update``'s ``session`` object, or :class:`ParamError` (nothing changes)."""
    raw = Obj(update, "session").raw
    merged = deep_merge(to_wire(current, dialect), raw, _MERGEABLE[dialect])
    parse = _parse_ga if dialect is Dialect.GA else _parse_beta
    config = parse(Obj(merged, "session"), current, defaults, limits, semantic_vad)
    check_tool_choice(config.tools, config.tool_choice, "session.tool_choice")
    return config


def _common(o: Obj, d: SessionConfig, limits: Limits, dialect: Dialect) -> dict[str, Any]:
    """Fields spelled the same in both dialects (``null`` -> the cleared value)."""
    return {
        "instructions": o.optional(
            "instructions", lambda v, p: f.string(v, p, max_len=limits.max_instructions_chars), "", ""
        ),
        "tools": o.optional("tools", lambda v, p: parse_tools(v, p, limits), (), ()),
        "tool_choice": o.optional(
            "tool_choice", lambda v, p: parse_tool_choice(v, p, limits, dialect), d.tool_choice, d.tool_choice
        ),
        "tracing": o.optional("tracing", _tracing, None, None),
    }


def _parse_ga(
    o: Obj, current: SessionConfig, d: SessionConfig, limits: Limits, semantic_vad: bool
) -> SessionConfig:
    dialect = Dialect.GA
    if (
        o.read("type", lambda v, p: f.choice(v, p, ("realtime", "transcription")), "realtime")
        == "transcription"
    ):
        raise unsupported("Transcription sessions (session.type 'transcription') are", o.at("type"))
    o.optional("model", _name(limits), None, None)  # GA shows the served model; a client's choice is ignored
    if o.optional("prompt", Obj, None, None) is not None:
        raise unsupported("Stored prompts ('prompt') are", o.at("prompt"))
    audio = o.read("audio", Obj, None)
    audio_in = audio.read("input", Obj, None) if audio else None
    audio_out = audio.read("output", Obj, None) if audio else None
    config = replace(
        current,
        **_common(o, d, limits, dialect),
        audio_output=o.optional("output_modalities", parse_modalities, d.audio_output, d.audio_output),
        max_output_tokens=o.optional(
            "max_output_tokens", lambda v, p: parse_max_tokens(v, p, limits), None, None
        ),
        include=o.optional(
            "include",
            lambda v, p: tuple(
                f.choice(x, f.child(p, i), ("item.input_audio_transcription.logprobs",))
                for i, x in enumerate(f.array(v, p, max_len=1))
            ),
            None,
            None,
        ),
        truncation=o.optional("truncation", _truncation, "auto", "auto"),
        reasoning=o.optional("reasoning", _reasoning, None, None),
        parallel_tool_calls=o.optional("parallel_tool_calls", f.boolean, None, None),
    )
    if audio_in is not None:
        config = replace(
            config,
            input_format=audio_in.optional(
                "format", lambda v, p: parse_format(v, p, dialect), d.input_format, d.input_format
            ),
            transcription=audio_in.optional(
                "transcription", lambda v, p: _transcription(v, p, dialect, limits), None, None
            ),
            noise_reduction=audio_in.optional(
                "noise_reduction", lambda v, p: _noise_reduction(v, p, dialect), None, None
            ),
            turn_detection=audio_in.optional(
                "turn_detection",
                lambda v, p: _turn_detection(v, p, dialect, limits, semantic_vad),
                None,
                None,
            ),
        )
        audio_in.done()
    if audio_out is not None:
        config = replace(
            config,
            output_format=audio_out.optional(
                "format", lambda v, p: parse_format(v, p, dialect), d.output_format, d.output_format
            ),
            voice=audio_out.optional(
                "voice", lambda v, p: parse_voice(v, p, limits, dialect), d.voice, d.voice
            ),
            speed=audio_out.optional(
                "speed", lambda v, p: f.number(v, p, lo=SPEED_RANGE[0], hi=SPEED_RANGE[1]), d.speed, d.speed
            ),
        )
        audio_out.done()
    if audio is not None:
        audio.done()
    o.done()
    return config


def _parse_beta(
    o: Obj, current: SessionConfig, d: SessionConfig, limits: Limits, semantic_vad: bool
) -> SessionConfig:
    dialect = Dialect.BETA
    o.ignore("client_secret")  # ephemeral-key minting options: meaningless on an open socket
    config = replace(
        current,
        **_common(o, d, limits, dialect),
        model=o.optional("model", lambda v, p: f.choice(v, p, BETA_MODELS), current.model, d.model),
        audio_output=o.optional("modalities", parse_modalities, d.audio_output, d.audio_output),
        voice=o.optional("voice", lambda v, p: parse_voice(v, p, limits, dialect), d.voice, d.voice),
        speed=o.optional(
            "speed", lambda v, p: f.number(v, p, lo=SPEED_RANGE[0], hi=SPEED_RANGE[1]), d.speed, d.speed
        ),
        input_format=o.optional(
            "input_audio_format", lambda v, p: parse_format(v, p, dialect), d.input_format, d.input_format
        ),
        output_format=o.optional(
            "output_audio_format", lambda v, p: parse_format(v, p, dialect), d.output_format, d.output_format
        ),
        transcription=o.optional(
            "input_audio_transcription", lambda v, p: _transcription(v, p, dialect, limits), None, None
        ),
        noise_reduction=o.optional(
            "input_audio_noise_reduction", lambda v, p: _noise_reduction(v, p, dialect), None, None
        ),
        turn_detection=o.optional(
            "turn_detection", lambda v, p: _turn_detection(v, p, dialect, limits, semantic_vad), None, None
        ),
        temperature=o.optional("temperature", parse_temperature, d.temperature, d.temperature),
        max_output_tokens=o.optional(
            "max_response_output_tokens", lambda v, p: parse_max_tokens(v, p, limits), None, None
        ),
    )
    o.done()
    return config
