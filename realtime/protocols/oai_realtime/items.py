"""Conversation items: typed dataclasses, the client's ``item`` parser, the server's item renderer.

Item kinds (GA ``conversation_item.py`` / beta ``conversation_item.py``): a ``message`` (role
``system`` | ``user`` | ``assistant``), a ``function_call`` and a ``function_call_output``. Content
part spellings differ: assistant text and audio are ``output_text`` / ``output_audio`` in GA and
``text`` / ``audio`` in beta; user parts are ``input_text`` / ``input_audio`` in both.

A client may not create assistant audio (OpenAI: "cannot populate assistant audio messages"),
images (``input_image``), item references inside a message, or MCP items: each is a typed error.
Audio travels as base64 on the wire and as decoded bytes here.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any

from . import fields as f
from .dialect import Dialect
from .errors import ErrorCode, ParamError, quote, unsupported
from .fields import Obj
from .limits import Limits
from .wire import new_id

STATUSES = ("completed", "incomplete", "in_progress")
ROLES = ("user", "assistant", "system")


@dataclass(frozen=True)
class InputText:
    text: str


@dataclass(frozen=True)
class InputAudio:
    audio: bytes | None = None  # in the session's input format
    transcript: str | None = None


@dataclass(frozen=True)
class OutputText:
    text: str


@dataclass(frozen=True)
class OutputAudio:
    transcript: str = ""
    audio: bytes | None = None  # only sent in conversation.item.retrieved


ContentPart = InputText | InputAudio | OutputText | OutputAudio


@dataclass(frozen=True)
class Message:
    id: str
    role: str
    content: tuple[ContentPart, ...]
    status: str = "completed"


@dataclass(frozen=True)
class FunctionCall:
    id: str
    call_id: str
    name: str
    arguments: str
    status: str = "completed"


@dataclass(frozen=True)
class FunctionCallOutput:
    id: str
    call_id: str
    output: str
    status: str = "completed"


Item = Message | FunctionCall | FunctionCallOutput

# content part type names per dialect and role, as the client may send them
_PART_TYPES = {
    (Dialect.GA, "system"): ("input_text",),
    (Dialect.GA, "user"): ("input_text", "input_audio"),
    (Dialect.GA, "assistant"): ("output_text",),
    (Dialect.BETA, "system"): ("input_text",),
    (Dialect.BETA, "user"): ("input_text", "input_audio"),
    (Dialect.BETA, "assistant"): ("text",),
}
_REFUSED_PARTS = {
    "input_image": "Image input ('input_image') is",
    "output_audio": "Creating assistant audio content ('output_audio') is",
    "audio": "Creating assistant audio content ('audio') is",
    "item_reference": "Item references inside a message are",
}


def decode_audio(value: Any, path: str, max_bytes: int) -> bytes:
    """Strict base64 (no whitespace, correct padding) of at most ``max_bytes`` decoded bytes."""
    if not isinstance(value, str):
        raise f.wrong_type(value, path, "a string")
    if (len(value) // 4) * 3 > max_bytes + 2:  # refuse before decoding: base64 is 4 chars per 3 bytes
        raise _audio_too_large(path, max_bytes)
    try:
        audio = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ParamError(
            ErrorCode.INVALID_BASE64, f"Invalid {quote(path)}: not valid base64 audio data.", path
        ) from None
    if len(audio) > max_bytes:
        raise _audio_too_large(path, max_bytes)
    return audio


def _audio_too_large(path: str, max_bytes: int) -> ParamError:
    return ParamError(
        ErrorCode.AUDIO_TOO_LARGE,
        f"Invalid {quote(path)}: audio is larger than {max_bytes} bytes decoded.",
        path,
    )


def _part(raw: Any, path: str, role: str, dialect: Dialect, limits: Limits) -> ContentPart:
    o = Obj(raw, path)
    allowed = _PART_TYPES[(dialect, role)]
    kind = o.get("type")
    if kind is f.MISSING:
        raise f.missing(o.at("type"))
    if isinstance(kind, str) and kind in _REFUSED_PARTS:
        raise unsupported(_REFUSED_PARTS[kind], o.at("type"))
    if kind not in allowed:
        f.choice(kind, o.at("type"), allowed)  # raises the typed error
    text = lambda v, p: f.string(v, p, max_len=limits.max_text_chars)  # noqa: E731
    if kind == "input_audio":
        audio = o.optional("audio", lambda v, p: decode_audio(v, p, limits.max_item_audio_bytes), None, None)
        part: ContentPart = InputAudio(audio, o.optional("transcript", text, None, None))
    elif kind == "input_text":
        part = InputText(o.read("text", text))
    else:
        part = OutputText(o.read("text", text))
    o.done()
    return part


def parse_item(raw: Any, path: str, dialect: Dialect, limits: Limits) -> Item:
    """A client's ``item``. A missing ``id`` gets a fresh ``item_...`` id (``call_id`` likewise)."""
    o = Obj(raw, path)
    ident = lambda v, p: f.string(v, p, max_len=limits.max_id_chars, min_len=1)  # noqa: E731
    text = lambda v, p: f.string(v, p, max_len=limits.max_text_chars)  # noqa: E731
    # the beta model leaves ``type`` optional; a message is the only item without other markers
    default_kind = f.MISSING if dialect is Dialect.GA else "message"
    kind = o.get("type")
    if isinstance(kind, str) and kind.startswith("mcp_"):
        raise unsupported(f"MCP items ({quote(kind)}) are", o.at("type"))
    kind = o.read(
        "type",
        lambda v, p: f.choice(v, p, ("message", "function_call", "function_call_output")),
        default_kind,
    )
    item_id = o.read("id", ident, None) or new_id("item")
    o.optional("object", lambda v, p: f.choice(v, p, ("realtime.item",)), None, None)
    status = o.optional("status", lambda v, p: f.choice(v, p, STATUSES), "completed", "completed")
    if kind == "message":
        role = o.read("role", lambda v, p: f.choice(v, p, ROLES))
        parts = o.read("content", lambda v, p: f.array(v, p, max_len=limits.max_content_parts))
        content = tuple(
            _part(p, f.child(o.at("content"), i), role, dialect, limits) for i, p in enumerate(parts)
        )
        item: Item = Message(item_id, role, content, status)
    elif kind == "function_call":
        item = FunctionCall(
            item_id,
            call_id=o.optional("call_id", ident, None, None) or new_id("call"),
            name=o.read("name", lambda v, p: f.string(v, p, max_len=limits.max_tool_name_chars, min_len=1)),
            arguments=o.read("arguments", text, f.MISSING if dialect is Dialect.GA else ""),
            status=status,
        )
    else:
        item = FunctionCallOutput(item_id, o.read("call_id", ident), o.read("output", text), status)
    o.done()
    return item


def _b64(audio: bytes) -> str:
    return base64.b64encode(audio).decode("ascii")


def _render_part(part: ContentPart, dialect: Dialect, include_audio: bool) -> dict[str, Any]:
    if isinstance(part, InputText):
        return {"type": "input_text", "text": part.text}
    if isinstance(part, OutputText):
        return {"type": "output_text" if dialect is Dialect.GA else "text", "text": part.text}
    wire: dict[str, Any]
    if isinstance(part, InputAudio):
        wire = {"type": "input_audio", "transcript": part.transcript}
    else:
        wire = {"type": "output_audio" if dialect is Dialect.GA else "audio", "transcript": part.transcript}
    if include_audio and part.audio is not None:
        wire["audio"] = _b64(part.audio)
    return wire


def audio_bytes(item: Item) -> int:
    """Decoded audio bytes an item holds (to decide whether retrieving it fits a frame)."""
    if not isinstance(item, Message):
        return 0
    return sum(len(p.audio or b"") for p in item.content if isinstance(p, InputAudio | OutputAudio))


def render_item(item: Item, dialect: Dialect, *, include_audio: bool = False) -> dict[str, Any]:
    """The server's item object; audio only when ``include_audio`` (``conversation.item.retrieved``)."""
    wire: dict[str, Any] = {"id": item.id, "object": "realtime.item", "status": item.status}
    if isinstance(item, Message):
        wire.update(
            type="message",
            role=item.role,
            content=[_render_part(p, dialect, include_audio) for p in item.content],
        )
    elif isinstance(item, FunctionCall):
        wire.update(type="function_call", call_id=item.call_id, name=item.name, arguments=item.arguments)
    else:
        wire.update(type="function_call_output", call_id=item.call_id, output=item.output)
    return wire
