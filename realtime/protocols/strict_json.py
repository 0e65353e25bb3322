"""A strict JSON parser shared by the JSON protocol codecs (world, OpenAI Realtime, echo).

``loads_strict`` refuses what ``json.loads`` lets through: ``NaN``/``Infinity`` literals, numbers
that overflow a double (``1e999``), integers beyond 64 bits (checked by digit count before
``int()`` runs, so a 100,000-digit integer costs nothing) and duplicate keys; nesting deeper than
the interpreter's recursion limit (``RecursionError``) is refused too. It raises
:class:`StrictJSONError` (a ``ValueError``) and nothing else, so every value it returns can be
rendered back (``dumps`` uses ``allow_nan=False``).

The number of values is bounded before any object is built (:func:`check_values`): at most
:data:`MAX_VALUES`. Every value past the first is preceded by a ``,`` or opens a container that
is the first item of its parent, and such a chain of first items is at most the recursion limit
deep, so one C pass counting ``,`` bounds the values from above (commas inside strings count too: a
document with more than ``MAX_VALUES`` commas anywhere is refused, which no protocol message of
this server needs). A megabyte of ``[0,0,...]`` is refused for the cost of that pass, never
parsed on the event loop. Nesting is bounded by the
parser's recursion limit (each level one empty container); consumers bound it further
(``sessions.events.MAX_DEPTH``).
"""

from __future__ import annotations

import json
import math
from typing import Any

MAX_INT = 2**63 - 1
MAX_VALUES = 16384 + 1024  # "," separated values, plus a chain of first items as deep as the parser allows


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


def check_values(text: str, max_values: int = MAX_VALUES) -> None:
    """Raise :class:`StrictJSONError` if ``text`` may hold more than ``max_values`` values (see
    the module docstring); builds nothing."""
    if text.count(",") >= max_values:
        raise StrictJSONError(f"more than {max_values} JSON values (or commas)")


def loads_strict(text: str) -> Any:
    """Parse one JSON document strictly (see the module docstring)."""
    check_values(text)
    try:
        return _DECODER.decode(text)
    except StrictJSONError:
        raise
    except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
        raise StrictJSONError(str(exc), syntax=True) from None


def dumps(message: dict[str, Any]) -> str:
    """Compact JSON; non-finite floats are a programming error here (``allow_nan=False``)."""
    return json.dumps(message, separators=(",", ":"), allow_nan=False)
