"""The lifecycle backend: how the session runtime releases worker-side state.

Every way a session ends or restarts (reset, close, disconnect, idle/lifetime expiry, LRU
eviction, failure cleanup, server shutdown) releases through ``LifecycleBackend.release`` — the
one release path of architecture invariant 4. Every stage runner implements it (an engine for its
slot table; a ``Pipeline`` fans one release out to all its stages).

Contract: ``release`` is idempotent (releasing an unknown session is a no-op), may be slow (the
runtime bounds it with a timeout) and raises on failure, which the runtime records as a
``CLEANUP_FAILED`` tombstone.
"""

from __future__ import annotations

from typing import Protocol

#: Why worker state is released: ``reset`` and ``failed`` restart the session (it lives on); every
#: other reason ends it. The runtime's own: ``close``, ``disconnect``, ``idle``, ``lifetime``,
#: ``evicted``, ``grace_expired`` (a detached session's resume grace ran out), ``shutdown``; a
#: kind may close with its own (the duplex kind's ``step_failed``, ``step_inbox_full``).
ReleaseReason = str
RESTARTS: tuple[ReleaseReason, ...] = ("reset", "failed")


class LifecycleBackend(Protocol):
    async def release(self, session_id: str, reason: ReleaseReason) -> None:
        """Free every piece of worker-side state held for ``session_id``."""
        ...


class NullLifecycle:
    """A backend for session kinds that keep no worker-side state."""

    async def release(self, session_id: str, reason: ReleaseReason) -> None:
        return None
