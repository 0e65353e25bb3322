"""Sessions that survive their replica: the checkpoint a kind takes, the store that keeps it, and
the hook a kind implements (phase 2 of docs/scaling.md wires each kind to it).

The contract, per kind that implements :class:`ResumableKind`:

- **Checkpoint at tick boundaries.** After a tick commits, the session's one owner (its
  connection's runner) calls ``kind.checkpoint(session_id)`` and puts the result to the store;
  puts are fire-and-forget (a slow store never holds a tick) and keep only the newest ``seq``
  per session, so a put that arrives late changes nothing.
- **Small and self-contained.** A checkpoint holds what rebuilds the session elsewhere, not its
  device state: the conversation items and session config (voice), the event journal (duplex),
  the prompt, seed and control history (world), the previous action chunk (robot RTC). KV caches
  are recomputed from it on the new replica. At most ``replicas.checkpoint_max_bytes``.
- **Restore where the router places it.** A request naming a session whose replica is gone is
  placed by capacity on a live replica (``realtime.scale.placement``); that replica's session
  check finds the checkpoint and calls ``kind.restore(checkpoint)`` instead of answering
  ``session_not_found``. A closed session's checkpoint is deleted through the release path.

:class:`CheckpointTable` is the store's state (bounds and expiry), :class:`CheckpointStore` the
async API the replicas use; ``realtime.scale.checkpoints`` keeps the table in a detached Ray
actor, one per cluster.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from sessions.errors import SessionError


class CheckpointTooLargeError(SessionError):
    """A session's resumable state is over ``replicas.checkpoint_max_bytes``; the older
    checkpoint stays."""

    code = "checkpoint_too_large"


@dataclass(frozen=True)
class Checkpoint:
    """One session's resumable state at a tick boundary (``seq``: that boundary; newer wins)."""

    session_id: str
    kind: str
    seq: int
    state: bytes


class CheckpointStore(Protocol):
    async def put(self, checkpoint: Checkpoint) -> bool:
        """Keep ``checkpoint`` unless the store holds a newer one (then ``False``); raises
        :class:`CheckpointTooLargeError`."""
        ...

    async def get(self, session_id: str) -> Checkpoint | None: ...

    async def delete(self, session_id: str) -> None: ...

    async def stats(self) -> dict[str, int]:
        """``sessions`` and ``bytes`` held now."""
        ...


class ResumableKind(Protocol):
    """What a session kind implements so its sessions outlive their replica (module docstring)."""

    name: str

    def checkpoint(self, session_id: str) -> Checkpoint | None:
        """The session's state after its last committed tick; ``None``: nothing to resume yet.
        Called by the session's owner, between ticks."""
        ...

    async def restore(self, checkpoint: Checkpoint) -> Any:
        """Recreate the session here from ``checkpoint`` (same id; KV recomputed) and return it."""
        ...


class CheckpointTable:
    """The store's state: one checkpoint per session, at most ``max_bytes`` each and
    ``max_total_bytes`` together (the ones written longest ago go first), each dropped
    ``ttl_s`` after its last put."""

    def __init__(
        self, max_bytes: int, max_total_bytes: int, ttl_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.max_bytes = max_bytes
        self.max_total_bytes = max_total_bytes
        self.ttl_s = ttl_s
        self._clock = clock
        self._entries: collections.OrderedDict[str, tuple[float, Checkpoint]] = collections.OrderedDict()
        self._bytes = 0

    def _drop(self, session_id: str) -> None:
        _, old = self._entries.pop(session_id)
        self._bytes -= len(old.state)

    def _expire(self) -> None:
        deadline = self._clock() - self.ttl_s
        while self._entries:
            session_id, (written, _) = next(iter(self._entries.items()))
            if written > deadline:
                break
            self._drop(session_id)

    def put(self, checkpoint: Checkpoint) -> bool:
        size = len(checkpoint.state)
        if size > self.max_bytes:
            raise CheckpointTooLargeError(
                f"the state of session {checkpoint.session_id} is {size} bytes, over {self.max_bytes}",
                session_id=checkpoint.session_id,
                limit=self.max_bytes,
            )
        self._expire()
        held = self._entries.get(checkpoint.session_id)
        if held is not None:
            if held[1].seq > checkpoint.seq:
                return False
            self._drop(checkpoint.session_id)
        while self._entries and self._bytes + size > self.max_total_bytes:
            self._drop(next(iter(self._entries)))
        self._entries[checkpoint.session_id] = (self._clock(), checkpoint)
        self._bytes += size
        return True

    def get(self, session_id: str) -> Checkpoint | None:
        self._expire()
        held = self._entries.get(session_id)
        return held[1] if held is not None else None

    def delete(self, session_id: str) -> None:
        if session_id in self._entries:
            self._drop(session_id)

    def stats(self) -> dict[str, int]:
        self._expire()
        return {"sessions": len(self._entries), "bytes": self._bytes}
