"""When a ``realtime``-paced world session starts its next block: the least generate-ahead that
keeps playback continuous (docs/protocols/world.md, "Pacing and latency").

A control applies at the next block boundary, and the block that carries it plays only after
every frame already generated ahead of it, so key-to-frame latency is the wait for the next
block to start plus the media the client holds at that moment. The pacer keeps that media as
small as the measured pipeline allows: the next block starts when what the client still has to
play (plus what is generated but not yet sent) has fallen to the **lead**, the slowest of the
last ``window`` blocks' tick-to-send times plus ``margin_s``, capped at ``cap_s``
(``world.max_ahead_blocks`` blocks). A block generated that way is sent just before the client
runs dry; a slower machine measures slower ticks and generates further ahead by itself.

The client model (the browser page and ``realtime bench world`` play this way): frames play at
``fps`` from the arrival of a session's first chunk; a chunk that arrives after the frames before
it have all played starts playing on arrival (a stall, not a skip).

Pure bookkeeping over times the caller passes in: the world handler owns one pacer per
connection and calls it only from its runner (single owner).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass
class PlaybackPacer:
    """The client's playback as the server models it, and the lead the next block needs.

    ``fps``: playback rate; ``margin_s``: safety margin over the measured tick time;
    ``window``: how many recent tick-to-send times the lead takes the maximum of; ``cap_s``: the
    most media the pacer ever lets the client hold before starting a block.
    """

    fps: float
    margin_s: float
    window: int
    cap_s: float
    play_end: float | None = None  # monotonic time the client runs out of frames
    unsent_frames: int = 0  # generated (committed) but not sent yet
    stalls: int = 0  # chunks sent after the client ran dry (this epoch)
    _tick_s: deque[float] = field(default_factory=deque, repr=False)

    def __post_init__(self) -> None:
        self._tick_s = deque(maxlen=self.window)

    def generated(self, frames: int) -> None:
        """A block committed: its ``frames`` are on their way to the client."""
        self.unsent_frames += frames

    def sent(self, frames: int, now: float, tick_s: float) -> float:
        """A chunk of ``frames`` was written (or, on the client, arrived) at ``now``, ``tick_s``
        after its tick started; returns when its first frame plays."""
        self.unsent_frames = max(0, self.unsent_frames - frames)
        if self.play_end is not None and now > self.play_end:
            self.stalls += 1
        start = now if self.play_end is None else max(self.play_end, now)
        self.play_end = start + frames / self.fps
        self._tick_s.append(tick_s)
        return start

    def lead_s(self) -> float | None:
        """Media the client should still hold when the next block starts; ``None`` before any
        chunk of the session was measured (the next block then waits for the first send)."""
        if not self._tick_s:
            return None
        return min(self.cap_s, max(self._tick_s) + self.margin_s)

    def ahead_s(self, now: float) -> float:
        """Media the client holds at ``now`` plus what is generated and not yet sent."""
        buffered = 0.0 if self.play_end is None else max(0.0, self.play_end - now)
        return buffered + self.unsent_frames / self.fps

    def wait_s(self, now: float) -> float | None:
        """Seconds until the next block should start (0: now); ``None``: wait for a send.

        The first block of a session starts at once (nothing is generated yet)."""
        if self.play_end is None and self.unsent_frames == 0:
            return 0.0
        lead = self.lead_s()
        if lead is None:
            return None
        return max(0.0, self.ahead_s(now) - lead)

    def restart(self) -> None:
        """A reset: the client starts a new stream (its playback restarts with chunk 0).

        The measured tick times are kept: they describe the machine, not the world."""
        self.play_end, self.unsent_frames, self.stalls = None, 0, 0
