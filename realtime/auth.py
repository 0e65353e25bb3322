"""Request checks made before any route runs: API key and websocket ``Origin``.

Contract of :func:`check_request` (called by the app's guard middleware for every HTTP request and
websocket handshake, so no route or session kind has to remember it):

- With ``server.api_keys`` set, every path except the probes (:data:`OPEN_PATHS`: ``/healthz``,
  ``/readyz``) needs one of the keys, as ``Authorization: Api-Key <key>`` (openpi-client's form),
  ``Authorization: Bearer <key>`` (OpenAI clients), the query parameter ``?api_key=<key>``
  (browser pages, which cannot set headers on a websocket) or, on websockets, the subprotocol
  ``openai-insecure-api-key.<key>`` (OpenAI's browser convention). A missing or wrong key is refused
  with HTTP 401. The presented key is compared with **every** configured key in constant time
  (SHA-256 digests through ``hmac.compare_digest``, no early exit), so timing reveals neither
  which key nor how much of one matched.
- A websocket handshake that carries an ``Origin`` header (browsers always send one) must come
  from the same origin as the request (``Origin``'s host:port equals ``Host``) or from an entry of
  ``server.allowed_origins`` (exact ``scheme://host[:port]``, or ``*`` for any); otherwise HTTP
  403. Clients that send no ``Origin`` (robots, SDKs, scripts) pass. Plain HTTP requests are not
  origin-checked: without CORS headers a browser page of another origin cannot read the answers.

Refusals happen before the websocket is accepted: the guard answers with the HTTP status.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlsplit

from starlette.types import Scope

from realtime.config import ServerConfig

OPEN_PATHS = frozenset({"/healthz", "/readyz"})
API_KEY_PARAM = "api_key"
KEY_SUBPROTOCOL_PREFIX = "openai-insecure-api-key."  # how OpenAI's browser clients send a key
_SCHEMES = ("api-key", "bearer")


@dataclass(frozen=True)
class Refusal:
    """Why a request is refused: the HTTP ``status`` and a short ``reason`` (no secrets in it)."""

    status: int
    reason: str


def _headers(scope: Scope) -> Mapping[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}


def presented_key(headers: Mapping[str, str], query_string: bytes) -> str | None:
    """The key a request presents: ``Authorization``, the key subprotocol, or ``?api_key=``."""
    scheme, _, value = headers.get("authorization", "").strip().partition(" ")
    if scheme.lower() in _SCHEMES and value.strip():
        return value.strip()
    for offered in headers.get("sec-websocket-protocol", "").split(","):
        offered = offered.strip()
        if offered.startswith(KEY_SUBPROTOCOL_PREFIX) and len(offered) > len(KEY_SUBPROTOCOL_PREFIX):
            return offered[len(KEY_SUBPROTOCOL_PREFIX) :]
    for name, value in parse_qsl(query_string.decode("latin-1"), keep_blank_values=True):
        if name == API_KEY_PARAM and value:
            return value
    return None


def key_matches(presented: str, keys: Iterable[str]) -> bool:
    """True if ``presented`` equals one of ``keys``; every key is compared, in constant time."""
    digest = hashlib.sha256(presented.encode("utf-8", "surrogateescape")).digest()
    found = False
    for key in keys:
        found |= hmac.compare_digest(digest, hashlib.sha256(key.encode()).digest())
    return found


def origin_allowed(origin: str, host: str, allowed: Iterable[str]) -> bool:
    """Same origin (``origin``'s host:port equals the ``Host`` header) or listed in ``allowed``."""
    allowed = tuple(allowed)
    if "*" in allowed or origin.rstrip("/").lower() in (a.rstrip("/").lower() for a in allowed):
        return True
    try:
        netloc = urlsplit(origin).netloc.lower()
    except ValueError:
        return False
    return bool(netloc) and netloc == host.strip().lower()


def check_request(scope: Scope, server: ServerConfig) -> Refusal | None:
    """``None`` if the HTTP request or websocket handshake in ``scope`` may proceed, else why not."""
    headers = _headers(scope)
    if server.api_keys and scope.get("path") not in OPEN_PATHS:
        key = presented_key(headers, scope.get("query_string", b""))
        if key is None or not key_matches(key, server.api_keys):
            return Refusal(401, "unauthorized: a valid API key is required")
    if scope["type"] == "websocket" and "origin" in headers:
        if not origin_allowed(headers["origin"], headers.get("host", ""), server.allowed_origins):
            return Refusal(403, "forbidden: origin not allowed")
    return None
