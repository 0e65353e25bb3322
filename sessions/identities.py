"""Identities of the session runtime (architecture invariant 8).

- ``session_id``: allocated by the server (:func:`new_session_id`), unique for the process
  lifetime in practice (random 64 bits), never reused while a tombstone holds it. In a scaled-out
  deployment each replica sets its **replica tag** once at startup (:func:`set_replica_tag`, by
  ``realtime.scale``) and every id it allocates carries it: ``"<kind>-<tag>.<16 hex>"``, so a
  router sends a request that carries the id back to the replica that owns the session
  (:func:`session_replica_tag`). Without a tag (the single-process server) ids are
  ``"<kind>-<16 hex>"`` as always.
- ``event_id``: chosen by the client; a non-negative integer, strictly increasing per session,
  also across reset (checked by :class:`sessions.session.Session`).
- ``chunk_index``: contiguous from 0 per session; a reset restarts it at 0.
- ``request_id``: one per tick, made by a :data:`RequestIdFactory` from ``(session_id,
  chunk_index)``; distinct from any engine-internal routing id (vllm-omni keeps AsyncOmni's
  UUID-suffixed engine id separate from the tick correlation id, seed reference §2.2). The
  default one extends the session id, so it never equals a session id, and it carries the replica
  tag, so it is unique across replicas too.
"""

from __future__ import annotations

import itertools
import re
import secrets
from collections.abc import Callable

RequestIdFactory = Callable[[str, int], str]
SessionIdFactory = Callable[[str], str]

_TAG = re.compile(r"[a-z0-9]{1,32}")
_TAGGED_ID = re.compile(r"[a-z]+-([a-z0-9]{1,32})\.[0-9a-f]{16}")
_replica_tag = ""  # set once at startup by a scaled-out replica; "" in the single-process server


def set_replica_tag(tag: str) -> None:
    """Tag every session id this process allocates from now on with ``tag`` (1-32 lowercase
    letters or digits: a Ray Serve replica's id). Called once, before any session exists."""
    global _replica_tag
    if not _TAG.fullmatch(tag):
        raise ValueError(f"a replica tag is 1-32 lowercase letters or digits, got {tag!r}")
    _replica_tag = tag


def replica_tag() -> str:
    """This process's replica tag; ``""`` when it serves alone."""
    return _replica_tag


def new_session_id(kind: str) -> str:
    """A fresh server-allocated session id, prefixed with the session kind (and the replica tag)."""
    token = secrets.token_hex(8)
    return f"{kind}-{_replica_tag}.{token}" if _replica_tag else f"{kind}-{token}"


def session_replica_tag(session_id: str) -> str | None:
    """The replica tag inside a session id a tagged replica allocated; ``None`` for any other
    string (untagged ids, client-chosen text)."""
    match = _TAGGED_ID.fullmatch(session_id)
    return match.group(1) if match else None


def allocated_elsewhere(session_id: str) -> bool:
    """``session_id`` was allocated by another replica than this process (so it is not here)."""
    tag = session_replica_tag(session_id)
    return tag is not None and tag != _replica_tag


_request_counter = itertools.count(1)  # next() on a C iterator: atomic under the GIL


def default_request_id(session_id: str, chunk_index: int) -> str:
    """``"<session_id>-<chunk_index>-<n>"`` with ``n`` a process-wide tick counter (hex): unique
    even when a reset replays chunk 0, and cheap (no system call per tick)."""
    return f"{session_id}-{chunk_index}-{next(_request_counter):x}"
