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


def served(policy: ArrivalAware, session_id: str, *, gap: float, done: float, n: int = 4) -> None:
    """``n`` request/reply cycles of ``session_id``: each request ``gap`` after the previous reply,
    each reply 10 ms after its request, the last one at ``done``."""
    cycle = gap + 0.010
    for i in range(n):
        arrival = done - (n - 1 - i) * cycle - 0.010
        policy.arrived(session_id, arrival)
        policy.completed([session_id], arrival + 0.010)


def test_a_paused_session_is_not_waited_for_while_the_window_would_wait():
    policy, window = ArrivalAware(WINDOW), Coalescing(WINDOW)
    policy.arrived("paused", 0.0)  # one request, its reply, then silence
    policy.completed(["paused"], 0.01)
    idle = ("paused",)
    assert policy.run_at_submit(view(5.0, idle))
    assert policy.decide(view(5.0, idle, oldest=5.0)) is None
    assert not window.run_at_submit(view(5.0, idle))
    assert window.decide(view(5.0, idle, oldest=5.0)) == pytest.approx(5.0 + WINDOW)


def test_a_session_due_within_the_window_is_waited_for_then_the_batch_runs_when_it_comes():
    policy = ArrivalAware(WINDOW)
    served(policy, "b", gap=0.002, done=1.000)  # next request due at 1.002
    now = 1.001
    assert not policy.run_at_submit(view(now, ("b",)))
    # waits until the deadline, or until b has been silent for the window (1.020), if earlier
    assert policy.decide(view(now, ("b",), oldest=now)) == pytest.approx(1.020)
    policy.arrived("b", 1.002)  # it came: nobody left to wait for
    assert policy.run_at_submit(view(1.002, ()))
    assert policy.decide(view(1.002, (), ready=2, oldest=now)) is None


def test_robots_split_into_two_batches_are_merged_again():
    """Half the robots' requests queued during the other half's 50 ms forward. When that forward's
    replies go out, the queued half is past its arrival + window, but the window runs from when
    the worker got free, and the served half is due straight back: the batch waits for it. (The
    plain window runs the queued half alone at once, and the halves stay apart; so would an
    inter-arrival predictor, which sees the served half due a whole cycle later.)"""
    policy = ArrivalAware(WINDOW)
    queued = ("b0", "b1", "b2", "b3")
    for sid in queued:
        served(policy, sid, gap=0.002, done=0.900)
        policy.arrived(sid, 0.950)
    first = tuple(f"a{i}" for i in range(4))
    for sid in first:
        served(policy, sid, gap=0.002, done=1.000)  # the last forward's outputs: worker free at 1.0
    now = 1.000
    assert policy.expected(view(now, first), now + WINDOW)[0] == 4
    assert policy.decide(view(now, first, ready=4, oldest=0.950)) == pytest.approx(now + WINDOW)
    assert Coalescing(WINDOW).decide(view(now, first, ready=4, oldest=0.950)) is None
    for sid in first:
        policy.arrived(sid, 1.002)
    assert policy.decide(view(1.002, (), ready=8, oldest=0.950)) is None


def test_a_session_due_after_the_deadline_is_not_waited_for():
    policy = ArrivalAware(WINDOW)
    served(policy, "slow", gap=0.200, done=1.0)  # chunk-broker robot: next request at 1.2
    assert policy.run_at_submit(view(1.05, ("slow",)))
    assert policy.decide(view(1.05, ("slow",), oldest=1.05)) is None
    # close to its turn it is waited for
    assert policy.decide(view(1.19, ("slow",), oldest=1.19)) == pytest.approx(1.19 + WINDOW)


def test_an_overdue_session_is_waited_for_only_until_it_has_been_silent_idle_after_gaps():
    policy = ArrivalAware(0.060, idle_after=3.0)
    served(policy, "late", gap=0.030, done=1.000)  # due at 1.030, gives up at 1.090 (3 gaps > window)
    now = 1.040
    assert policy.decide(view(now, ("late",), oldest=now)) == pytest.approx(1.090)  # before the deadline
    assert policy.decide(view(1.090, ("late",), oldest=now)) is None
    assert policy.expected(view(1.091, ("late",)), 2.0) == (0, 2.0)


def test_a_session_that_comes_straight_back_is_given_the_window():
    policy = ArrivalAware(WINDOW, idle_after=3.0)
    served(policy, "quick", gap=0.0, done=1.000)  # 3 x its gap is 0: the window is the floor
    assert policy.expected(view(1.015, ("quick",)), 1.03)[0] == 1
    assert policy.expected(view(1.021, ("quick",)), 1.04)[0] == 0


def test_the_typical_gap_is_the_median_so_one_pause_does_not_change_it():
    policy = ArrivalAware(WINDOW)
    served(policy, "r", gap=0.002, done=1.0, n=HISTORY)
    policy.arrived("r", 31.0)  # a 30 s pause (environment reset), then the loop resumes
    policy.completed(["r"], 31.010)
    assert policy.expected(view(31.011, ("r",)), 31.011 + WINDOW)[0] == 1  # due back at 31.012
    for i in range(HISTORY // 2 + 1):  # a lasting change of pace wins after about HISTORY / 2 requests
        policy.arrived("r", 32.0 + i)
        policy.completed(["r"], 32.01 + i)
    done = 32.01 + HISTORY // 2
    assert policy.expected(view(done + 0.05, ("r",)), done + 0.5)[0] == 0  # now due ~1 s after a reply
    assert policy.expected(view(done + 0.05, ("r",)), done + 1.0)[0] == 1


def test_sessions_never_served_unserved_or_forgotten_are_not_waited_for():
    policy = ArrivalAware(WINDOW)
    served(policy, "gone", gap=0.002, done=1.0)
    policy.arrived("dropped", 0.99)  # queued, then dropped unserved (epoch bump, cancel)
    idle = ("gone", "fresh", "dropped")
    assert policy.expected(view(1.001, idle), 1.02)[0] == 1
    policy.forget("gone")
    assert policy.expected(view(1.001, idle), 1.02)[0] == 0
    policy.forget("never-known")  # idempotent


def test_a_full_batch_or_a_zero_window_runs_at_once():
    policy = ArrivalAware(WINDOW)
    served(policy, "b", gap=0.002, done=1.0)
    assert policy.run_at_submit(SessionView(1.001, 8, 1, None, 8, ("b",)))
    assert policy.decide(SessionView(1.001, 8, 1, 1.001, 8, ("b",))) is None
    eager = ArrivalAware(0.0)
    served(eager, "b", gap=0.002, done=1.0)
    assert eager.run_at_submit(view(1.001, ("b",)))


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

    def completed(self, session_ids, now):
        self.policy.completed(session_ids, now)

    def forget(self, session_id):
        self.policy.forget(session_id)

    def on_silence_output(self, session_id, output):
        self.policy.on_silence_output(session_id, output)


async def _lockstep(engine, session_id: str, steps: int) -> None:
    for x in range(steps):
        assert await engine.submit(session_id, 0, x) == 2 * x


async def test_one_active_session_among_paused_ones_is_dispatched_inside_submit(make_engine):
    # Any wait for the paused sessions would show as a timer decision.
    spy = Spy(ArrivalAware(0.05, idle_after=3.0))
    stage = RecordingStage()
    async with make_engine(stage, dispatch=spy, max_batch=8) as engine:
        paused = [f"paused-{i}" for i in range(7)]
        for sid in [*paused, "active"]:
            await engine.open(sid)
        await asyncio.gather(*(_lockstep(engine, sid, 3) for sid in paused))  # learn fast rates...
        await asyncio.sleep(0.3)  # ...then go silent for far longer than the window and 3 gaps
        spy.at_submit.clear()
        spy.decisions.clear()
        before = len(stage.batches)
        await _lockstep(engine, "active", 10)
    assert stage.batches[before:] == [["active"]] * 10
    assert spy.at_submit == [True] * 10  # every request posted to the worker within its submit
    assert spy.decisions == [None] * len(spy.decisions)  # and no decision ever set a timer


async def test_sessions_sending_together_still_batch_whole(make_engine):
    spy = Spy(ArrivalAware(0.2))
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
    # when it came), and at the end, for the robot that had finished (until it had been silent
    # for the window), never in the steady state.
    assert sum(d is not None for d in spy.decisions) <= 2, spy.decisions


async def test_release_forgets_the_session(make_engine):
    policy = ArrivalAware(10.0)
    async with make_engine(RecordingStage(), dispatch=policy) as engine:
        await engine.open("a")
        await _lockstep(engine, "a", 3)
        assert policy.expected(view(0.0, ("a",)), math.inf)[0] == 1
        await engine.release("a")
        assert policy.expected(view(0.0, ("a",)), math.inf)[0] == 0
