"""``StageEngine``: one model stage, batched across sessions, forwards off the event loop.

Scheduling (one forward in flight per engine; decisions are taken only while the worker is free,
so work that arrives during a forward simply joins the next batch). A batch holds at most
``max_batch`` items and at most one item per session, oldest first. *When* it runs is the
engine's :class:`~sessions.engine.dispatch.DispatchPolicy`:

- :class:`~sessions.engine.dispatch.Coalescing` (the default): dispatch at once when
  ``max_batch`` sessions have ready work, or when at most ``eager_remaining`` open sessions have
  nothing pending (waiting cannot grow the batch), or when the window is 0; otherwise wait until
  the oldest ready item's arrival + ``coalesce_window_s`` (later arrivals never extend it).
- :class:`~sessions.engine.dispatch.ArrivalAware`: the same window, waiting only for idle
  sessions whose arrival pattern predicts them (the engine reports every queued item, every
  batch's outputs going out and every release to its policy).
- :class:`~sessions.engine.dispatch.FrameClock`: every ``period_s`` all open sessions step
  together; a session with nothing pending steps on the policy's silence input and its output
  goes to the policy's ``on_silence_output``.

Waiting allocates nothing; session state exists only between ``open`` and ``release``. A
streaming item whose ``block`` output channel is full is not ready (backpressure) and waits
without holding up other sessions.

Scheduling is callback-driven, with no scheduler task: any change that can make work
dispatchable (submit, open, release, epoch bump, room in a stream's channel) asks for one
decision at the next loop iteration (``call_soon``, so a burst of submits in one iteration is
decided together), a coalescing wait is one ``call_at`` timer, and the worker thread's
completion callback fans the outputs out and dispatches the next batch directly. A submit that
completes the eager rule while no forward runs (the lone robot's tick) posts its batch to the
worker at once, inside ``submit``. The tick's hand-off is therefore: submit -> worker thread ->
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
import math
import time
import weakref
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry

from models.stage import BatchedStage, StageItem
from sessions.engine.channels import BackpressurePolicy, Channel, Chunk, check_capacity, check_policy
from sessions.engine.dispatch import Coalescing, DispatchPolicy, SessionView
from sessions.engine.errors import (
    EngineClosedError,
    EngineConfigError,
    EngineError,
    QueueFullError,
    SessionNotOpenError,
    SessionReleasedError,
    StageBatchError,
    StageItemError,
    StaleEpochError,
)
from sessions.engine.metrics import engine_metrics
from sessions.engine.slots import Slot, SlotTable
from sessions.engine.streams import ChunkStream
from sessions.engine.worker import DeviceWorker
from sessions.lifecycle import ReleaseReason

log = logging.getLogger("sessions.engine")

DEFAULT_MAX_SESSIONS = 256


def check_stall_timeout(value: float) -> float:
    """Validate a stall deadline: finite and >= 0; 0 disables it (with a warning)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise EngineConfigError(f"stall_timeout_s must be a finite number >= 0 (0 disables), got {value!r}")
    if value == 0:
        log.warning("stall deadline disabled (stall_timeout_s=0): a stalled stage will hang its streams")
    return float(value)


@dataclass(eq=False)
class _Stream:
    """Engine side of one chunk stream."""

    session_id: str
    epoch: int
    channel: Channel
    next_seq: int = 0
    closed: bool = False  # failed or cancelled; nothing more is delivered

    def fail(self, error: BaseException) -> None:
        if not self.closed:
            self.closed = True
            self.channel.close(error)


@dataclass(eq=False, slots=True)
class _Work:
    session_id: str
    epoch: int
    payload: Any
    request_id: str
    seq: int
    last: bool
    arrived: float
    future: asyncio.Future | None = None
    stream: _Stream | None = None
    dead: bool = False  # dropped while in flight; its outputs are discarded
    silent: bool = False  # a frame-clock step on silence: its output goes to the policy

    def fail(self, error: BaseException) -> None:
        future = self.future
        if future is not None and not future.done():
            future.set_exception(error)
            # Consumers that moved on (epoch bump, release) may never await: mark the error
            # retrieved so it is not logged as lost; one that awaits still gets it, typed.
            future.exception()
        if self.stream is not None:
            self.stream.fail(error)


@dataclass(eq=False)
class _Session:
    slot: Slot
    epoch: int = 0
    pending: deque[_Work] = field(default_factory=deque)
    inflight: _Work | None = None
    streams: weakref.WeakSet[_Stream] = field(default_factory=weakref.WeakSet)


class StageEngine:
    """Owns one :class:`models.stage.BatchedStage`, its worker thread and its slot table.

    A :class:`~sessions.engine.protocol.StageRunner` (the interface kinds and pipelines use).
    """

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
        check_capacity("max_pending", max_pending)
        check_capacity("stream_buffer", stream_buffer)
        check_policy(backpressure)
        self.dispatch = dispatch if dispatch is not None else Coalescing(coalesce_window_s, eager_remaining)
        capacity = (
            max_sessions
            if max_sessions is not None
            else getattr(stage, "slot_capacity", DEFAULT_MAX_SESSIONS)
        )
        check_capacity("max_sessions", capacity)
        stage_capacity = getattr(stage, "slot_capacity", None)
        if stage_capacity is not None and capacity > stage_capacity:
            raise EngineConfigError(
                f"max_sessions {capacity} exceeds stage {stage.name!r} slot_capacity {stage_capacity}"
            )
        self.stage = stage
        self.name = stage.name
        self.max_batch = max_batch
        self.max_pending = max_pending
        self.stream_buffer = stream_buffer
        self.backpressure: BackpressurePolicy = backpressure
        self.stall_timeout_s = check_stall_timeout(stall_timeout_s)
        self._owns_worker = worker is None
        self.worker = worker or DeviceWorker(stage.device, name=f"stage-{stage.name}")
        self.slots = SlotTable(stage, self.worker, capacity, on_change=self._update_slot_gauges)
        self._sessions: dict[str, _Session] = {}
        self._releasing: dict[str, int] = {}  # session id -> releases in progress (an open racing one fails)
        self._pending_count = 0
        self._soon: asyncio.Handle | None = None  # a scheduling decision queued for the next iteration
        self._timer: asyncio.TimerHandle | None = None  # the coalescing window's deadline
        self._running: list[_Work] | None = None  # the batch of the forward in flight
        self._idle: asyncio.Future | None = None  # made by close(): resolved once those outputs are out
        self._closed = False
        self._bisections = 0  # forwards re-run in halves after raising (batch isolation)
        self._silence_turn = 0  # where the next frame-clock step starts among silent sessions
        m = engine_metrics(registry)
        self._m_batch = m.batch_size.labels(stage=self.name)
        me = weakref.ref(self)  # read at scrape time; the registry must not keep the engine alive
        m.queue_depth.labels(stage=self.name).set_function(lambda: getattr(me(), "_pending_count", 0))
        self._m_forward = m.forward_seconds.labels(stage=self.name)
        self._m_item = m.item_seconds.labels(stage=self.name)
        self._m_item_fail = m.failures.labels(stage=self.name, scope="item")
        self._m_batch_fail = m.failures.labels(stage=self.name, scope="batch")
        self._m_stale = m.stale_dropped.labels(stage=self.name)
        self._m_dropped = m.backpressure_dropped.labels(stage=self.name)
        self._m_stalls = m.stalls.labels(stage=self.name)
        self._m_slots = m.slots_open.labels(stage=self.name)
        self._m_bytes = m.slot_bytes.labels(stage=self.name)
        self._m_channel = m.channel_depth.labels(stage=self.name)

    # ----------------------------------------------------------------- sessions and slots

    @property
    def per_session_bytes(self) -> int:
        """Resident bytes one session's slot holds (0 for a stateless stage)."""
        return self.slots.per_session_bytes

    @property
    def active_sessions(self) -> int:
        return len(self._sessions)

    def epoch(self, session_id: str) -> int | None:
        entry = self._sessions.get(session_id)
        return None if entry is None else entry.epoch

    def is_open(self, session_id: str) -> bool:
        """True when ``session_id`` holds an open slot (``open`` would return at once)."""
        entry = self._sessions.get(session_id)
        return entry is not None and entry.slot.status == "open"

    async def open(self, session_id: str) -> Slot:
        """Give ``session_id`` a slot (initialising the stage's state in it); idempotent."""
        if self._closed:
            raise EngineClosedError(f"stage {self.name!r} is closed")
        entry = self._sessions.get(session_id)
        if entry is not None and entry.slot.status == "open":  # every tick of an open session
            return entry.slot
        slot = await self.slots.open(session_id)
        if session_id in self._releasing:  # released while this open waited for its state
            raise SessionReleasedError(session_id, "released while opening")
        if session_id not in self._sessions:
            self._sessions[session_id] = _Session(slot)
        self._update_slot_gauges()
        self._kick()
        return slot

    async def release(self, session_id: str, reason: ReleaseReason = "close") -> None:
        """Drop the session's work and free its slot (idempotent; raises if the stage's release fails).

        An ``open`` of the same session still in flight fails with :class:`SessionReleasedError`
        instead of handing out the slot being released."""
        entry = self._sessions.pop(session_id, None)
        if entry is not None:
            error = SessionReleasedError(session_id, reason)
            for work in entry.pending:
                work.fail(error)
            for sink in list(entry.streams):
                sink.fail(error)
            self._pending_count -= len(entry.pending)
            entry.pending.clear()
            self._kill_inflight(entry, error)
            self.dispatch.forget(session_id)
            self._kick()
        self._releasing[session_id] = self._releasing.get(session_id, 0) + 1
        try:
            await self.slots.release(session_id)
        finally:
            if left := self._releasing.pop(session_id) - 1:
                self._releasing[session_id] = left
            self._update_slot_gauges()

    # ----------------------------------------------------------------- work

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
        policy = backpressure or self.backpressure
        check_policy(policy)
        channel = Channel(
            buffer or self.stream_buffer,
            policy,
            on_drop=lambda _chunk: self._m_dropped.inc(),
            on_space=self._kick,
            depth=self._m_channel,
        )
        sink = _Stream(session_id, epoch, channel)
        self._enqueue(session_id, epoch, payload, request_id, seq, last, None, sink)
        self._sessions[session_id].streams.add(sink)
        return ChunkStream(
            channel,
            stage=self.name,
            session_id=session_id,
            stall_timeout_s=self.stall_timeout_s,
            on_cancel=lambda error: self._cancel_stream(sink, error),
            on_stall=self._m_stalls.inc,
        )

    def bump_epoch(self, session_id: str, epoch: int) -> int:
        """Make ``epoch`` current for the session; returns how many stale items/chunks were dropped."""
        entry = self._sessions.get(session_id)
        if entry is None or epoch <= entry.epoch:
            return 0
        entry.epoch = epoch
        dropped = 0
        for sink in list(entry.streams):
            if sink.epoch < epoch and not sink.closed:
                dropped += len(sink.channel.purge(lambda _chunk: True))
                sink.fail(StaleEpochError(session_id, sink.epoch, epoch))
        kept: deque[_Work] = deque()
        for work in entry.pending:
            if work.epoch < epoch:
                dropped += 1
                work.fail(StaleEpochError(session_id, work.epoch, epoch))
            else:
                kept.append(work)
        self._pending_count -= len(entry.pending) - len(kept)
        entry.pending = kept
        inflight = entry.inflight
        if inflight is not None and inflight.epoch < epoch:
            self._kill_inflight(entry, StaleEpochError(session_id, inflight.epoch, epoch))
        self._m_stale.inc(dropped)
        self._kick()
        return dropped

    # ----------------------------------------------------------------- shutdown

    async def close(self) -> None:
        """Fail pending work, finish the in-flight forward, release every slot, stop the worker."""
        if self._closed:
            return
        self._closed = True
        error = EngineClosedError(f"stage {self.name!r} is shutting down")
        self._fail_pending(error)
        for handle in (self._soon, self._timer):
            if handle is not None:
                handle.cancel()
        self._soon = self._timer = None
        if self._running is not None:  # the forward in flight finishes and fans out
            self._idle = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._idle)
        self._fail_pending(error)  # continuations queued by the last forward
        for slot in list(self.slots):
            try:
                await self.release(slot.session_id, "shutdown")
            except Exception:
                log.exception("slot release failed at shutdown", extra={"stage": self.name})
        if self._owns_worker:
            await self.worker.close()

    # ----------------------------------------------------------------- internals

    def _fail_pending(self, error: BaseException) -> None:
        for entry in self._sessions.values():
            for work in entry.pending:
                work.fail(error)
            entry.pending.clear()
        self._pending_count = 0

    def _enqueue(
        self,
        session_id: str,
        epoch: int,
        payload: Any,
        request_id: str,
        seq: int,
        last: bool,
        future: asyncio.Future | None,
        stream: _Stream | None,
    ) -> None:
        if self._closed:
            raise EngineClosedError(f"stage {self.name!r} is closed")
        entry = self._sessions.get(session_id)
        if entry is None:
            raise SessionNotOpenError(self.name, session_id)
        if epoch < entry.epoch:
            raise StaleEpochError(session_id, epoch, entry.epoch)
        if self._pending_count >= self.max_pending:
            raise QueueFullError(self.name, self.max_pending)
        if epoch > entry.epoch:
            self.bump_epoch(session_id, epoch)
        now = asyncio.get_running_loop().time()
        entry.pending.append(_Work(session_id, epoch, payload, request_id, seq, last, now, future, stream))
        self._pending_count += 1
        self.dispatch.arrived(session_id, now)
        if self._running is None and self.dispatch.run_at_submit(self._view(now)):
            self._dispatch()  # waiting cannot grow the batch: skip the round through the loop
        else:
            self._kick()

    def _kill_inflight(self, entry: _Session, error: BaseException) -> None:
        work = entry.inflight
        if work is None or work.dead:
            return
        work.dead = True
        work.fail(error)

    def _cancel_stream(self, sink: _Stream, error: BaseException | None) -> None:
        """The consumer stopped reading (closed early, stalled or failed): drop the stream's work."""
        error = error or EngineError("stream cancelled by its consumer")
        sink.fail(error)
        entry = self._sessions.get(sink.session_id)
        if entry is None:
            return
        before = len(entry.pending)
        entry.pending = deque(w for w in entry.pending if w.stream is not sink)
        self._pending_count -= before - len(entry.pending)
        if entry.inflight is not None and entry.inflight.stream is sink:
            self._kill_inflight(entry, error)
        self._kick()

    def _ready(self) -> tuple[list[_Work], list[str]]:
        """Heads of the sessions' queues that can run now (oldest first) and sessions with nothing pending."""
        ready, idle = [], []
        for session_id, entry in self._sessions.items():
            if not entry.pending:
                idle.append(session_id)
                continue
            head = entry.pending[0]
            if head.stream is None or head.stream.channel.has_room():
                ready.append(head)
        ready.sort(key=lambda w: w.arrived)
        return ready, idle

    def _view(
        self, now: float, ready: list[_Work] | None = None, idle: Sequence[str] | None = None
    ) -> SessionView:
        """What the policy decides on; at a submit (``ready`` None) only the counts matter.
        ``idle``: the sessions with nothing pending, when the caller has them (``_ready``)."""
        if idle is None:
            idle = [session_id for session_id, entry in self._sessions.items() if not entry.pending]
        idle = tuple(idle)
        if ready is None:
            return SessionView(now, len(self._sessions) - len(idle), len(idle), None, self.max_batch, idle)
        oldest = ready[0].arrived if ready else None
        return SessionView(now, len(ready), len(idle), oldest, self.max_batch, idle)

    def _kick(self) -> None:
        """Ask for a scheduling decision at the next loop iteration (at most one queued)."""
        if self._soon is None and self._running is None and not self._closed:
            self._soon = asyncio.get_running_loop().call_soon(self._dispatch)

    def _dispatch(self) -> None:
        """Decide: start a forward now, wait until the policy's time, or do nothing."""
        for handle in (self._soon, self._timer):
            if handle is not None:
                handle.cancel()  # superseded by this decision (cancelling the running one is a no-op)
        self._soon = self._timer = None
        policy = self.dispatch
        if self._running is not None or self._closed:
            return  # the forward's completion decides again
        if not self._pending_count and (policy.silence is None or not self._sessions):
            return
        ready, idle = self._ready()
        if not ready and policy.silence is None:
            return
        loop = asyncio.get_running_loop()
        decision = policy.decide(self._view(loop.time(), ready, idle))
        if decision is not None:
            self._timer = loop.call_at(decision, self._dispatch)
            return
        batch = self._take(ready[: self.max_batch])
        if policy.silence is not None and idle:
            # Beyond max_batch, silent sessions take turns (a rotating start), so none starves.
            room = self.max_batch - len(batch)
            start = self._silence_turn % len(idle)
            self._silence_turn += room
            for session_id in (idle[start:] + idle[:start])[:room]:
                batch.append(self._silent_work(session_id, loop.time()))
        if not batch:
            self._kick_later()
            return
        items = []
        for work in batch:
            slot = self._sessions[work.session_id].slot
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
        self._m_batch.observe(len(batch))
        self._running = batch
        try:
            self.worker.post(self._forward, (items,), self._finished)
        except BaseException as exc:  # the worker itself is closed
            self._finished((None, exc, 0.0), None)

    def _kick_later(self) -> None:
        """A frame clock with every session backpressured: decide again at the next period."""
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_at(
                self.dispatch.decide(self._view(asyncio.get_running_loop().time(), [])) or 0.0, self._dispatch
            )

    def _silent_work(self, session_id: str, now: float) -> _Work:
        entry = self._sessions[session_id]
        work = _Work(session_id, entry.epoch, self.dispatch.silence(session_id), "", 0, True, now, None, None)
        work.silent = True
        entry.inflight = work
        return work

    def _take(self, batch: list[_Work]) -> list[_Work]:
        for work in batch:
            entry = self._sessions[work.session_id]
            entry.pending.popleft()
            entry.inflight = work
        self._pending_count -= len(batch)
        return batch

    def _forward(self, items: list[StageItem]) -> tuple[list[Any] | None, BaseException | None, float]:
        """Runs on the worker thread: one forward, bisected on failure (batch isolation)."""
        start = time.perf_counter()
        try:
            outputs = self._isolated(items)
            return outputs, None, time.perf_counter() - start
        except Exception as exc:  # only a wrong output count gets here
            return None, exc, time.perf_counter() - start

    def _isolated(self, items: list[StageItem]) -> list[Any]:
        """``stage.forward(items)``; if it raises, the halves again, so only failing items fail."""
        try:
            outputs = list(self.stage.forward(items))
        except Exception as exc:
            if len(items) == 1:
                return [_BatchFailure(exc)]
            self._bisections += 1
            half = len(items) // 2
            return self._isolated(items[:half]) + self._isolated(items[half:])
        if len(outputs) != len(items):
            raise EngineError(f"forward returned {len(outputs)} outputs for {len(items)} items")
        return outputs

    def _finished(
        self,
        outcome: tuple[Sequence[Any] | None, BaseException | None, float] | None,
        failed: BaseException | None,
    ) -> None:
        """On the loop, once the worker ran :meth:`_forward`: fan out, then decide the next batch."""
        batch, idle = self._running, self._idle
        assert batch is not None
        outputs, error, seconds = outcome if failed is None else (None, failed, 0.0)
        self._m_forward.observe(seconds)
        try:
            self._fan_out(batch, outputs, error)
        except Exception:  # a bug here must not kill the engine for every session
            log.exception("engine fan-out failed", extra={"stage": self.name})
            for work in batch:
                work.fail(EngineError("internal engine error"))
        finally:
            self._running = self._idle = None
            if idle is not None:
                idle.set_result(None)
        self.dispatch.completed([work.session_id for work in batch], asyncio.get_running_loop().time())
        self._dispatch()

    def _fan_out(
        self, batch: list[_Work], outputs: Sequence[Any] | None, error: BaseException | None
    ) -> None:
        now = asyncio.get_running_loop().time()
        if error is not None:
            self._m_batch_fail.inc(len(batch))
            log.error(
                "stage forward failed for a batch of %d: %r", len(batch), error, extra={"stage": self.name}
            )
        for i, work in enumerate(batch):
            entry = self._sessions.get(work.session_id)
            if entry is not None and entry.inflight is work:
                entry.inflight = None
            if work.dead:
                if entry is not None and work.epoch < entry.epoch:
                    self._m_stale.inc()  # the in-flight chunk of an older epoch is dropped here
                continue
            if entry is None:  # released between dispatch and now (already failed by release)
                continue
            if error is not None:
                work.fail(StageBatchError(self.name, len(batch), error))
                continue
            out = outputs[i]
            if isinstance(out, _BatchFailure):
                self._m_batch_fail.inc()
                log.warning("stage forward raised for one item: %r", out.error, extra={"stage": self.name})
                work.fail(StageBatchError(self.name, 1, out.error))
                continue
            if isinstance(out, BaseException):
                self._m_item_fail.inc()
                work.fail(StageItemError(self.name, work.session_id, out))
                continue
            self._m_item.observe(now - work.arrived)
            if work.silent:
                self.dispatch.on_silence_output(work.session_id, out)
            elif work.stream is not None:
                if not work.stream.closed:
                    work.stream.channel.put_nowait(
                        Chunk(work.session_id, work.epoch, work.stream.next_seq, out, True)
                    )
                    work.stream.next_seq += 1
            elif not work.future.done():
                work.future.set_result(out)

    def _update_slot_gauges(self) -> None:
        self._m_slots.set(len(self.slots))
        self._m_bytes.set(self.slots.bytes_in_use)


@dataclass(frozen=True, slots=True)
class _BatchFailure:
    """The forward raised for this item alone (after bisecting)."""

    error: BaseException
