"""Client events of the Realtime protocol as typed commands, and their parsers.

Every command keeps the client's ``event_id`` (a string of at most ``Limits.max_event_id_chars``,
or ``None``). ``session.update`` is not here: it needs the connection's current config, so the
codec (``codec.py``) handles it and returns :class:`SessionUpdate`.

| client event | command | fields |
| --- | --- | --- |
| ``session.update`` | :class:`SessionUpdate` | ``config`` (effective, after the deep merge), ``previous`` |
| ``input_audio_buffer.append`` | :class:`AudioAppend` | ``audio`` (decoded bytes, <= 15 MiB) |
| ``input_audio_buffer.commit`` | :class:`AudioCommit` | |
| ``input_audio_buffer.clear`` | :class:`AudioClear` | |
| ``conversation.item.create`` | :class:`ItemCreate` | ``item``, ``previous_item_id`` (``"root"`` = first) |
| ``conversation.item.delete`` | :class:`ItemDelete` | ``item_id`` |
| ``conversation.item.retrieve`` | :class:`ItemRetrieve` | ``item_id`` |
| ``conversation.item.truncate`` | :class:`ItemTruncate` | ``item_id``, ``content_index``, ``audio_end_ms`` |
| ``response.create`` | :class:`ResponseCreate` | ``options`` (:class:`~.responses.ResponseOptions`) |
| ``response.cancel`` | :class:`ResponseCancel` | ``response_id`` (optional) |
| ``output_audio_buffer.clear`` | :class:`OutputAudioClear` | |
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from . import fields as f
from .dialect import Dialect
from .errors import Rejected
from .fields import Obj
from .items import Item, decode_audio, parse_item
from .limits import Limits
from .responses import ResponseOptions, parse_response_options
from .session_config import SessionConfig

MAX_AUDIO_END_MS = 24 * 60 * 60 * 1000  # a truncate point past a day of audio is refused as a value


@dataclass(frozen=True)
class SessionUpdate:
    event_id: str | None
    config: SessionConfig
    previous: SessionConfig


@dataclass(frozen=True)
class AudioAppend:
    event_id: str | None
    audio: bytes


@dataclass(frozen=True)
class AudioCommit:
    event_id: str | None


@dataclass(frozen=True)
class AudioClear:
    event_id: str | None


@dataclass(frozen=True)
class ItemCreate:
    event_id: str | None
    item: Item
    previous_item_id: str | None = None


@dataclass(frozen=True)
class ItemDelete:
    event_id: str | None
    item_id: str


@dataclass(frozen=True)
class ItemRetrieve:
    event_id: str | None
    item_id: str


@dataclass(frozen=True)
class ItemTruncate:
    event_id: str | None
    item_id: str
    content_index: int
    audio_end_ms: int


@dataclass(frozen=True)
class ResponseCreate:
    event_id: str | None
    options: ResponseOptions


@dataclass(frozen=True)
class ResponseCancel:
    event_id: str | None
    response_id: str | None = None


@dataclass(frozen=True)
class OutputAudioClear:
    event_id: str | None


Command = (
    SessionUpdate
    | AudioAppend
    | AudioCommit
    | AudioClear
    | ItemCreate
    | ItemDelete
    | ItemRetrieve
    | ItemTruncate
    | ResponseCreate
    | ResponseCancel
    | OutputAudioClear
    | Rejected
)

Parser = Callable[[Obj, str | None, Dialect, Limits], Command]


def _id(limits: Limits):
    return lambda v, p: f.string(v, p, max_len=limits.max_id_chars, min_len=1)


def _append(o: Obj, event_id: str | None, dialect: Dialect, limits: Limits) -> AudioAppend:
    return AudioAppend(event_id, o.read("audio", lambda v, p: decode_audio(v, p, limits.max_append_bytes)))


def _item_create(o: Obj, event_id: str | None, dialect: Dialect, limits: Limits) -> ItemCreate:
    previous = o.optional("previous_item_id", _id(limits), None, None)
    return ItemCreate(event_id, o.read("item", lambda v, p: parse_item(v, p, dialect, limits)), previous)


def _item_id(cls: type) -> Parser:
    return lambda o, event_id, dialect, limits: cls(event_id, o.read("item_id", _id(limits)))


def _truncate(o: Obj, event_id: str | None, dialect: Dialect, limits: Limits) -> ItemTruncate:
    return ItemTruncate(
        event_id,
        o.read("item_id", _id(limits)),
        o.read("content_index", lambda v, p: f.integer(v, p, lo=0, hi=limits.max_content_parts)),
        o.read("audio_end_ms", lambda v, p: f.integer(v, p, lo=0, hi=MAX_AUDIO_END_MS)),
    )


def _response_create(o: Obj, event_id: str | None, dialect: Dialect, limits: Limits) -> ResponseCreate:
    return ResponseCreate(
        event_id,
        o.read("response", lambda v, p: parse_response_options(v, p, dialect, limits), ResponseOptions()),
    )


def _cancel(o: Obj, event_id: str | None, dialect: Dialect, limits: Limits) -> ResponseCancel:
    return ResponseCancel(event_id, o.optional("response_id", _id(limits), None, None))


def _bare(cls: type) -> Parser:
    return lambda o, event_id, dialect, limits: cls(event_id)


PARSERS: dict[str, Parser] = {
    "input_audio_buffer.append": _append,
    "input_audio_buffer.commit": _bare(AudioCommit),
    "input_audio_buffer.clear": _bare(AudioClear),
    "conversation.item.create": _item_create,
    "conversation.item.delete": _item_id(ItemDelete),
    "conversation.item.retrieve": _item_id(ItemRetrieve),
    "conversation.item.truncate": _truncate,
    "response.create": _response_create,
    "response.cancel": _cancel,
    "output_audio_buffer.clear": _bare(OutputAudioClear),
}


def parse_event(o: Obj, event_id: str | None, kind: str, dialect: Dialect, limits: Limits) -> Command:
    """One client event other than ``session.update``; ``kind`` must be a key of :data:`PARSERS`."""
    command = PARSERS[kind](o, event_id, dialect, limits)
    o.done()
    return command
