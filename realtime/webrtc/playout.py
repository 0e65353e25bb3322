"""The output audio buffer of one WebRTC call, sans-I/O: assistant audio waiting to play.

OpenAI keeps this buffer on the server for WebRTC calls (the ``output_audio_buffer.*`` events):
the model makes audio faster than real time, the call's track plays it at real time, and a
barge-in clears what has not been played. The track pulls one 20 ms frame at a time
(:meth:`Playout.pull`); the connection pushes audio (:meth:`~Playout.push`), marks a response
complete (:meth:`~Playout.finish`) and clears (:meth:`~Playout.clear`). Each call returns the
events it causes: ``output_audio_buffer.started`` when a response's first audio starts to play,
``stopped`` once a complete response has played out, ``cleared`` on a clear.

Bound: at most ``max_seconds`` of audio waits; audio pushed beyond it is dropped (counted in
:attr:`Playout.dropped_samples`), so a model that runs far ahead cannot grow the server's memory.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

import numpy as np

from realtime.protocols.oai_realtime import server_events as ev

RATE = 48_000  # Opus's clock: what the track plays
FRAME_SAMPLES = RATE // 50  # 20 ms, one Opus frame


@dataclass(frozen=True)
class Cleared:
    """What a clear cut short: the response, its message and how much of it had played."""

    response_id: str
    item_id: str
    played_ms: int


class Playout:
    def __init__(self, max_seconds: float = 120.0) -> None:
        self.max_samples = int(max_seconds * RATE)
        self._queue: collections.deque[tuple[str, str, np.ndarray]] = collections.deque()
        self._queued = 0
        self._offset = 0  # samples of the queue's first chunk already played
        self._finished: set[str] = set()
        self.current: tuple[str, str] | None = None  # (response, item) now playing
        self.played_samples = 0  # of the current item
        self.dropped_samples = 0

    @property
    def queued_samples(self) -> int:
        return self._queued

    def push(self, response_id: str, item_id: str, samples: np.ndarray) -> None:
        """Queue int16 mono samples at 48 kHz of ``response_id``'s message ``item_id``."""
        room = self.max_samples - self._queued
        if len(samples) > room:
            self.dropped_samples += len(samples) - max(room, 0)
            samples = samples[: max(room, 0)]
        if len(samples):
            self._queue.append((response_id, item_id, samples))
            self._queued += len(samples)

    def finish(self, response_id: str) -> list[ev.ServerEvent]:
        """``response_id`` has sent all its audio; ``stopped`` follows once it has played."""
        if (self.current and self.current[0] == response_id) or any(c[0] == response_id for c in self._queue):
            self._finished.add(response_id)
        return self._stop_if_done()

    def pull(self) -> tuple[np.ndarray, list[ev.ServerEvent]]:
        """The next 20 ms to play (silence when nothing is queued) and the events it causes."""
        out = np.zeros(FRAME_SAMPLES, np.int16)
        events: list[ev.ServerEvent] = []
        filled = 0
        while filled < FRAME_SAMPLES and self._queue:
            response_id, item_id, chunk = self._queue[0]
            if self.current is None or self.current[0] != response_id:
                if self.current is not None:
                    events.append(ev.OutputAudioStopped(self.current[0]))
                    self._finished.discard(self.current[0])
                self.current, self.played_samples = (response_id, item_id), 0
                events.append(ev.OutputAudioStarted(response_id))
            take = min(FRAME_SAMPLES - filled, len(chunk) - self._offset)
            out[filled : filled + take] = chunk[self._offset : self._offset + take]
            filled += take
            self._offset += take
            self._queued -= take
            self.played_samples += take
            if self._offset == len(chunk):
                self._queue.popleft()
                self._offset = 0
        return out, events + self._stop_if_done()

    def clear(self) -> tuple[Cleared | None, list[ev.ServerEvent]]:
        """Drop every queued sample. What was playing (and for how long) and ``cleared``; nothing
        when no response was playing or waiting."""
        waiting = self._queue[0][:2] if self._queue else None
        playing = self.current or waiting
        self._queue.clear()
        self._queued = self._offset = 0
        self._finished.clear()
        if playing is None:
            return None, []
        cut = Cleared(playing[0], playing[1], self.played_samples * 1000 // RATE if self.current else 0)
        self.current, self.played_samples = None, 0
        return cut, [ev.OutputAudioCleared(playing[0])]

    def _stop_if_done(self) -> list[ev.ServerEvent]:
        if self.current is None or self.current[0] not in self._finished:
            return []
        if any(chunk[0] == self.current[0] for chunk in self._queue):
            return []
        response_id = self.current[0]
        self._finished.discard(response_id)
        self.current = None
        return [ev.OutputAudioStopped(response_id)]
