"""JSON in and out for the OpenAI Realtime codec: the shared strict parser
(``realtime.protocols.strict_json``), a compact writer, OpenAI-style ids. Free-form values kept
from a client (tool ``parameters``, ``metadata``) are depth-checked by ``fields.opaque``.
"""

from __future__ import annotations

import secrets

from realtime.protocols.strict_json import MAX_INT, StrictJSONError, dumps, loads_strict

__all__ = ["MAX_INT", "StrictJSONError", "dumps", "loads_strict", "new_id"]

ID_CHARS = 21  # OpenAI's ids: a prefix, '_', then 21 alphanumerics (``event_...``, ``item_...``)


def new_id(prefix: str) -> str:
    """``<prefix>_`` + 21 random alphanumerics (hex digits: 84 bits), as OpenAI's ``event_``, ``item_`` ids."""
    return prefix + "_" + secrets.token_hex(11)[:ID_CHARS]
