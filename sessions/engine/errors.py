"""Typed errors of the stage engine, part of the runtime's one hierarchy (``sessions.errors``).

Each carries a stable ``code`` for protocol error events. :class:`QueueFullError` is a
:class:`~sessions.errors.TransientError`: the work was refused before it started and the session
is not failed by it.
"""

from __future__ import annotations

from sessions.errors import SessionError, TransientError


class EngineError(SessionError):
    """Base class; ``code`` is a stable machine-readable string."""

    code = "engine_error"


class EngineConfigError(EngineError, ValueError):
    """An engine, channel or pipeline limit is out of range (raised at construction)."""

    code = "engine_config_invalid"


class EngineClosedError(EngineError):
    """The engine was shut down; pending and new work fail with this."""

    code = "engine_closed"


class StageWorkerDiedError(EngineClosedError):
    """A stage's worker thread died (not closed): its work in hand, queued and new fails with this."""

    code = "stage_worker_died"


class SessionNotOpenError(EngineError):
    """Work was submitted for a session that has no open slot on this engine."""

    code = "session_not_open"

    def __init__(self, stage: str, session_id: str) -> None:
        super().__init__(f"session {session_id!r} has no open slot on stage {stage!r}")
        self.session_id = session_id


class SlotsExhaustedError(EngineError):
    """Every slot of the stage is taken; admission should have prevented this."""

    code = "slots_exhausted"

    def __init__(self, stage: str, capacity: int) -> None:
        super().__init__(f"stage {stage!r} has no free slot (capacity {capacity})")
        self.capacity = capacity


class QueueFullError(EngineError, TransientError):
    """The engine's pending-work bound was reached."""

    code = "engine_queue_full"

    def __init__(self, stage: str, limit: int) -> None:
        super().__init__(f"stage {stage!r} has {limit} items pending (max_pending)")
        self.limit = limit


class StaleEpochError(EngineError):
    """The work belongs to an epoch older than the session's current one (interrupted, reset)."""

    code = "stale_epoch"

    def __init__(self, session_id: str, epoch: int, current: int) -> None:
        super().__init__(f"session {session_id!r}: epoch {epoch} is stale (current {current})")
        self.session_id = session_id
        self.epoch = epoch
        self.current = current


class SessionReleasedError(EngineError):
    """The session's slot was released (close, reset, eviction...) while work was pending."""

    code = "session_released"

    def __init__(self, session_id: str, reason: str) -> None:
        super().__init__(f"session {session_id!r} was released ({reason})")
        self.session_id = session_id
        self.reason = reason


class StallError(EngineError):
    """No chunk arrived within the stall deadline after the previous one."""

    code = "stage_stalled"

    def __init__(self, stage: str, session_id: str, timeout_s: float) -> None:
        super().__init__(f"stage {stage!r} stalled: no chunk for session {session_id!r} within {timeout_s}s")
        self.session_id = session_id
        self.timeout_s = timeout_s


class StageItemError(EngineError):
    """The stage failed this one item; the other items of its batch were unaffected."""

    code = "stage_item_failed"

    def __init__(self, stage: str, session_id: str, cause: BaseException) -> None:
        super().__init__(f"stage {stage!r} failed the item of session {session_id!r}: {cause!r}")
        self.session_id = session_id
        self.cause = cause


class StageBatchError(EngineError):
    """The stage's forward raised; every item of that batch fails with this, the engine goes on."""

    code = "stage_batch_failed"

    def __init__(self, stage: str, batch_size: int, cause: BaseException) -> None:
        super().__init__(f"stage {stage!r} forward failed for a batch of {batch_size}: {cause!r}")
        self.batch_size = batch_size
        self.cause = cause
