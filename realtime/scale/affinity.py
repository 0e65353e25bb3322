"""What a request says about placement: the session it names and the kind of session it opens.

Read by the router in Serve's proxy (``realtime.scale.router``) and by the replica's session
check (``realtime.scale.replica``); pure functions of the ASGI scope, no Ray import.

- A request **names a session** with the query parameter ``session_id`` or the header Serve maps to
  ``RequestMetadata.session_id`` (``x-session-id``, or ``RAY_SERVE_SESSION_ID_HEADER_KEY``); the
  query wins. A name the router can route is a session id a tagged replica allocated
  (``sessions.identities``) or, for calls between replicas, :func:`replica_key`.
- A websocket **opens a kind** by its path (the kinds' websocket routes, which every replica
  publishes in its report). A path several kinds share (``/v1/realtime``: duplex and voice) is
  told apart by ``mode=<kind>`` in the query; without it, the last kind listed for the path (the
  app's route order: the one that takes the path unconditionally) opens.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import parse_qs

from sessions.identities import session_replica_tag

SESSION_QUERY = "session_id"
# Serve's own session header (ray.serve._private.constants.SERVE_SESSION_ID): the same variable
SESSION_HEADER = os.environ.get("RAY_SERVE_SESSION_ID_HEADER_KEY", "x-session-id")
REPLICA_KEY_PREFIX = "replica:"
_TAG = re.compile(r"[a-z0-9]{1,32}")

Routes = tuple[tuple[str, str], ...]  # (websocket path, kind), in the app's route order


def replica_key(tag: str) -> str:
    """The ``session_id`` of a call that must reach replica ``tag`` (the cluster views' peer calls)."""
    return REPLICA_KEY_PREFIX + tag


def owner_of(name: str | None) -> str | None:
    """The replica tag a session name routes to, or ``None`` (no name, or one no replica issued)."""
    if not name:
        return None
    if name.startswith(REPLICA_KEY_PREFIX):
        tag = name[len(REPLICA_KEY_PREFIX) :]
        return tag if _TAG.fullmatch(tag) else None
    return session_replica_tag(name)


def _header_matches(key: str) -> bool:
    # as Serve's proxy: case-insensitive, '-' and '_' alike (proxies rewrite the separator)
    return key.lower().replace("-", "_") == SESSION_HEADER.lower().replace("-", "_")


def query_value(query_string: bytes | str, key: str) -> str | None:
    """The first value of ``key`` in a query string, or ``None``."""
    text = query_string.decode("latin-1") if isinstance(query_string, bytes) else query_string
    values = parse_qs(text).get(key)
    return values[0] if values else None


def named_session(scope: Mapping[str, Any]) -> str | None:
    """The session a request names: query ``session_id``, else the session header."""
    name = query_value(scope.get("query_string", b""), SESSION_QUERY)
    if name:
        return name
    for key, value in scope.get("headers", ()):
        if _header_matches(key.decode("latin-1")):
            return value.decode("latin-1") or None
    return None


def websocket_routes(kinds: Iterable[Any]) -> Routes:
    """The (path, kind) table of the kinds' websocket routes, in the app's order."""
    from starlette.routing import WebSocketRoute

    return tuple(
        (route.path, kind.name)
        for kind in kinds
        for route in kind.routes()
        if isinstance(route, WebSocketRoute)
    )


def kind_of(path: str, query_string: bytes | str, routes: Routes) -> str | None:
    """The kind a websocket to ``path`` opens (module docstring), or ``None`` for no kind's path."""
    kinds = [kind for route_path, kind in routes if route_path == path]
    if len(kinds) <= 1:
        return kinds[0] if kinds else None
    mode = query_value(query_string, "mode")
    return mode if mode in kinds else kinds[-1]
