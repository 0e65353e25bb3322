"""Handshake negotiation of ``/v1/realtime``: dialect, subprotocol answer, API key, model.

A pure function of the request's query string, headers and offered subprotocols
(reference ``openai-realtime-and-voice-servers.md`` §1.1):

- **dialect**: beta when the ``OpenAI-Beta: realtime=v1`` header (one token of a comma list) or the
  ``openai-beta.realtime-v1`` subprotocol is present, GA otherwise. One socket speaks one dialect.
- **subprotocol**: ``realtime`` when offered, else none. Browsers fail the handshake when they
  offered protocols and none is answered; the key-carrying protocol is never answered (that would
  echo the key).
- **API key**, first found of: ``Authorization: Bearer <key>`` (or ``Api-Key <key>``), the
  ``openai-insecure-api-key.<key>`` subprotocol, ``?api_key=``. Kept out of ``repr``; never logged.
- **model**: ``?model=`` (the SDK always sends it). ``session.model`` is a display name: GA shows
  the served model; beta echoes the requested name when the beta SDK accepts it, else
  :data:`DEFAULT_BETA_MODEL`. The served model always goes in the :data:`SERVED_MODEL_HEADER`
  response header of the upgrade (:meth:`Handshake.accept_headers`).

Other query parameters (``intent``, ``call_id``, whatever ``base_url`` carried) are ignored.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from urllib.parse import parse_qs

SUBPROTOCOL = "realtime"
BETA_SUBPROTOCOL = "openai-beta.realtime-v1"
KEY_SUBPROTOCOL_PREFIX = "openai-insecure-api-key."
BETA_HEADER_TOKEN = "realtime=v1"
SERVED_MODEL_HEADER = "x-served-model"
MAX_MODEL_CHARS = 256  # a longer ?model= is ignored (treated as absent)

# ``openai.types.beta.realtime.Session.model`` accepts exactly these (a Literal, not any string)
BETA_MODELS = (
    "gpt-realtime",
    "gpt-realtime-2025-08-28",
    "gpt-4o-realtime-preview",
    "gpt-4o-realtime-preview-2024-10-01",
    "gpt-4o-realtime-preview-2024-12-17",
    "gpt-4o-realtime-preview-2025-06-03",
    "gpt-4o-mini-realtime-preview",
    "gpt-4o-mini-realtime-preview-2024-12-17",
)
DEFAULT_BETA_MODEL = "gpt-4o-realtime-preview"


class Dialect(enum.StrEnum):
    GA = "ga"
    BETA = "beta"


@dataclass(frozen=True)
class Handshake:
    """What the upgrade request asked for. ``api_key`` is ``None`` when none was presented."""

    dialect: Dialect
    subprotocol: str | None
    model: str | None
    api_key: str | None = field(default=None, repr=False)
    key_source: str | None = None  # "authorization", "subprotocol" or "query": safe to log

    def display_model(self, served_model: str) -> str:
        """The ``session.model`` this connection shows (see the module docstring)."""
        if self.dialect is Dialect.GA:
            return served_model
        return self.model if self.model in BETA_MODELS else DEFAULT_BETA_MODEL

    def accept_headers(self, served_model: str) -> list[tuple[bytes, bytes]]:
        """Extra headers of the 101 response (Starlette's ``websocket.accept(headers=...)``)."""
        return [(SERVED_MODEL_HEADER.encode(), served_model.encode("utf-8", "replace"))]


def _first(query: Mapping[str, list[str]], key: str) -> str | None:
    values = query.get(key)
    return values[0] if values else None


def _bearer(headers: Mapping[str, str]) -> str | None:
    scheme, _, presented = headers.get("authorization", "").strip().partition(" ")
    presented = presented.strip()
    if scheme.lower() in ("bearer", "api-key") and presented:
        return presented
    return None


def negotiate(query: str | bytes, headers: Mapping[str, str], subprotocols: Iterable[str]) -> Handshake:
    """The :class:`Handshake` of one upgrade request. ``headers`` may use any letter case."""
    if isinstance(query, bytes):
        query = query.decode("latin-1")
    params = parse_qs(query, keep_blank_values=True)
    lowered = {k.lower(): v for k, v in headers.items()}
    offered = [p.strip() for p in subprotocols]

    beta_tokens = {t.strip().lower() for t in lowered.get("openai-beta", "").split(",")}
    beta = BETA_HEADER_TOKEN in beta_tokens or BETA_SUBPROTOCOL in offered

    key, source = _bearer(lowered), "authorization"
    if key is None:
        key = next(
            (p[len(KEY_SUBPROTOCOL_PREFIX) :] for p in offered if p.startswith(KEY_SUBPROTOCOL_PREFIX)), None
        )
        source = "subprotocol"
    if not key:
        key, source = _first(params, "api_key") or None, "query"

    model = _first(params, "model")
    if model is not None and (not model or len(model) > MAX_MODEL_CHARS):
        model = None
    return Handshake(
        dialect=Dialect.BETA if beta else Dialect.GA,
        subprotocol=SUBPROTOCOL if SUBPROTOCOL in offered else None,
        model=model,
        api_key=key,
        key_source=source if key else None,
    )
