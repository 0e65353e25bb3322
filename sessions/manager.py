"""SessionManager: create / get / reset / close / disconnect, admission, eviction, tombstones.

Contract (architecture §5; seed reference §2.6-2.7, §2.10; duplex manager, surfaces §3.3):

- One manager per session kind. ``await create(session_id=None)`` admits a new session (a
  server-allocated id unless one is given). An id that exists, tombstones included, raises
  :class:`SessionExistsError`. Every live entry holds one admission slot until it is removed:
  ACTIVE, FAILED, CLOSING and CLEANUP_FAILED tombstones (a failed cleanup deliberately keeps
  its slot, like vllm-omni's duplex manager).
- Beyond ``capacity``: a detached session (below) is the first to go (closed with reason
  ``evicted``, the oldest detached first); then, with ``evict_idle_lru``, the
  least-recently-active idle session (no tick in flight, idle for at least ``evict_min_idle_s``)
  is closed with reason ``evicted``; then
  ``over_capacity="reject"`` raises :class:`SessionLimitError` (code
  ``session_limit_reached``, ``limit``), ``"queue"`` waits FIFO (at most ``max_queued``, at most
  ``queue_timeout_s``) calling ``on_queue_position(position)`` (1-based) whenever the position
  changes.
- ``close(id, reason)`` is idempotent (an unknown id is already closed) and is the one release
  path for close, disconnect, expiry, eviction and shutdown. It returns ``CLOSED`` or raises
  :class:`CleanupFailedError` leaving a CLEANUP_FAILED tombstone that blocks the id until a
  retried close succeeds; a re-created id is a new ``Session`` object. ``disconnect(id)`` is
  the same path with reason ``disconnect`` and never raises for a failed cleanup.
- Ownership and resume (the manager is the one registry of a kind's sessions): every session
  has one ``owner``, the connection whose runner mutates it (``attach(session, owner)``; a
  resume attaches it to the new connection, whose old owner must then stop touching it).
  ``disconnect(id, owner=, dropped=)`` counts only the owner's end. A socket that dropped
  without a goodbye (``dropped``) of a resumable kind (``resume_grace_s`` > 0) *detaches* the
  session instead of closing it: it stays, with its slot, ownerless, until ``attach`` (a resume)
  or the grace timer, which closes it with reason ``grace_expired``; while a create waits for a
  slot it is closed at once (``evicted``). ``close_soon(id, reason)`` closes from a callback that
  cannot await (the manager tracks the task); ``close_reason(id)`` remembers why each of the
  last :data:`REMEMBERED_CLOSES` sessions closed (a late resume's answer).
- ``reset(id)`` resets a session (rejected for CLEANUP_FAILED and closed sessions).
- ``start()`` starts the reaper (idle timeout, maximum lifetime with a warning hook, retry of
  tombstones); ``shutdown()`` refuses new sessions, fails queued waiters and closes every
  session with reason ``shutdown``.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from prometheus_client import CollectorRegistry

from sessions.capacity import CapacityPlan
from sessions.errors import (
    CleanupFailedError,
    SessionExistsError,
    SessionLimitError,
    ShuttingDownError,
    UnknownSessionError,
)
from sessions.identities import RequestIdFactory, SessionIdFactory, default_request_id, new_session_id
from sessions.lifecycle import LifecycleBackend, NullLifecycle, ReleaseReason
from sessions.metrics import RuntimeMetrics
from sessions.reaper import ExpiryPolicy, Reaper
from sessions.reducer import ControlReducer
from sessions.session import Session, SessionLimits, SessionStatus
from sessions.tick import TickExecutor

log = logging.getLogger("sessions.manager")

REMEMBERED_CLOSES = 1024  # closed session ids whose reason ``close_reason`` still answers

QueuePositionFn = Callable[[int], None]


@dataclass(frozen=True)
class AdmissionPolicy:
    """What happens beyond capacity (``runtime.*`` in the deploy config)."""

    over_capacity: Literal["reject", "queue"] = "reject"
    max_queued: int = 16
    queue_timeout_s: float = 30.0
    evict_idle_lru: bool = False
    evict_min_idle_s: float = 0.0


@dataclass(frozen=True)
class SessionInfo:
    session_id: str
    kind: str
    status: str
    chunk_index: int
    epoch: int
    pending_events: int
    busy: bool
    age_s: float
    idle_s: float
    close_reason: str | None
    failure: str | None


@dataclass(frozen=True)
class ManagerStats:
    kind: str
    capacity: int
    occupied: int
    queued: int
    by_status: dict[str, int]
    tombstones: int
    created: int
    closed: int
    evicted: int
    expired: int
    rejected: int


@dataclass
class _Waiter:
    future: asyncio.Future
    on_position: QueuePositionFn | None
    position: int = 0


class SessionManager:
    def __init__(
        self,
        kind: str,
        *,
        executor: TickExecutor,
        capacity: int | CapacityPlan,
        lifecycle: LifecycleBackend | None = None,
        admission: AdmissionPolicy | None = None,
        expiry: ExpiryPolicy | None = None,
        limits: SessionLimits | None = None,
        reducer_factory: Callable[[], ControlReducer] | None = None,
        request_id_factory: RequestIdFactory = default_request_id,
        session_id_factory: SessionIdFactory = new_session_id,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.monotonic,
        resume_grace_s: float = 0.0,
        on_release: Callable[[str], None] | None = None,
    ) -> None:
        self.kind = kind
        #: Called with a session's id once it is released for good (after its close; the
        #: replica's checkpointer drops its resumable state).
        self.on_release = on_release
        if not resume_grace_s >= 0:
            raise ValueError(f"resume_grace_s must be >= 0, got {resume_grace_s!r}")
        self.resume_grace_s = resume_grace_s
        self.plan = capacity if isinstance(capacity, CapacityPlan) else None
        self.capacity = capacity.capacity if isinstance(capacity, CapacityPlan) else capacity
        if self.capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {self.capacity}")
        self._executor = executor
        self._lifecycle = lifecycle if lifecycle is not None else NullLifecycle()
        self.admission = admission if admission is not None else AdmissionPolicy()
        self.expiry = expiry if expiry is not None else ExpiryPolicy()
        self._limits = limits if limits is not None else SessionLimits()
        self._reducer_factory = reducer_factory
        self._request_id_factory = request_id_factory
        self._session_id_factory = session_id_factory
        self._clock = clock
        self._sessions: dict[str, Session] = {}
        self._creating: set[str] = set()
        self._reserved = 0
        self._queue: collections.deque[_Waiter] = collections.deque()
        self._status_counts: collections.Counter[SessionStatus] = collections.Counter()
        self._counts = collections.Counter[str]()
        self._shutting_down = False
        self._reaper: Reaper | None = None
        self._graces: dict[str, asyncio.TimerHandle] = {}  # detached session -> its grace timer
        self._closing: dict[str, asyncio.Task] = {}  # close_soon's tasks, by session id
        self._closed_reasons: collections.OrderedDict[str, str] = collections.OrderedDict()
        self._metrics = RuntimeMetrics.for_registry(registry) if registry is not None else None
        self._ticks_committed = None  # the per-tick counter child, looked up once
        if self._metrics is not None:
            self._metrics.capacity.labels(kind).set(self.capacity)
            self._ticks_committed = self._metrics.ticks.labels(kind, "committed")

    # -- lookup ---------------------------------------------------------------------------
    def get(self, session_id: str) -> Session:
        session = self._sessions.get(session_id)
        if session is None:
            raise UnknownSessionError(f"session {session_id} does not exist", session_id=session_id)
        return session

    def find(self, session_id: str) -> Session | None:
        return self._sessions.get(session_id)

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._sessions

    def list_sessions(self) -> list[Session]:
        return list(self._sessions.values())

    @property
    def occupied(self) -> int:
        """Admission slots in use: live entries (tombstones included) plus reservations."""
        return len(self._sessions) + self._reserved

    @property
    def queued(self) -> int:
        return len(self._queue)

    def tombstones(self) -> list[str]:
        return [s.session_id for s in self._sessions.values() if s.status is SessionStatus.CLEANUP_FAILED]

    # -- create and admission -------------------------------------------------------------
    async def create(
        self,
        session_id: str | None = None,
        *,
        executor: TickExecutor | None = None,
        reducer: ControlReducer | None = None,
        on_queue_position: QueuePositionFn | None = None,
    ) -> Session:
        """Admit and create a session (see the module contract)."""
        if self._shutting_down:
            raise ShuttingDownError(f"{self.kind} sessions are shutting down")
        sid = session_id if session_id is not None else self._session_id_factory(self.kind)
        if not isinstance(sid, str) or not sid:
            raise ValueError(f"session_id must be a non-empty string, got {sid!r}")
        self._check_new_id(sid)
        self._creating.add(sid)
        try:
            await self._admit(on_queue_position)
        finally:
            self._creating.discard(sid)
        try:
            self._check_new_id(sid)
            if self._shutting_down:
                raise ShuttingDownError(f"{self.kind} sessions are shutting down")
            session = Session(
                sid,
                kind=self.kind,
                executor=executor if executor is not None else self._executor,
                lifecycle=self._lifecycle,
                reducer=reducer if reducer is not None else self._new_reducer(),
                limits=self._limits,
                request_id_factory=self._request_id_factory,
                clock=self._clock,
                on_status=self._status_changed,
                on_tick=self._tick_finished,
            )
        except BaseException:
            self._reserved -= 1
            self._slot_freed()
            raise
        self._reserved -= 1
        self._sessions[sid] = session
        self._count_status(session.status, +1)
        self._counts["created"] += 1
        return session

    def _new_reducer(self) -> ControlReducer | None:
        return self._reducer_factory() if self._reducer_factory is not None else None

    def _check_new_id(self, sid: str) -> None:
        existing = self._sessions.get(sid)
        if existing is not None or sid in self._creating:
            status = existing.status.value if existing is not None else "being created"
            raise SessionExistsError(f"session {sid} already exists ({status})", session_id=sid)

    def _free_slots(self) -> int:
        return self.capacity - self.occupied

    async def _admit(self, on_position: QueuePositionFn | None) -> None:
        """Return holding one reserved slot (``self._reserved`` counts it) or raise."""
        while self._free_slots() <= 0 and not self._queue:  # grace-held slots go first
            victim = self._oldest_detached()
            if victim is None:
                break
            await self._evict(victim)
        if self._free_slots() > 0 and not self._queue:
            self._reserved += 1
            return
        if self.admission.evict_idle_lru and not self._queue:
            while self._free_slots() <= 0:
                victim = self.lru_idle_session()
                if victim is None:
                    break
                await self._evict(victim)
            if self._free_slots() > 0 and not self._queue:
                self._reserved += 1
                return
        if self.admission.over_capacity == "queue":
            await self._wait_in_queue(on_position)
            return
        self._reject("capacity", f"{self.kind} session limit reached ({self.capacity} sessions)")

    def _reject(self, reason: str, message: str) -> None:
        self._counts["rejected"] += 1
        if self._metrics is not None:
            self._metrics.admission_rejections.labels(self.kind, reason).inc()
        raise SessionLimitError(message, limit=self.capacity, reason=reason, queued=len(self._queue))

    async def _wait_in_queue(self, on_position: QueuePositionFn | None) -> None:
        limit = self.admission.max_queued
        if len(self._queue) >= limit:
            self._reject("queue_full", f"{self.kind} session limit reached and {limit} sessions already wait")
        waiter = _Waiter(asyncio.get_running_loop().create_future(), on_position)
        self._queue.append(waiter)
        self._queue_changed()
        started = self._clock()
        try:
            await asyncio.wait_for(waiter.future, self.admission.queue_timeout_s)
        except TimeoutError:
            self._reject(
                "queue_timeout",
                f"{self.kind} session limit reached; no slot freed within "
                f"{self.admission.queue_timeout_s:g} s",
            )
        except asyncio.CancelledError:
            if waiter.future.done() and not waiter.future.cancelled() and waiter.future.exception() is None:
                self._reserved -= 1  # a slot was handed over as we were cancelled: give it back
                self._slot_freed()
            raise
        finally:
            if waiter in self._queue:
                self._queue.remove(waiter)
                self._queue_changed()
            if self._metrics is not None:
                self._metrics.queue_wait.labels(self.kind).observe(self._clock() - started)

    def _queue_changed(self) -> None:
        for position, waiter in enumerate(self._queue, start=1):
            if waiter.position != position:
                waiter.position = position
                if waiter.on_position is not None:
                    waiter.on_position(position)
        if self._metrics is not None:
            self._metrics.queue_depth.labels(self.kind).set(len(self._queue))

    def _slot_freed(self) -> None:
        handed = False
        while self._queue and self._free_slots() > 0:
            waiter = self._queue.popleft()
            if waiter.future.done():
                continue
            self._reserved += 1
            waiter.future.set_result(None)
            handed = True
        if handed:
            self._queue_changed()

    def lru_idle_session(self) -> Session | None:
        """The least-recently-active session that may be evicted now, or ``None``."""
        now = self._clock()
        candidates = [
            s
            for s in self._sessions.values()
            if s.status in (SessionStatus.ACTIVE, SessionStatus.FAILED)
            and not s.busy
            and now - s.last_active_at >= self.admission.evict_min_idle_s
        ]
        return min(candidates, key=lambda s: s.last_active_at, default=None)

    def _oldest_detached(self) -> Session | None:
        detached = [
            s
            for s in self._sessions.values()
            if s.detached_at is not None and s.status in (SessionStatus.ACTIVE, SessionStatus.FAILED)
        ]
        return min(detached, key=lambda s: s.detached_at or 0.0, default=None)

    async def _evict(self, session: Session) -> None:
        self._counts["evicted"] += 1
        if self._metrics is not None:
            self._metrics.evictions.labels(self.kind).inc()
        try:
            await self.close(session.session_id, "evicted")
        except CleanupFailedError as exc:
            log.warning("eviction left a tombstone: %s", exc.message)

    # -- reset and close ------------------------------------------------------------------
    async def reset(self, session_id: str) -> None:
        await self.get(session_id).reset()

    async def close(self, session_id: str, reason: ReleaseReason = "close") -> SessionStatus:
        """Close through the one release path; raises ``CleanupFailedError`` on a tombstone."""
        session = self._sessions.get(session_id)
        if session is None:
            return SessionStatus.CLOSED
        status = await session._close(reason)
        if status is SessionStatus.CLEANUP_FAILED:
            if self._metrics is not None:
                self._metrics.release_failures.labels(self.kind, reason).inc()
            raise CleanupFailedError(
                f"closing session {session_id} failed; it stays a cleanup_failed tombstone until a retry succeeds",
                session_id=session_id,
                reason=reason,
            )
        if self._sessions.get(session_id) is session:
            del self._sessions[session_id]
            self._count_status(session.status, -1)
            self._counts["closed"] += 1
            self._forget_grace(session_id)
            self._closed_reasons[session_id] = session.close_reason or reason
            while len(self._closed_reasons) > REMEMBERED_CLOSES:
                self._closed_reasons.popitem(last=False)
            self._slot_freed()
            if self.on_release is not None:
                self.on_release(session_id)
        return status

    async def disconnect(
        self, session_id: str, *, owner: object | None = None, dropped: bool = False
    ) -> SessionStatus:
        """The transport went away: close with reason ``disconnect`` (a failed cleanup is logged).

        With ``owner``, only the session's owner's end counts (a session a resume attached
        elsewhere is left alone). A ``dropped`` socket (no goodbye) of a resumable kind detaches
        the session for ``resume_grace_s`` instead (see the module contract)."""
        session = self._sessions.get(session_id)
        if session is None:
            return SessionStatus.CLOSED
        if owner is not None and session.owner is not owner:
            return session.status
        if dropped and self.resume_grace_s > 0 and session.status is SessionStatus.ACTIVE:
            self._detach(session)
            return session.status
        try:
            return await self.close(session_id, "disconnect")
        except CleanupFailedError as exc:
            log.error("%s", exc.message)
            return SessionStatus.CLEANUP_FAILED

    # -- ownership, detach and resume ---------------------------------------------------------
    def attach(self, session: Session, owner: object) -> Session:
        """Make ``owner`` (a connection) the session's one owner: a new session's, a detached
        one's (a resume: its grace ends) or another owner's (a takeover)."""
        self._forget_grace(session.session_id)
        session.owner = owner
        session.detached_at = None
        return session

    def _detach(self, session: Session) -> None:
        session.owner = None
        session.detached_at = self._clock()
        sid = session.session_id
        if self._queue:  # a create is waiting for a slot: a grace-held one is the first to go
            self._counts["evicted"] += 1
            if self._metrics is not None:
                self._metrics.evictions.labels(self.kind).inc()
            self.close_soon(sid, "evicted")
            return
        loop = asyncio.get_running_loop()
        self._graces[sid] = loop.call_later(self.resume_grace_s, self.close_soon, sid, "grace_expired")

    def _forget_grace(self, session_id: str) -> None:
        timer = self._graces.pop(session_id, None)
        if timer is not None:
            timer.cancel()

    def close_soon(self, session_id: str, reason: ReleaseReason) -> None:
        """Close from a callback that cannot await (a timer, a frame clock's output hand-off);
        the close runs as a task the manager tracks (shutdown waits for it)."""
        self._forget_grace(session_id)
        if session_id in self._closing:
            return  # one is under way
        task = asyncio.create_task(self._close_logged(session_id, reason), name=f"close-{session_id}")
        self._closing[session_id] = task
        task.add_done_callback(lambda _: self._closing.pop(session_id, None))

    async def _close_logged(self, session_id: str, reason: ReleaseReason) -> None:
        try:
            await self.close(session_id, reason)
        except CleanupFailedError as exc:
            log.warning("%s", exc.message)

    def close_reason(self, session_id: str) -> str | None:
        """Why ``session_id`` closed (one of the last :data:`REMEMBERED_CLOSES`), else None."""
        return self._closed_reasons.get(session_id)

    async def expire(self, session_id: str, reason: Literal["idle", "lifetime"]) -> None:
        """Close a session the reaper found expired (counted as an expiry)."""
        self._counts["expired"] += 1
        if self._metrics is not None:
            self._metrics.expiries.labels(self.kind, reason).inc()
        try:
            await self.close(session_id, reason)
        except CleanupFailedError as exc:
            log.warning("expiry left a tombstone: %s", exc.message)

    # -- lifecycle of the manager ---------------------------------------------------------
    async def start(self) -> None:
        """Start the reaper (a no-op when nothing expires and no interval is set)."""
        if self._reaper is None:
            self._reaper = Reaper(self, self.expiry, clock=self._clock)
            self._reaper.start()

    async def shutdown(self) -> None:
        """Refuse new sessions, fail queued waiters, close every session (reason ``shutdown``)."""
        self._shutting_down = True
        while self._queue:
            waiter = self._queue.popleft()
            if not waiter.future.done():
                waiter.future.set_exception(ShuttingDownError(f"{self.kind} sessions are shutting down"))
        self._queue_changed()
        if self._reaper is not None:
            await self._reaper.stop()
            self._reaper = None
        for sid in list(self._graces):
            self._forget_grace(sid)
        results = await asyncio.gather(
            *(self.close(sid, "shutdown") for sid in list(self._sessions)),
            *self._closing.values(),
            return_exceptions=True,
        )
        for result in results:
            if isinstance(result, BaseException):
                log.error("shutdown close failed: %s", result)

    # -- introspection --------------------------------------------------------------------
    def sessions(self) -> list[SessionInfo]:
        now = self._clock()
        return [
            SessionInfo(
                session_id=s.session_id,
                kind=s.kind,
                status=s.status.value,
                chunk_index=s.chunk_index,
                epoch=s.epoch,
                pending_events=s.pending_event_count,
                busy=s.busy,
                age_s=now - s.created_at,
                idle_s=now - s.last_active_at,
                close_reason=s.close_reason,
                failure=s.failure,
            )
            for s in self._sessions.values()
        ]

    def stats(self) -> ManagerStats:
        return ManagerStats(
            kind=self.kind,
            capacity=self.capacity,
            occupied=self.occupied,
            queued=len(self._queue),
            by_status={status.value: n for status, n in self._status_counts.items() if n},
            tombstones=self._status_counts[SessionStatus.CLEANUP_FAILED],
            created=self._counts["created"],
            closed=self._counts["closed"],
            evicted=self._counts["evicted"],
            expired=self._counts["expired"],
            rejected=self._counts["rejected"],
        )

    # -- observers ------------------------------------------------------------------------
    def _count_status(self, status: SessionStatus, delta: int) -> None:
        self._status_counts[status] += delta
        if self._metrics is not None:
            self._metrics.sessions.labels(self.kind, status.value).inc(delta)

    def _status_changed(self, session: Session, old: SessionStatus, new: SessionStatus) -> None:
        if self._sessions.get(session.session_id) is session:
            self._count_status(old, -1)
            self._count_status(new, +1)

    def _tick_finished(self, session: Session, outcome: str, code: str | None) -> None:
        if outcome == "committed" and self._ticks_committed is not None:
            self._ticks_committed.inc()
        elif self._metrics is not None:
            self._metrics.ticks.labels(self.kind, outcome).inc()
            if code is not None and outcome == "failed":
                self._metrics.failures.labels(self.kind, code).inc()
