"""The replay journal of one duplex session: every server event, by ``server_event_seq``, bounded.

Contract:

- :meth:`Journal.record` gives the next seq (from 1, strictly increasing, never reused) to an
  event's frame and keeps it. At most ``max_events`` entries and ``max_bytes`` of frames are
  kept; the oldest go first. An entry alone larger than ``max_bytes`` is sent but not kept.
- :meth:`Journal.after` is the replay of a resume: every kept entry with a seq above the client's
  cursor, in order, and whether some were lost to the bounds (a gap: the client must resync).
- :meth:`Journal.release_through` is ``session.event_ack``: the client holds every event up to
  a seq, so the journal forgets them early (a later resume from behind that seq is a gap).
- :meth:`Journal.drop_stale` forgets the audio and transcript deltas of epochs before a barge-in,
  so a replay never sends audio of an interrupted response (the live socket drops them too).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Entry:
    seq: int
    epoch: int
    frame: str
    delta: bool  # an audio or transcript delta: dropped once its epoch is superseded


class Journal:
    def __init__(self, max_events: int, max_bytes: int) -> None:
        self.max_events = max_events
        self.max_bytes = max_bytes
        self._entries: deque[Entry] = deque()
        self._bytes = 0
        self._last_seq = 0
        self._trimmed_to = 0  # the highest seq lost to the bounds (0: none)

    @property
    def last_seq(self) -> int:
        return self._last_seq

    def next_seq(self) -> int:
        return self._last_seq + 1

    def record(self, frame: str, epoch: int, *, delta: bool) -> Entry:
        """Keep ``frame`` under the next seq (the frame must already carry it: see ``next_seq``)."""
        self._last_seq += 1
        entry = Entry(self._last_seq, epoch, frame, delta)
        self._entries.append(entry)
        self._bytes += len(frame)
        while self._entries and (len(self._entries) > self.max_events or self._bytes > self.max_bytes):
            old = self._entries.popleft()
            self._bytes -= len(old.frame)
            self._trimmed_to = old.seq
        return entry

    def release_through(self, seq: int) -> int:
        """Forget every entry with a seq at or below ``seq`` (at most ``last_seq``); returns how many."""
        dropped = 0
        while self._entries and self._entries[0].seq <= seq:
            old = self._entries.popleft()
            self._bytes -= len(old.frame)
            dropped += 1
        self._trimmed_to = max(self._trimmed_to, min(seq, self._last_seq))
        return dropped

    def after(self, cursor: int) -> tuple[list[Entry], bool]:
        """Entries with ``seq > cursor``, and True when some of them are no longer kept."""
        return [e for e in self._entries if e.seq > cursor], cursor < self._trimmed_to

    def snapshot(self, max_bytes: int | None = None) -> tuple[int, int, tuple[Entry, ...]]:
        """``(last_seq, trimmed_to, entries)``: what :meth:`restore` rebuilds the journal from;
        with ``max_bytes`` only the newest entries whose frames fit (the older count as trimmed)."""
        if max_bytes is None or self._bytes <= max_bytes:
            return self._last_seq, self._trimmed_to, tuple(self._entries)
        kept: list[Entry] = []
        size = 0
        for entry in reversed(self._entries):
            size += len(entry.frame)
            if size > max_bytes:
                return self._last_seq, max(self._trimmed_to, entry.seq), tuple(reversed(kept))
            kept.append(entry)
        return self._last_seq, self._trimmed_to, tuple(reversed(kept))

    def restore(self, last_seq: int, trimmed_to: int, entries: tuple[Entry, ...]) -> None:
        """Continue a journal taken by :meth:`snapshot` (a session resumed on another replica):
        seqs go on after ``last_seq``; the entries beyond this journal's bounds are trimmed."""
        self._entries = deque()
        self._bytes = 0
        self._last_seq, self._trimmed_to = last_seq, trimmed_to
        for entry in entries:
            self._entries.append(entry)
            self._bytes += len(entry.frame)
        while self._entries and (len(self._entries) > self.max_events or self._bytes > self.max_bytes):
            old = self._entries.popleft()
            self._bytes -= len(old.frame)
            self._trimmed_to = old.seq

    def first_available(self) -> int:
        return self._entries[0].seq if self._entries else self._last_seq + 1

    def drop_stale(self, epoch: int) -> int:
        """Forget the deltas of epochs below ``epoch``; returns how many."""
        kept = deque(e for e in self._entries if not (e.delta and e.epoch < epoch))
        dropped = len(self._entries) - len(kept)
        if dropped:
            self._entries = kept
            self._bytes = sum(len(e.frame) for e in kept)
        return dropped
