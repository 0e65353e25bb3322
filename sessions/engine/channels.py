"""Chunks and the bounded async channels that carry them between stages and to sessions.

A :class:`Chunk` is ``(session_id, epoch, seq, payload, final)``: ``seq`` is contiguous from 0
within one stream. A batched engine's stream is one chunk with ``final`` set; a streaming
stage's and a pipeline's streams end when their channel closes (their chunks are never
``final``: the last one is known only once the stage stops). Every channel is bounded; what happens when
it is full is the stream kind's :data:`BackpressurePolicy`:

- ``"block"``: the producer waits for room. An engine does not schedule a streaming item whose
  output channel is full, so a slow reader pauses only its own session's work, and the pause
  propagates upstream through every blocked hop (memory stays bounded by the channel sizes).
  Use it for anything that must arrive whole (tokens, text, action chunks, latent blocks).
- ``"drop_oldest"``: the producer never waits; when full, the oldest buffered chunk is dropped
  and counted (``engine_backpressure_dropped_total``), so the reader skips ahead and sees a gap
  in ``seq``. Use it for live media where a late frame is worthless (preview video frames).

Channels live on one event loop; none of their methods are thread-safe.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from sessions.engine.errors import EngineConfigError

BackpressurePolicy = Literal["block", "drop_oldest"]
POLICIES: tuple[str, ...] = ("block", "drop_oldest")


@dataclass(frozen=True, slots=True)
class Chunk:
    session_id: str
    epoch: int
    seq: int
    payload: Any
    final: bool


class ChannelFullError(Exception):
    """``put_nowait`` on a full ``block`` channel (a scheduling bug: callers check ``has_room``)."""


def check_policy(policy: str) -> None:
    if policy not in POLICIES:
        raise EngineConfigError(f"backpressure policy must be one of {POLICIES}, got {policy!r}")


def check_capacity(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise EngineConfigError(f"{name} must be an integer >= 1, got {value!r}")


class Channel:
    """A bounded FIFO of chunks with one backpressure policy, closable with an error."""

    def __init__(
        self,
        capacity: int,
        policy: BackpressurePolicy = "block",
        on_drop: Callable[[Chunk], None] | None = None,
        on_space: Callable[[], None] | None = None,
        depth: Any = None,
    ) -> None:
        check_capacity("channel capacity", capacity)
        check_policy(policy)
        self.capacity = capacity
        self.policy = policy
        self._items: deque[Chunk] = deque()
        self._getters: deque[asyncio.Future] = deque()
        self._putters: deque[asyncio.Future] = deque()
        self._closed = False
        self._error: BaseException | None = None
        self._on_drop = on_drop
        self._on_space = on_space
        self._depth = depth  # a prometheus Gauge child, or None

    def __len__(self) -> int:
        return len(self._items)

    @property
    def closed(self) -> bool:
        return self._closed

    def has_room(self) -> bool:
        return self.policy == "drop_oldest" or len(self._items) < self.capacity

    def put_nowait(self, chunk: Chunk) -> None:
        if self._closed:
            return
        if len(self._items) >= self.capacity:
            if self.policy == "block":
                raise ChannelFullError(f"channel full ({self.capacity})")
            dropped = self._items.popleft()
            self._count(-1)
            if self._on_drop is not None:
                self._on_drop(dropped)
        self._items.append(chunk)
        self._count(1)
        _wake(self._getters)

    async def put(self, chunk: Chunk) -> None:
        """Append; under ``block`` wait for room first. A closed channel discards the chunk."""
        while not self._closed and not self.has_room():
            fut = asyncio.get_running_loop().create_future()
            self._putters.append(fut)
            await fut
        self.put_nowait(chunk)

    async def get(self) -> Chunk | None:
        """The next chunk; ``None`` once closed cleanly and drained; raises the close error."""
        while not self._items:
            if self._closed:
                if self._error is not None:
                    raise self._error
                return None
            fut = asyncio.get_running_loop().create_future()
            self._getters.append(fut)
            await fut
        chunk = self._items.popleft()
        self._count(-1)
        self._space()
        return chunk

    def purge(self, predicate: Callable[[Chunk], bool]) -> list[Chunk]:
        """Remove buffered chunks matching ``predicate``; returns them."""
        removed = [c for c in self._items if predicate(c)]
        if removed:
            self._items = deque(c for c in self._items if not predicate(c))
            self._count(-len(removed))
            self._space()
        return removed

    def close(self, error: BaseException | None = None) -> None:
        """No more puts. With ``error``, buffered chunks are discarded and readers get the error."""
        if self._closed:
            return
        self._closed = True
        self._error = error
        if error is not None:
            self._count(-len(self._items))
            self._items.clear()
        _wake(self._getters)
        _wake(self._putters)

    def _space(self) -> None:
        _wake(self._putters)
        if self._on_space is not None:
            self._on_space()

    def _count(self, delta: int) -> None:
        if self._depth is not None and delta:
            self._depth.inc(delta)


def _wake(waiters: deque[asyncio.Future]) -> None:
    while waiters:
        fut = waiters.popleft()
        if not fut.done():
            fut.set_result(None)
