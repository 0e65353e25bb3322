"""Dispatch policies: when a :class:`~sessions.engine.engine.StageEngine` runs its next batch.

The engine asks its policy only while no forward runs, so work that arrives during a forward joins
the next batch. Two policies:

- :class:`Coalescing` (request-driven kinds: robots, world blocks): run at once when ``max_batch``
  sessions have ready work, or when at most ``eager_remaining`` open sessions have nothing pending
  (waiting cannot grow the batch), or when the window is 0; otherwise wait until the oldest ready
  item's arrival + ``window_s``. The deadline belongs to that item: later arrivals join the batch
  but never extend the wait.
- :class:`FrameClock` (full-duplex voice): the server clock drives steps, not input arrival. Every
  ``period_s`` every open session steps together in one batch; a session with nothing pending
  steps on ``silence(session_id)`` (counted in ``silent_steps``) and its output goes to
  ``on_silence_output``. A step that starts later than its slot counts in ``late_steps``; slots
  missed entirely are skipped (``missed_steps``), never run back to back to catch up.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from sessions.engine.errors import EngineConfigError


@dataclass(frozen=True, slots=True)
class SessionView:
    """What a policy sees of the engine when it decides."""

    now: float
    ready: int  # sessions whose next item can run now
    idle_sessions: int  # open sessions with nothing pending
    oldest_arrival: float | None  # arrival time of the oldest ready item
    max_batch: int


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
