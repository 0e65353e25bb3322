"""JSON in and out for the OpenAI Realtime codec: a strict parser, a compact writer, OpenAI-style ids.

``loads_strict`` refuses what ``json.loads`` lets through: ``NaN``/``Infinity`` literals, numbers
that overflow a double (``1e999``), integers beyond 64 bits and duplicate keys; nesting deeper than
the interpreter's recursion limit (``RecursionError``) is refused too. It raises
:class:`StrictJSONError` (a ``ValueError``) and nothing else. Free-form values kept from a client
(tool ``parameters``, ``metadata``) are depth-checked by ``fields.opaque``.
"""

from __future__ import annotations

import json
import math
import secrets
from typing import Any

MAX_INT = 2**63 - 1
ID_CHARS = 21  # OpenAI's ids: a prefix, '_', then 21 alphanumerics (``event_...``, ``item_...``)


class StrictJSONError(ValueError):
    pass


def _constant(name: str) -> Any:
    raise StrictJSONError(f"{name} is not valid JSON")


def _int(text: str) -> int:
    if len(text.lstrip("-")) > 19:  # cheap guard before int(): 10**19 > 2**63
        raise StrictJSONError(f"integer {text[:24]}... is out of range")
    value = int(text)
    if abs(value) > MAX_INT:
        raise StrictJSONError(f"integer {text} is out of range")
    return value


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise StrictJSONError(f"number {text[:24]} is out of range")
    return value


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise StrictJSONError(f"duplicate key {key[:64]!r}")
            seen.add(key)
    return obj


_DECODER = json.JSONDecoder(
    parse_constant=_constant, parse_int=_int, parse_float=_float, object_pairs_hook=_object
)


def loads_strict(text: str) -> Any:
    """Parse one JSON document strictly (see the module docstring)."""
    try:
        return _DECODER.decode(text)
    except StrictJSONError:
        raise
    except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
        raise StrictJSONError(str(exc)) from None


def dumps(message: dict[str, Any]) -> str:
    """Compact JSON; non-finite floats are a programming error here (``allow_nan=False``)."""
    return json.dumps(message, separators=(",", ":"), allow_nan=False)


def new_id(prefix: str) -> str:
    """``<prefix>_`` + 21 random alphanumerics (hex digits: 84 bits), as OpenAI's ``event_``, ``item_`` ids."""
    return prefix + "_" + secrets.token_hex(11)[:ID_CHARS]
