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
  from one of the server's public origins, compared as scheme, host and port (default ports
  filled in: ``https://app.example`` is ``https://app.example:443``): the entries of
  ``server.allowed_origins`` (``*`` for any), or, when that is empty, the loopback names
  (``localhost``, ``127.0.0.1``, ``[::1]``) on the port the connection was accepted on, with the
  connection's own scheme (``https`` under TLS). Never the request's own ``Host`` header: a page
  of ``http://evil.example:8765`` that rebinds that name to this server sends a matching
  ``Host``. Otherwise HTTP 403. Clients that send no ``Origin`` (robots, SDKs, scripts) pass.
  Plain HTTP requests are not origin-checked: without CORS headers a browser page of another
  origin cannot read the answers.

- An **ephemeral client secret** (``ek_...``, minted by ``POST /v1/realtime/client_secrets`` or
  the beta ``POST /v1/realtime/sessions``: ``realtime.client_secrets``) is accepted in place of a
  key, in any of the same places, on a websocket to ``/v1/realtime`` (:data:`SECRET_PATHS`) and on
  the requests that place a WebRTC call (:data:`CALL_PATHS`), with or without ``server.api_keys``. It is redeemed once, by :func:`redeem_secret`, which the guard
  calls only when the connection is admitted (not refused as loading, draining or unavailable, so
  a retry can still use it): the session config it was minted with goes to the connection in
  ``scope["state"][BOUND_SESSION]``. Elsewhere, or expired, used or unknown, it gets OpenAI's
  401 body (``invalid_api_key``), the same in every case.

Refusals happen before the websocket is accepted: the guard answers with the HTTP status. The
origin is checked before a secret is redeemed, so a refused origin never uses one up.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlsplit

from starlette.types import Scope

from realtime.client_secrets import PREFIX as SECRET_PREFIX
from realtime.client_secrets import ClientSecrets
from realtime.config import ServerConfig

OPEN_PATHS = frozenset({"/healthz", "/readyz"})
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")  # the default public origins' hosts
_DEFAULT_PORTS = {"http": 80, "https": 443}
API_KEY_PARAM = "api_key"
KEY_SUBPROTOCOL_PREFIX = "openai-insecure-api-key."  # how OpenAI's browser clients send a key
_SCHEMES = ("api-key", "bearer")
SECRET_PATHS = frozenset({"/v1/realtime"})  # websockets an ephemeral client secret opens
CALL_PATHS = frozenset({"/v1/realtime/calls", "/v1/realtime"})  # POSTs that place a WebRTC call
BOUND_SESSION = "realtime.client_secret_session"  # the redeemed secret's config, in scope["state"]
_PENDING_SECRET = "realtime.client_secret"  # a valid secret to redeem once admitted, in scope["state"]
#: OpenAI's answer to a wrong key, also for an expired, used or forged client secret (never echoed)
INVALID_API_KEY_BODY = json.dumps(
    {
        "error": {
            "message": "Incorrect API key provided.",
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_api_key",
        }
    }
)


@dataclass(frozen=True)
class Refusal:
    """Why a request is refused: the HTTP ``status`` and a short ``reason`` (no secrets in it)."""

    status: int
    reason: str
    json_body: str | None = None  # an OpenAI-shaped error body to send instead of ``reason``


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


@dataclass(frozen=True)
class Origin:
    """A web origin as browsers compare them: scheme, host (lower case) and port."""

    scheme: str
    host: str
    port: int


def parse_origin(text: str) -> Origin | None:
    """``http[s]://host[:port]`` (a trailing ``/`` allowed) as an :class:`Origin`, else ``None``
    (``null``, other schemes, paths, queries, user info, bad ports)."""
    try:
        parts = urlsplit(text.strip())
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not parts.hostname or parts.username is not None:
        return None
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        return None
    return Origin(scheme, parts.hostname.lower(), port if port is not None else _DEFAULT_PORTS[scheme])


def public_origins(scope: Scope, configured: Iterable[str]) -> frozenset[Origin] | None:
    """The origins a browser page may open websockets from; ``None`` means any (``*``)."""
    configured = tuple(configured)
    if "*" in configured:
        return None
    if configured:
        return frozenset(o for o in map(parse_origin, configured) if o is not None)
    scheme = "https" if scope.get("scheme") in ("https", "wss") else "http"
    port = (scope.get("server") or (None, None))[1]
    if port is None:  # not on a TCP socket: no loopback origin to name
        return frozenset()
    return frozenset(Origin(scheme, host, port) for host in LOOPBACK_HOSTS)


def origin_allowed(origin: str, allowed: frozenset[Origin] | None) -> bool:
    """``origin`` (an ``Origin`` header) is one of ``allowed`` (``None``: any origin)."""
    if allowed is None:
        return True
    parsed = parse_origin(origin)
    return parsed is not None and parsed in allowed


def check_request(scope: Scope, server: ServerConfig, secrets: ClientSecrets | None = None) -> Refusal | None:
    """``None`` if the HTTP request or websocket handshake in ``scope`` may proceed, else why not.
    A valid client secret it carries is noted in ``scope["state"]`` for :func:`redeem_secret`."""
    headers = _headers(scope)
    websocket = scope["type"] == "websocket"
    if websocket and "origin" in headers:
        if not origin_allowed(headers["origin"], public_origins(scope, server.allowed_origins)):
            return Refusal(403, "forbidden: origin not allowed")
    key = presented_key(headers, scope.get("query_string", b""))
    is_api_key = key is not None and bool(server.api_keys) and key_matches(key, server.api_keys)
    if key is not None and key.startswith(SECRET_PREFIX) and secrets is not None and not is_api_key:
        if not (opens_session(scope) and secrets.holds(key)):
            return Refusal(401, "unauthorized: invalid client secret", INVALID_API_KEY_BODY)
        scope.setdefault("state", {})[_PENDING_SECRET] = key
        return None
    if server.api_keys and scope.get("path") not in OPEN_PATHS and not is_api_key:
        return Refusal(401, "unauthorized: a valid API key is required")
    return None


def is_call(scope: Scope) -> bool:
    """``scope`` is an HTTP request that places a WebRTC call (``POST`` to :data:`CALL_PATHS`)."""
    return scope["type"] == "http" and scope.get("method") == "POST" and scope.get("path") in CALL_PATHS


def opens_session(scope: Scope) -> bool:
    """``scope`` starts a voice session: a websocket to :data:`SECRET_PATHS` or a call."""
    return (scope["type"] == "websocket" and scope.get("path") in SECRET_PATHS) or is_call(scope)


def redeem_secret(scope: Scope, secrets: ClientSecrets) -> Refusal | None:
    """Redeem the client secret :func:`check_request` noted, once the connection is admitted: its
    config goes to ``scope["state"][BOUND_SESSION]``. Call it with no ``await`` since the check, so
    a second connection with the same secret cannot pass in between."""
    key = scope.get("state", {}).pop(_PENDING_SECRET, None)
    if key is None:
        return None
    bound = secrets.redeem(key)
    if bound is None:
        return Refusal(401, "unauthorized: invalid client secret", INVALID_API_KEY_BODY)
    scope["state"][BOUND_SESSION] = bound
    return None
