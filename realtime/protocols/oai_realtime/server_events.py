"""Server events of the Realtime protocol: typed dataclasses and ``render(event, dialect)``.

Each class is one event; its ``TYPE`` is the GA name and :data:`BETA_NAMES` holds the beta
spelling where it differs. ``render`` writes the frame with a fresh ``event_...`` id and exactly
the fields the SDK's pydantic model for that type and dialect declares (tests validate every
event against ``openai.types.realtime`` / ``openai.types.beta.realtime`` and refuse extra keys).

Two GA events have no beta counterpart: ``conversation.item.done`` and
``input_audio_buffer.timeout_triggered``; ``render`` returns ``None`` for them in beta (send
nothing). In beta the assistant item is announced by ``conversation.item.created`` (what GA calls
``conversation.item.added``), which the legacy beta JS client needs before the first content part.
``response.function_call_arguments.done`` carries ``name`` in GA only (the beta model lacks it).

The ``session`` object of ``session.created`` / ``session.updated`` carries ``id``, ``object`` and
``expires_at`` besides the config: GA's ``RealtimeSessionCreateResponse`` declares all three, the
beta ``Session`` model declares ``id`` (docs/protocols/openai-realtime.md, "Session object").
"""

from __future__ import annotations

import base64
import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from .dialect import Dialect
from .errors import Rejected
from .items import ContentPart, Item, OutputAudio, OutputText, audio_bytes, render_item
from .responses import ResponseSettings
from .session_config import AudioFormat, SessionConfig, render_format, render_modalities, render_session
from .wire import dumps, new_id

MAX_RETRIEVED_AUDIO_BYTES = (
    512 * 1024
)  # decoded; more would push the frame past 1 MiB, the clients' default cap

BETA_NAMES: dict[str, str | None] = {
    "response.output_audio.delta": "response.audio.delta",
    "response.output_audio.done": "response.audio.done",
    "response.output_audio_transcript.delta": "response.audio_transcript.delta",
    "response.output_audio_transcript.done": "response.audio_transcript.done",
    "response.output_text.delta": "response.text.delta",
    "response.output_text.done": "response.text.done",
    "conversation.item.added": "conversation.item.created",
    "conversation.item.done": None,
    "input_audio_buffer.timeout_triggered": None,
}


def type_name(ga_type: str, dialect: Dialect) -> str | None:
    """The wire ``type`` of an event in ``dialect`` (``None``: the dialect has no such event)."""
    return ga_type if dialect is Dialect.GA else BETA_NAMES.get(ga_type, ga_type)


class ServerEvent:
    """Base of the events: the default body is the dataclass fields as they are."""

    TYPE: ClassVar[str]

    def body(self, dialect: Dialect) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for fld in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, fld.name)
            if isinstance(value, PartRef):
                out.update(dataclasses.asdict(value))
            else:
                out[fld.name] = value
        return out


def render(event: ServerEvent, dialect: Dialect) -> str | None:
    """The text frame of ``event`` in ``dialect``, or ``None`` when the dialect has no such event."""
    name = type_name(event.TYPE, dialect)
    if name is None:
        return None
    return dumps({"type": name, "event_id": new_id("event"), **event.body(dialect)})


@dataclass(frozen=True)
class PartRef:
    """Where a content part lives: the response, its output item, the item's content index."""

    response_id: str
    item_id: str
    output_index: int = 0
    content_index: int = 0


# ------------------------------------------------------------------------------- session


@dataclass(frozen=True)
class SessionCreated(ServerEvent):
    TYPE = "session.created"
    session_id: str
    expires_at: int  # unix seconds
    config: SessionConfig

    def body(self, dialect: Dialect) -> dict[str, Any]:
        return {"session": render_session(self.config, dialect, self.session_id, self.expires_at)}


@dataclass(frozen=True)
class SessionUpdated(SessionCreated):
    TYPE = "session.updated"


@dataclass(frozen=True)
class ConversationCreated(ServerEvent):
    TYPE = "conversation.created"
    conversation_id: str

    def body(self, dialect: Dialect) -> dict[str, Any]:
        return {"conversation": {"id": self.conversation_id, "object": "realtime.conversation"}}


@dataclass(frozen=True)
class ErrorEvent(ServerEvent):
    TYPE = "error"
    error: Rejected

    def body(self, dialect: Dialect) -> dict[str, Any]:
        e = self.error
        return {
            "error": {
                "type": e.type,
                "code": e.code,
                "message": e.message,
                "param": e.param,
                "event_id": e.event_id,
            }
        }


@dataclass(frozen=True)
class RateLimit:
    name: str  # "requests" | "tokens"
    limit: int
    remaining: int
    reset_seconds: float


@dataclass(frozen=True)
class RateLimitsUpdated(ServerEvent):
    TYPE = "rate_limits.updated"
    rate_limits: tuple[RateLimit, ...]

    def body(self, dialect: Dialect) -> dict[str, Any]:
        return {"rate_limits": [dataclasses.asdict(r) for r in self.rate_limits]}


# -------------------------------------------------------------------------- input audio


@dataclass(frozen=True)
class SpeechStarted(ServerEvent):
    TYPE = "input_audio_buffer.speech_started"
    item_id: str
    audio_start_ms: int  # from the start of all audio written this session, prefix padding included


@dataclass(frozen=True)
class SpeechStopped(ServerEvent):
    TYPE = "input_audio_buffer.speech_stopped"
    item_id: str
    audio_end_ms: int


@dataclass(frozen=True)
class AudioCommitted(ServerEvent):
    TYPE = "input_audio_buffer.committed"
    item_id: str
    previous_item_id: str | None = None


@dataclass(frozen=True)
class AudioCleared(ServerEvent):
    TYPE = "input_audio_buffer.cleared"


@dataclass(frozen=True)
class AudioTimeoutTriggered(ServerEvent):
    """GA only (``idle_timeout_ms`` exists only in GA's ``server_vad``)."""

    TYPE = "input_audio_buffer.timeout_triggered"
    item_id: str
    audio_start_ms: int
    audio_end_ms: int


# ---------------------------------------------------------------------------- conversation


@dataclass(frozen=True)
class ItemAdded(ServerEvent):
    """GA ``conversation.item.added`` / beta ``conversation.item.created`` (no audio in the item)."""

    TYPE = "conversation.item.added"
    item: Item
    previous_item_id: str | None = None

    def body(self, dialect: Dialect) -> dict[str, Any]:
        return {"item": render_item(self.item, dialect), "previous_item_id": self.previous_item_id}


@dataclass(frozen=True)
class ItemDone(ItemAdded):
    """GA only: the item is final (``render`` gives ``None`` in beta)."""

    TYPE = "conversation.item.done"


@dataclass(frozen=True)
class ItemRetrieved(ServerEvent):
    """The item with its audio, unless that exceeds MAX_RETRIEVED_AUDIO_BYTES (then without audio)."""

    TYPE = "conversation.item.retrieved"
    item: Item

    def body(self, dialect: Dialect) -> dict[str, Any]:
        fits = audio_bytes(self.item) <= MAX_RETRIEVED_AUDIO_BYTES
        return {"item": render_item(self.item, dialect, include_audio=fits)}


@dataclass(frozen=True)
class ItemDeleted(ServerEvent):
    TYPE = "conversation.item.deleted"
    item_id: str


@dataclass(frozen=True)
class ItemTruncated(ServerEvent):
    TYPE = "conversation.item.truncated"
    item_id: str
    content_index: int
    audio_end_ms: int


@dataclass(frozen=True)
class TranscriptionDelta(ServerEvent):
    TYPE = "conversation.item.input_audio_transcription.delta"
    item_id: str
    content_index: int
    delta: str


@dataclass(frozen=True)
class DurationUsage:
    seconds: float


@dataclass(frozen=True)
class TokenUsage:
    input_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class TranscriptionCompleted(ServerEvent):
    TYPE = "conversation.item.input_audio_transcription.completed"
    item_id: str
    content_index: int
    transcript: str
    usage: DurationUsage | TokenUsage

    def body(self, dialect: Dialect) -> dict[str, Any]:
        u = self.usage
        if isinstance(u, DurationUsage):
            usage: dict[str, Any] = {"type": "duration", "seconds": u.seconds}
        else:
            usage = {
                "type": "tokens",
                "input_tokens": u.input_tokens,
                "output_tokens": u.output_tokens,
                "total_tokens": u.input_tokens + u.output_tokens,
            }
        return {
            "item_id": self.item_id,
            "content_index": self.content_index,
            "transcript": self.transcript,
            "usage": usage,
        }


@dataclass(frozen=True)
class TranscriptionFailed(ServerEvent):
    TYPE = "conversation.item.input_audio_transcription.failed"
    item_id: str
    content_index: int
    error: Rejected

    def body(self, dialect: Dialect) -> dict[str, Any]:
        e = self.error
        return {
            "item_id": self.item_id,
            "content_index": self.content_index,
            "error": {"type": e.type, "code": e.code, "message": e.message, "param": e.param},
        }


# ------------------------------------------------------------------------------- responses


@dataclass(frozen=True)
class Usage:
    """Token counts of one response; ``cached_tokens`` are input tokens served from resident KV."""

    input_text_tokens: int = 0
    input_audio_tokens: int = 0
    cached_tokens: int = 0
    output_text_tokens: int = 0
    output_audio_tokens: int = 0

    def wire(self) -> dict[str, Any]:
        inputs = self.input_text_tokens + self.input_audio_tokens
        outputs = self.output_text_tokens + self.output_audio_tokens
        return {
            "total_tokens": inputs + outputs,
            "input_tokens": inputs,
            "output_tokens": outputs,
            "input_token_details": {
                "text_tokens": self.input_text_tokens,
                "audio_tokens": self.input_audio_tokens,
                "cached_tokens": self.cached_tokens,
            },
            "output_token_details": {
                "text_tokens": self.output_text_tokens,
                "audio_tokens": self.output_audio_tokens,
            },
        }


RESPONSE_STATUSES = ("in_progress", "completed", "cancelled", "incomplete", "failed")
# status_details.reason: cancelled -> "turn_detected" | "client_cancelled";
# incomplete -> "max_output_tokens" | "content_filter"


@dataclass(frozen=True)
class ResponseState:
    """The ``response`` object at one moment (``response.created``: in progress, no output yet)."""

    id: str
    settings: ResponseSettings
    status: str = "in_progress"
    reason: str | None = None
    error: Rejected | None = None  # status "failed"
    output: tuple[Item, ...] = ()
    usage: Usage | None = None
    conversation_id: str | None = None

    def wire(self, dialect: Dialect) -> dict[str, Any]:
        s = self.settings
        details: dict[str, Any] | None = None
        if self.status in ("cancelled", "incomplete", "failed"):
            details = {"type": self.status, "reason": self.reason}
            if self.error is not None:
                details["error"] = {
                    "type": self.error.type,
                    "code": self.error.code,
                    "message": self.error.message,
                }
        wire: dict[str, Any] = {
            "object": "realtime.response",
            "id": self.id,
            "status": self.status,
            "status_details": details,
            "output": [render_item(item, dialect) for item in self.output],
            "conversation_id": self.conversation_id,
            "max_output_tokens": "inf" if s.max_output_tokens is None else s.max_output_tokens,
            "metadata": None if s.metadata is None else dict(s.metadata),
            "usage": None if self.usage is None else self.usage.wire(),
        }
        if dialect is Dialect.GA:
            wire["output_modalities"] = render_modalities(s.audio_output, dialect)
            wire["audio"] = {"output": {"format": render_format(s.output_format, dialect), "voice": s.voice}}
        else:
            wire["modalities"] = render_modalities(s.audio_output, dialect)
            wire["voice"] = s.voice
            wire["output_audio_format"] = render_format(s.output_format, dialect)
            wire["temperature"] = s.temperature
        return wire


@dataclass(frozen=True)
class ResponseCreated(ServerEvent):
    TYPE = "response.created"
    response: ResponseState

    def body(self, dialect: Dialect) -> dict[str, Any]:
        return {"response": self.response.wire(dialect)}


@dataclass(frozen=True)
class ResponseDone(ResponseCreated):
    """Terminal: exactly one per response, after every closing event of its items."""

    TYPE = "response.done"


@dataclass(frozen=True)
class OutputItemAdded(ServerEvent):
    TYPE = "response.output_item.added"
    response_id: str
    output_index: int
    item: Item

    def body(self, dialect: Dialect) -> dict[str, Any]:
        return {
            "response_id": self.response_id,
            "output_index": self.output_index,
            "item": render_item(self.item, dialect),
        }


@dataclass(frozen=True)
class OutputItemDone(OutputItemAdded):
    TYPE = "response.output_item.done"


def _render_part(part: ContentPart) -> dict[str, Any]:
    # a response's part literal is "audio" / "text" in both dialects (not output_audio / output_text)
    if isinstance(part, OutputAudio):
        return {"type": "audio", "transcript": part.transcript}
    if isinstance(part, OutputText):
        return {"type": "text", "text": part.text}
    raise TypeError(f"a response content part is OutputAudio or OutputText, not {type(part).__name__}")


@dataclass(frozen=True)
class ContentPartAdded(ServerEvent):
    TYPE = "response.content_part.added"
    ref: PartRef
    part: ContentPart

    def body(self, dialect: Dialect) -> dict[str, Any]:
        return {**dataclasses.asdict(self.ref), "part": _render_part(self.part)}


@dataclass(frozen=True)
class ContentPartDone(ContentPartAdded):
    TYPE = "response.content_part.done"


@dataclass(frozen=True)
class AudioDelta(ServerEvent):
    """``audio`` in the response's output format; keep each delta short (<= 200 ms) so frames stay small."""

    TYPE = "response.output_audio.delta"
    ref: PartRef
    audio: bytes
    format: AudioFormat = AudioFormat.PCM16  # of ``audio`` (a WebRTC call's track decodes it)

    def body(self, dialect: Dialect) -> dict[str, Any]:
        return {**dataclasses.asdict(self.ref), "delta": base64.b64encode(self.audio).decode("ascii")}


@dataclass(frozen=True)
class AudioDone(ServerEvent):
    TYPE = "response.output_audio.done"
    ref: PartRef


@dataclass(frozen=True)
class TranscriptDelta(ServerEvent):
    TYPE = "response.output_audio_transcript.delta"
    ref: PartRef
    delta: str


@dataclass(frozen=True)
class TranscriptDone(ServerEvent):
    TYPE = "response.output_audio_transcript.done"
    ref: PartRef
    transcript: str


@dataclass(frozen=True)
class TextDelta(ServerEvent):
    TYPE = "response.output_text.delta"
    ref: PartRef
    delta: str


@dataclass(frozen=True)
class TextDone(ServerEvent):
    TYPE = "response.output_text.done"
    ref: PartRef
    text: str


@dataclass(frozen=True)
class FunctionArgumentsDelta(ServerEvent):
    TYPE = "response.function_call_arguments.delta"
    response_id: str
    item_id: str
    output_index: int
    call_id: str
    delta: str


@dataclass(frozen=True)
class FunctionArgumentsDone(ServerEvent):
    TYPE = "response.function_call_arguments.done"
    response_id: str
    item_id: str
    output_index: int
    call_id: str
    name: str
    arguments: str

    def body(self, dialect: Dialect) -> dict[str, Any]:
        out = super().body(dialect)
        if dialect is Dialect.BETA:
            del out["name"]
        return out


@dataclass(frozen=True)
class OutputAudioStarted(ServerEvent):
    TYPE = "output_audio_buffer.started"
    response_id: str


@dataclass(frozen=True)
class OutputAudioStopped(ServerEvent):
    TYPE = "output_audio_buffer.stopped"
    response_id: str


@dataclass(frozen=True)
class OutputAudioCleared(ServerEvent):
    TYPE = "output_audio_buffer.cleared"
    response_id: str
