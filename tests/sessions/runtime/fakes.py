"""Test doubles for one layer: a scripted tick executor and a recording lifecycle backend."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from sessions.events import ControlInput, SessionEvent
from sessions.manager import SessionManager
from sessions.reducer import LatestWinsReducer, PreparedControls
from sessions.session import Session
from sessions.tick import TickMetadata, TickOutput, TickSnapshot


def request_id(session_id: str, chunk_index: int) -> str:
    return f"{session_id}-request-{chunk_index}"


class ScriptedExecutor:
    """Echoes the snapshot; can block on a gate, raise, or return other metadata.

    As a streaming executor it yields ``chunks``; the gate blocks before chunk ``gate_at`` and
    ``error`` is raised in place of chunk ``error_at``.
    """

    def __init__(self) -> None:
        self.snapshots: list[TickSnapshot] = []
        self.gate: asyncio.Event | None = None
        self.started = asyncio.Event()
        self.error: BaseException | None = None
        self.metadata: Callable[[TickSnapshot], TickMetadata] | None = None
        self.chunks: list[object] = ["a", "b", "c"]
        self.gate_at = 1
        self.error_at = 0
        self.closed_streams = 0  # streams whose generator was closed or ran to its end
        self.fences: list[tuple[str, int]] = []  # Session.interrupt's fence calls

    async def execute(self, snapshot: TickSnapshot) -> TickOutput[int]:
        self.snapshots.append(snapshot)
        self.started.set()
        if self.gate is not None:
            await self.gate.wait()
        if self.error is not None:
            raise self.error
        md = self.metadata(snapshot) if self.metadata is not None else snapshot.metadata
        return TickOutput(md, snapshot.chunk_index)

    async def stream(self, snapshot: TickSnapshot) -> AsyncIterator[object]:
        self.snapshots.append(snapshot)
        self.started.set()
        try:
            for i, value in enumerate(self.chunks):
                if i == self.gate_at and self.gate is not None:
                    await self.gate.wait()
                if i == self.error_at and self.error is not None:
                    raise self.error
                yield value
        finally:
            self.closed_streams += 1

    def fence(self, session_id: str, epoch: int) -> None:
        self.fences.append((session_id, epoch))


class RecordingLifecycle:
    def __init__(self) -> None:
        self.releases: list[tuple[str, str]] = []
        self.failures_left = 0
        self.hang: asyncio.Event | None = None

    async def release(self, session_id: str, reason: str) -> None:
        self.releases.append((session_id, reason))
        if self.hang is not None:
            await self.hang.wait()
        if self.failures_left > 0:
            self.failures_left -= 1
            raise RuntimeError("worker rpc failed")

    def reasons(self, session_id: str) -> list[str]:
        return [r for s, r in self.releases if s == session_id]


class FailingCommitReducer(LatestWinsReducer):
    def __init__(self) -> None:
        self.fail_commit = True
        self.resets = 0
        self.commits = 0

    def commit(self, prepared: PreparedControls) -> None:
        if self.fail_commit:
            raise RuntimeError("commit exploded")
        self.commits += 1

    def reset(self) -> None:
        self.resets += 1


def event(event_id: int, prompt: str | None = None, **tracks: object) -> SessionEvent:
    controls = tuple(ControlInput(track, f"test.{track}.v1", data) for track, data in tracks.items())
    return SessionEvent(event_id, prompt=prompt, controls=controls)


def make_session(executor=None, lifecycle=None, **kwargs) -> Session:
    return Session(
        kwargs.pop("session_id", "world-1"),
        kind="world",
        executor=executor or ScriptedExecutor(),
        lifecycle=lifecycle or RecordingLifecycle(),
        request_id_factory=request_id,
        **kwargs,
    )


def make_manager(executor=None, lifecycle=None, capacity: int = 8, **kwargs) -> SessionManager:
    return SessionManager(
        "world",
        executor=executor or ScriptedExecutor(),
        lifecycle=lifecycle or RecordingLifecycle(),
        capacity=capacity,
        request_id_factory=request_id,
        **kwargs,
    )
