"""The duplex client events (additive to OpenAI's), as typed commands, and their parsers.

| client event | command | fields |
| --- | --- | --- |
| ``playback.ack`` | :class:`PlaybackAck` | ``response_id``, ``played_ms`` (audio of it the client played) |
| ``session.resume`` | :class:`SessionResume` | ``session_id``, ``resume_token``, ``last_received_server_event_seq`` |
| ``session.event_ack`` | :class:`EventAck` | ``server_event_seq`` (every event up to it received) |
| ``session.heartbeat`` | :class:`Heartbeat` | |
| ``session.close`` | :class:`SessionClose` | |
| (a binary frame, Ogg/Opus negotiated) | :class:`OpusAppend` | ``data``: Ogg pages of the user's audio |

The OpenAI events a duplex session accepts are the OpenAI codec's commands
(``realtime.protocols.oai_realtime.client_events``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from realtime.protocols.oai_realtime import fields as f
from realtime.protocols.oai_realtime.fields import Obj
from realtime.protocols.oai_realtime.limits import Limits

MAX_PLAYED_MS = 24 * 60 * 60 * 1000  # a day of audio
MAX_SEQ = 2**53  # a JSON-safe integer: server_event_seq never gets near it
MAX_TOKEN_CHARS = 128


@dataclass(frozen=True)
class PlaybackAck:
    event_id: str | None
    response_id: str
    played_ms: int


@dataclass(frozen=True)
class SessionResume:
    event_id: str | None
    session_id: str
    resume_token: str
    last_received_server_event_seq: int  # 0: nothing received yet


@dataclass(frozen=True)
class EventAck:
    event_id: str | None
    server_event_seq: int


@dataclass(frozen=True)
class Heartbeat:
    event_id: str | None


@dataclass(frozen=True)
class SessionClose:
    event_id: str | None


@dataclass(frozen=True)
class OpusAppend:
    data: bytes  # Ogg pages (any split: a page may span frames)


Parser = Callable[[Obj, str | None, Limits], object]


def _id(limits: Limits) -> Callable:
    return lambda v, p: f.string(v, p, max_len=limits.max_id_chars, min_len=1)


def _ack(o: Obj, event_id: str | None, limits: Limits) -> PlaybackAck:
    return PlaybackAck(
        event_id,
        o.read("response_id", _id(limits)),
        o.read("played_ms", lambda v, p: f.integer(v, p, lo=0, hi=MAX_PLAYED_MS)),
    )


def _resume(o: Obj, event_id: str | None, limits: Limits) -> SessionResume:
    return SessionResume(
        event_id,
        o.read("session_id", _id(limits)),
        o.read("resume_token", lambda v, p: f.string(v, p, max_len=MAX_TOKEN_CHARS, min_len=1)),
        o.read("last_received_server_event_seq", lambda v, p: f.integer(v, p, lo=0, hi=MAX_SEQ), 0),
    )


def _event_ack(o: Obj, event_id: str | None, limits: Limits) -> EventAck:
    return EventAck(event_id, o.read("server_event_seq", lambda v, p: f.integer(v, p, lo=0, hi=MAX_SEQ)))


PARSERS: dict[str, Parser] = {
    "playback.ack": _ack,
    "session.resume": _resume,
    "session.event_ack": _event_ack,
    "session.heartbeat": lambda o, event_id, limits: Heartbeat(event_id),
    "session.close": lambda o, event_id, limits: SessionClose(event_id),
}
