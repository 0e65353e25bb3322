"""``response.create`` overrides and the effective settings of one response.

:class:`ResponseOptions` is what the client's ``response`` object asked for (``None`` = use the
session's value); :meth:`ResponseOptions.resolve` merges it over the :class:`SessionConfig` into
:class:`ResponseSettings`, which the voice kind generates with and which the ``response`` object
of ``response.created`` / ``response.done`` echoes. Overrides apply to that response only.

Accepted: ``instructions``, modalities (GA ``output_modalities`` / beta ``modalities``), voice and
output format (GA ``audio.output`` / beta ``voice``, ``output_audio_format``), ``tools``,
``tool_choice``, ``temperature`` (beta), max tokens (GA ``max_output_tokens`` / beta
``max_response_output_tokens``), ``conversation`` (``auto`` | ``none``), ``metadata`` (at most 16
string pairs), ``input`` (items and ``item_reference`` s). GA ``parallel_tool_calls`` and
``reasoning`` are accepted and ignored; ``prompt`` is a typed ``unsupported_feature``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from . import fields as f
from .dialect import Dialect
from .errors import ErrorCode, ParamError, quote, unsupported
from .fields import Obj
from .items import Item, parse_item
from .limits import Limits
from .session_config import (
    AudioFormat,
    FunctionTool,
    SessionConfig,
    ToolChoice,
    parse_format,
    parse_max_tokens,
    parse_modalities,
    parse_temperature,
    parse_tool_choice,
    parse_tools,
    parse_voice,
)

INF = "inf"


@dataclass(frozen=True)
class ItemReference:
    """``{"type": "item_reference", "id": ...}`` in ``response.input``: an existing item by id."""

    id: str


@dataclass(frozen=True)
class ResponseSettings:
    """What one response is generated with (session values with the response's overrides)."""

    instructions: str
    audio_output: bool
    voice: str
    output_format: AudioFormat
    tools: tuple[FunctionTool, ...]
    tool_choice: ToolChoice
    temperature: float
    max_output_tokens: int | None  # None: "inf"
    conversation: str = "auto"  # "none": out of band, not written to the conversation
    metadata: Mapping[str, str] | None = None
    input: tuple[Item | ItemReference, ...] | None = None  # None: the whole conversation

    @classmethod
    def of_session(cls, config: SessionConfig) -> ResponseSettings:
        """A response the server starts itself (server VAD ``create_response``)."""
        return cls(
            config.instructions,
            config.audio_output,
            config.voice,
            config.output_format,
            config.tools,
            config.tool_choice,
            config.temperature,
            config.max_output_tokens,
        )


@dataclass(frozen=True)
class ResponseOptions:
    instructions: str | None = None
    audio_output: bool | None = None
    voice: str | None = None
    output_format: AudioFormat | None = None
    tools: tuple[FunctionTool, ...] | None = None
    tool_choice: ToolChoice | None = None
    temperature: float | None = None
    max_output_tokens: int | str | None = None  # an int, "inf", or None (the session's)
    conversation: str = "auto"
    metadata: Mapping[str, str] | None = None
    input: tuple[Item | ItemReference, ...] | None = None

    def resolve(self, config: SessionConfig) -> ResponseSettings:
        def pick(value: Any, fallback: Any) -> Any:
            return fallback if value is None else value

        tokens = self.max_output_tokens
        return ResponseSettings(
            instructions=pick(self.instructions, config.instructions),
            audio_output=pick(self.audio_output, config.audio_output),
            voice=pick(self.voice, config.voice),
            output_format=pick(self.output_format, config.output_format),
            tools=pick(self.tools, config.tools),
            tool_choice=pick(self.tool_choice, config.tool_choice),
            temperature=pick(self.temperature, config.temperature),
            max_output_tokens=config.max_output_tokens
            if tokens is None
            else (None if tokens == INF else tokens),
            conversation=self.conversation,
            metadata=self.metadata,
            input=self.input,
        )


def _metadata(value: Any, path: str, limits: Limits) -> dict[str, str]:
    o = Obj(value, path)
    if len(o.raw) > limits.max_metadata_pairs:
        raise ParamError(
            ErrorCode.INVALID_VALUE,
            f"Invalid {quote(path)}: at most {limits.max_metadata_pairs} key-value pairs are allowed.",
            path,
        )
    out = {}
    for key in list(o.raw):
        f.string(key, path, max_len=limits.max_metadata_key_chars)
        out[key] = o.read(key, lambda v, p: f.string(v, p, max_len=limits.max_metadata_value_chars))
    return out


def _input(value: Any, path: str, dialect: Dialect, limits: Limits) -> tuple[Item | ItemReference, ...]:
    out: list[Item | ItemReference] = []
    for i, raw in enumerate(f.array(value, path, max_len=limits.max_response_input_items)):
        here = f.child(path, i)
        if isinstance(raw, dict) and raw.get("type") == "item_reference":
            o = Obj(raw, here)
            o.ignore("type")
            out.append(
                ItemReference(
                    o.read("id", lambda v, p: f.string(v, p, max_len=limits.max_id_chars, min_len=1))
                )
            )
            o.done()
        else:
            out.append(parse_item(raw, here, dialect, limits))
    return tuple(out)


def parse_response_options(value: Any, path: str, dialect: Dialect, limits: Limits) -> ResponseOptions:
    """The ``response`` object of ``response.create`` (absent or ``null``: no overrides)."""
    if value is None:
        return ResponseOptions()
    o = Obj(value, path)

    def opt(key: str, convert):
        return o.optional(key, convert, None, None)

    fmt = lambda v, p: parse_format(v, p, dialect)  # noqa: E731
    voice = lambda v, p: parse_voice(v, p, limits, dialect)  # noqa: E731
    tokens = lambda v, p: INF if v == INF else parse_max_tokens(v, p, limits)  # noqa: E731
    output_format = voice_name = None
    if dialect is Dialect.GA:
        if opt("prompt", Obj) is not None:
            raise unsupported("Stored prompts ('prompt') are", o.at("prompt"))
        opt("parallel_tool_calls", f.boolean)
        opt("reasoning", Obj)
        audio = opt("audio", Obj)
        if audio is not None:
            out = audio.optional("output", Obj, None, None)
            audio.done()
            if out is not None:
                output_format, voice_name = (
                    out.optional("format", fmt, None, None),
                    out.optional("voice", voice, None, None),
                )
                out.done()
        modalities, temperature, max_tokens = (
            opt("output_modalities", parse_modalities),
            None,
            opt("max_output_tokens", tokens),
        )
    else:
        output_format, voice_name = opt("output_audio_format", fmt), opt("voice", voice)
        modalities, temperature = opt("modalities", parse_modalities), opt("temperature", parse_temperature)
        max_tokens = opt("max_response_output_tokens", tokens)
    options = ResponseOptions(
        instructions=opt("instructions", lambda v, p: f.string(v, p, max_len=limits.max_instructions_chars)),
        audio_output=modalities,
        voice=voice_name,
        output_format=output_format,
        tools=opt("tools", lambda v, p: parse_tools(v, p, limits)),
        tool_choice=opt("tool_choice", lambda v, p: parse_tool_choice(v, p, limits, dialect)),
        temperature=temperature,
        max_output_tokens=max_tokens,
        conversation=o.optional(
            "conversation", lambda v, p: f.choice(v, p, ("auto", "none")), "auto", "auto"
        ),
        metadata=opt("metadata", lambda v, p: _metadata(v, p, limits)),
        input=opt("input", lambda v, p: _input(v, p, dialect, limits)),
    )
    o.done()
    return options
