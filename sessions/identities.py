"""Identities of the session runtime (architecture invariant 8).

- ``session_id``: allocated by the server (:func:`new_session_id`), unique for the process
  lifetime in practice (random 64 bits), never reused while a tombstone holds it.
- ``event_id``: chosen by the client; a non-negative integer, strictly increasing per session,
  also across reset (checked by :class:`sessions.session.Session`).
- ``chunk_index``: contiguous from 0 per session; a reset restarts it at 0.
- ``request_id``: one per tick, made by a :data:`RequestIdFactory` from ``(session_id,
  chunk_index)``; distinct from any engine-internal routing id (vllm-omni keeps AsyncOmni's
  UUID-suffixed engine id separate from the tick correlation id, seed reference §2.2).
"""

from __future__ import annotations

import itertools
import secrets
from collections.abc import Callable

RequestIdFactory = Callable[[str, int], str]
SessionIdFactory = Callable[[str], str]


def new_session_id(kind: str) -> str:
    """A fresh server-allocated session id, prefixed with the session kind."""
    return f"{kind}-{secrets.token_hex(8)}"


_request_counter = itertools.count(1)  # next() on a C iterator: atomic under the GIL


def default_request_id(session_id: str, chunk_index: int) -> str:
    """``"<session_id>-<chunk_index>-<n>"`` with ``n`` a process-wide tick counter (hex): unique
    even when a reset replays chunk 0, and cheap (no system call per tick)."""
    return f"{session_id}-{chunk_index}-{next(_request_counter):x}"
