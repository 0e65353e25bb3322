"""Sans-I/O codec of the public world protocol, ``/v1/realtime/world?protocol_version=1``.

Text frames carry JSON control messages; binary frames carry media (docs/protocols/world.md).
No sockets, no asyncio: ``ServerConnection.receive_text`` / ``receive_bytes`` turn a frame into a
typed command; the ``render_*`` functions turn typed events into text frames.

States: ``AWAIT_START`` -> (``session.start``) -> ``STARTED`` -> (``session.close``) ->
``CLOSED``. Every bad input becomes a :class:`Rejected` command carrying the error code, message
and (when known) ``event_id``; the session goes on. Error codes: ``invalid_json``,
``unknown_type``, ``invalid_message``, ``message_too_large``, ``unexpected_binary``,
``not_started``, ``already_started``, ``unsupported_protocol_version`` (fatal, close 1008).

Hostile JSON is typed too: ``NaN``/``Infinity``, numbers that overflow a float (``1e999``) and
integers beyond 64 bits are ``invalid_message`` (``realtime.protocols.strict_json``) (Python would
otherwise raise on 4,300-digit integers or overflow in arithmetic later); so are fields a message
type does not define, ``session.ping`` data nested deeper than ``sessions.events.MAX_DEPTH``, and
prompts with lone surrogates. Therefore every value a command carries can be rendered back by the
``render_*`` functions (which never raise for them), and error messages quote client values cut to
a few dozen characters.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from realtime.protocols.strict_json import StrictJSONError, dumps, loads_strict
from sessions.errors import InvalidEventError
from sessions.events import SessionEvent, freeze_json

PROTOCOL = "realtime-world"
PROTOCOL_VERSION = 1
FORMATS = ("jpeg", "fmp4")
PACING = ("realtime", "fast")
MAX_EVENT_ID = 2**53 - 1  # largest integer a JavaScript client parses exactly
_REPR_CHARS = 60  # client values quoted in error messages are cut to this
_FIELDS = {
    "session.start": frozenset({"type", "prompt", "seed", "width", "height", "fps", "format", "pacing"}),
    "session.event": frozenset({"type", "event_id", "prompt", "controls", "client_ts_ms"}),
    "session.reset": frozenset({"type"}),
    "session.close": frozenset({"type"}),
    "session.ping": frozenset({"type", "data"}),
}


class ErrorCode(enum.StrEnum):
    INVALID_JSON = "invalid_json"
    UNKNOWN_TYPE = "unknown_type"
    INVALID_MESSAGE = "invalid_message"
    MESSAGE_TOO_LARGE = "message_too_large"
    UNEXPECTED_BINARY = "unexpected_binary"
    NOT_STARTED = "not_started"
    ALREADY_STARTED = "already_started"
    UNSUPPORTED_VERSION = "unsupported_protocol_version"


@dataclass(frozen=True)
class Limits:
    """What ``session.start`` may ask for (the model's and the deployment's limits)."""

    width: int
    height: int
    min_fps: int
    max_fps: int
    max_prompt_chars: int
    max_message_bytes: int


@dataclass(frozen=True)
class Start:
    prompt: str | None
    seed: int
    fps: int
    format: str
    pacing: str


@dataclass(frozen=True)
class Event:
    event: SessionEvent


@dataclass(frozen=True)
class Reset:
    pass


@dataclass(frozen=True)
class Close:
    pass


@dataclass(frozen=True)
class Ping:
    data: Any = None


@dataclass(frozen=True)
class Rejected:
    code: str
    message: str
    event_id: int | None = None


Command = Start | Event | Reset | Close | Ping | Rejected


def check_version(query_value: str | None) -> Rejected | None:
    """``None`` if the URL's ``protocol_version`` is supported, else the fatal error."""
    if query_value == str(PROTOCOL_VERSION):
        return None
    return Rejected(
        ErrorCode.UNSUPPORTED_VERSION,
        f"protocol_version={query_value!r} is not supported; this server speaks {PROTOCOL_VERSION}",
    )


class _Invalid(Exception):
    pass


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _REPR_CHARS else text[: _REPR_CHARS - 3] + "..."


def _text_ok(value: str) -> bool:
    """True if ``value`` is encodable text (JSON escapes can spell lone surrogates)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _int(raw: Mapping[str, Any], key: str, default: int) -> int:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Invalid(f"{key} must be an integer, got {_short(value)}")
    return value


def _choice(raw: Mapping[str, Any], key: str, options: tuple[str, ...], default: str) -> str:
    value = raw.get(key, default)
    if value not in options:
        raise _Invalid(f"{key} must be one of {', '.join(options)}, got {_short(value)}")
    return value


#: ``validate_control(track, schema, data)``: raises ``ValueError`` naming what is wrong
ControlCheck = Callable[[str, str, Any], object]


class ServerConnection:
    """Parser state of one connection. ``validate_control`` is the model's control rule (the kind
    passes it in; the codec imports no model code): a ``ValueError`` from it makes the event
    ``invalid_message``. Without it, controls are checked for shape only."""

    def __init__(
        self,
        limits: Limits,
        default_fps: int,
        default_pacing: str = "realtime",
        validate_control: ControlCheck | None = None,
    ) -> None:
        self.limits = limits
        self.validate_control = validate_control
        self.default_fps = default_fps
        self.default_pacing = default_pacing
        self.started = False
        self.closed = False

    def receive_bytes(self, data: bytes) -> Rejected:
        return Rejected(ErrorCode.UNEXPECTED_BINARY, "clients send JSON text frames only")

    def receive_text(self, text: str) -> Command:
        size = len(text.encode("utf-8", "surrogatepass"))
        if size > self.limits.max_message_bytes:
            return Rejected(
                ErrorCode.MESSAGE_TOO_LARGE,
                f"message of {size} bytes exceeds max_message_bytes={self.limits.max_message_bytes}",
            )
        try:
            raw = loads_strict(text)
        except StrictJSONError as exc:
            if exc.syntax:
                return Rejected(ErrorCode.INVALID_JSON, f"not valid JSON: {exc}")
            return Rejected(ErrorCode.INVALID_MESSAGE, str(exc))
        if not isinstance(raw, dict) or not isinstance(raw.get("type"), str):
            return Rejected(ErrorCode.INVALID_MESSAGE, "a message must be a JSON object with a string 'type'")
        kind = raw["type"]
        handler = {
            "session.start": self._start,
            "session.event": self._event,
            "session.reset": lambda r: Reset(),
            "session.close": lambda r: Close(),
            "session.ping": self._ping,
        }.get(kind)
        if handler is None:
            return Rejected(ErrorCode.UNKNOWN_TYPE, f"unknown message type {_short(kind)}")
        if kind == "session.start" and self.started:
            return Rejected(ErrorCode.ALREADY_STARTED, "session.start was already received")
        if kind not in ("session.start", "session.ping") and not self.started:
            return Rejected(ErrorCode.NOT_STARTED, f"{kind} before session.start")
        unknown = set(raw) - _FIELDS[kind]
        if unknown:
            event_id = raw.get("event_id")
            return Rejected(
                ErrorCode.INVALID_MESSAGE,
                f"unknown {kind} field(s): {_short(', '.join(sorted(unknown)))}",
                event_id if _is_int(event_id) else None,
            )
        try:
            command = handler(raw)
        except _Invalid as exc:
            event_id = raw.get("event_id")
            return Rejected(ErrorCode.INVALID_MESSAGE, str(exc), event_id if _is_int(event_id) else None)
        if isinstance(command, Start):
            self.started = True
        elif isinstance(command, Close):
            self.closed = True
        return command

    def _start(self, raw: dict[str, Any]) -> Start:
        lim = self.limits
        prompt = raw.get("prompt")
        if prompt is not None and (not isinstance(prompt, str) or len(prompt) > lim.max_prompt_chars):
            raise _Invalid(f"prompt must be a string of at most {lim.max_prompt_chars} characters")
        if prompt is not None and not _text_ok(prompt):
            raise _Invalid("prompt must be valid Unicode text (no lone surrogates)")
        width, height = _int(raw, "width", lim.width), _int(raw, "height", lim.height)
        if (width, height) != (lim.width, lim.height):
            raise _Invalid(
                f"size {width}x{height} is not supported; the model renders {lim.width}x{lim.height}"
            )
        fps = _int(raw, "fps", self.default_fps)
        if not lim.min_fps <= fps <= lim.max_fps:
            raise _Invalid(f"fps must be in {lim.min_fps}..{lim.max_fps}, got {fps}")
        seed = _int(raw, "seed", 0)
        if not 0 <= seed < 2**63:
            raise _Invalid("seed must be in 0..2**63-1")
        return Start(
            prompt,
            seed,
            fps,
            _choice(raw, "format", FORMATS, "jpeg"),
            _choice(raw, "pacing", PACING, self.default_pacing),
        )

    def _event(self, raw: dict[str, Any]) -> Event:
        event_id = raw.get("event_id")
        if isinstance(event_id, int) and not isinstance(event_id, bool) and event_id > MAX_EVENT_ID:
            raise _Invalid(f"event_id must be at most {MAX_EVENT_ID} (2**53 - 1, exact in JavaScript)")
        body = {k: v for k, v in raw.items() if k != "type"}
        try:
            event = SessionEvent.from_dict(body)
        except InvalidEventError as exc:
            raise _Invalid(str(exc)) from None
        if event.prompt is not None and len(event.prompt) > self.limits.max_prompt_chars:
            raise _Invalid(f"prompt must be at most {self.limits.max_prompt_chars} characters")
        if event.prompt is not None and not _text_ok(event.prompt):
            raise _Invalid("prompt must be valid Unicode text (no lone surrogates)")
        for control in event.controls if self.validate_control is not None else ():
            try:
                self.validate_control(control.track, control.schema, control.data)
            except ValueError as exc:
                raise _Invalid(str(exc)) from None
        return Event(event)

    def _ping(self, raw: dict[str, Any]) -> Ping:
        data = raw.get("data")
        try:
            freeze_json(data)  # depth-bounded, so render_pong can always serialise it
        except InvalidEventError as exc:
            raise _Invalid(str(exc)) from None
        return Ping(data)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _dump(message: dict[str, Any]) -> str:
    return dumps(message)


def render_created(session_id: str, capabilities: dict[str, Any]) -> str:
    return _dump(
        {
            "type": "session.created",
            "session_id": session_id,
            "protocol_version": PROTOCOL_VERSION,
            "capabilities": capabilities,
        }
    )


def render_queued(position: int) -> str:
    """The socket's place in the admission queue (1 = next), before ``session.created``."""
    return _dump({"type": "session.queued", "position": position})


def render_event_ack(event_id: int, status: str) -> str:
    return _dump({"type": "session.event.ack", "event_id": event_id, "status": status})


def render_chunk_metadata(meta: dict[str, Any]) -> str:
    timing = meta.get("timing", {})
    meta = {
        **meta,
        "timing": {
            k: (round(v, 3) if isinstance(v, float) and math.isfinite(v) else v) for k, v in timing.items()
        },
    }
    return _dump({"type": "chunk.metadata", **meta})


def render_reset_done(session_id: str) -> str:
    return _dump({"type": "session.reset_done", "session_id": session_id})


def render_closed(session_id: str | None, reason: str) -> str:
    return _dump({"type": "session.closed", "session_id": session_id, "reason": reason})


def render_pong(data: Any) -> str:
    return _dump({"type": "session.pong", "data": data})


def render_error(code: str, message: str, event_id: int | None = None, **details: Any) -> str:
    error: dict[str, Any] = {"code": str(code), "message": message, "event_id": event_id}
    error.update(details)
    return _dump({"type": "error", "error": error})
