"""A strict JSON parser shared by the JSON protocol codecs (world, OpenAI Realtime, echo).

``loads_strict`` refuses what ``json.loads`` lets through: ``NaN``/``Infinity`` literals, numbers
that overflow a double (``1e999``), integers beyond 64 bits (checked by digit count before
``int()`` runs, so a 100,000-digit integer costs nothing) and duplicate keys; nesting deeper than
the interpreter's recursion limit (``RecursionError``) is refused too. It raises
:class:`StrictJSONError` (a ``ValueError``) and nothing else, so every value it returns can be
rendered back (``dumps`` uses ``allow_nan=False``).

The number of values and the nesting are bounded before any object is built
(:func:`check_shape`): at most :data:`MAX_VALUES` values and :data:`MAX_DEPTH` levels. Every value
past the first is preceded by a ``,`` or opens a container that is the first item of its parent,
and such a chain is at most ``MAX_DEPTH`` deep, so one C pass counting ``,`` bounds the values
from above (commas inside strings count too: a document with more than ``MAX_VALUES`` commas
anywhere is refused, which no protocol message of this server needs). The depth is walked only
when the document holds more than ``MAX_DEPTH`` brackets at all (two more C counts), over its
brackets and strings alone. So a megabyte of ``[0,0,...]`` or 5,000 nested brackets is refused
for the cost of a few passes, never parsed on the event loop (nor deep enough for the parser to
reach the recursion limit).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

MAX_INT = 2**63 - 1
MAX_VALUES = 16384  # values (scalars and containers) in one document
MAX_DEPTH = 64  # nesting levels of arrays and objects
# a string (unrolled: one C loop per run of plain characters) or a bracket
_BRACKETS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')


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


def check_shape(text: str, max_values: int = MAX_VALUES, max_depth: int = MAX_DEPTH) -> None:
    """Raise :class:`StrictJSONError` if ``text`` may hold more than ``max_values`` values or nests
    deeper than ``max_depth`` (see the module docstring); builds nothing."""
    if text.count(",") >= max_values:
        raise StrictJSONError(f"more than {max_values} JSON values (or commas)")
    if text.count("[") + text.count("{") <= max_depth:
        return
    depth = 0
    for token in _BRACKETS.finditer(text):
        bracket = token.group()
        if bracket in "[{":
            depth += 1
            if depth > max_depth:
                raise StrictJSONError(f"JSON nested deeper than {max_depth} levels")
        elif bracket in "]}":
            depth -= 1


def loads_strict(text: str) -> Any:
    """Parse one JSON document strictly (see the module docstring)."""
    check_shape(text)
    try:
        return _DECODER.decode(text)
    except StrictJSONError:
        raise
    except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
        raise StrictJSONError(str(exc), syntax=True) from None


def dumps(message: dict[str, Any]) -> str:
    """Compact JSON; non-finite floats are a programming error here (``allow_nan=False``)."""
    return json.dumps(message, separators=(",", ":"), allow_nan=False)
