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
from sessions.engine.channels import BackpressurePolicy, Channel, Chunk
from sessions.engine.errors import EngineError, QueueFullError, StageItemError, StaleEpochError
from sessions.engine.runner import EngineBase
from sessions.engine.slots import Slot
from sessions.engine.streams import ChunkStream

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


class StreamingStageEngine(EngineBase[_Session]):
    """Owns one :class:`models.stage.StreamingStage`; a ``StageRunner`` and ``LifecycleBackend``."""

    stage: StreamingStage

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
        # Its own worker runs only open_state / release_state: the stage schedules its compute.
        super().__init__(
            stage, registry, None, max_sessions, max_pending, stream_buffer, backpressure, stall_timeout_s
        )
        self._inflight = 0  # requests started and not ended, across sessions

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
        entry = self._admit(session_id, epoch)
        if self._inflight >= self.max_pending:
            raise QueueFullError(self.name, self.max_pending)
        channel = self._output_channel(buffer, backpressure)
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
        return self._chunk_stream(
            session_id,
            channel,
            lambda error: self._abort(request, error or EngineError("stream cancelled by its consumer")),
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

    # ----------------------------------------------------------------- sessions (BaseRunner hooks)

    def _register(self, session_id: str, slot: Slot) -> _Session:
        return _Session(slot)

    def _drop_work(self, session_id: str, entry: _Session, error: BaseException) -> None:
        for request in list(entry.requests):
            self._abort(request, error)

    def _drop_stale(self, session_id: str, entry: _Session, epoch: int) -> int:
        stale = [r for r in entry.requests if r.epoch < epoch]
        for request in stale:
            self._abort(request, StaleEpochError(session_id, request.epoch, epoch))
        self.metrics.stale_dropped.inc(len(stale))
        return len(stale)

    # ----------------------------------------------------------------- requests

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
                self.metrics.item_seconds.observe(time.monotonic() - started)
            request.stop(None)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.metrics.item_failures.inc()
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
