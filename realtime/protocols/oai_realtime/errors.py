"""Typed errors of the OpenAI Realtime codec, worded as OpenAI words them.

Every bad client input becomes a :class:`Rejected`: the data of one ``error`` server event
(``{"type": "error", "error": {type, code, message, param, event_id}}``, the shape of
``openai.types.realtime.RealtimeError``). Parsing code raises :class:`ParamError` internally; the
codec catches it and returns the :class:`Rejected` with the client's ``event_id`` attached, so no
exception escapes ``receive_text``.

The builders at the end (``active_response`` ... ``session_expired``) carry the wording of the
semantic errors that only the voice kind can detect (they need conversation state); they live
here so every message of the dialect is written in one place (docs/protocols/openai-realtime.md
lists them).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

INVALID_REQUEST = "invalid_request_error"
SERVER_ERROR = "server_error"
_QUOTED_VALUE_CHARS = 64  # a client's value quoted back in a message is cut to this many characters
_PARAM_CHARS = 256  # an error's ``param`` (a path that may hold a client's key) is cut to this


class ErrorCode(enum.StrEnum):
    """``error.code`` values this server sends (OpenAI's where OpenAI has one)."""

    INVALID_JSON = "invalid_json"
    INVALID_EVENT = "invalid_event"  # not an object, or no string ``type``
    MESSAGE_TOO_LARGE = "message_too_large"
    UNEXPECTED_BINARY = "unexpected_binary"
    UNKNOWN_PARAMETER = "unknown_parameter"
    MISSING_PARAMETER = "missing_required_parameter"
    INVALID_TYPE = "invalid_type"
    INVALID_VALUE = "invalid_value"
    INTEGER_BELOW_MIN = "integer_below_min_value"
    INTEGER_ABOVE_MAX = "integer_above_max_value"
    DECIMAL_BELOW_MIN = "decimal_below_min_value"
    DECIMAL_ABOVE_MAX = "decimal_above_max_value"
    STRING_TOO_SHORT = "string_below_min_length"
    STRING_TOO_LONG = "string_above_max_length"
    ARRAY_TOO_LONG = "array_above_max_length"
    INVALID_BASE64 = "invalid_audio_base64"
    AUDIO_TOO_LARGE = "audio_append_too_large"
    UNSUPPORTED = "unsupported_feature"
    CANNOT_UPDATE_VOICE = "cannot_update_voice"
    # semantic errors the voice kind raises (builders below)
    ACTIVE_RESPONSE = "conversation_already_has_active_response"
    CANCEL_NOT_ACTIVE = "response_cancel_not_active"
    COMMIT_EMPTY = "input_audio_buffer_commit_empty"
    ITEM_NOT_FOUND = "item_not_found"
    ITEM_ID_IN_USE = "item_id_already_exists"
    TRUNCATE_INVALID = "truncate_invalid"
    SESSION_EXPIRED = "session_expired"
    INVALID_API_KEY = "invalid_api_key"


@dataclass(frozen=True)
class Rejected:
    """One ``error`` event's data. ``event_id`` is the client event's id when it had a valid one."""

    code: str
    message: str
    param: str | None = None
    event_id: str | None = None
    type: str = INVALID_REQUEST

    def with_event_id(self, event_id: str | None) -> Rejected:
        return replace(self, event_id=event_id)


class ParamError(ValueError):
    """Raised by the parsers; carries the :class:`Rejected` the codec returns."""

    def __init__(self, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.rejected = Rejected(code, message, param[:_PARAM_CHARS] if param else param)


def quote(value: object) -> str:
    """A client value as OpenAI quotes it in messages, cut short (never a whole payload)."""
    text = value if isinstance(value, str) else repr(value)
    if len(text) > _QUOTED_VALUE_CHARS:
        text = text[:_QUOTED_VALUE_CHARS] + "..."
    return f"'{text}'"


def supported_values(options: tuple[str, ...]) -> str:
    quoted = [f"'{o}'" for o in options]
    if len(quoted) <= 2:
        return " and ".join(quoted)
    return ", ".join(quoted[:-1]) + ", and " + quoted[-1]


def unsupported(what: str, param: str | None = None) -> ParamError:
    return ParamError(ErrorCode.UNSUPPORTED, f"{what} is not supported by this server.", param)


# ------------------------------------------------------------------ semantic errors (voice kind)


def active_response(response_id: str) -> Rejected:
    return Rejected(
        ErrorCode.ACTIVE_RESPONSE,
        f"Conversation already has an active response in progress: {response_id}. "
        "Wait until the response is finished before creating a new one.",
    )


def cancel_not_active() -> Rejected:
    return Rejected(
        ErrorCode.CANCEL_NOT_ACTIVE, "Cancellation failed: no active response found.", "response_id"
    )


def commit_empty(buffered_ms: float, minimum_ms: int) -> Rejected:
    return Rejected(
        ErrorCode.COMMIT_EMPTY,
        "Error committing input audio buffer: buffer too small. "
        f"Expected at least {minimum_ms}ms of audio, but buffer only has {buffered_ms:.2f}ms of audio.",
    )


def item_not_found(item_id: str, param: str = "item_id") -> Rejected:
    return Rejected(ErrorCode.ITEM_NOT_FOUND, f"Conversation item with id {quote(item_id)} not found.", param)


def item_id_in_use(item_id: str) -> Rejected:
    return Rejected(
        ErrorCode.ITEM_ID_IN_USE, f"Conversation item with id {quote(item_id)} already exists.", "item.id"
    )


def truncate_beyond_audio(audio_ms: int, audio_end_ms: int) -> Rejected:
    """OpenAI's wording when ``audio_end_ms`` is past the item's generated audio."""
    return Rejected(
        ErrorCode.TRUNCATE_INVALID,
        f"Audio content of {audio_ms}ms is already shorter than {audio_end_ms}ms",
        "audio_end_ms",
    )


def truncate_not_assistant_audio() -> Rejected:
    return Rejected(
        ErrorCode.TRUNCATE_INVALID, "Only model output audio messages can be truncated", "item_id"
    )


def session_expired(minutes: int) -> Rejected:
    return Rejected(ErrorCode.SESSION_EXPIRED, f"Your session hit the maximum duration of {minutes} minutes.")


def session_expiring(minutes: int, seconds_left: float) -> Rejected:
    return Rejected(
        "session_expiring",
        f"Your session will hit the maximum duration of {minutes} minutes in {seconds_left:.0f} seconds.",
    )


def transcription_failed() -> Rejected:
    return Rejected("transcription_failed", "Input audio transcription failed.", type=SERVER_ERROR)


def response_failed(code: str) -> Rejected:
    return Rejected(code, "The response failed in the model.", type=SERVER_ERROR)


def invalid_api_key() -> Rejected:
    """Never quotes the presented key (OpenAI masks it; this server leaves it out)."""
    return Rejected(ErrorCode.INVALID_API_KEY, "Incorrect API key provided.")
