"""Reply pacing for a streaming LLM stage: generate only as fast as the client plays the audio, and
run a new turn's first clause ahead of other replies' continuations.

The client plays a reply in real time, so a reply generated ten times faster than it is spoken only
takes CPU from the sessions whose turn just ended. :class:`PlaybackClock` is a response's playback
position as the server knows it (the kind records the audio it sends; playback is taken to start
at the first audio and run in real time); its ``lead_s`` is how much sent audio is not played yet.
:class:`StepGate` admits model steps (one forward each) by urgency: first-clause work first, then
replies whose lead is below ``urgent_lead_s`` (playback would soon stall), then the rest; a step
waits while a reply of a more urgent level is generating. ``ReplyPace.wait`` sleeps a
reply whose lead reached ``max_lead_s`` until it is back under it.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

RECHECK_S = 0.05  # a waiting relaxed step re-evaluates its urgency this often (its lead shrinks)


DEFAULT_CHARS_PER_S = 15.0  # speech rate assumed for text not yet voiced, before a response's first audio


class PlaybackClock:
    """One response's audio as the client plays it; thread-safe (the kind writes, a worker reads).

    ``sent(seconds, chars)`` records audio sent and how many characters of clause text it voices;
    playback starts at the first ``sent`` and runs in real time, stalling (not counted) when it
    catches up with what was sent. ``queued(chars)`` records clause text handed to the TTS and
    not voiced yet: when the TTS falls behind (a loaded box), the text waiting for it is lead
    too, or the LLM would run on and the audio arrive later in one burst far ahead of playback.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._ends_at: float | None = None  # when the audio sent so far has played out
        self._queued_chars = 0
        self._voiced_chars = 0
        self._sent_s = 0.0

    def queued(self, chars: int) -> None:
        with self._lock:
            self._queued_chars += chars

    def sent(self, seconds: float, chars: int = 0) -> None:
        now = self._clock()
        with self._lock:
            self._ends_at = max(self._ends_at or now, now) + seconds
            self._sent_s += seconds
            self._voiced_chars += chars

    def lead_s(self) -> float:
        """Sent audio not yet played (0 before the first audio and after a stall)."""
        with self._lock:
            ends_at = self._ends_at
        return 0.0 if ends_at is None else max(0.0, ends_at - self._clock())

    def pending_s(self) -> float:
        """Queued text not voiced yet, in seconds at this response's own speech rate so far
        (:data:`DEFAULT_CHARS_PER_S` before its first voiced text)."""
        with self._lock:
            pending = self._queued_chars - self._voiced_chars
            rate = self._voiced_chars / self._sent_s if self._voiced_chars and self._sent_s else 0.0
        return max(0, pending) / (rate or DEFAULT_CHARS_PER_S)


@dataclass(frozen=True, slots=True)
class PacingPolicy:
    """``max_lead_s``: a reply's generation sleeps while its lead is at least this (0: never).
    ``urgent_lead_s``: below this lead a reply's steps go before relaxed replies' (``BEHIND``).
    """

    max_lead_s: float = 4.0
    urgent_lead_s: float = 1.0

    def __post_init__(self) -> None:
        if self.max_lead_s < 0 or self.urgent_lead_s < 0:
            raise ValueError("max_lead_s and urgent_lead_s must be >= 0")
        if self.max_lead_s and self.urgent_lead_s > self.max_lead_s:
            raise ValueError(
                f"urgent_lead_s ({self.urgent_lead_s}) must be <= max_lead_s ({self.max_lead_s})"
            )


DEFAULT_PACING = PacingPolicy()


FIRST, BEHIND, RELAXED = 0, 1, 2  # a reply's step levels, most urgent first (ReplyPace.level)


class ReplyPace:
    """One reply's pacing state: whether its first clause is out, and its playback clock.

    Its steps' level (:meth:`level`): ``FIRST`` before its first clause (time-to-first-audio
    work) and while its playback is stalled (the sent audio has played out: the listener hears
    the same silence as before a first clause, so a stalled reply does not wait behind new
    turns), ``BEHIND`` while its lead is under ``urgent_lead_s`` (playback would soon stall),
    ``RELAXED`` otherwise. ``clock`` None (a text-only reply, or one whose audio the caller does
    not track): always ``FIRST``, and it never sleeps, as without pacing. Once ``stop`` is set (an
    abort) it is ``FIRST`` too: the step that notices the abort must not wait behind other
    replies (the session's next turn waits for it to end).
    """

    def __init__(
        self, policy: PacingPolicy, clock: PlaybackClock | None, stop: threading.Event | None = None
    ) -> None:
        self.policy = policy
        self.clock = clock
        self.stop = stop
        self.spoke = False  # the first clause went to the TTS

    def level(self) -> int:
        if self.clock is None or not self.spoke or (self.stop is not None and self.stop.is_set()):
            return FIRST
        lead = self.clock.lead_s()
        if lead <= 0.0:  # playback caught up: the user hears silence, as before a first clause
            return FIRST
        return BEHIND if lead < self.policy.urgent_lead_s else RELAXED

    def emitted(self, clauses: tuple[str, ...]) -> None:
        """The reply completed ``clauses`` (handed to the TTS): the first makes it ``spoke``, and
        their text is queued on the clock until the kind reports it voiced."""
        if clauses:
            self.spoke = True
            if self.clock is not None:
                self.clock.queued(sum(len(c) for c in clauses))

    def _lead_s(self) -> float:
        assert self.clock is not None
        return self.clock.lead_s() + self.clock.pending_s()

    def ahead(self) -> bool:
        """The lead (sent audio not played plus queued text not voiced) reached ``max_lead_s``
        (after the first clause; never when pacing is off)."""
        if self.clock is None or not self.policy.max_lead_s or not self.spoke:
            return False
        return self._lead_s() >= self.policy.max_lead_s

    def wait(self, stop: threading.Event) -> None:
        """Sleep while the lead is at least ``max_lead_s`` (returns early once ``stop`` is set)."""
        while self.ahead() and not stop.is_set():
            stop.wait(max(self._lead_s() - self.policy.max_lead_s, 0.0) + RECHECK_S)


class StepGate:
    """At most ``permits`` steps at once, and a step only while no reply is at a more urgent level.

    Thread-safe. A reply (anything with ``level()``) is registered at its level at each of its
    ``step`` s and ``update`` s and stays so between them, so a reply in its first clause holds
    the others' continuations back across its whole first clause, not only during its forwards;
    ``finish`` forgets it. A waiting step re-evaluates its level every ``RECHECK_S`` (a relaxed
    reply's lead shrinks as its audio plays).
    """

    def __init__(self, permits: int) -> None:
        if permits < 1:
            raise ValueError(f"permits must be >= 1, got {permits}")
        self.permits = permits
        self._cond = threading.Condition()
        self._running = 0
        self._levels: dict[int, int] = {}  # id() of each reply -> its level at its last step or update
        self.yielded = 0  # steps that waited for a more urgent reply (metrics, tests)

    @contextlib.contextmanager
    def step(self, reply: ReplyPace) -> Iterator[None]:
        """One model step of ``reply``: waits for a permit and for no more urgent reply."""
        with self._cond:
            waited = False
            while True:
                level = self._mark(reply)
                blocked = any(other < level for other in self._levels.values())
                if self._running < self.permits and not blocked:
                    break
                waited = waited or blocked
                self._cond.wait(None if level == FIRST else RECHECK_S)
            self.yielded += waited
            self._running += 1
        try:
            yield
        finally:
            with self._cond:
                self._running -= 1
                self._cond.notify_all()

    def update(self, reply: ReplyPace) -> None:
        """Re-register ``reply`` (its first clause went out, or its lead changed)."""
        with self._cond:
            self._mark(reply)
            self._cond.notify_all()

    def finish(self, reply: ReplyPace) -> None:
        with self._cond:
            self._levels.pop(id(reply), None)
            self._cond.notify_all()

    def _mark(self, reply: ReplyPace) -> int:
        level = self._levels[id(reply)] = reply.level()
        return level
