"""Random operation sequences against a small reference model of the session contract."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from sessions.errors import (
    ChunkMetadataError,
    CleanupFailedError,
    EventQueueFullError,
    ReducerCommitError,
    ReleaseFailedError,
    SessionExistsError,
    SessionFailedError,
    SessionLimitError,
    StaleEventError,
    TickFailedError,
    UnknownSessionError,
)
from sessions.events import ControlInput, SessionEvent
from sessions.reducer import LatestWinsReducer
from sessions.session import EventAcceptance, SessionLimits, SessionStatus
from sessions.tick import TickMetadata

from .fakes import RecordingLifecycle, ScriptedExecutor, make_manager

IDS = st.sampled_from(["a", "b", "c"])
CAPACITY, MAX_PENDING = 2, 3


@dataclass
class Model:
    status: SessionStatus = SessionStatus.ACTIVE
    floor: int = -1
    seen: set[int] = field(default_factory=set)
    pending: dict[int, SessionEvent] = field(default_factory=dict)
    chunk: int = 0
    prompt: str | None = None
    controls: dict[str, object] = field(default_factory=dict)


class Switch(LatestWinsReducer):
    fail_commit = False

    def commit(self, prepared):
        if Switch.fail_commit:
            raise RuntimeError("commit failed")


class SessionContract(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.executor = ScriptedExecutor()
        self.lifecycle = RecordingLifecycle()
        self.manager = make_manager(
            self.executor,
            self.lifecycle,
            capacity=CAPACITY,
            limits=SessionLimits(max_pending_events=MAX_PENDING),
            reducer_factory=Switch,
        )
        self.model: dict[str, Model] = {}

    def teardown(self) -> None:
        self.loop.close()

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    def outcome(self, coro):
        try:
            return self.run(coro), None
        except Exception as exc:  # compared against the model's expected error type
            return None, exc

    def expect_state_error(self, sid: str) -> type[Exception] | None:
        m = self.model.get(sid)
        if m is None:
            return UnknownSessionError
        if m.status is SessionStatus.FAILED:
            return SessionFailedError
        if m.status is SessionStatus.CLEANUP_FAILED:
            return CleanupFailedError
        return None

    @initialize()
    def start_two_sessions(self):
        for sid in ("a", "b"):
            self.create(sid)

    @rule(sid=IDS)
    def create(self, sid):
        _, err = self.outcome(self.manager.create(sid))
        if sid in self.model:
            assert isinstance(err, SessionExistsError)
        elif len(self.model) >= CAPACITY:
            assert isinstance(err, SessionLimitError)
        else:
            assert err is None
            self.model[sid] = Model()

    @rule(
        sid=IDS,
        event_id=st.integers(0, 6),
        prompt=st.sampled_from([None, "p", "q"]),
        track=st.sampled_from([None, "cam", "act"]),
        value=st.integers(0, 3),
    )
    def accept(self, sid, event_id, prompt, track, value):
        controls = (ControlInput(track, "s", value),) if track else ()
        ev = SessionEvent(event_id, prompt=prompt, controls=controls)

        async def go():
            return self.manager.get(sid).accept_event(ev)

        got, err = self.outcome(go())
        expected_err = self.expect_state_error(sid)
        if expected_err is not None:
            assert isinstance(err, expected_err), err
            return
        m = self.model[sid]
        if event_id in m.seen:
            assert got is EventAcceptance.DUPLICATE, (got, err)
        elif event_id <= m.floor:
            assert isinstance(err, StaleEventError), err
        elif len(m.pending) >= MAX_PENDING:
            assert isinstance(err, EventQueueFullError), err
        else:
            assert got is EventAcceptance.ACCEPTED, (got, err)
            m.seen.add(event_id)
            m.pending[event_id] = ev

    @rule(sid=IDS, result=st.sampled_from(["ok", "ok", "raise", "mismatch", "commit_fail"]))
    def tick(self, sid, result):
        self.executor.error = RuntimeError("x") if result == "raise" else None
        self.executor.metadata = (
            (lambda s: TickMetadata(s.session_id, "other", s.chunk_index, s.applied_event_ids))
            if result == "mismatch"
            else None
        )
        Switch.fail_commit = result == "commit_fail"

        async def go():
            return await self.manager.get(sid).next_tick()

        before = len(self.executor.snapshots)
        _, err = self.outcome(go())
        expected_err = self.expect_state_error(sid)
        if expected_err is not None:
            assert isinstance(err, expected_err), err
            assert len(self.executor.snapshots) == before
            return
        m = self.model[sid]
        snap = self.executor.snapshots[-1]
        events = [m.pending[k] for k in sorted(m.pending)]
        prompt = m.prompt
        controls = dict(m.controls)
        for ev in events:
            prompt = ev.prompt if ev.prompt is not None else prompt
            controls.update({c.track: c.data for c in ev.controls})
        assert snap.applied_event_ids == tuple(e.event_id for e in events)
        assert (snap.chunk_index, snap.prompt) == (m.chunk, prompt)
        assert {c.track: c.data for c in snap.controls} == controls
        if events:
            m.floor = max(m.floor, events[-1].event_id)
        if result == "ok":
            assert err is None
            m.pending.clear()
            m.prompt, m.controls, m.chunk = prompt, controls, m.chunk + 1
        else:
            expected = {
                "raise": TickFailedError,
                "mismatch": ChunkMetadataError,
                "commit_fail": ReducerCommitError,
            }
            assert type(err) is expected[result]
            m.status = SessionStatus.FAILED

    @rule(sid=IDS, release_fails=st.booleans())
    def reset(self, sid, release_fails):
        self.lifecycle.failures_left = int(release_fails)
        _, err = self.outcome(self.manager.reset(sid))
        self.lifecycle.failures_left = 0
        m = self.model.get(sid)
        if m is None:
            assert isinstance(err, UnknownSessionError)
            return
        if m.status is SessionStatus.CLEANUP_FAILED:
            assert isinstance(err, CleanupFailedError)
            return
        if m.pending:
            m.floor = max(m.floor, max(m.pending))
        m.pending.clear()
        m.chunk, m.prompt, m.controls = 0, None, {}
        if release_fails:
            assert isinstance(err, ReleaseFailedError)
            m.status = SessionStatus.FAILED
        else:
            assert err is None
            m.status = SessionStatus.ACTIVE

    @rule(sid=IDS, release_fails=st.booleans(), disconnect=st.booleans())
    def close(self, sid, release_fails, disconnect):
        self.lifecycle.failures_left = int(release_fails)
        op = self.manager.disconnect(sid) if disconnect else self.manager.close(sid)
        got, err = self.outcome(op)
        self.lifecycle.failures_left = 0
        if sid not in self.model:
            assert got is SessionStatus.CLOSED and err is None
        elif release_fails:
            if disconnect:
                assert got is SessionStatus.CLEANUP_FAILED
            else:
                assert isinstance(err, CleanupFailedError)
            self.model[sid].status = SessionStatus.CLEANUP_FAILED
        else:
            assert got is SessionStatus.CLOSED and err is None
            del self.model[sid]

    @invariant()
    def matches_model(self):
        assert sorted(s.session_id for s in self.manager.list_sessions()) == sorted(self.model)
        for sid, m in self.model.items():
            s = self.manager.get(sid)
            assert (s.status, s.chunk_index, s.pending_event_count) == (m.status, m.chunk, len(m.pending))
            assert s.prompt == m.prompt
        assert self.manager.occupied == len(self.model)


SessionContract.TestCase.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)
test_session_contract = SessionContract.TestCase
