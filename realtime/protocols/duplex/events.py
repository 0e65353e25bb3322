"""The duplex server events (additive to OpenAI's; docs/protocols/duplex.md lists them all).

Each is an OpenAI-codec :class:`~realtime.protocols.oai_realtime.server_events.ServerEvent` (its
body is its fields), so one renderer writes both vocabularies with ``epoch`` and
``server_event_seq`` added (``codec.DuplexCodec.frame``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from realtime.protocols.oai_realtime.dialect import Dialect
from realtime.protocols.oai_realtime.server_events import ServerEvent, SessionCreated


@dataclass(frozen=True)
class Capabilities:
    """What a client branches on (``session.created.session.capabilities``), never the model name."""

    chunk_period_ms: int
    sample_rate_hz: int
    audio_formats: tuple[str, ...]  # "pcm16" (base64 in JSON) and, if enabled, "ogg_opus" (binary)
    audio_format: str  # the one this connection negotiated
    supports_resume: bool
    supports_barge_in: bool
    supports_playback_ack: bool
    context_policy: str  # "roll" | "end": what happens at the model's context length
    context_frames: int
    resume_grace_s: float
    implementation_level: str = "model_native_duplex"

    def wire(self) -> dict[str, Any]:
        return {**self.__dict__, "audio_formats": list(self.audio_formats)}


@dataclass(frozen=True)
class DuplexSessionCreated(SessionCreated):
    """``session.created`` with the duplex capabilities and the first resume token."""

    capabilities: Capabilities = None  # type: ignore[assignment]
    resume_token: str = ""

    def body(self, dialect: Dialect) -> dict[str, Any]:
        body = super().body(dialect)
        body["session"]["capabilities"] = self.capabilities.wire()
        return {**body, "resume_token": self.resume_token}


@dataclass(frozen=True)
class ResponseSpeak(ServerEvent):
    """The model chose to speak: a response starts (before its first audio delta)."""

    TYPE = "response.speak"
    response_id: str
    step: int


@dataclass(frozen=True)
class ResponseListen(ServerEvent):
    """The model chose to listen: the response it spoke (if any) ended."""

    TYPE = "response.listen"
    response_id: str | None
    step: int


@dataclass(frozen=True)
class PlaybackAcknowledged(ServerEvent):
    TYPE = "playback.acknowledged"
    response_id: str
    played_ms: int
    generated_ms: int
    committed_ms: int
    history_committed: str  # the transcript the history holds for this response now


@dataclass(frozen=True)
class SessionResumed(ServerEvent):
    TYPE = "session.resumed"
    session_id: str
    resume_token: str  # rotated: the previous one no longer works
    replayed: int  # journaled events sent again (before this one), each with its original seq


@dataclass(frozen=True)
class SessionReplaced(ServerEvent):
    """Sent to the old socket when another one resumed its session; that socket then closes."""

    TYPE = "session.replaced"
    session_id: str


@dataclass(frozen=True)
class SessionExpired(ServerEvent):
    TYPE = "session.expired"
    session_id: str
    reason: str  # "disconnect_grace_expired"


@dataclass(frozen=True)
class ResyncRequired(ServerEvent):
    """Resumed, but the journal no longer holds every event after the client's cursor."""

    TYPE = "session.resync_required"
    session_id: str
    reason: str  # "journal_gap"
    first_available_seq: int


@dataclass(frozen=True)
class HeartbeatAck(ServerEvent):
    TYPE = "session.heartbeat_ack"
