"""A strict JSON parser shared by the JSON protocol codecs (world, OpenAI Realtime, echo).

``loads_strict`` refuses what ``json.loads`` lets through: ``NaN``/``Infinity`` literals, numbers
that overflow a double (``1e999``), integers beyond 64 bits (checked by digit count before
``int()`` runs, so a 100,000-digit integer costs nothing) and duplicate keys; nesting deeper than
the interpreter's recursion limit (``RecursionError``) is refused too. It raises
:class:`StrictJSONError` (a ``ValueError``) and nothing else, so every value it returns can be
rendered back (``dumps`` uses ``allow_nan=False``).
"""

from __future__ import annotations

import json
import math
from typing import Any

MAX_INT = 2**63 - 1


class StrictJSONError(ValueError):
    """``syntax`` is True for text that is not JSON at all, False for a refused value."""

    def __init__(self, message: str, syntax: bool = False) -> None:
        super().__init__(message)
        self.syntax = syntax


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
        raise StrictJSONError(str(exc), syntax=True) from None


def dumps(message: dict[str, Any]) -> str:
    """Compact JSON; non-finite floats are a programming error here (``allow_nan=False``)."""
    return json.dumps(message, separators=(",", ":"), allow_nan=False)
