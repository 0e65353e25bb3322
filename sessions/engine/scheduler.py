"""The batched engine's scheduler: which queued items run next, and when.

One forward is in flight per engine, and decisions are taken only while none runs, so work that
arrives during a forward simply joins the next batch. A batch holds at most ``max_batch`` items
and at most one item per session, oldest first. *When* it runs is the engine's
:class:`~sessions.engine.dispatch.DispatchPolicy` (``Coalescing``, ``ArrivalAware`` or
``FrameClock``); the scheduler reports to it every queued item (``arrived``), every batch whose
outputs went out (``completed``) and every released session (``forget``). Under a frame clock,
sessions with nothing pending step on the policy's silence input; beyond ``max_batch`` they take
turns (a rotating start), so none starves.

Waiting allocates nothing. A streaming item whose ``block`` output channel is full is not ready
(backpressure) and waits without holding up other sessions.

Scheduling is callback-driven, with no scheduler task: any change that can make work
dispatchable (an item queued, a session opened or released, an epoch bump, room in a stream's
channel) asks for one decision at the next loop iteration (:meth:`Scheduler.kick`: ``call_soon``,
so a burst of submits in one iteration is decided together), a coalescing wait is one ``call_at``
timer, and the engine's completion callback decides the next batch directly
(:meth:`Scheduler.done`). An item that completes the policy's ``run_at_submit`` rule while no
forward runs (the lone robot's tick) is launched at once, inside :meth:`Scheduler.add`.

The scheduler owns each open session's *work* (:class:`SessionQueue`: queued items, the one in
flight, its live streams) and the queue count; the engine owns the registry of open sessions and
their epochs, the slot table their slots. Everything runs on the event loop thread.
"""

from __future__ import annotations

import asyncio
import weakref
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sessions.engine.channels import Channel
from sessions.engine.dispatch import DispatchPolicy, SessionView
from sessions.engine.errors import StaleEpochError
from sessions.engine.slots import Slot


@dataclass(eq=False)
class StreamSink:
    """The engine side of one chunk stream: where its item's output goes."""

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
class Work:
    """One queued item and where its output goes: a future (``submit``) or a stream."""

    session_id: str
    epoch: int
    payload: Any
    request_id: str
    seq: int
    last: bool
    arrived: float
    future: asyncio.Future | None = None
    stream: StreamSink | None = None
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
class SessionQueue:
    """One open session of a batched engine: its slot and epoch (the engine's) and its work (the
    scheduler's): queued items oldest first, the item in flight, its live streams."""

    slot: Slot
    epoch: int = 0
    pending: deque[Work] = field(default_factory=deque)
    inflight: Work | None = None
    streams: weakref.WeakSet[StreamSink] = field(default_factory=weakref.WeakSet)


class Scheduler:
    """Decides what the engine's next batch holds and when it runs (see the module docstring).

    ``sessions`` is the engine's registry of open sessions: the scheduler reads it and changes
    only their work, never which sessions are open. ``launch(batch)`` starts the forward of a batch
    the scheduler took (never while one runs); the engine calls :meth:`done` once that batch's
    outputs went out.
    """

    def __init__(
        self,
        sessions: Mapping[str, SessionQueue],
        policy: DispatchPolicy,
        max_batch: int,
        launch: Callable[[list[Work]], None],
    ) -> None:
        self.sessions = sessions
        self.policy = policy
        self.max_batch = max_batch
        self.pending = 0  # items queued across sessions (``engine_queue_depth``)
        self.running: list[Work] | None = None  # the batch of the forward in flight
        self._launch = launch
        self._soon: asyncio.Handle | None = None  # a decision queued for the next iteration
        self._timer: asyncio.TimerHandle | None = None  # the policy's wait
        self._silence_turn = 0  # where the next frame-clock step starts among silent sessions
        self._idle: asyncio.Future | None = None  # made by stop(): resolved once the batch is out
        self._stopped = False

    # ----------------------------------------------------------------- work in and out

    def add(self, entry: SessionQueue, work: Work) -> None:
        """Queue ``work`` (admitted by the engine); launch at once when waiting cannot grow the batch."""
        entry.pending.append(work)
        self.pending += 1
        self.policy.arrived(work.session_id, work.arrived)
        if self.running is None and self.policy.run_at_submit(self._view(work.arrived)):
            self.decide()  # skip the round through the loop
        else:
            self.kick()

    def land(self, batch: list[Work]) -> int:
        """The batch's forward returned: its sessions have nothing in flight now. Returns how many
        of its items were dropped in flight for an older epoch."""
        stale = 0
        for work in batch:
            entry = self.sessions.get(work.session_id)
            if entry is None:
                continue
            if entry.inflight is work:
                entry.inflight = None
            if work.dead and work.epoch < entry.epoch:
                stale += 1
        return stale

    def done(self, batch: list[Work]) -> None:
        """The running batch's outputs went out: tell the policy and decide the next batch."""
        idle = self._idle
        self.running = self._idle = None
        if idle is not None:
            idle.set_result(None)
        self.policy.completed([work.session_id for work in batch], asyncio.get_running_loop().time())
        self.decide()

    # ----------------------------------------------------------------- dropping work

    def drop_session(self, session_id: str, entry: SessionQueue, error: BaseException) -> None:
        """The session was released: fail its queued, streaming and in-flight work with ``error``."""
        for work in entry.pending:
            work.fail(error)
        for sink in list(entry.streams):
            sink.fail(error)
        self.pending -= len(entry.pending)
        entry.pending.clear()
        _kill_inflight(entry, error)
        self.policy.forget(session_id)
        self.kick()

    def drop_older(self, session_id: str, entry: SessionQueue, epoch: int) -> int:
        """``epoch`` became current: fail the session's work of older epochs (``StaleEpochError``)
        and drop its buffered chunks; returns how many items and chunks were dropped."""
        dropped = 0
        for sink in list(entry.streams):
            if sink.epoch < epoch and not sink.closed:
                dropped += len(sink.channel.purge(lambda _chunk: True))
                sink.fail(StaleEpochError(session_id, sink.epoch, epoch))
        kept: deque[Work] = deque()
        for work in entry.pending:
            if work.epoch < epoch:
                dropped += 1
                work.fail(StaleEpochError(session_id, work.epoch, epoch))
            else:
                kept.append(work)
        self.pending -= len(entry.pending) - len(kept)
        entry.pending = kept
        inflight = entry.inflight
        if inflight is not None and inflight.epoch < epoch:
            _kill_inflight(entry, StaleEpochError(session_id, inflight.epoch, epoch))
        self.kick()
        return dropped

    def cancel_stream(self, sink: StreamSink, error: BaseException) -> None:
        """The stream's consumer stopped reading: drop the stream's queued and in-flight work."""
        sink.fail(error)
        entry = self.sessions.get(sink.session_id)
        if entry is None:
            return
        before = len(entry.pending)
        entry.pending = deque(w for w in entry.pending if w.stream is not sink)
        self.pending -= before - len(entry.pending)
        if entry.inflight is not None and entry.inflight.stream is sink:
            _kill_inflight(entry, error)
        self.kick()

    async def stop(self, error: BaseException) -> None:
        """Decide nothing more: fail queued work, let the running forward finish and fan out,
        then fail what its completions queued."""
        self._stopped = True
        self._fail_pending(error)
        for handle in (self._soon, self._timer):
            if handle is not None:
                handle.cancel()
        self._soon = self._timer = None
        if self.running is not None:
            self._idle = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._idle)
        self._fail_pending(error)

    def _fail_pending(self, error: BaseException) -> None:
        for entry in self.sessions.values():
            for work in entry.pending:
                work.fail(error)
            entry.pending.clear()
        self.pending = 0

    # ----------------------------------------------------------------- decisions

    def kick(self) -> None:
        """Ask for a decision at the next loop iteration (at most one queued)."""
        if self._soon is None and self.running is None and not self._stopped:
            self._soon = asyncio.get_running_loop().call_soon(self.decide)

    def decide(self) -> None:
        """Launch a batch now, wait until the policy's time, or do nothing."""
        for handle in (self._soon, self._timer):
            if handle is not None:
                handle.cancel()  # superseded by this decision (cancelling the running one is a no-op)
        self._soon = self._timer = None
        policy = self.policy
        if self.running is not None or self._stopped:
            return  # the forward's completion decides again
        if not self.pending and (policy.silence is None or not self.sessions):
            return
        ready, idle = self._ready()
        if not ready and policy.silence is None:
            return
        loop = asyncio.get_running_loop()
        decision = policy.decide(self._view(loop.time(), ready, idle))
        if decision is not None:
            self._timer = loop.call_at(decision, self.decide)
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
            self._decide_later()
            return
        self.running = batch
        self._launch(batch)

    def _ready(self) -> tuple[list[Work], list[str]]:
        """Heads of the sessions' queues that can run now (oldest first) and sessions with nothing pending."""
        ready, idle = [], []
        for session_id, entry in self.sessions.items():
            if not entry.pending:
                idle.append(session_id)
                continue
            head = entry.pending[0]
            if head.stream is None or head.stream.channel.has_room():
                ready.append(head)
        ready.sort(key=lambda w: w.arrived)
        return ready, idle

    def _view(
        self, now: float, ready: list[Work] | None = None, idle: Sequence[str] | None = None
    ) -> SessionView:
        """What the policy decides on; at a submit (``ready`` None) only the counts matter.
        ``idle``: the sessions with nothing pending, when the caller has them (``_ready``)."""
        if idle is None:
            idle = [session_id for session_id, entry in self.sessions.items() if not entry.pending]
        idle = tuple(idle)
        if ready is None:
            return SessionView(now, len(self.sessions) - len(idle), len(idle), None, self.max_batch, idle)
        oldest = ready[0].arrived if ready else None
        return SessionView(now, len(ready), len(idle), oldest, self.max_batch, idle)

    def _decide_later(self) -> None:
        """A frame clock with every session backpressured: decide again at the next period."""
        if self._timer is None:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_at(self.policy.decide(self._view(loop.time(), [])) or 0.0, self.decide)

    def _silent_work(self, session_id: str, now: float) -> Work:
        entry = self.sessions[session_id]
        work = Work(session_id, entry.epoch, self.policy.silence(session_id), "", 0, True, now)
        work.silent = True
        entry.inflight = work
        return work

    def _take(self, batch: list[Work]) -> list[Work]:
        for work in batch:
            entry = self.sessions[work.session_id]
            entry.pending.popleft()
            entry.inflight = work
        self.pending -= len(batch)
        return batch


def _kill_inflight(entry: SessionQueue, error: BaseException) -> None:
    work = entry.inflight
    if work is None or work.dead:
        return
    work.dead = True
    work.fail(error)
