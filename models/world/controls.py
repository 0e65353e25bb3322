"""Control schemas of the world model and their mapping to the model's action vector.

Two tracks (opaque ``{track, schema, data}`` controls on the wire):

- ``keys`` / ``world.keys.v1``: ``{"pressed": ["w", "arrowleft", ...]}`` — the set of keys held
  now; latest wins and it stays held until a new ``keys`` control arrives. ``w``/``arrowup``
  forward, ``s``/``arrowdown`` back, ``a``/``arrowleft`` turn left, ``d``/``arrowright`` turn
  right (case-insensitive); other keys are ignored.
- ``mouse`` / ``world.mouse.v1``: ``{"dx": float, "dy": float}`` — relative motion in pixels since
  the previous event; deltas of all events applied in one block are summed, then scaled by
  ``1 / MOUSE_PIXELS_PER_UNIT`` and clipped to ``[-1, 1]`` (dx > 0 turns right, dy > 0 looks down).

Action layout: ``[forward, back, turn_left, turn_right, mouse_dx, mouse_dy]`` (see ``env.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import Tensor

KEYS_TRACK, KEYS_SCHEMA = "keys", "world.keys.v1"
MOUSE_TRACK, MOUSE_SCHEMA = "mouse", "world.mouse.v1"
MOUSE_PIXELS_PER_UNIT = 100.0
MAX_KEYS = 16
KEY_ACTIONS = {"w": 0, "arrowup": 0, "s": 1, "arrowdown": 1, "a": 2, "arrowleft": 2, "d": 3, "arrowright": 3}

CONTROL_SCHEMAS: dict[str, dict[str, Any]] = {
    KEYS_TRACK: {
        "schema": KEYS_SCHEMA,
        "data": {"pressed": "list of held keys (latest wins, sticky)"},
        "keys": sorted(KEY_ACTIONS),
    },
    MOUSE_TRACK: {
        "schema": MOUSE_SCHEMA,
        "data": {"dx": "pixels, > 0 turns right", "dy": "pixels, > 0 looks down"},
        "accumulate": "summed over the events of one block",
        "pixels_per_unit": MOUSE_PIXELS_PER_UNIT,
    },
}


class ControlError(ValueError):
    """A control's data does not match its schema."""


def validate_control(track: str, schema: str, data: Any) -> None:
    """Raise ``ControlError`` unless ``(track, schema, data)`` is a known, well-formed control."""
    if track == KEYS_TRACK:
        if schema != KEYS_SCHEMA:
            raise ControlError(f"track 'keys' needs schema {KEYS_SCHEMA!r}, got {schema!r}")
        pressed = data.get("pressed") if isinstance(data, Mapping) else None
        if (
            not isinstance(pressed, list | tuple)
            or len(pressed) > MAX_KEYS
            or not all(isinstance(k, str) for k in pressed)
        ):
            raise ControlError(f"keys data must be {{'pressed': [<= {MAX_KEYS} key names]}}")
    elif track == MOUSE_TRACK:
        if schema != MOUSE_SCHEMA:
            raise ControlError(f"track 'mouse' needs schema {MOUSE_SCHEMA!r}, got {schema!r}")
        if not isinstance(data, Mapping) or set(data) - {"dx", "dy"}:
            raise ControlError("mouse data must be {'dx': number, 'dy': number}")
        for axis in ("dx", "dy"):
            value = data.get(axis, 0)
            if isinstance(value, bool) or not isinstance(value, int | float) or abs(value) > 1e6:
                raise ControlError(f"mouse {axis} must be a number of pixels, got {value!r}")
    else:
        raise ControlError(f"unknown control track {track!r} (known: {', '.join(CONTROL_SCHEMAS)})")


def action_vector(pressed: Iterable[str], mouse_dx: float, mouse_dy: float) -> Tensor:
    """The model action of one block from the held keys and the summed mouse deltas."""
    action = torch.zeros(6)
    for key in pressed:
        index = KEY_ACTIONS.get(key.lower())
        if index is not None:
            action[index] = 1.0
    action[4] = max(-1.0, min(1.0, mouse_dx / MOUSE_PIXELS_PER_UNIT))
    action[5] = max(-1.0, min(1.0, mouse_dy / MOUSE_PIXELS_PER_UNIT))
    return action
