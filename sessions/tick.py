"""Tick snapshots, the metadata echo, and the executor interface a session kind supplies.

Contract (architecture invariant 3; vllm-omni seed reference §2.3-2.5):

- :class:`TickSnapshot` is immutable: identity (``session_id``, ``request_id``, ``chunk_index``,
  strictly increasing ``applied_event_ids``), the sticky ``prompt``, the reduced ``controls``
  (one per track, sorted by track), the applied ``events`` themselves, the session ``epoch`` and
  an opaque ``payload`` (a robot observation; the kind must not mutate it). ``chunk_index == 0``
  means fresh worker state (first tick after create or reset).
- A :class:`TickExecutor` runs ticks (``sessions.executor.StageExecutor`` is the one production
  executor) and is fenced by interrupts (``fence``): ``await execute(snapshot)`` returns any
  object with a ``metadata`` attribute (:class:`TickOutput` is the ready-made one). The session
  commits only if ``result.metadata == snapshot.metadata`` exactly; anything else fails the
  session. Executors run model compute off the event loop (normally through the stage engine).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from sessions.events import ControlInput, SessionEvent

T = TypeVar("T")


def _check_identity(session_id: str, request_id: str, chunk_index: int, applied: tuple[int, ...]) -> None:
    if not isinstance(session_id, str) or not session_id:
        raise ValueError("session_id must be a non-empty string")
    if not isinstance(request_id, str) or not request_id:
        raise ValueError("request_id must be a non-empty string")
    if isinstance(chunk_index, bool) or not isinstance(chunk_index, int) or chunk_index < 0:
        raise ValueError(f"chunk_index must be an integer >= 0, got {chunk_index!r}")
    if len(applied) > 1 and any(b <= a for a, b in zip(applied, applied[1:], strict=False)):
        raise ValueError(f"applied_event_ids must be unique and strictly increasing, got {list(applied)}")


@dataclass(frozen=True)
class TickMetadata:
    """The identity a tick result must echo (vllm-omni's ``ARDiffusionChunkMetadata``)."""

    session_id: str
    request_id: str
    chunk_index: int
    applied_event_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "applied_event_ids", tuple(self.applied_event_ids))
        _check_identity(self.session_id, self.request_id, self.chunk_index, self.applied_event_ids)

    def to_dict(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "request_id": self.request_id,
            "chunk_index": self.chunk_index,
            "applied_event_ids": list(self.applied_event_ids),
        }


@dataclass(frozen=True)
class TickSnapshot:
    """Everything one tick may read; built by the session, never mutated afterwards."""

    session_id: str
    request_id: str
    chunk_index: int
    applied_event_ids: tuple[int, ...]
    prompt: str | None
    controls: tuple[ControlInput, ...]
    events: tuple[SessionEvent, ...]
    epoch: int
    payload: Any = None

    def __post_init__(self) -> None:
        # Built (and validated) once: every tick reads it twice (executor echo, session check).
        metadata = TickMetadata(self.session_id, self.request_id, self.chunk_index, self.applied_event_ids)
        object.__setattr__(self, "_metadata", metadata)

    @property
    def metadata(self) -> TickMetadata:
        return self._metadata

    def control(self, track: str) -> ControlInput | None:
        """The sticky control on ``track``, or ``None`` if the track was never set."""
        return next((c for c in self.controls if c.track == track), None)


@dataclass(frozen=True)
class TickOutput(Generic[T]):
    """A tick result: the metadata echo plus the kind's value (actions, latents, frames)."""

    metadata: TickMetadata
    value: T


@dataclass(frozen=True, slots=True)
class TickChunk(Generic[T]):
    """One chunk of a streaming tick: the tick's identity, its position, the kind's value and the
    tick's epoch (send its output with it: an interrupt makes queued output of it stale)."""

    metadata: TickMetadata
    seq: int
    value: T
    epoch: int = 0


class TickResult(Protocol):
    @property
    def metadata(self) -> TickMetadata: ...


class TickExecutor(Protocol):
    async def execute(self, snapshot: TickSnapshot) -> TickResult:
        """Run one tick; raise on failure. Must not mutate the snapshot or its payload."""
        ...

    def stream(self, snapshot: TickSnapshot) -> AsyncIterator[Any]:
        """Run one streaming tick: its chunks' values in order (``Session.stream_tick``)."""
        ...

    def fence(self, session_id: str, epoch: int) -> None:
        """``Session.interrupt`` moved the session to ``epoch``: drop and abort older work."""
        ...
