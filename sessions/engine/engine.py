"""``StageEngine``: one model stage, batched across sessions, forwards off the event loop.

A thin composition of roles, each the one owner of its state (vLLM v1's split of scheduler,
engine core, model runner and output processor):

- the **registry** of open sessions and their epochs, admission and the open/release path:
  :class:`~sessions.engine.runner.BaseRunner` (shared by every runner);
- the **slot table** (:class:`~sessions.engine.slots.SlotTable`): per-session resident state;
- the **scheduler** (:class:`~sessions.engine.scheduler.Scheduler`): each session's queued and
  in-flight work, which items form the next batch and when it runs, under the engine's
  :class:`~sessions.engine.dispatch.DispatchPolicy` (``Coalescing``, ``ArrivalAware`` or
  ``FrameClock``);
- the **worker** (:class:`~sessions.engine.worker.DeviceWorker`): the thread the forward runs on,
  as :func:`~sessions.engine.worker.isolated_forward` (batch isolation by bisecting);
- the **metrics** (:class:`~sessions.engine.metrics.BatchMetrics`): batch sizes, latencies,
  failures, queue depth.

The engine itself admits work (:meth:`StageEngine.submit`, :meth:`StageEngine.stream`), turns a
batch the scheduler took into the stage's items and posts it to the worker, and fans the outputs
out (the output processor). A submit that the policy runs at once goes submit -> worker thread ->
completion callback -> the item's future, with no task switch in between.

Results fan out to each item's future or chunk stream. Batch isolation: an ``Exception`` returned
for one item fails only that item (:class:`StageItemError`); a forward that *raises* is re-run on
the worker in halves, recursively (bisect), so only the items whose forward raises alone fail
(:class:`StageBatchError`) and the others get their outputs. Either way the engine keeps serving.

Epochs: ``bump_epoch(session_id, epoch)`` (or a submit with a newer epoch) drops the session's
queued work and buffered chunks of older epochs and discards the result of its in-flight item;
their consumers get :class:`StaleEpochError`.

The engine is a :class:`sessions.lifecycle.LifecycleBackend`: ``release`` fails the session's
pending work with :class:`SessionReleasedError` and frees its slot after any in-flight forward.
All public methods must be called on the event loop thread.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from prometheus_client import CollectorRegistry

from models.stage import BatchedStage, StageItem
from sessions.engine.channels import BackpressurePolicy, Chunk, check_capacity
from sessions.engine.dispatch import Coalescing, DispatchPolicy
from sessions.engine.errors import (
    EngineError,
    QueueFullError,
    StageBatchError,
    StageItemError,
    StageWorkerDiedError,
)
from sessions.engine.metrics import BatchMetrics
from sessions.engine.runner import EngineBase
from sessions.engine.scheduler import Scheduler, SessionQueue, StreamSink, Work
from sessions.engine.slots import Slot
from sessions.engine.streams import ChunkStream
from sessions.engine.worker import BatchFailure, DeviceWorker, isolated_forward

log = logging.getLogger("sessions.engine")


class StageEngine(EngineBase[SessionQueue]):
    """Owns one :class:`models.stage.BatchedStage`, its worker thread and its slot table.

    A :class:`~sessions.engine.protocol.StageRunner` (the interface kinds and pipelines use).
    """

    metrics_type = BatchMetrics
    stage: BatchedStage
    metrics: BatchMetrics

    def __init__(
        self,
        stage: BatchedStage,
        *,
        registry: CollectorRegistry,
        max_batch: int = 8,
        coalesce_window_s: float = 0.010,
        eager_remaining: int = 0,
        dispatch: DispatchPolicy | None = None,
        max_pending: int = 1024,
        max_sessions: int | None = None,
        stream_buffer: int = 8,
        backpressure: BackpressurePolicy = "block",
        stall_timeout_s: float = 30.0,
        worker: DeviceWorker | None = None,
    ) -> None:
        check_capacity("max_batch", max_batch)
        policy = dispatch if dispatch is not None else Coalescing(coalesce_window_s, eager_remaining)
        super().__init__(
            stage, registry, worker, max_sessions, max_pending, stream_buffer, backpressure, stall_timeout_s
        )
        self.scheduler = Scheduler(self._sessions, policy, max_batch, self._launch)
        self.metrics.read_queue_depth(self.scheduler)

    @property
    def dispatch(self) -> DispatchPolicy:
        """The dispatch policy (read by the scheduler at every decision; may be replaced)."""
        return self.scheduler.policy

    @dispatch.setter
    def dispatch(self, policy: DispatchPolicy) -> None:
        self.scheduler.policy = policy

    # ----------------------------------------------------------------- work in

    def submit(
        self,
        session_id: str,
        epoch: int,
        payload: Any,
        *,
        request_id: str = "",
        seq: int = 0,
        last: bool = True,
    ) -> asyncio.Future:
        """Queue one item; the returned future resolves to its output.

        Raises at once (typed): engine closed, session not open, stale epoch, queue full (a
        :class:`~sessions.errors.TransientError`: nothing was queued).
        """
        fut = asyncio.get_running_loop().create_future()
        self._enqueue(session_id, epoch, payload, request_id, seq, last, fut, None)
        return fut

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
        """Queue one item whose output arrives as a chunk stream (one final chunk for this flavour).

        The form pipelines use, so a batched and a streaming stage look alike downstream;
        ``buffer`` / ``backpressure`` override the engine defaults for this stream's channel.
        """
        channel = self._output_channel(buffer, backpressure, on_space=self.scheduler.kick)
        sink = StreamSink(session_id, epoch, channel)
        entry = self._enqueue(session_id, epoch, payload, request_id, seq, last, None, sink)
        entry.streams.add(sink)
        return self._chunk_stream(session_id, channel, lambda error: self._cancel_stream(sink, error))

    def _enqueue(
        self,
        session_id: str,
        epoch: int,
        payload: Any,
        request_id: str,
        seq: int,
        last: bool,
        future: asyncio.Future | None,
        stream: StreamSink | None,
    ) -> SessionQueue:
        entry = self._admit(session_id, epoch)
        if self.scheduler.pending >= self.max_pending:
            raise QueueFullError(self.name, self.max_pending)
        now = asyncio.get_running_loop().time()
        self.scheduler.add(
            entry, Work(session_id, epoch, payload, request_id, seq, last, now, future, stream)
        )
        return entry

    def _cancel_stream(self, sink: StreamSink, error: BaseException | None) -> None:
        """The consumer stopped reading (closed early, stalled or failed): drop the stream's work."""
        self.scheduler.cancel_stream(sink, error or EngineError("stream cancelled by its consumer"))

    # ----------------------------------------------------------------- sessions (BaseRunner hooks)

    def _register(self, session_id: str, slot: Slot) -> SessionQueue:
        self.scheduler.kick()  # a frame clock steps the new session
        return SessionQueue(slot)

    def _drop_work(self, session_id: str, entry: SessionQueue, error: BaseException) -> None:
        self.scheduler.drop_session(session_id, entry, error)

    def _drop_stale(self, session_id: str, entry: SessionQueue, epoch: int) -> int:
        dropped = self.scheduler.drop_older(session_id, entry, epoch)
        self.metrics.stale_dropped.inc(dropped)
        return dropped

    async def _stop_work(self, error: BaseException) -> None:
        await self.scheduler.stop(error)

    # ----------------------------------------------------------------- forwards and outputs

    def _launch(self, batch: list[Work]) -> None:
        """The scheduler took ``batch``: its forward runs on the worker; outputs come to :meth:`_finished`."""
        sessions = self._sessions
        items = []
        for work in batch:
            slot = sessions[work.session_id].slot
            items.append(
                StageItem(
                    work.session_id,
                    work.epoch,
                    work.payload,
                    work.request_id,
                    work.seq,
                    work.last,
                    slot.index,
                    slot.state,
                )
            )
        self.metrics.batch_size.observe(len(batch))
        try:
            self.worker.post(isolated_forward, (self.stage, items), self._finished)
        except BaseException as exc:  # the worker itself is closed
            self._finished((None, exc, 0.0), None)

    def _finished(
        self,
        outcome: tuple[Sequence[Any] | None, BaseException | None, float] | None,
        failed: BaseException | None,
    ) -> None:
        """On the loop, once the worker ran the forward: fan out, then let the scheduler decide."""
        batch = self.scheduler.running
        assert batch is not None
        outputs, error, seconds = outcome if failed is None else (None, failed, 0.0)
        self.metrics.forward_seconds.observe(seconds)
        try:
            self._fan_out(batch, outputs, error)
        except Exception:  # a bug here must not kill the engine for every session
            log.exception("engine fan-out failed", extra={"stage": self.name})
            for work in batch:
                work.fail(EngineError("internal engine error"))
        self.scheduler.done(batch)

    def _fan_out(self, batch: list[Work], outputs: Sequence[Any] | None, error: BaseException | None) -> None:
        """Each item's output to its future, stream or (a silent step) the policy; failures typed."""
        metrics = self.metrics
        stale = self.scheduler.land(batch)
        if stale:
            metrics.stale_dropped.inc(stale)  # the in-flight items of an older epoch are dropped here
        if error is not None:
            metrics.batch_failures.inc(len(batch))
        if error is not None and not isinstance(error, StageWorkerDiedError):  # a death is logged once
            log.error(
                "stage forward failed for a batch of %d: %r", len(batch), error, extra={"stage": self.name}
            )
        now = asyncio.get_running_loop().time()
        for i, work in enumerate(batch):
            if work.dead:  # dropped in flight (epoch bump, release, its stream cancelled)
                continue
            if error is not None:  # a dead worker is named as such: no batch of this stage runs again
                dead = isinstance(error, StageWorkerDiedError)
                work.fail(error if dead else StageBatchError(self.name, len(batch), error))
                continue
            out = outputs[i]
            if isinstance(out, BatchFailure):
                metrics.batch_failures.inc()
                log.warning("stage forward raised for one item: %r", out.error, extra={"stage": self.name})
                work.fail(StageBatchError(self.name, 1, out.error))
                continue
            if isinstance(out, BaseException):
                metrics.item_failures.inc()
                work.fail(StageItemError(self.name, work.session_id, out))
                continue
            metrics.item_seconds.observe(now - work.arrived)
            if work.silent:
                self.scheduler.policy.on_silence_output(work.session_id, out)
            elif work.stream is not None:
                if not work.stream.closed:
                    work.stream.channel.put_nowait(
                        Chunk(work.session_id, work.epoch, work.stream.next_seq, out, True)
                    )
                    work.stream.next_seq += 1
            elif not work.future.done():
                work.future.set_result(out)
