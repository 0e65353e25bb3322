"""Ephemeral client secrets, sans-I/O: the mint requests and their answers in both dialects.

OpenAI's browser flow: a backend holding the API key mints a short-lived secret bound to a
session config, and hands only the secret to the page, which opens the realtime connection
with it (``docs/protocols/openai-realtime.md``, "Client secrets").

- **GA** ``POST /v1/realtime/client_secrets``: ``{"expires_after": {"anchor": "created_at",
  "seconds": 10..7200}, "session": {GA session object}}`` (both optional) ->
  ``{"value", "expires_at", "session"}``.
- **beta** ``POST /v1/realtime/sessions``: the beta session object itself (``model``, ``voice``,
  ...; optionally ``client_secret: {"expires_after": {...}}``) -> the session object with
  ``client_secret: {"value", "expires_at"}``.

:func:`parse_mint` validates a request body exactly as ``session.update`` validates its
``session`` (the same parser, so a secret never binds a config a connection would refuse) and
raises :class:`~.errors.ParamError`; :func:`render_minted` renders the answer. The table of
minted secrets is the server's (``realtime.client_secrets``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import fields as f
from .dialect import Dialect
from .limits import Limits
from .session_config import SessionConfig, apply_update, render_session

DEFAULT_EXPIRES_S = 600
MIN_EXPIRES_S = 10
MAX_EXPIRES_S = 7200
MAX_BODY_BYTES = 1024 * 1024  # a mint request's body; larger ones get 413 before reading on


@dataclass(frozen=True)
class MintRequest:
    """A valid mint request: the session config the secret binds and its lifetime."""

    config: SessionConfig
    expires_after_s: int


def _expires_after(value: Any, path: str) -> int:
    o = f.Obj(value, path)
    o.read("anchor", lambda v, p: f.choice(v, p, ("created_at",)), "created_at")
    seconds = o.read(
        "seconds", lambda v, p: f.integer(v, p, lo=MIN_EXPIRES_S, hi=MAX_EXPIRES_S), DEFAULT_EXPIRES_S
    )
    o.done()
    return seconds


def parse_mint(body: Any, dialect: Dialect, defaults: SessionConfig, limits: Limits) -> MintRequest:
    """The request's session config (over ``defaults``) and lifetime, or :class:`ParamError`."""
    o = f.Obj(body, "")
    if dialect is Dialect.GA:
        expires = o.read("expires_after", _expires_after, DEFAULT_EXPIRES_S)
        session = o.read("session", lambda v, p: f.Obj(v, p).raw, {"type": "realtime"})
        o.done()
    else:
        secret = o.get("client_secret")
        expires = DEFAULT_EXPIRES_S
        if secret is not f.MISSING:
            s = f.Obj(secret, "client_secret")
            expires = s.read("expires_after", _expires_after, DEFAULT_EXPIRES_S)
            s.done()
        session = {k: v for k, v in o.raw.items() if k != "client_secret"}
    config = apply_update(defaults, session, dialect, defaults=defaults, limits=limits, semantic_vad=True)
    return MintRequest(config, expires)


def render_minted(
    value: str, expires_at: int, config: SessionConfig, dialect: Dialect, session_id: str
) -> dict[str, Any]:
    """The answer to a mint request in ``dialect`` (``session_id``: the bound session's name)."""
    session = render_session(config, dialect, session_id, expires_at)
    if dialect is Dialect.GA:
        return {"value": value, "expires_at": expires_at, "session": session}
    return {**session, "client_secret": {"value": value, "expires_at": expires_at}}
