"""Typed reads of parsed JSON with OpenAI's validation wording and parameter paths.

Each function takes the raw value and its ``param`` path (``session.tools[3].description``) and
returns the typed value or raises :class:`~.errors.ParamError` with OpenAI's code and message
(``invalid_type``, ``invalid_value``, ``integer_above_max_value``, ``string_above_max_length``...).
:class:`Obj` reads one JSON object and refuses keys nobody read (``unknown_parameter``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from .errors import ErrorCode, ParamError, quote, supported_values

T = TypeVar("T")
MISSING: Any = object()
MAX_OPAQUE_DEPTH = 32  # free-form JSON kept from a client (tool parameters, metadata) nests at most this deep

_TYPE_NAMES = {
    str: "a string",
    int: "an integer",
    float: "a decimal",
    bool: "a boolean",
    dict: "an object",
    list: "an array",
    type(None): "null",
}


def describe(value: Any) -> str:
    return _TYPE_NAMES.get(type(value), "an unknown type")


def child(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def wrong_type(value: Any, path: str, expected: str) -> ParamError:
    return ParamError(
        ErrorCode.INVALID_TYPE,
        f"Invalid type for {quote(path)}: expected {expected}, but got {describe(value)} instead.",
        path,
    )


def missing(path: str) -> ParamError:
    return ParamError(ErrorCode.MISSING_PARAMETER, f"Missing required parameter: {quote(path)}.", path)


def string(value: Any, path: str, *, max_len: int, min_len: int = 0) -> str:
    if not isinstance(value, str):
        raise wrong_type(value, path, "a string")
    if len(value) > max_len:
        raise ParamError(
            ErrorCode.STRING_TOO_LONG,
            f"Invalid {quote(path)}: string too long. Expected a string with maximum length {max_len}, "
            f"but got a string with length {len(value)} instead.",
            path,
        )
    if len(value) < min_len:
        raise ParamError(
            ErrorCode.STRING_TOO_SHORT,
            f"Invalid {quote(path)}: string too short. Expected a string with minimum length {min_len}, "
            f"but got a string with length {len(value)} instead.",
            path,
        )
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate ("\ud800") would break every later encode
            raise ParamError(
                ErrorCode.INVALID_VALUE, f"Invalid {quote(path)}: not valid Unicode.", path
            ) from None
    return value


def boolean(value: Any, path: str) -> bool:
    if not isinstance(value, bool):
        raise wrong_type(value, path, "a boolean")
    return value


def integer(value: Any, path: str, *, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():  # JSON 500.0 from JavaScript clients
            value = int(value)
        else:
            raise wrong_type(value, path, "an integer")
    if value < lo:
        raise ParamError(
            ErrorCode.INTEGER_BELOW_MIN,
            f"Invalid {quote(path)}: integer below minimum value. Expected a value >= {lo}, but got {value} instead.",
            path,
        )
    if value > hi:
        raise ParamError(
            ErrorCode.INTEGER_ABOVE_MAX,
            f"Invalid {quote(path)}: integer above maximum value. Expected a value <= {hi}, but got {value} instead.",
            path,
        )
    return value


def number(value: Any, path: str, *, lo: float, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise wrong_type(value, path, "a number")
    if value < lo:
        raise ParamError(
            ErrorCode.DECIMAL_BELOW_MIN,
            f"Invalid {quote(path)}: decimal below minimum value. Expected a value >= {lo}, but got {value} instead.",
            path,
        )
    if value > hi:
        raise ParamError(
            ErrorCode.DECIMAL_ABOVE_MAX,
            f"Invalid {quote(path)}: decimal above maximum value. Expected a value <= {hi}, but got {value} instead.",
            path,
        )
    return float(value)


def choice(value: Any, path: str, options: tuple[str, ...]) -> str:
    if not isinstance(value, str):
        raise wrong_type(value, path, "a string")
    if value not in options:
        raise ParamError(
            ErrorCode.INVALID_VALUE,
            f"Invalid value: {quote(value)}. Supported values are: {supported_values(options)}.",
            path,
        )
    return value


def array(value: Any, path: str, *, max_len: int) -> list[Any]:
    if not isinstance(value, list):
        raise wrong_type(value, path, "an array")
    if len(value) > max_len:
        raise ParamError(
            ErrorCode.ARRAY_TOO_LONG,
            f"Invalid {quote(path)}: array too long. Expected an array with maximum length {max_len}, "
            f"but got an array with length {len(value)} instead.",
            path,
        )
    return value


def opaque(value: Any, path: str, *, depth: int = 0) -> Any:
    """Free-form JSON kept as is (tool ``parameters``), refused past MAX_OPAQUE_DEPTH levels."""
    if depth > MAX_OPAQUE_DEPTH:
        raise ParamError(
            ErrorCode.INVALID_VALUE,
            f"Invalid {quote(path)}: nested deeper than {MAX_OPAQUE_DEPTH} levels.",
            path,
        )
    if isinstance(value, dict):
        for k, v in value.items():
            opaque(v, path, depth=depth + 1)
            string(k, path, max_len=1024)
    elif isinstance(value, list):
        for v in value:
            opaque(v, path, depth=depth + 1)
    elif isinstance(value, str):
        string(value, path, max_len=1 << 20)
    return value


class Obj:
    """One JSON object at ``path``. Reads mark keys; :meth:`done` refuses the keys nobody read."""

    def __init__(self, value: Any, path: str) -> None:
        if not isinstance(value, dict):
            raise wrong_type(value, path or "event", "an object")
        self.raw: Mapping[str, Any] = value
        self.path = path
        self._seen: set[str] = set()

    def has(self, key: str) -> bool:
        return key in self.raw

    def at(self, key: str) -> str:
        return child(self.path, key)

    def get(self, key: str) -> Any:
        """The raw value, or :data:`MISSING`."""
        self._seen.add(key)
        return self.raw.get(key, MISSING)

    def read(self, key: str, convert: Callable[[Any, str], T], default: Any = MISSING) -> T:
        """``convert(value, path)``; absent -> ``default`` (required when no default); ``null`` -> error."""
        value = self.get(key)
        if value is MISSING:
            if default is MISSING:
                raise missing(self.at(key))
            return default
        return convert(value, self.at(key))

    def optional(self, key: str, convert: Callable[[Any, str], T], absent: Any, null: Any) -> T:
        """Like :meth:`read`, but an explicit ``null`` gives ``null`` (the field's cleared value)."""
        value = self.get(key)
        if value is MISSING:
            return absent
        if value is None:
            return null
        return convert(value, self.at(key))

    def ignore(self, *keys: str) -> None:
        self._seen.update(keys)

    def done(self) -> None:
        for key in self.raw:
            if key not in self._seen:
                raise ParamError(
                    ErrorCode.UNKNOWN_PARAMETER, f"Unknown parameter: {quote(self.at(key))}.", self.at(key)
                )
