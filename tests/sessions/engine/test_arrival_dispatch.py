"""The arrival-aware dispatch policy: idle sessions cost nothing, sessions that send together batch whole.

Policy tests drive :class:`ArrivalAware` with explicit loop times (no clock); engine tests check batch
composition and the dispatch decisions the engine took, never wall-clock thresholds.
"""

from __future__ import annotations

import asyncio
import math

import pytest

from sessions.engine import Coalescing, EngineConfigError
from sessions.engine.dispatch import HISTORY, ArrivalAware, SessionView
from tests.sessions.engine.stages import RecordingStage

WINDOW = 0.020


def view(now: float, idle: tuple[str, ...], *, ready: int = 1, oldest: float | None = None) -> SessionView:
    return SessionView(now, ready, len(idle), oldest, 8, idle)


def learned(policy: ArrivalAware, session_id: str, *, every: float, last: float, n: int = 4) -> None:
    """``session_id`` arrived ``n`` times, ``every`` seconds apart, the last one at ``last``."""
    for i in range(n):
        policy.arrived(session_id, last - (n - 1 - i) * every)


def test_a_paused_session_is_not_waited_for_while_the_window_would_wait():
    policy, window = ArrivalAware(WINDOW), Coalescing(WINDOW)
    policy.arrived("paused", 0.0)  # one request, then silence
    learned(policy, "active", every=0.016, last=5.0)
    idle = ("paused",)
    assert policy.run_at_submit(view(5.0, idle))
    assert policy.decide(view(5.0, idle, oldest=5.0)) is None
    assert not window.run_at_submit(view(5.0, idle))
    assert window.decide(view(5.0, idle, oldest=5.0)) == pytest.approx(5.0 + WINDOW)


def test_a_session_due_within_the_window_is_waited_for_until_the_deadline():
    policy = ArrivalAware(WINDOW)
    learned(policy, "b", every=0.016, last=1.000)  # due at 1.016
    learned(policy, "a", every=0.016, last=1.010)
    now = 1.010
    assert not policy.run_at_submit(view(now, ("b",)))
    assert policy.decide(view(now, ("b",), oldest=now)) == pytest.approx(now + WINDOW)
    assert policy.expected(view(now, ("b",)), now + WINDOW)[0] == 1
    policy.arrived("b", 1.016)  # it came: nobody left to wait for
    assert policy.run_at_submit(view(1.016, ()))
    assert policy.decide(view(1.016, (), ready=2, oldest=now)) is None


def test_a_session_due_after_the_deadline_is_not_waited_for():
    policy = ArrivalAware(WINDOW)
    learned(policy, "slow", every=0.200, last=1.0)  # chunk-broker robot: next at 1.2
    assert policy.run_at_submit(view(1.05, ("slow",)))
    assert policy.decide(view(1.05, ("slow",), oldest=1.05)) is None
    # close to its turn it is waited for
    assert policy.decide(view(1.19, ("slow",), oldest=1.19)) == pytest.approx(1.19 + WINDOW)


def test_an_overdue_session_is_waited_for_only_until_it_has_been_silent_idle_after_intervals():
    policy = ArrivalAware(0.050, idle_after=3.0)
    learned(policy, "late", every=0.010, last=1.000)  # due at 1.010, gives up at 1.030
    now = 1.015
    assert policy.decide(view(now, ("late",), oldest=now)) == pytest.approx(1.030)  # before the deadline
    assert policy.decide(view(1.030, ("late",), oldest=now)) is None
    assert policy.expected(view(1.031, ("late",)), 2.0) == (0, 2.0)


def test_the_typical_interval_is_the_median_so_one_pause_does_not_change_it():
    policy = ArrivalAware(WINDOW)
    learned(policy, "r", every=0.016, last=1.0, n=HISTORY)
    policy.arrived("r", 31.0)  # a 30 s pause (environment reset), then the loop resumes
    policy.arrived("r", 31.016)
    assert policy.expected(view(31.02, ("r",)), 31.02 + WINDOW)[0] == 1  # still expected every 16 ms
    for i in range(HISTORY // 2 + 1):  # a lasting change of rate wins after about HISTORY / 2 arrivals
        policy.arrived("r", 32.0 + i)
    assert policy.expected(view(32.0 + HISTORY // 2 + 0.1, ("r",)), 50.0)[0] == 1
    assert policy.expected(view(32.0 + HISTORY // 2 + 0.1, ("r",)), 32.0 + HISTORY // 2 + 0.5)[0] == 0


def test_sessions_that_never_sent_or_were_forgotten_are_not_waited_for():
    policy = ArrivalAware(WINDOW)
    learned(policy, "gone", every=0.016, last=1.0)
    assert policy.expected(view(1.01, ("gone", "fresh")), 1.03)[0] == 1
    policy.forget("gone")
    assert policy.expected(view(1.01, ("gone", "fresh")), 1.03)[0] == 0
    policy.forget("never-known")  # idempotent


def test_a_full_batch_or_a_zero_window_runs_at_once():
    policy = ArrivalAware(WINDOW)
    learned(policy, "b", every=0.016, last=1.0)
    assert policy.run_at_submit(SessionView(1.01, 8, 1, None, 8, ("b",)))
    assert policy.decide(SessionView(1.01, 8, 1, 1.01, 8, ("b",))) is None
    eager = ArrivalAware(0.0)
    learned(eager, "b", every=0.016, last=1.0)
    assert eager.run_at_submit(view(1.01, ("b",)))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"window_s": -1}, "coalesce_window_s"),
        ({"window_s": math.nan}, "coalesce_window_s"),
        ({"idle_after": 0.5}, "idle_after"),
        ({"idle_after": math.inf}, "idle_after"),
    ],
)
def test_bad_parameters_are_rejected(kwargs, match):
    with pytest.raises(EngineConfigError, match=match):
        ArrivalAware(**kwargs)


class Spy:
    """Delegates to a policy and records its answers (the engine reads ``engine.dispatch`` each time)."""

    def __init__(self, policy) -> None:
        self.policy = policy
        self.silence = policy.silence
        self.at_submit: list[bool] = []
        self.views: list[SessionView] = []  # what each run_at_submit saw
        self.decisions: list[float | None] = []

    def run_at_submit(self, view):
        self.views.append(view)
        self.at_submit.append(self.policy.run_at_submit(view))
        return self.at_submit[-1]

    def decide(self, view):
        self.decisions.append(self.policy.decide(view))
        return self.decisions[-1]

    def arrived(self, session_id, now):
        self.policy.arrived(session_id, now)

    def forget(self, session_id):
        self.policy.forget(session_id)

    def on_silence_output(self, session_id, output):
        self.policy.on_silence_output(session_id, output)


async def _lockstep(engine, session_id: str, steps: int) -> None:
    for x in range(steps):
        assert await engine.submit(session_id, 0, x) == 2 * x


async def test_one_active_session_among_paused_ones_is_dispatched_inside_submit(make_engine):
    # A 10 s window: any wait for the paused sessions would show as a timer decision.
    spy = Spy(ArrivalAware(10.0, idle_after=3.0))
    stage = RecordingStage()
    async with make_engine(stage, dispatch=spy, max_batch=8) as engine:
        paused = [f"paused-{i}" for i in range(7)]
        for sid in [*paused, "active"]:
            await engine.open(sid)
        await asyncio.gather(*(_lockstep(engine, sid, 3) for sid in paused))  # learn fast rates...
        await asyncio.sleep(0.3)  # ...then go silent for far more than 3 of their intervals
        spy.at_submit.clear()
        spy.decisions.clear()
        before = len(stage.batches)
        await _lockstep(engine, "active", 10)
    assert stage.batches[before:] == [["active"]] * 10
    assert spy.at_submit == [True] * 10  # every request posted to the worker within its submit
    assert spy.decisions == [None] * len(spy.decisions)  # and no decision ever set a timer


async def test_sessions_sending_together_still_batch_whole(make_engine):
    spy = Spy(ArrivalAware(10.0))
    stage = RecordingStage(delay_s=0.002)
    async with make_engine(stage, dispatch=spy, max_batch=8) as engine:
        robots = [f"r{i}" for i in range(8)]
        for sid in robots:
            await engine.open(sid)
        await asyncio.gather(*(_lockstep(engine, sid, 12) for sid in robots))
    sizes = [len(batch) for batch in stage.batches]
    assert sum(sizes) == 8 * 12
    # The first submit runs alone (a session that never sent is not waited for), so that robot runs
    # one step ahead of the others from then on; every other forward holds all 8.
    assert sizes == [1] + [8] * 11 + [7], sizes
    # A wait was set only twice: in the first round, for the robot that ran ahead (superseded
    # when it came), and at the end, for the robot that had finished (until it was silent 3x its
    # interval), never in the steady state.
    assert sum(d is not None for d in spy.decisions) <= 2, spy.decisions


async def test_release_forgets_the_session(make_engine):
    policy = ArrivalAware(10.0)
    async with make_engine(RecordingStage(), dispatch=policy) as engine:
        await engine.open("a")
        await _lockstep(engine, "a", 3)
        assert policy.expected(view(0.0, ("a",)), math.inf)[0] == 1
        await engine.release("a")
        assert policy.expected(view(0.0, ("a",)), math.inf)[0] == 0
