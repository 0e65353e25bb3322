"""Client events: immutable, transport-safe prompt and control updates.

Contract (vllm-omni AR-diffusion session contract, seed reference §2.5-2.6):

- :class:`ControlInput` ``(track, schema, data)`` is opaque to the runtime; model reducers
  interpret it. ``data`` must be JSON-like ("transport-safe": ``None``, ``bool``, ``int``,
  finite ``float``, ``str``, lists/tuples and string-keyed mappings, nested at most
  :data:`MAX_DEPTH` deep). It is deep-copied and frozen on construction: lists become tuples,
  mappings become read-only, so a caller mutating its payload afterwards changes nothing.
- :class:`SessionEvent` ``(event_id, prompt, controls, client_ts_ms)`` carries one update; a
  control track appears at most once per event. Malformed events raise
  :class:`~sessions.errors.InvalidEventError`.
- :class:`SeenEventIds` remembers which ids a session accepted, as disjoint ranges (clients
  usually number events contiguously, so this stays one range), bounded by ``max_ranges``:
  beyond it the oldest ranges are forgotten and ids below them count as stale, never as
  duplicates of something unknown.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from sessions.errors import InvalidEventError

MAX_DEPTH = 32


def freeze_json(value: Any, path: str = "data", depth: int = 0) -> Any:
    """Deep-copy ``value`` into an immutable JSON-like value or raise ``InvalidEventError``."""
    if depth > MAX_DEPTH:
        raise InvalidEventError(f"{path} is nested deeper than {MAX_DEPTH} levels")
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidEventError(f"{path} is not transport-safe: non-finite number {value!r}")
        return value
    if isinstance(value, list | tuple):
        return tuple(freeze_json(v, f"{path}[{i}]", depth + 1) for i, v in enumerate(value))
    if isinstance(value, Mapping):
        frozen = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidEventError(f"{path} is not transport-safe: key {key!r} is not a string")
            frozen[key] = freeze_json(item, f"{path}.{key}", depth + 1)
        return MappingProxyType(frozen)
    raise InvalidEventError(f"{path} is not transport-safe: {type(value).__name__} is not JSON-like")


def thaw_json(value: Any) -> Any:
    """The plain ``dict``/``list`` form of a frozen value (for serialisation)."""
    if isinstance(value, tuple):
        return [thaw_json(v) for v in value]
    if isinstance(value, Mapping):
        return {k: thaw_json(v) for k, v in value.items()}
    return value


def _non_empty_str(name: str, value: Any) -> None:
    if not isinstance(value, str) or not value:
        raise InvalidEventError(f"{name} must be a non-empty string, got {value!r}")


@dataclass(frozen=True)
class ControlInput:
    """One opaque control value on a named track, e.g. ``("camera", "example.camera.v1", {...})``."""

    track: str
    schema: str
    data: Any = None

    def __post_init__(self) -> None:
        _non_empty_str("control track", self.track)
        _non_empty_str("control schema", self.schema)
        object.__setattr__(self, "data", freeze_json(self.data, f"controls[{self.track}].data"))

    def to_dict(self) -> dict[str, Any]:
        return {"track": self.track, "schema": self.schema, "data": thaw_json(self.data)}

    def __reduce__(self) -> tuple[Any, ...]:
        # picklable (a world session's checkpoint): the frozen data travels thawed, refrozen on load
        return (ControlInput, (self.track, self.schema, thaw_json(self.data)))

    @classmethod
    def from_dict(cls, raw: Any) -> ControlInput:
        if not isinstance(raw, Mapping):
            raise InvalidEventError(f"a control must be an object, got {type(raw).__name__}")
        unknown = set(raw) - {"track", "schema", "data"}
        if unknown:
            raise InvalidEventError(f"unknown control field(s): {', '.join(sorted(map(str, unknown)))}")
        return cls(track=raw.get("track"), schema=raw.get("schema"), data=raw.get("data"))


@dataclass(frozen=True)
class SessionEvent:
    """One client update: an optional prompt and controls, identified by ``event_id``."""

    event_id: int
    prompt: str | None = None
    controls: tuple[ControlInput, ...] = ()
    client_ts_ms: float | None = None

    def __post_init__(self) -> None:
        if isinstance(self.event_id, bool) or not isinstance(self.event_id, int) or self.event_id < 0:
            raise InvalidEventError(f"event_id must be an integer >= 0, got {self.event_id!r}")
        if self.prompt is not None and not isinstance(self.prompt, str):
            raise InvalidEventError(f"prompt must be a string, got {type(self.prompt).__name__}")
        if self.client_ts_ms is not None and (
            isinstance(self.client_ts_ms, bool)
            or not isinstance(self.client_ts_ms, int | float)
            or not math.isfinite(self.client_ts_ms)
        ):
            raise InvalidEventError(f"client_ts_ms must be a finite number, got {self.client_ts_ms!r}")
        if isinstance(self.controls, ControlInput) or not isinstance(self.controls, Iterable):
            raise InvalidEventError("controls must be a list of controls")
        controls = tuple(self.controls)
        tracks: set[str] = set()
        for control in controls:
            if not isinstance(control, ControlInput):
                raise InvalidEventError(f"controls must be ControlInput values, got {type(control).__name__}")
            if control.track in tracks:
                raise InvalidEventError(
                    f"control track {control.track!r} appears more than once in one event"
                )
            tracks.add(control.track)
        object.__setattr__(self, "controls", controls)

    @classmethod
    def from_dict(cls, raw: Any) -> SessionEvent:
        """Build from the JSON form ``{event_id, prompt?, controls?: [{track, schema, data}], client_ts_ms?}``."""
        if not isinstance(raw, Mapping):
            raise InvalidEventError(f"an event must be an object, got {type(raw).__name__}")
        unknown = set(raw) - {"event_id", "prompt", "controls", "client_ts_ms"}
        if unknown:
            raise InvalidEventError(f"unknown event field(s): {', '.join(sorted(map(str, unknown)))}")
        if "event_id" not in raw:
            raise InvalidEventError("event_id is required")
        controls = raw.get("controls") or ()
        if not isinstance(controls, list | tuple):
            raise InvalidEventError("controls must be a list")
        return cls(
            event_id=raw["event_id"],
            prompt=raw.get("prompt"),
            controls=tuple(ControlInput.from_dict(c) for c in controls),
            client_ts_ms=raw.get("client_ts_ms"),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"event_id": self.event_id}
        if self.prompt is not None:
            out["prompt"] = self.prompt
        if self.controls:
            out["controls"] = [c.to_dict() for c in self.controls]
        if self.client_ts_ms is not None:
            out["client_ts_ms"] = self.client_ts_ms
        return out


@dataclass
class SeenEventIds:
    """A bounded set of accepted event ids stored as sorted disjoint inclusive ranges."""

    max_ranges: int = 1024
    forgotten_below: int = -1
    _starts: list[int] = field(default_factory=list)
    _ends: list[int] = field(default_factory=list)

    def __contains__(self, event_id: int) -> bool:
        i = bisect_right(self._starts, event_id) - 1
        return i >= 0 and event_id <= self._ends[i]

    def add(self, event_id: int) -> None:
        i = bisect_right(self._starts, event_id) - 1
        if i >= 0 and event_id <= self._ends[i]:
            return
        joins_left = i >= 0 and self._ends[i] == event_id - 1
        joins_right = i + 1 < len(self._starts) and self._starts[i + 1] == event_id + 1
        if joins_left and joins_right:
            self._ends[i] = self._ends[i + 1]
            del self._starts[i + 1], self._ends[i + 1]
        elif joins_left:
            self._ends[i] = event_id
        elif joins_right:
            self._starts[i + 1] = event_id
        else:
            self._starts.insert(i + 1, event_id)
            self._ends.insert(i + 1, event_id)
            if len(self._starts) > self.max_ranges:
                self.forgotten_below = self._ends[0]
                del self._starts[0], self._ends[0]

    def range_count(self) -> int:
        return len(self._starts)
