"""``StageRunner``: the interface session kinds, executors and pipelines drive a stage through.

Three implementations: :class:`~sessions.engine.engine.StageEngine` (a batched stage, scheduled by
the engine's dispatch policy), :class:`~sessions.engine.streaming.StreamingStageEngine` (a
self-scheduling streaming stage such as vLLM's ``AsyncLLM``) and
:class:`~sessions.engine.pipeline.Pipeline` (runners chained by bounded channels), all three on
:class:`~sessions.engine.runner.BaseRunner` (what they share, written once). Each is a
``sessions.lifecycle.LifecycleBackend`` (``release`` is the one release path). All methods are
called on the event loop thread.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from typing import Any, Protocol

from sessions.engine.channels import Chunk
from sessions.lifecycle import ReleaseReason


class StageRunner(Protocol):
    name: str

    @property
    def per_session_bytes(self) -> int:
        """Resident bytes one open session holds (the stage's ``state_bytes()``; 0 if stateless)."""
        ...

    def is_open(self, session_id: str) -> bool: ...

    def epoch(self, session_id: str) -> int | None: ...

    async def open(self, session_id: str) -> Any:
        """Give the session its resident state (a slot); idempotent."""
        ...

    async def release(self, session_id: str, reason: ReleaseReason = "close") -> None:
        """Drop the session's work and free its state; idempotent; raises if freeing fails."""
        ...

    def submit(
        self,
        session_id: str,
        epoch: int,
        payload: Any,
        *,
        request_id: str = "",
        seq: int = 0,
        last: bool = True,
    ) -> Awaitable[Any]:
        """Run one input; the awaitable resolves to its result (raises typed engine errors)."""
        ...

    def stream(
        self,
        session_id: str,
        epoch: int,
        payload: Any,
        *,
        request_id: str = "",
        seq: int = 0,
        last: bool = True,
    ) -> AsyncIterator[Chunk]:
        """Run one input; its output chunks in order, each tagged ``(session_id, epoch, seq)``."""
        ...

    def bump_epoch(self, session_id: str, epoch: int) -> int:
        """Make ``epoch`` current: drop and abort older work; returns how many items were dropped."""
        ...

    async def close(self) -> None: ...
