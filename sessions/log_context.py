"""Session-scoped logging context.

Every log line emitted while ``session_context(session_id)`` is active (or from a task created
inside it: contextvars are copied into tasks and ``asyncio.to_thread``) carries that session id.
The formatter in ``realtime.logs`` reads :data:`current_session_id`; this module lives in
``sessions/`` so that the runtime and models can tag lines without importing the server.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

current_session_id: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "current_session_id", default=None
)


@contextlib.contextmanager
def session_context(session_id: str) -> Iterator[None]:
    """Tag log lines in this block (and tasks it spawns) with ``session_id``."""
    token = current_session_id.set(session_id)
    try:
        yield
    finally:
        current_session_id.reset(token)
