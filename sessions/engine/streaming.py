"""``StreamingStageEngine``: the runtime side of a self-scheduling streaming stage.

A :class:`models.stage.StreamingStage` batches on its own (vLLM's ``AsyncLLM`` does continuous
batching), so this engine never forms batches or forces lockstep. It gives the stage what the
runtime guarantees every stage:

- **Slots**: a stateful streaming stage gets its per-session slot from the same
  :class:`~sessions.engine.slots.SlotTable` as batched stages (``open_state`` / ``release_state``
  on a worker thread), so there is one owner of slot indices and one capacity declaration.
- **Requests**: ``stream(...)`` calls ``stage.stream(item)`` in one pump task per request that
  copies its chunks into a bounded channel (``block``: a slow reader pauses only that request;
  ``drop_oldest``: chunks are shed and counted). The consumer's
  :class:`~sessions.engine.streams.ChunkStream` enforces the stall deadline between chunks.
  ``submit(...)`` resolves to the tuple of every chunk's payload.
- **Aborts**: an epoch bump, a release, a consumer that stops reading, a stall or shutdown cancels
  the pump and calls ``stage.abort(request_id)``; the consumer gets the typed reason.
- **Bounds**: at most ``max_pending`` requests in flight across sessions
  (:class:`~sessions.engine.errors.QueueFullError`, a transient error, beyond it).
- **Metrics**: ``engine_item_seconds`` observes each request that ran to its end (start to last
  chunk), so ``/v1/status`` counts the stage's requests; the stage batches its own forwards, so
  ``engine_batch_size`` and ``engine_forward_seconds`` stay empty.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry

from models.stage import StageItem, StreamingStage
from sessions.engine.channels import BackpressurePolicy, Channel, Chunk, check_capacity, check_policy
from sessions.engine.engine import DEFAULT_MAX_SESSIONS, check_stall_timeout
from sessions.engine.errors import (
    EngineClosedError,
    EngineConfigError,
    EngineError,
    QueueFullError,
    SessionNotOpenError,
    SessionReleasedError,
    StageItemError,
    StaleEpochError,
)
from sessions.engine.metrics import engine_metrics
from sessions.engine.slots import Slot, SlotTable
from sessions.engine.streams import ChunkStream
from sessions.engine.worker import DeviceWorker
from sessions.lifecycle import ReleaseReason

log = logging.getLogger("sessions.engine")


@dataclass(eq=False)
class _Request:
    session_id: str
    epoch: int
    request_id: str
    channel: Channel
    task: asyncio.Task | None = None
    done: bool = False

    def stop(self, error: BaseException | None) -> None:
        """End the request: the channel closes with ``error`` (None: cleanly)."""
        if self.done:
            return
        self.done = True
        self.channel.close(error)
        if self.task is not None and self.task is not asyncio.current_task():
            self.task.cancel()


@dataclass(eq=False)
class _Session:
    slot: Slot
    epoch: int = 0
    requests: set[_Request] = field(default_factory=set)


class StreamingStageEngine:
    """Owns one :class:`models.stage.StreamingStage`; a ``StageRunner`` and ``LifecycleBackend``."""

    def __init__(
        self,
        stage: StreamingStage,
        *,
        registry: CollectorRegistry,
        max_sessions: int | None = None,
        max_pending: int = 1024,
        stream_buffer: int = 32,
        backpressure: BackpressurePolicy = "block",
        stall_timeout_s: float = 30.0,
    ) -> None:
        check_capacity("max_pending", max_pending)
        check_capacity("stream_buffer", stream_buffer)
        check_policy(backpressure)
        stage_capacity = getattr(stage, "slot_capacity", None)
        capacity = max_sessions if max_sessions is not None else (stage_capacity or DEFAULT_MAX_SESSIONS)
        check_capacity("max_sessions", capacity)
        if stage_capacity is not None and capacity > stage_capacity:
            raise EngineConfigError(
                f"max_sessions {capacity} exceeds stage {stage.name!r} slot_capacity {stage_capacity}"
            )
        self.stage = stage
        self.name = stage.name
        self.max_pending = max_pending
        self.stream_buffer = stream_buffer
        self.backpressure: BackpressurePolicy = backpressure
        self.stall_timeout_s = check_stall_timeout(stall_timeout_s)
        self.worker = DeviceWorker(stage.device, name=f"stage-{stage.name}")  # open/release_state
        self.slots = SlotTable(stage, self.worker, capacity)
        self._sessions: dict[str, _Session] = {}
        self._inflight = 0
        self._closed = False
        m = engine_metrics(registry)
        self._m_stale = m.stale_dropped.labels(stage=self.name)
        self._m_dropped = m.backpressure_dropped.labels(stage=self.name)
        self._m_stalls = m.stalls.labels(stage=self.name)
        self._m_item_fail = m.failures.labels(stage=self.name, scope="item")
        self._m_item = m.item_seconds.labels(stage=self.name)
        self._m_channel = m.channel_depth.labels(stage=self.name)
        self._m_slots = m.slots_open.labels(stage=self.name)

    @property
    def per_session_bytes(self) -> int:
        return self.slots.per_session_bytes

    def is_open(self, session_id: str) -> bool:
        entry = self._sessions.get(session_id)
        return entry is not None and entry.slot.status == "open"

    def epoch(self, session_id: str) -> int | None:
        entry = self._sessions.get(session_id)
        return None if entry is None else entry.epoch

    async def open(self, session_id: str) -> Slot:
        if self._closed:
            raise EngineClosedError(f"stage {self.name!r} is closed")
        entry = self._sessions.get(session_id)
        if entry is not None and entry.slot.status == "open":
            return entry.slot
        slot = await self.slots.open(session_id)
        self._sessions.setdefault(session_id, _Session(slot))
        self._m_slots.set(len(self.slots))
        return slot

    async def release(self, session_id: str, reason: ReleaseReason = "close") -> None:
        entry = self._sessions.pop(session_id, None)
        if entry is not None:
            error = SessionReleasedError(session_id, reason)
            for request in list(entry.requests):
                self._abort(request, error)
        try:
            await self.slots.release(session_id)
        finally:
            self._m_slots.set(len(self.slots))

    def bump_epoch(self, session_id: str, epoch: int) -> int:
        entry = self._sessions.get(session_id)
        if entry is None or epoch <= entry.epoch:
            return 0
        entry.epoch = epoch
        stale = [r for r in entry.requests if r.epoch < epoch]
        for request in stale:
            self._abort(request, StaleEpochError(session_id, request.epoch, epoch))
        self._m_stale.inc(len(stale))
        return len(stale)

    def stream(
        self,
        session_id: str,
        epoch: int,
        payload: Any,
        *,
        request_id: str = "",
        seq: int = 0,
        last: bool = True,
        buffer: int | None = None,
        backpressure: BackpressurePolicy | None = None,
    ) -> ChunkStream:
        """Start one request; its chunks stream back (the stream ends after the stage's last chunk)."""
        if self._closed:
            raise EngineClosedError(f"stage {self.name!r} is closed")
        entry = self._sessions.get(session_id)
        if entry is None:
            raise SessionNotOpenError(self.name, session_id)
        if epoch < entry.epoch:
            raise StaleEpochError(session_id, epoch, entry.epoch)
        if self._inflight >= self.max_pending:
            raise QueueFullError(self.name, self.max_pending)
        self.bump_epoch(session_id, epoch)
        policy = backpressure or self.backpressure
        check_policy(policy)
        channel = Channel(
            buffer or self.stream_buffer,
            policy,
            on_drop=lambda _chunk: self._m_dropped.inc(),
            depth=self._m_channel,
        )
        request = _Request(session_id, epoch, request_id, channel)
        item = StageItem(
            session_id, epoch, payload, request_id, seq, last, entry.slot.index, entry.slot.state
        )
        entry.requests.add(request)
        self._inflight += 1
        request.task = asyncio.get_running_loop().create_task(
            self._pump(request, item), name=f"stream-{self.name}"
        )
        # A done callback, not the pump's ``finally``: a pump cancelled before its first step
        # (an abort in the same loop iteration as ``stream``) never runs its body.
        request.task.add_done_callback(lambda _task: self._ended(entry, request))
        return ChunkStream(
            channel,
            stage=self.name,
            session_id=session_id,
            stall_timeout_s=self.stall_timeout_s,
            on_cancel=lambda error: self._abort(
                request, error or EngineError("stream cancelled by its consumer")
            ),
            on_stall=self._m_stalls.inc,
        )

    async def submit(
        self,
        session_id: str,
        epoch: int,
        payload: Any,
        *,
        request_id: str = "",
        seq: int = 0,
        last: bool = True,
    ) -> tuple[Any, ...]:
        """Run one request to its end; every chunk's payload, in order."""
        stream = self.stream(session_id, epoch, payload, request_id=request_id, seq=seq, last=last)
        return tuple(chunk.payload for chunk in await stream.collect())

    async def close(self) -> None:
        """Release every session (aborting its requests), then stop the worker."""
        if self._closed:
            return
        self._closed = True
        for session_id in list(self._sessions):  # release aborts the session's requests
            try:
                await self.release(session_id, "shutdown")
            except Exception:
                log.exception("slot release failed at shutdown", extra={"stage": self.name})
        await self.worker.close()

    def _ended(self, entry: _Session, request: _Request) -> None:
        entry.requests.discard(request)
        self._inflight -= 1

    async def _pump(self, request: _Request, item: StageItem) -> None:
        seq, started = 0, time.monotonic()
        chunks: AsyncIterator[Any] = self.stage.stream(item)
        try:
            async for payload in chunks:
                if request.done:
                    break
                await request.channel.put(Chunk(request.session_id, request.epoch, seq, payload, False))
                seq += 1
            if not request.done:
                self._m_item.observe(time.monotonic() - started)
            request.stop(None)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._m_item_fail.inc()
            request.stop(StageItemError(self.name, request.session_id, exc))
        finally:
            aclose = getattr(chunks, "aclose", None)
            if aclose is not None:
                try:
                    await aclose()
                except Exception:
                    log.exception("closing a stage stream failed", extra={"stage": self.name})

    def _abort(self, request: _Request, error: BaseException) -> None:
        if request.done:
            return
        request.stop(error)
        try:
            self.stage.abort(request.request_id)
        except Exception:
            log.exception("stage abort failed", extra={"stage": self.name})
