"""The sans-I/O codec of one ``/v1/realtime`` connection (h11 style: explicit state, no I/O).

State: the connection's :class:`~.dialect.Dialect` (fixed at the handshake: one socket never
mixes dialects), the effective :class:`~.session_config.SessionConfig` (updated by every valid
``session.update``), the server defaults that an explicit ``null`` restores, and whether the voice
is locked (after the first assistant audio, as OpenAI does).

``receive_text(text)`` returns one typed command (``client_events.Command``) or a
:class:`~.errors.Rejected`; it never raises, whatever the text, and the codec stays usable after
a rejection. ``render(event)`` writes a server event in the connection's dialect.

Checks in order: size (``message_too_large``), strict JSON (``invalid_json``: also NaN,
Infinity, out-of-range numbers, duplicate keys), a JSON object (``invalid_event``), ``type`` a
string naming a known event (``invalid_value``, ``param: "type"``), ``event_id`` a short string,
then the event's own fields (``unknown_parameter``, ``invalid_type``, ``invalid_value``...).
"""

from __future__ import annotations

from dataclasses import dataclass

from . import fields as f
from .client_events import PARSERS, Command, SessionUpdate, parse_event
from .dialect import Dialect
from .errors import ErrorCode, ParamError, Rejected, supported_values, unsupported
from .fields import Obj
from .limits import Limits
from .server_events import AudioDelta, ServerEvent, render
from .session_config import SessionConfig, apply_update
from .track import TrackAudio, pack
from .wire import StrictJSONError, loads_strict

_ERROR_DETAIL_CHARS = 200
_TYPES = ("session.update", *PARSERS)
_NOT_SUPPORTED = {  # known to some OpenAI dialect, not served here
    "transcription_session.update": "Transcription sessions ('transcription_session.update') are",
}


@dataclass(frozen=True)
class CodecOptions:
    limits: Limits = Limits()
    semantic_vad: bool = False  # True once the voice kind implements semantic_vad turn detection
    media_track: bool = False  # a WebRTC call: assistant audio renders as track frames (``track``)


class RealtimeCodec:
    """Parser and renderer of one connection. ``config`` is also the defaults ``null`` restores."""

    def __init__(
        self, dialect: Dialect, config: SessionConfig, options: CodecOptions = CodecOptions()
    ) -> None:
        self.dialect = dialect
        self.defaults = config
        self.config = config
        self.options = options
        self.voice_locked = False

    def lock_voice(self) -> None:
        """Call when the first assistant audio goes out; later voice changes are refused."""
        self.voice_locked = True

    def render(self, event: ServerEvent) -> str | bytes | None:
        """The frame of ``event`` in this connection's dialect (``None``: nothing to send); with
        ``media_track``, assistant audio as a track frame (bytes, ``track.pack``)."""
        if self.options.media_track and isinstance(event, AudioDelta):
            return pack(TrackAudio(event.ref.response_id, event.ref.item_id, event.format, event.audio))
        return render(event, self.dialect)

    def receive_bytes(self, data: bytes) -> Rejected:
        return Rejected(
            ErrorCode.UNEXPECTED_BINARY, "Binary frames are not supported; send JSON text frames."
        )

    def receive_text(self, text: str) -> Command:
        limit = self.options.limits.max_event_bytes
        size = (
            len(text) if text.isascii() or len(text) > limit else len(text.encode("utf-8", "surrogatepass"))
        )
        if size > limit:
            return Rejected(
                ErrorCode.MESSAGE_TOO_LARGE, f"The event is larger than the maximum of {limit} bytes."
            )
        try:
            raw = loads_strict(text)
        except StrictJSONError as exc:
            detail = str(exc)[:_ERROR_DETAIL_CHARS]
            return Rejected(
                ErrorCode.INVALID_JSON, f"We could not parse the JSON body of your request. ({detail})"
            )
        if not isinstance(raw, dict):
            return Rejected(
                ErrorCode.INVALID_EVENT,
                f"Invalid event: expected a JSON object, but got {f.describe(raw)} instead.",
            )
        event_id = raw.get("event_id")
        try:
            if event_id is not None:
                f.string(event_id, "event_id", max_len=self.options.limits.max_event_id_chars)
        except ParamError as exc:
            return exc.rejected
        try:
            return self._dispatch(raw, event_id)
        except ParamError as exc:
            return exc.rejected.with_event_id(event_id)

    def _dispatch(self, raw: dict, event_id: str | None) -> Command:
        o = Obj(raw, "")
        kind = o.read("type", lambda v, p: f.string(v, p, max_len=64))
        o.ignore("event_id")
        if kind in _NOT_SUPPORTED:
            raise unsupported(_NOT_SUPPORTED[kind], "type")
        if kind == "session.update":
            return self._session_update(o, event_id)
        if kind not in PARSERS:
            raise ParamError(
                ErrorCode.INVALID_VALUE,
                f"Invalid value: '{kind}'. Supported values are: {supported_values(_TYPES)}.",
                "type",
            )
        return parse_event(o, event_id, kind, self.dialect, self.options.limits)

    def _session_update(self, o: Obj, event_id: str | None) -> SessionUpdate:
        previous = self.config
        config = o.read(
            "session",
            lambda v, p: apply_update(
                previous,
                v,
                self.dialect,
                defaults=self.defaults,
                limits=self.options.limits,
                semantic_vad=self.options.semantic_vad,
            ),
        )
        o.done()
        if self.voice_locked and config.voice != previous.voice:
            voice_path = "session.audio.output.voice" if self.dialect is Dialect.GA else "session.voice"
            raise ParamError(
                ErrorCode.CANNOT_UPDATE_VOICE,
                "Cannot update a conversation's voice if assistant audio is present.",
                voice_path,
            )
        self.config = config
        return SessionUpdate(event_id, config, previous)
