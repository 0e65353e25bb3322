"""Typed errors of the session runtime.

This is the one error hierarchy of the runtime: the stage engine's errors
(:mod:`sessions.engine.errors`) derive from :class:`SessionError` too, so a kind maps any of them
to a protocol error by ``code`` alone. :class:`TransientError` (and its engine subclasses such as
a full queue) never fails a session.

Contract: every error a client may cause or observe is a :class:`SessionError` with a stable
machine-readable ``code`` (the protocol layer puts it on the wire), a one-line human message and
JSON-like ``details`` (limits, floors, counts). The codes are listed in ``docs/sessions.md``;
changing one is a protocol change. Messages never contain tracebacks or model internals.

:class:`CapacityError` is the one startup error: raised while planning capacity when even one
session cannot fit the memory that is actually available.
"""

from __future__ import annotations

from typing import Any, ClassVar


class SessionError(Exception):
    """Base of every runtime error; ``code`` is stable, ``details`` is JSON-like."""

    code: ClassVar[str] = "session_error"

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, **self.details}


class InvalidEventError(SessionError, ValueError):
    """An event is malformed: bad id, non transport-safe data, a control track twice."""

    code = "invalid_event"


class StaleEventError(SessionError):
    """``event_id`` is at or below the highest event already snapshotted (``floor``)."""

    code = "stale_event"


class EventQueueFullError(SessionError):
    """The session already holds ``max_pending_events`` unapplied events."""

    code = "event_queue_full"


class SessionStateError(SessionError):
    """The operation is illegal in the session's current state."""

    code = "invalid_state"


class SessionFailedError(SessionStateError):
    """A tick was requested on a FAILED session: it must be reset or closed first."""

    code = "session_failed"


class SessionClosedError(SessionStateError):
    """The session is closing or closed (``reason`` says why: close, idle, evicted, ...)."""

    code = "session_closed"


class CleanupFailedError(SessionStateError):
    """Worker cleanup failed; the id is a tombstone until a close retry succeeds."""

    code = "cleanup_failed"


class TickFailedError(SessionError):
    """The executor failed; the session is now FAILED and its worker state was released."""

    code = "tick_failed"


class ChunkMetadataError(TickFailedError):
    """The executor's returned metadata does not equal the tick snapshot; nothing committed."""

    code = "metadata_mismatch"


class ReducerCommitError(TickFailedError):
    """The control reducer's commit raised; the session failed closed, nothing committed."""

    code = "reducer_commit_failed"


class TickSupersededError(SessionError):
    """A reset or close happened while the tick ran; its result was dropped uncommitted."""

    code = "tick_superseded"


class ReleaseFailedError(SessionError):
    """The lifecycle backend raised or timed out while releasing worker state."""

    code = "release_failed"


class SessionExistsError(SessionError):
    """``create`` was given an id that exists (tombstones included)."""

    code = "session_exists"


class UnknownSessionError(SessionError, KeyError):
    """No session with this id is known to the manager."""

    code = "unknown_session"

    def __str__(self) -> str:  # KeyError would repr() the message
        return self.message


class SessionLimitError(SessionError):
    """Admission refused: capacity reached (``limit``), admission queue full or wait timed out."""

    code = "session_limit_reached"


class ShuttingDownError(SessionError):
    """The manager is shutting down and admits nothing."""

    code = "shutting_down"


class TransientError(SessionError):
    """Work was refused for now (a full queue, backpressure) before anything started: nothing
    changed, the session stays ACTIVE, and the same request may be sent again later."""

    code = "busy"


class TickInFlightError(TransientError):
    """A tick was started while another (or a reset) runs: one tick at a time per session."""

    code = "tick_in_flight"


class CapacityError(SessionError, ValueError):
    """Startup: the model cannot fit even one session into the available memory."""

    code = "insufficient_memory"
