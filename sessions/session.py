"""One session: its state machine, event intake and transactional ticks.

States (architecture §5; vllm-omni seed reference §2.7)::

    ACTIVE --tick/commit failure--> FAILED --reset--> ACTIVE
    ACTIVE | FAILED | CLEANUP_FAILED --close--> CLOSING --release ok--> CLOSED
                                               CLOSING --release fails--> CLEANUP_FAILED

Contract:

- ``accept_event(event)`` (ACTIVE only) returns ``ACCEPTED`` or ``DUPLICATE``. Duplicates are
  recognised before any other check, while pending and after application (also after reset).
  An id at or below the floor (the highest event id already snapshotted, in-flight ticks
  included) raises :class:`StaleEventError`; a full queue raises :class:`EventQueueFullError`.
- ``await next_tick(payload)`` runs one tick. It belongs to the epoch current when
  ``next_tick`` is *called* (the session's owner calls it in its runner; the awaiting may start
  later, in a child task): an interrupt, reset or close in between drops it unstarted
  (:class:`TickSupersededError`). One tick runs at a time: a tick started while another (or a
  reset) is in flight is refused with :class:`TickInFlightError` (transient; the session goes
  on). The tick snapshots the pending events
  (sorted by id), the sticky prompt (newest event's prompt wins) and the reducer's prepared
  controls, runs the snapshot through the executor, requires ``result.metadata ==
  snapshot.metadata`` and then commits in one synchronous step (reducer commit, pop applied
  events, keep prompt/controls, ``chunk_index += 1``), so a cancellation cannot half-commit.
  Any failure (reducer prepare, executor, metadata mismatch, reducer commit) moves the session
  to FAILED, bumps ``epoch``, releases worker state with reason ``failed``, leaves
  ``chunk_index`` and the pending events untouched and raises a :class:`TickFailedError`.
  A tick cancelled by its caller also fails the session (its worker state is released on the
  next reset or close). A reset or close during a tick drops its result
  (:class:`TickSupersededError`). The executor runs in the caller's task (no task per tick);
  reset and close cut it short by cancelling that task and withdraw their cancel request before
  the caller sees the error, so only the caller's own cancels surface as ``CancelledError``.
- ``stream_tick(payload)`` is the streaming form (an async iterator; voice responses): the
  executor's ``stream(snapshot)`` chunks come out as :class:`~sessions.tick.TickChunk` (the tick's
  metadata, a ``seq`` from 0, the tick's ``epoch``, the value); the tick commits after the last
  chunk, exactly as ``next_tick`` commits its one result. A reset, close, interrupt or failure
  while it streams raises :class:`TickSupersededError` from the iterator and commits nothing.
- ``interrupt()`` is the one call of a barge-in or a client's cancel: it bumps ``epoch``, cuts
  the tick in flight and fences the executor's stage runner (its work of older epochs is dropped
  and aborted). Output queued with an older epoch is never sent (the connection's outbound queue
  reads this epoch). Nothing else changes.
- ``submit(runner, payload)`` is side work of the session outside its ticks (the voice kind's
  VAD and ASR): the payload through a stage runner under the session's id and current epoch.
- A :class:`~sessions.errors.TransientError` from the executor (a full engine queue) is raised
  as is and does not fail the session: the work was refused before it started.
- ``await reset()`` (ACTIVE or FAILED): bump ``epoch``, cancel an in-flight tick, discard
  pending events (not replayed; their ids stay duplicate), clear prompt and controls, reset the
  reducer, restart at chunk 0, release worker state with reason
  ``reset``. Old event ids stay duplicate or stale.
- ``_close(reason)`` is the manager's release path (never called by kinds directly).

Only one task owns a session (``owner``: the connection whose runner it is; see
``SessionManager.attach``); state is mutated in synchronous sections between awaits, so no lock
guards it. ``kind_state`` holds what a kind keeps per session beyond its socket (the duplex
kind's protocol state), owned the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from sessions.errors import (
    ChunkMetadataError,
    CleanupFailedError,
    EventQueueFullError,
    InvalidEventError,
    ReducerCommitError,
    ReleaseFailedError,
    SessionClosedError,
    SessionFailedError,
    StaleEventError,
    TickFailedError,
    TickInFlightError,
    TickSupersededError,
    TransientError,
)
from sessions.events import ControlInput, SeenEventIds, SessionEvent
from sessions.identities import RequestIdFactory, default_request_id
from sessions.lifecycle import LifecycleBackend, ReleaseReason
from sessions.log_context import session_context
from sessions.reducer import ControlReducer, LatestWinsReducer, PreparedControls
from sessions.tick import TickChunk, TickExecutor, TickResult, TickSnapshot

if TYPE_CHECKING:
    from sessions.engine.protocol import StageRunner

log = logging.getLogger("sessions.session")


class SessionStatus(enum.StrEnum):
    ACTIVE = "active"
    FAILED = "failed"
    CLOSING = "closing"
    CLOSED = "closed"
    CLEANUP_FAILED = "cleanup_failed"


class EventAcceptance(enum.StrEnum):
    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"


@dataclass(frozen=True)
class SessionLimits:
    """Per-session bounds (configured from ``runtime.*`` in the deploy config)."""

    max_pending_events: int = 64
    release_timeout_s: float = 30.0
    max_event_id_ranges: int = 1024


StatusListener = Callable[["Session", SessionStatus, SessionStatus], None]
#: ``(session, outcome, error_code)``; outcome is committed, failed, superseded or cancelled.
TickListener = Callable[["Session", str, str | None], None]


class Session:
    """A resident session of one kind; created and closed only through ``SessionManager``."""

    def __init__(
        self,
        session_id: str,
        *,
        kind: str,
        executor: TickExecutor,
        lifecycle: LifecycleBackend,
        reducer: ControlReducer | None = None,
        limits: SessionLimits | None = None,
        request_id_factory: RequestIdFactory = default_request_id,
        clock: Callable[[], float] = time.monotonic,
        on_status: StatusListener | None = None,
        on_tick: TickListener | None = None,
    ) -> None:
        self.session_id = session_id
        self.kind = kind
        self._executor = executor
        self._lifecycle = lifecycle
        self._reducer: ControlReducer = reducer if reducer is not None else LatestWinsReducer()
        self._limits = limits = limits if limits is not None else SessionLimits()
        self._request_id_factory = request_id_factory
        self._clock = clock
        self._on_status = on_status
        self._on_tick = on_tick
        self._status = SessionStatus.ACTIVE
        self._epoch = 0
        self._chunk_index = 0
        self._floor = -1
        self._seen = SeenEventIds(max_ranges=limits.max_event_id_ranges)
        self._pending: dict[int, SessionEvent] = {}
        self._prompt: str | None = None
        self._controls: dict[str, ControlInput] = {}
        self._ticking = False  # a tick (or a reset) runs
        self._tick_end: asyncio.Future | None = None  # a reset waiting for the tick it cut to end
        self._tick_task: asyncio.Task | None = None  # the task awaiting the executor, while it does
        self._cutting = False  # reset/close cancelled that task; the tick undoes it (superseded)
        self._tick_done: asyncio.Future | None = None  # a close waiting for the executor call to end
        self._ended = asyncio.Event()
        self._close_done: asyncio.Future | None = None
        self.close_reason: str | None = None
        self.failure: str | None = None
        self.created_at = clock()
        self.last_active_at = self.created_at
        self.ticks_committed = 0
        self.lifetime_warned = False
        #: Called once with the seconds left before the maximum lifetime closes the session.
        self.on_lifetime_warning: Callable[[float], None] | None = None
        #: The connection whose runner owns the session (``SessionManager.attach``); None while
        #: detached (a resumable kind's dropped socket, waiting for a resume).
        self.owner: Any = None
        #: When the session was detached (``SessionManager.detach``); None while attached.
        self.detached_at: float | None = None
        #: The kind's per-session state that outlives a socket (duplex: its protocol state).
        self.kind_state: Any = None

    # -- read-only views ------------------------------------------------------------------
    @property
    def status(self) -> SessionStatus:
        return self._status

    @property
    def epoch(self) -> int:
        """The session's one fence: bumped by interrupt, reset, close and failure."""
        return self._epoch

    @property
    def chunk_index(self) -> int:
        return self._chunk_index

    @property
    def event_floor(self) -> int:
        """The highest event id already snapshotted (-1 before any); ids at or below are stale."""
        return max(self._floor, self._seen.forgotten_below)

    @property
    def pending_event_count(self) -> int:
        return len(self._pending)

    @property
    def prompt(self) -> str | None:
        return self._prompt

    @property
    def controls(self) -> Mapping[str, ControlInput]:
        return MappingProxyType(self._controls)

    @property
    def busy(self) -> bool:
        """True while a tick is in flight."""
        return self._tick_task is not None

    def touch(self) -> None:
        """Record client activity that is not a tick or event (e.g. a ping) for the idle reaper."""
        self.last_active_at = self._clock()

    async def wait_closed(self) -> str:
        """Wait until the session stops serving (closing began); returns the close reason."""
        await self._ended.wait()
        return self.close_reason or "close"

    # -- intake ---------------------------------------------------------------------------
    def accept_event(self, event: SessionEvent) -> EventAcceptance:
        if not isinstance(event, SessionEvent):
            raise InvalidEventError(f"expected a SessionEvent, got {type(event).__name__}")
        self._require_active()
        event_id = event.event_id
        if event_id in self._pending or event_id in self._seen:
            self.touch()
            return EventAcceptance.DUPLICATE
        floor = self.event_floor
        if event_id <= floor:
            raise StaleEventError(
                f"event {event_id} is stale: the event floor is {floor}", event_id=event_id, floor=floor
            )
        limit = self._limits.max_pending_events
        if len(self._pending) >= limit:
            raise EventQueueFullError(
                f"event queue is full ({limit} pending events)", event_id=event_id, limit=limit
            )
        self._pending[event_id] = event
        self._seen.add(event_id)
        self.touch()
        return EventAcceptance.ACCEPTED

    # -- ticks ----------------------------------------------------------------------------
    def next_tick(self, payload: Any = None) -> Coroutine[Any, Any, TickResult]:
        """One transactional tick; awaiting it returns the executor's result once committed.

        The tick belongs to the epoch of this call: an interrupt, reset or close before it runs
        drops it unstarted (``TickSupersededError``), never run as the new epoch's tick."""
        return self._next_tick(payload, self._epoch)

    async def _next_tick(self, payload: Any, epoch: int) -> TickResult:
        self._require_active()
        self._begin_tick(epoch)
        try:
            self.touch()
            snapshot, prepared = await self._prepare(payload)
            try:
                result = await self._execute(self._executor.execute(snapshot))
            except asyncio.CancelledError:
                self._mark_failed("cancelled")
                self._tick_finished("cancelled", None)
                raise
            except Exception as exc:
                await self._executor_failed(snapshot, epoch, exc)
            if result is _CUT or self._epoch != epoch:
                raise self._superseded(snapshot)
            returned = getattr(result, "metadata", None)
            if returned is not snapshot.metadata and returned != snapshot.metadata:
                await self._fail(
                    ChunkMetadataError(
                        f"tick metadata {_describe(returned)} does not match the snapshot "
                        f"{_describe(snapshot.metadata)}",
                        chunk_index=snapshot.chunk_index,
                        request_id=snapshot.request_id,
                    )
                )
            await self._commit_tick(snapshot, prepared)
            return result
        finally:
            self._end_tick()

    def stream_tick(self, payload: Any = None) -> AsyncIterator[TickChunk]:
        """One streaming tick: its chunks, each tagged with the tick's identity and epoch; it
        commits after the last one (see the module contract). The caller must iterate to the end:
        leaving early counts as a cancelled tick (the session fails). Like :meth:`next_tick`, the
        tick belongs to the epoch of this call."""
        return self._stream_tick(payload, self._epoch)

    async def _stream_tick(self, payload: Any, epoch: int) -> AsyncIterator[TickChunk]:
        self._require_active()
        self._begin_tick(epoch)
        try:
            self.touch()
            snapshot, prepared = await self._prepare(payload)
            chunks = self._executor.stream(snapshot)
            seq, left = 0, False
            try:
                while True:
                    if self._epoch != epoch:
                        raise self._superseded(snapshot)
                    try:
                        value = await self._execute(_next_chunk(chunks))
                    except asyncio.CancelledError:
                        self._mark_failed("cancelled")
                        self._tick_finished("cancelled", None)
                        raise
                    except Exception as exc:
                        await self._executor_failed(snapshot, epoch, exc)
                    if value is _CUT or self._epoch != epoch:
                        raise self._superseded(snapshot)
                    if value is _END:
                        break
                    try:
                        yield TickChunk(snapshot.metadata, seq, value, epoch)
                    except GeneratorExit:  # the consumer left early (not a transient refusal)
                        left = True
                        raise
                    seq += 1
            finally:
                if left and self._epoch == epoch:
                    self._mark_failed("cancelled")
                    self._tick_finished("cancelled", None)
                with contextlib.suppress(Exception):
                    await chunks.aclose()
            await self._commit_tick(snapshot, prepared)
        finally:
            self._end_tick()

    def _begin_tick(self, requested_epoch: int) -> None:
        """Take the session's one tick place (a tick of an older epoch is dropped unstarted)."""
        if self._epoch != requested_epoch:
            self._tick_finished("superseded", TickSupersededError.code)
            raise TickSupersededError(
                "tick was dropped before it ran: the session was interrupted, reset or closed after it was requested"
            )
        if self._ticking:
            self._tick_finished("rejected", TickInFlightError.code)
            raise TickInFlightError(f"session {self.session_id} already runs a tick")
        self._ticking = True

    def _end_tick(self) -> None:
        self._ticking = False
        waiter, self._tick_end = self._tick_end, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def submit(self, runner: StageRunner, payload: Any) -> Awaitable[Any]:
        """Side work of the session outside its ticks (the voice kind's VAD and ASR): ``payload``
        through ``runner`` (open for this session) under the session's id and current epoch.
        Nothing is committed; the runner raises its typed errors (a full queue is transient).
        Allowed while ACTIVE or FAILED (input goes on while a failed tick waits for its reset)."""
        self._require_resettable()
        return runner.submit(self.session_id, self._epoch, payload)

    async def _prepare(self, payload: Any) -> tuple[TickSnapshot, PreparedControls]:
        try:
            return self._build_snapshot(payload)
        except Exception as exc:
            await self._fail(
                TickFailedError(
                    f"tick {self._chunk_index} failed preparing controls ({type(exc).__name__})",
                    chunk_index=self._chunk_index,
                ),
                exc,
            )
            raise  # unreachable: _fail raises

    async def _executor_failed(self, snapshot: TickSnapshot, epoch: int, exc: Exception) -> None:
        """Raise the right error for an executor failure: superseded, transient, or fail closed."""
        if self._epoch != epoch:
            raise self._superseded(snapshot) from exc
        if isinstance(exc, TransientError):  # refused before it started: nothing changed
            self._tick_finished("rejected", exc.code)
            raise exc
        await self._fail(
            TickFailedError(
                f"tick {snapshot.chunk_index} failed in the model ({type(exc).__name__})",
                chunk_index=snapshot.chunk_index,
                request_id=snapshot.request_id,
            ),
            exc,
        )

    async def _commit_tick(self, snapshot: TickSnapshot, prepared: PreparedControls) -> None:
        try:
            self._reducer.commit(prepared)
        except Exception as exc:
            await self._fail(
                ReducerCommitError(
                    f"control reducer commit failed ({type(exc).__name__}); nothing was committed",
                    chunk_index=snapshot.chunk_index,
                ),
                exc,
            )
        self._commit(snapshot, prepared)
        self._tick_finished("committed", None)

    async def _execute(self, work: Awaitable[Any]) -> Any:
        """Await executor work in the caller's own task: no task per tick, so no extra loop
        iterations on the hot path. Reset and close cut the call short by cancelling that task
        (:meth:`_cut_tick`); their cancel request is withdrawn here (``Task.uncancel``, as
        ``asyncio.timeout`` does) and ``_CUT`` returned, unless the caller was cancelled too, in
        which case ``CancelledError`` propagates."""
        task = asyncio.current_task()
        assert task is not None
        self._tick_task = task
        try:
            return await work
        except asyncio.CancelledError:
            if self._cutting:
                self._cutting = False
                if task.uncancel() == 0:
                    return _CUT
            raise
        finally:
            if self._cutting:  # the executor swallowed the cancel: withdraw it all the same
                self._cutting = False
                task.uncancel()
            self._tick_task = None
            done, self._tick_done = self._tick_done, None
            if done is not None and not done.done():
                done.set_result(None)

    def _cut_tick(self) -> None:
        """Cancel the executor call in flight (reset and close; the epoch is already bumped)."""
        if self._tick_task is not None and not self._cutting:
            self._cutting = True
            self._tick_task.cancel()

    def _build_snapshot(self, payload: Any) -> tuple[TickSnapshot, PreparedControls]:
        prompt = self._prompt
        if self._pending:
            events = tuple(self._pending[k] for k in sorted(self._pending))
            for event in events:
                if event.prompt is not None:
                    prompt = event.prompt
        else:  # most ticks (a robot's every tick): nothing queued since the last one
            events = ()
        prepared = self._reducer.prepare(
            current_controls=MappingProxyType(self._controls),  # never mutated: commit replaces it
            events=events,
            chunk_index=self._chunk_index,
        )
        controls = tuple(sorted(prepared.controls, key=_track))
        if controls:
            tracks = [c.track for c in controls]
            if len(set(tracks)) != len(tracks) or not all(isinstance(c, ControlInput) for c in controls):
                raise ValueError(f"reducer returned invalid controls for tracks {tracks}")
        snapshot = TickSnapshot(
            session_id=self.session_id,
            request_id=self._request_id_factory(self.session_id, self._chunk_index),
            chunk_index=self._chunk_index,
            applied_event_ids=tuple(e.event_id for e in events) if events else (),
            prompt=prompt,
            controls=controls,
            events=events,
            epoch=self._epoch,
            payload=payload,
        )
        if events:
            self._floor = max(self._floor, events[-1].event_id)
        return snapshot, prepared

    def _commit(self, snapshot: TickSnapshot, prepared: PreparedControls) -> None:
        for event_id in snapshot.applied_event_ids:
            del self._pending[event_id]
        self._prompt = snapshot.prompt
        self._controls = {c.track: c for c in snapshot.controls}
        self._chunk_index += 1
        self.ticks_committed += 1
        self.touch()

    def _tick_finished(self, outcome: str, code: str | None) -> None:
        if self._on_tick is not None:
            self._on_tick(self, outcome, code)

    def _superseded(self, snapshot: TickSnapshot) -> TickSupersededError:
        self._tick_finished("superseded", TickSupersededError.code)
        return TickSupersededError(
            f"tick {snapshot.chunk_index} was dropped: the session was reset or closed while it ran",
            chunk_index=snapshot.chunk_index,
            request_id=snapshot.request_id,
        )

    def _mark_failed(self, failure: str) -> None:
        self._epoch += 1
        if self._status in (SessionStatus.ACTIVE, SessionStatus.FAILED):  # never undo a close
            self.failure = failure
            self._set_status(SessionStatus.FAILED)

    async def _fail(self, error: TickFailedError, cause: BaseException | None = None) -> None:
        """Fail closed: FAILED, release worker state (a forward may have half-written it), raise."""
        self._mark_failed(error.code)
        self._tick_finished("failed", error.code)
        with session_context(self.session_id):
            log.warning("tick failed: %s", error.message, exc_info=cause)
            try:
                await self._release("failed")
            except ReleaseFailedError as exc:
                log.error("failure cleanup did not release worker state: %s", exc.message)
        raise error from cause

    # -- reset and close ------------------------------------------------------------------
    async def reset(self) -> None:
        """Start the session over at chunk 0 (see the module contract)."""
        self._require_resettable()
        self._epoch += 1
        self._cut_tick()
        while self._ticking:  # the cut tick (or another reset) unwinds first
            if self._tick_end is None:
                self._tick_end = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._tick_end)
        self._require_resettable()
        self._ticking = True  # no tick runs while it resets
        try:
            if self._pending:
                self._floor = max(self._floor, max(self._pending))
            self._pending.clear()
            self._prompt = None
            self._controls = {}
            self._chunk_index = 0
            try:
                self._reducer.reset()
                await self._release("reset")
            except ReleaseFailedError:
                self._mark_failed("release_failed")
                raise
            except Exception as exc:
                self._mark_failed("reducer_reset_failed")
                raise ReducerCommitError(f"control reducer reset failed ({type(exc).__name__})") from exc
            self.failure = None
            self._set_status(SessionStatus.ACTIVE)
            self.touch()
        finally:
            self._end_tick()

    def continue_from(
        self,
        epoch: int,
        prompt: str | None = None,
        controls: Sequence[ControlInput] = (),
        chunk_index: int = 0,
    ) -> None:
        """A session restored from a checkpoint (``realtime.scale.resume``), before its first
        tick: it continues the epochs its client already holds frames of (the epoch moves to
        ``epoch``, never back, and the executor's stage runner is fenced there, as after an
        interrupt), with the sticky ``prompt`` and ``controls`` its last committed tick left, its
        next tick being chunk ``chunk_index`` (a session whose model state is rebuilt goes on where
        it was; request ids stay unique per tick)."""
        if self.ticks_committed or self._ticking:
            raise RuntimeError("continue_from() is for a restored session before its first tick")
        if epoch > self._epoch:
            self._epoch = epoch
            self._executor.fence(self.session_id, self._epoch)
        self._prompt = prompt
        self._controls = {c.track: c for c in controls}
        self._chunk_index = chunk_index

    def interrupt(self) -> bool:
        """Supersede the session's work in flight, keeping everything else: the one call of a
        barge-in or a client's cancel.

        Bumps ``epoch``, cuts the tick in flight (it raises :class:`TickSupersededError` and
        commits nothing; one requested but not started yet is dropped when it starts) and fences
        the executor's stage runner (its work of older epochs is dropped and aborted); output
        queued with an older epoch is never sent. Unlike ``reset`` the session keeps its chunk
        index, prompt, controls, pending events and worker state (a FAILED one stays FAILED).
        Returns whether a tick was in flight.
        """
        self._require_resettable()
        ticking = self._ticking
        self._epoch += 1
        self._cut_tick()
        self._executor.fence(self.session_id, self._epoch)
        return ticking

    async def _close(self, reason: ReleaseReason) -> SessionStatus:
        """The one release path: CLOSING, cancel the tick, release; CLOSED or CLEANUP_FAILED."""
        if self._status is SessionStatus.CLOSED:
            return self._status
        if self._status is SessionStatus.CLOSING:
            assert self._close_done is not None
            await asyncio.shield(self._close_done)
            return self._status
        self.close_reason = reason
        self._epoch += 1
        self._set_status(SessionStatus.CLOSING)
        self._ended.set()
        self._close_done = asyncio.get_running_loop().create_future()
        try:
            if self._tick_task is not None:
                done = self._tick_done = asyncio.get_running_loop().create_future()
                self._cut_tick()
                await asyncio.wait({done}, timeout=self._limits.release_timeout_s)
            await self._release(reason)
        except ReleaseFailedError:
            self._set_status(SessionStatus.CLEANUP_FAILED)
        except BaseException:
            self._set_status(SessionStatus.CLEANUP_FAILED)
            raise
        else:
            self._pending.clear()
            self._controls = {}
            self._set_status(SessionStatus.CLOSED)
        finally:
            self._close_done.set_result(None)
        return self._status

    async def _release(self, reason: ReleaseReason) -> None:
        timeout = self._limits.release_timeout_s
        try:
            # Not ``wait_for``: on Python 3.11 it swallows a cancel that lands as the release
            # completes, and the cancelled caller (a connection's runner) then waits forever.
            async with asyncio.timeout(timeout):
                await self._lifecycle.release(self.session_id, reason)
        except TimeoutError:
            raise ReleaseFailedError(
                f"releasing worker state of {self.session_id} timed out after {timeout:g} s", reason=reason
            ) from None
        except Exception as exc:
            with session_context(self.session_id):
                log.error("lifecycle release (%s) failed", reason, exc_info=exc)
            raise ReleaseFailedError(
                f"releasing worker state of {self.session_id} failed ({type(exc).__name__})", reason=reason
            ) from exc

    # -- state checks ---------------------------------------------------------------------
    def _set_status(self, status: SessionStatus) -> None:
        old, self._status = self._status, status
        if self._on_status is not None and old is not status:
            self._on_status(self, old, status)

    def _require_active(self) -> None:
        status = self._status
        if status is SessionStatus.ACTIVE:
            return
        if status is SessionStatus.FAILED:
            raise SessionFailedError(
                f"session {self.session_id} failed ({self.failure}) and must be reset or closed",
                failure=self.failure,
            )
        self._raise_closed()

    def _require_resettable(self) -> None:
        if self._status not in (SessionStatus.ACTIVE, SessionStatus.FAILED):
            self._raise_closed()

    def _raise_closed(self) -> None:
        if self._status is SessionStatus.CLEANUP_FAILED:
            raise CleanupFailedError(
                f"session {self.session_id} is cleanup_failed: only a close retry is allowed",
                reason=self.close_reason,
            )
        raise SessionClosedError(
            f"session {self.session_id} is {self._status.value} ({self.close_reason})",
            reason=self.close_reason,
        )


_CUT = object()  # what _execute returns when reset or close cut the executor call short
_END = object()  # what _next_chunk returns after a stream's last chunk


async def _next_chunk(chunks: AsyncIterator[Any]) -> Any:
    try:
        return await chunks.__anext__()
    except StopAsyncIteration:
        return _END


def _track(control: ControlInput) -> str:
    return control.track


def _describe(metadata: Any) -> str:
    to_dict = getattr(metadata, "to_dict", None)
    return repr(to_dict()) if callable(to_dict) else repr(metadata)
