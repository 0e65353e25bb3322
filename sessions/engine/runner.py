"""What the three :class:`~sessions.engine.protocol.StageRunner` implementations share, written once.

:class:`BaseRunner` (every runner: ``StageEngine``, ``StreamingStageEngine``, ``Pipeline``) owns
the registry of open sessions and their epochs: admission of new work (closed, not open, stale
epoch; a newer epoch is made current first), ``epoch``, ``bump_epoch`` and the one open/release
path, where a release racing an in-flight open of the same session wins (the open fails with
:class:`SessionReleasedError` instead of registering a session on a freed slot). A flavour fills
in four hooks: ``_open_state`` (give the session its resident state), ``_register`` (its entry in
the registry), ``_release`` (drop its work, free its state) and ``_drop_stale`` (drop work of an
older epoch).

:class:`EngineBase` (both engines) adds what a runner over one model stage holds: the stage, its
:class:`DeviceWorker`, its :class:`SlotTable` (the session's resident state is a slot), its
metrics, the limits of its output streams, and shutdown (stop the work, release every slot,
stop the worker).

All methods are called on the event loop thread.
"""

from __future__ import annotations

import logging
import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

from prometheus_client import CollectorRegistry

from models.stage import ModelStage
from sessions.engine.channels import BackpressurePolicy, Channel, check_capacity, check_policy
from sessions.engine.errors import (
    EngineClosedError,
    EngineConfigError,
    SessionNotOpenError,
    SessionReleasedError,
    StaleEpochError,
)
from sessions.engine.metrics import StageMetrics
from sessions.engine.slots import Slot, SlotTable, slot_capacity
from sessions.engine.streams import ChunkStream
from sessions.engine.worker import DeviceWorker
from sessions.lifecycle import ReleaseReason

log = logging.getLogger("sessions.engine")


def check_stall_timeout(value: float) -> float:
    """Validate a stall deadline: finite and >= 0; 0 disables it (with a warning)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise EngineConfigError(f"stall_timeout_s must be a finite number >= 0 (0 disables), got {value!r}")
    if value == 0:
        log.warning("stall deadline disabled (stall_timeout_s=0): a stalled stage will hang its streams")
    return float(value)


class _Entry(Protocol):
    epoch: int


class _SlotEntry(Protocol):
    slot: Slot
    epoch: int


E = TypeVar("E", bound=_Entry)
S = TypeVar("S", bound=_SlotEntry)


class BaseRunner(ABC, Generic[E]):
    """The registry of open sessions (one entry ``E`` each, carrying its epoch) and the one
    open/release path (see the module docstring)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._sessions: dict[str, E] = {}
        self._releasing: dict[str, int] = {}  # session id -> releases in progress (an open racing one fails)
        self._closed = False

    @property
    def active_sessions(self) -> int:
        return len(self._sessions)

    def epoch(self, session_id: str) -> int | None:
        entry = self._sessions.get(session_id)
        return None if entry is None else entry.epoch

    async def open(self, session_id: str) -> Any:
        """Give the session its resident state (idempotent); returns what ``_open_state`` gave.

        A ``release`` of the same session while this waits wins: this raises
        :class:`SessionReleasedError` and registers nothing."""
        if self._closed:
            raise EngineClosedError(f"stage {self.name!r} is closed")
        state = await self._open_state(session_id)
        if session_id in self._releasing:
            raise SessionReleasedError(session_id, "released while opening")
        if session_id not in self._sessions:
            self._sessions[session_id] = self._register(session_id, state)
        return state

    async def release(self, session_id: str, reason: ReleaseReason = "close") -> None:
        """Drop the session's work and free its state (idempotent; raises if freeing fails)."""
        entry = self._sessions.pop(session_id, None)
        self._releasing[session_id] = self._releasing.get(session_id, 0) + 1
        try:
            await self._release(session_id, entry, reason)
        finally:
            if left := self._releasing.pop(session_id) - 1:
                self._releasing[session_id] = left

    def bump_epoch(self, session_id: str, epoch: int) -> int:
        """Make ``epoch`` current for the session; returns how many stale items/chunks were dropped."""
        entry = self._sessions.get(session_id)
        if entry is None or epoch <= entry.epoch:
            return 0
        entry.epoch = epoch
        return self._drop_stale(session_id, entry, epoch)

    def _admit(self, session_id: str, epoch: int) -> E:
        """The session's entry if it may take work of ``epoch`` (made current if newer); raises typed."""
        if self._closed:
            raise EngineClosedError(f"stage {self.name!r} is closed")
        entry = self._sessions.get(session_id)
        if entry is None:
            raise SessionNotOpenError(self.name, session_id)
        if epoch != entry.epoch:
            if epoch < entry.epoch:
                raise StaleEpochError(session_id, epoch, entry.epoch)
            self.bump_epoch(session_id, epoch)
        return entry

    # ----------------------------------------------------------------- the flavour's hooks

    @abstractmethod
    async def _open_state(self, session_id: str) -> Any:
        """Give the session its resident state (idempotent); raises if it cannot."""
        raise NotImplementedError

    @abstractmethod
    def _register(self, session_id: str, state: Any) -> E:
        """The registry entry of a session just opened with ``state``."""
        raise NotImplementedError

    @abstractmethod
    async def _release(self, session_id: str, entry: E | None, reason: ReleaseReason) -> None:
        """Fail the work of ``entry`` (None: it was not registered) and free the session's state."""
        raise NotImplementedError

    @abstractmethod
    def _drop_stale(self, session_id: str, entry: E, epoch: int) -> int:
        """``epoch`` became current: drop older work; returns how much was dropped."""
        raise NotImplementedError


class EngineBase(BaseRunner[S]):
    """A runner over one model stage: its worker, slot table, metrics and output streams.

    ``worker`` None: the engine starts its own (and stops it at ``close``); pass one to serialize
    several stages on one thread and CUDA stream. ``metrics_type``: what the flavour records.
    """

    metrics_type: type[StageMetrics] = StageMetrics

    def __init__(
        self,
        stage: ModelStage,
        registry: CollectorRegistry,
        worker: DeviceWorker | None,
        max_sessions: int | None,
        max_pending: int,
        stream_buffer: int,
        backpressure: BackpressurePolicy,
        stall_timeout_s: float,
    ) -> None:
        check_capacity("max_pending", max_pending)
        check_capacity("stream_buffer", stream_buffer)
        check_policy(backpressure)
        capacity = slot_capacity(stage, max_sessions)
        super().__init__(stage.name)
        self.stage = stage
        self.max_pending = max_pending
        self.stream_buffer = stream_buffer
        self.backpressure: BackpressurePolicy = backpressure
        self.stall_timeout_s = check_stall_timeout(stall_timeout_s)
        self.metrics = metrics = self.metrics_type(registry, stage.name)
        self._owns_worker = worker is None
        self.worker = worker or DeviceWorker(stage.device, name=f"stage-{stage.name}")
        self.slots = SlotTable(
            stage, self.worker, capacity, on_change=lambda: metrics.slots_changed(self.slots)
        )

    @property
    def per_session_bytes(self) -> int:
        """Resident bytes one session's slot holds (0 for a stateless stage)."""
        return self.slots.per_session_bytes

    def is_open(self, session_id: str) -> bool:
        """True when ``session_id`` holds an open slot (``open`` would return at once)."""
        entry = self._sessions.get(session_id)
        return entry is not None and entry.slot.status == "open"

    async def open(self, session_id: str) -> Slot:
        """Give ``session_id`` a slot (initialising the stage's state in it); idempotent."""
        entry = self._sessions.get(session_id)
        if entry is not None and entry.slot.status == "open" and not self._closed:
            return entry.slot  # every tick of an open session
        return await super().open(session_id)

    async def close(self) -> None:
        """Stop the work (``_stop_work``), release every slot, stop the worker (if this engine's)."""
        if self._closed:
            return
        self._closed = True
        await self._stop_work(EngineClosedError(f"stage {self.name!r} is shutting down"))
        for slot in list(self.slots):
            try:
                await self.release(slot.session_id, "shutdown")
            except Exception:
                log.exception("slot release failed at shutdown", extra={"stage": self.name})
        if self._owns_worker:
            await self.worker.close()

    def _output_channel(
        self,
        buffer: int | None,
        backpressure: BackpressurePolicy | None,
        on_space: Callable[[], None] | None = None,
    ) -> Channel:
        """A stream's channel: ``buffer`` / ``backpressure`` override the engine's defaults."""
        policy = backpressure or self.backpressure
        check_policy(policy)
        return Channel(
            buffer or self.stream_buffer,
            policy,
            on_drop=self.metrics.chunk_dropped,
            on_space=on_space,
            depth=self.metrics.channel_depth,
        )

    def _chunk_stream(
        self, session_id: str, channel: Channel, on_cancel: Callable[[BaseException | None], None]
    ) -> ChunkStream:
        """The consumer's side of ``channel``, under the engine's stall deadline."""
        return ChunkStream(
            channel,
            stage=self.name,
            session_id=session_id,
            stall_timeout_s=self.stall_timeout_s,
            on_cancel=on_cancel,
            on_stall=self.metrics.stalls.inc,
        )

    async def _open_state(self, session_id: str) -> Slot:
        slot = await self.slots.open(session_id)
        self.metrics.slots_changed(self.slots)
        return slot

    async def _release(self, session_id: str, entry: S | None, reason: ReleaseReason) -> None:
        if entry is not None:
            self._drop_work(session_id, entry, SessionReleasedError(session_id, reason))
        try:
            await self.slots.release(session_id)
        finally:
            self.metrics.slots_changed(self.slots)

    @abstractmethod
    def _drop_work(self, session_id: str, entry: S, error: BaseException) -> None:
        """Fail the released session's work with ``error``."""
        raise NotImplementedError

    async def _stop_work(self, error: BaseException) -> None:
        """At shutdown, before the slots are released: stop taking decisions, fail queued work."""
        return None
