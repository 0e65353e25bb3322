"""Optional API-key auth for websocket handshakes.

Accepted forms (any one): ``Authorization: Api-Key <key>`` (openpi-client's form),
``Authorization: Bearer <key>`` (OpenAI clients). With no keys configured every request passes.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable, Mapping


def api_key_ok(headers: Mapping[str, str], keys: Iterable[str]) -> bool:
    keys = tuple(keys)
    if not keys:
        return True
    scheme, _, presented = headers.get("authorization", "").strip().partition(" ")
    if scheme.lower() not in ("api-key", "bearer") or not presented:
        return False
    return any(hmac.compare_digest(presented.strip().encode(), k.encode()) for k in keys)
