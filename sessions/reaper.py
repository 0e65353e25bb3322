"""The reaper: idle timeout, maximum lifetime (with a warning hook) and tombstone retries.

Contract, per session kind (one reaper per :class:`~sessions.manager.SessionManager`), checked
every ``interval_s``:

- ``idle_timeout_s`` (> 0 enables): a session with no tick in flight whose last activity
  (create, event, tick, reset, ``touch()``) is at least this old is closed with reason ``idle``.
- ``max_lifetime_s`` (> 0 enables): a session at least this old is closed with reason
  ``lifetime``, in flight or not. When ``lifetime_warning_s`` > 0, the session's
  ``on_lifetime_warning(seconds_left)`` hook runs once when at most that much time is left
  (a handler sends its client a warning event).
- CLEANUP_FAILED tombstones are retried with their original reason; a success frees the id and
  its admission slot (as vllm-omni's duplex reaper retries failed stage cleanup).

Expiry uses the manager's one release path. Closes of one sweep run concurrently.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sessions.errors import CleanupFailedError
from sessions.session import SessionStatus

if TYPE_CHECKING:
    from sessions.manager import SessionManager

log = logging.getLogger("sessions.reaper")


@dataclass(frozen=True)
class ExpiryPolicy:
    idle_timeout_s: float = 0.0
    max_lifetime_s: float = 0.0
    lifetime_warning_s: float = 0.0
    interval_s: float = 1.0

    def __post_init__(self) -> None:
        for name in ("idle_timeout_s", "max_lifetime_s", "lifetime_warning_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        if not self.interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {self.interval_s!r}")


class Reaper:
    def __init__(
        self, manager: SessionManager, policy: ExpiryPolicy, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._manager = manager
        self.policy = policy
        self._clock = clock
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"reaper-{self._manager.kind}")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.policy.interval_s)
            try:
                await self.sweep()
            except Exception:
                log.exception("reaper sweep failed")

    async def sweep(self) -> list[tuple[str, str]]:
        """One pass; returns ``(session_id, reason)`` for every close it started."""
        policy = self.policy
        now = self._clock()
        actions: list[tuple[str, str]] = []
        jobs: list[Awaitable[object]] = []
        for session in self._manager.list_sessions():
            sid = session.session_id
            if session.status is SessionStatus.CLEANUP_FAILED:
                reason = session.close_reason or "close"
                actions.append((sid, reason))
                jobs.append(self._retry(sid, reason))
                continue
            if session.status not in (SessionStatus.ACTIVE, SessionStatus.FAILED):
                continue
            if policy.max_lifetime_s > 0:
                left = session.created_at + policy.max_lifetime_s - now
                if left <= 0:
                    actions.append((sid, "lifetime"))
                    jobs.append(self._manager.expire(sid, "lifetime"))
                    continue
                if policy.lifetime_warning_s > 0 and left <= policy.lifetime_warning_s:
                    self._warn(session, left)
            if (
                policy.idle_timeout_s > 0
                and not session.busy
                and now - session.last_active_at >= policy.idle_timeout_s
            ):
                actions.append((sid, "idle"))
                jobs.append(self._manager.expire(sid, "idle"))
        if jobs:
            await asyncio.gather(*jobs)
        return actions

    async def _retry(self, session_id: str, reason: str) -> None:
        try:
            await self._manager.close(session_id, reason)  # type: ignore[arg-type]
        except CleanupFailedError as exc:
            log.warning("tombstone cleanup retry failed: %s", exc.message)

    @staticmethod
    def _warn(session, seconds_left: float) -> None:
        if session.lifetime_warned:
            return
        session.lifetime_warned = True
        hook = session.on_lifetime_warning
        if hook is None:
            return
        try:
            hook(seconds_left)
        except Exception:
            log.exception("lifetime warning hook failed for %s", session.session_id)
