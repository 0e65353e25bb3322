"""Dispatch policies: when a :class:`~sessions.engine.engine.StageEngine` runs its next batch.

The engine asks its policy only while no forward runs, so work that arrives during a forward joins
the next batch. It also tells the policy of every item it queues (``arrived``), of the sessions
of every batch whose outputs went out (``completed``) and of every session it releases
(``forget``), so a policy may learn each session's arrival pattern. Three policies:

- :class:`Coalescing` (request-driven kinds: robots, world blocks): run at once when ``max_batch``
  sessions have ready work, or when at most ``eager_remaining`` open sessions have nothing pending
  (waiting cannot grow the batch), or when the window is 0; otherwise wait until the oldest ready
  item's arrival + ``window_s``. The deadline belongs to that item: later arrivals join the batch
  but never extend the wait.
- :class:`ArrivalAware` (robots, the default of the robot kind): the coalescing window, but an
  idle session counts as "could still join" only when its pattern predicts it: its next request
  (its last output + its typical gap from a reply to the next request, the median of its last
  :data:`HISTORY` gaps) falls before the window's deadline, and it has been silent since its
  output for less than ``idle_after`` typical gaps (at least the window). A connected robot that
  paused (between episodes, at a breakpoint) therefore costs the others nothing, while robots
  that send together still batch whole. With no idle session predicted, the batch runs at once.
  The window runs from the oldest ready item's arrival or from when the worker got free,
  whichever is later (so robots split into two alternating batches merge again).
- :class:`FrameClock` (full-duplex voice): the server clock drives steps, not input arrival. Every
  ``period_s`` every open session steps together in one batch; a session with nothing pending
  steps on ``silence(session_id)`` (counted in ``silent_steps``) and its output goes to
  ``on_silence_output``. A step that starts later than its slot counts in ``late_steps``; slots
  missed entirely are skipped (``missed_steps``), never run back to back to catch up.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from sessions.engine.errors import EngineConfigError


class SessionView(NamedTuple):
    """What a policy sees of the engine when it decides (built twice per robot request: a named
    tuple costs a fraction of a frozen dataclass's ``__init__``)."""

    now: float
    ready: int  # sessions whose next item can run now
    idle_sessions: int  # open sessions with nothing pending
    oldest_arrival: float | None  # arrival time of the oldest ready item
    max_batch: int
    idle_ids: tuple[str, ...] = ()  # the ids of those idle sessions (policies that learn per session)


class DispatchPolicy(Protocol):
    #: Sessions with nothing pending step on ``silence(session_id)`` (frame clocks); None: they wait.
    silence: Callable[[str], Any] | None

    def run_at_submit(self, view: SessionView) -> bool:
        """A submit arrived while no forward runs: post the batch at once, inside ``submit``?"""
        ...

    def decide(self, view: SessionView) -> float | None:
        """``None``: run the batch now; a loop time: decide again then (one timer)."""
        ...

    def on_silence_output(self, session_id: str, output: Any) -> None:
        """Output of a step run on silence (frame clocks only)."""
        ...

    def arrived(self, session_id: str, now: float) -> None:
        """An item of ``session_id`` was queued at loop time ``now`` (before the engine decides)."""
        ...

    def completed(self, session_ids: Iterable[str], now: float) -> None:
        """A batch's outputs (or failures) went out at ``now``: one item of each of these sessions."""
        ...

    def forget(self, session_id: str) -> None:
        """``session_id`` was released: drop whatever the policy keeps about it."""
        ...


def _finite_non_negative(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise EngineConfigError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)


class Coalescing:
    """The coalescing window with eager dispatch (see the module docstring)."""

    silence = None

    def __init__(self, window_s: float = 0.010, eager_remaining: int = 0) -> None:
        self.window_s = _finite_non_negative("coalesce_window_s", window_s)
        if isinstance(eager_remaining, bool) or not isinstance(eager_remaining, int) or eager_remaining < 0:
            raise EngineConfigError(f"eager_remaining must be an integer >= 0, got {eager_remaining!r}")
        self.eager_remaining = eager_remaining

    def run_at_submit(self, view: SessionView) -> bool:
        return view.idle_sessions <= self.eager_remaining

    def decide(self, view: SessionView) -> float | None:
        assert view.oldest_arrival is not None
        deadline = view.oldest_arrival + self.window_s
        if view.ready >= view.max_batch or view.idle_sessions <= self.eager_remaining or view.now >= deadline:
            return None
        return deadline

    def on_silence_output(self, session_id: str, output: Any) -> None:  # never called: no silence
        raise AssertionError("coalescing steps no silent sessions")

    def arrived(self, session_id: str, now: float) -> None:
        return None  # the window does not depend on who sends

    def completed(self, session_ids: Iterable[str], now: float) -> None:
        return None

    def forget(self, session_id: str) -> None:
        return None


# Reply-to-request gaps kept per session. Their median is the session's typical gap: one pause
# is an outlier it ignores, and a lasting change of pace wins after about HISTORY / 2 requests.
HISTORY = 8


@dataclass(slots=True)
class _Pattern:
    """One session's pace: when its last output went out and its latest reply-to-request gaps."""

    done: float | None = None  # fan-out of its last item; None while one is queued or running
    gaps: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY))
    typical: float = 0.0  # median of ``gaps``; 0 until the first one


class ArrivalAware:
    """The coalescing window, waiting only for sessions predicted to join (see the module docstring).

    A request/response client (an openpi robot) sends its next request a roughly constant time
    after it got its reply (its control step, the transport), however long the reply took. So
    the prediction starts from the session's last *output*, not its last arrival: predicting from
    inter-arrival times would keep robots that once fell into two alternating batches apart (each
    half is then, correctly, predicted to arrive during the other half's forward).

    An idle session is expected when it has been served (``completed``), its typical gap puts its
    next request before the deadline, and it has been silent since its output for less than
    ``idle_after`` (>= 1) typical gaps, or the window, whichever is longer (a robot that comes
    straight back after its reply is given at least the window). Later than that it has paused
    and is not waited for. One that never sent, or whose work was dropped unserved, is never
    waited for. Per-session state is one small record per open session, dropped by ``forget``.

    The window runs from the oldest ready item's arrival or from when the worker got free (the
    last ``completed``), whichever is later: an item that queued during a forward could not have
    run sooner, and the sessions that forward just served, due straight back, may still join it.
    Without this, robots split into two alternating batches (after a pause, the first robot to
    resume runs alone) would stay split: each half's items would be past their deadline when the
    other half's replies go out.
    """

    silence = None

    def __init__(self, window_s: float = 0.010, idle_after: float = 3.0) -> None:
        self.window_s = _finite_non_negative("coalesce_window_s", window_s)
        if _finite_non_negative("idle_after", idle_after) < 1:
            raise EngineConfigError(f"idle_after must be >= 1 (typical gaps), got {idle_after!r}")
        self.idle_after = float(idle_after)
        self._patterns: dict[str, _Pattern] = {}
        self._free_at = -math.inf  # when the last forward's outputs went out (the worker got free)

    def arrived(self, session_id: str, now: float) -> None:
        pattern = self._patterns.get(session_id)
        if pattern is None:
            pattern = self._patterns[session_id] = _Pattern()
        elif pattern.done is not None:
            pattern.gaps.append(max(0.0, now - pattern.done))
            gaps = sorted(pattern.gaps)  # the median (statistics.median costs twice this, every request)
            half = len(gaps) // 2
            pattern.typical = gaps[half] if len(gaps) % 2 else (gaps[half - 1] + gaps[half]) / 2
        pattern.done = None

    def completed(self, session_ids: Iterable[str], now: float) -> None:
        self._free_at = now
        for session_id in session_ids:
            pattern = self._patterns.get(session_id)
            if pattern is not None:
                pattern.done = now

    def forget(self, session_id: str) -> None:
        self._patterns.pop(session_id, None)

    def expected(self, view: SessionView, deadline: float) -> tuple[int, float]:
        """Idle sessions predicted to arrive by ``deadline``, and the earliest time one of them stops
        being expected (it has then been silent too long: it paused)."""
        count, until = 0, deadline
        for session_id in view.idle_ids:
            pattern = self._patterns.get(session_id)
            if pattern is None or pattern.done is None:
                continue
            gives_up = pattern.done + max(self.idle_after * pattern.typical, self.window_s)
            if pattern.done + pattern.typical <= deadline and view.now < gives_up:
                count += 1
                until = min(until, gives_up)
        return count, until

    def run_at_submit(self, view: SessionView) -> bool:
        if view.ready >= view.max_batch or self.window_s == 0:
            return True
        # The new item's deadline; an older ready item's is earlier, which can only over-count
        # here: then the engine's next decide() rules with the exact one.
        return self.expected(view, view.now + self.window_s)[0] == 0

    def decide(self, view: SessionView) -> float | None:
        assert view.oldest_arrival is not None
        deadline = max(view.oldest_arrival, self._free_at) + self.window_s
        if view.ready >= view.max_batch or view.now >= deadline:
            return None
        count, until = self.expected(view, deadline)
        return None if count == 0 else until

    def on_silence_output(self, session_id: str, output: Any) -> None:  # never called: no silence
        raise AssertionError("arrival-aware coalescing steps no silent sessions")


@dataclass
class FrameClock:
    """Lockstep steps every ``period_s`` (see the module docstring)."""

    period_s: float
    silence: Callable[[str], Any]
    on_output: Callable[[str, Any], None]
    next_at: float | None = None
    steps: int = 0
    silent_steps: int = 0
    late_steps: int = 0
    missed_steps: int = 0
    lateness_s: list[float] = field(default_factory=list, repr=False)  # bounded: last 1024 steps

    def __post_init__(self) -> None:
        if _finite_non_negative("period_s", self.period_s) == 0:
            raise EngineConfigError("period_s must be > 0")

    def run_at_submit(self, view: SessionView) -> bool:
        return False  # the clock, not the arrival, starts a step

    def decide(self, view: SessionView) -> float | None:
        if self.next_at is None:
            self.next_at = view.now
        if view.now < self.next_at:
            return self.next_at
        late = view.now - self.next_at
        missed = int(late // self.period_s)
        self.missed_steps += missed
        self.late_steps += late > 0.1 * self.period_s
        self.lateness_s = [*self.lateness_s[-1023:], late]
        self.next_at += (missed + 1) * self.period_s
        self.steps += 1
        return None

    def on_silence_output(self, session_id: str, output: Any) -> None:
        self.silent_steps += 1
        self.on_output(session_id, output)

    def arrived(self, session_id: str, now: float) -> None:
        return None  # the clock, not arrivals, drives steps

    def completed(self, session_ids: Iterable[str], now: float) -> None:
        return None

    def forget(self, session_id: str) -> None:
        return None
