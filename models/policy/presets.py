"""Observation key presets: how common robots name their cameras and state on the OpenPI wire.

Keys and shapes follow openpi's ``*_policy.py`` input transforms (reference
``openpi-and-robot-policy-servers.md`` §2.6) and vllm-omni's pi0 example client:

======== ================================================ ====================================== =======
preset   cameras (model slot: base, left wrist, right)    state                                  actions
======== ================================================ ====================================== =======
libero   ``observation/image``, ``observation/wrist_image``  ``observation/state`` [8]            7
droid    ``observation/exterior_image_1_left``,           ``observation/joint_position`` [7] +   8
         ``observation/wrist_image_left``                 ``observation/gripper_position`` [1]
aloha    ``images``: ``cam_high`` (required),             ``state`` [14]                         14
         ``cam_left_wrist``, ``cam_right_wrist`` (CHW;
         ``cam_low`` accepted, unused like openpi's pi0)
pi0      ``observation.images.base_0_rgb``,               ``state`` [<= 32]                      32
         ``observation.images.left_wrist_0_rgb``,
         ``observation.images.right_wrist_0_rgb`` (all optional, missing ones are masked)
======== ================================================ ====================================== =======

``detect(observation)`` picks the preset from an observation's keys; ``canonicalize`` turns an
observation into per-slot HWC uint8 images, a float32 state vector and a prompt. It is the whole
validation of an observation: what it returns can always be collated and run, so one robot's bad
observation fails only its own request, never a batch it would share (the rules are listed in
:func:`canonicalize`). Anything else raises :class:`ObservationError` whose message names the key
and the rule. Inputs are never written to.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any

import numpy as np

from models.policy.interface import ObservationError

MAX_IMAGE_SIDE = 4096
MAX_PROMPT_CHARS = 2000  # default bound on a prompt's length; the policies take max_prompt_chars


@dataclass(frozen=True)
class StateKey:
    """One state array of a preset: ``size`` values (1-D, or a 0-d scalar when ``size`` is 1);
    ``exact=False`` accepts 1..``size`` values (pi0's generic state, zero-padded by the model)."""

    key: str
    size: int
    exact: bool = True

    @property
    def rule(self) -> str:
        return f"shape [{self.size}]" if self.exact else f"1-D with 1..{self.size} values"


@dataclass(frozen=True)
class Camera:
    key: str
    slot: int
    required: bool


@dataclass(frozen=True)
class Preset:
    name: str
    cameras: tuple[Camera, ...]
    state: tuple[StateKey, ...]
    action_dim: int
    images_key: str | None = None  # cameras nested under this key (ALOHA's "images" dict)
    ignored_cameras: tuple[str, ...] = ()
    metadata: Mapping[str, Any] = field(default_factory=dict)
    #: Camera names a nested ``images`` map may hold (computed once, not per request).
    accepted_cameras: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        accepted = frozenset(c.key for c in self.cameras) | frozenset(self.ignored_cameras)
        object.__setattr__(self, "accepted_cameras", accepted)

    def describe(self) -> dict[str, Any]:
        """This preset's entry in the handshake metadata."""
        return {
            "camera_keys": [c.key for c in self.cameras],
            "required_cameras": [c.key for c in self.cameras if c.required],
            "images_key": self.images_key,
            "state_keys": [k.key for k in self.state],
            "action_dim": self.action_dim,
            **self.metadata,
        }


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            "libero",
            (Camera("observation/image", 0, True), Camera("observation/wrist_image", 1, True)),
            (StateKey("observation/state", 8),),
            action_dim=7,
        ),
        Preset(
            "droid",
            (
                Camera("observation/exterior_image_1_left", 0, True),
                Camera("observation/wrist_image_left", 1, True),
            ),
            (StateKey("observation/joint_position", 7), StateKey("observation/gripper_position", 1)),
            action_dim=8,
        ),
        Preset(
            "aloha",
            (
                Camera("cam_high", 0, True),
                Camera("cam_left_wrist", 1, False),
                Camera("cam_right_wrist", 2, False),
            ),
            (StateKey("state", 14),),
            action_dim=14,
            images_key="images",
            ignored_cameras=("cam_low",),
            metadata={"reset_pose": [0.0, -1.5, 1.5, 0.0, 0.0, 0.0]},
        ),
        Preset(
            "pi0",
            (
                Camera("observation.images.base_0_rgb", 0, False),
                Camera("observation.images.left_wrist_0_rgb", 1, False),
                Camera("observation.images.right_wrist_0_rgb", 2, False),
            ),
            (StateKey("state", 32, exact=False),),
            action_dim=32,
        ),
    )
}


def all_str(keys: Iterable[Any]) -> bool:
    """Whether every key is a ``str`` (one C-level pass: this runs on every request)."""
    return all(map(isinstance, keys, repeat(str)))


def detect(observation: Mapping[str, Any]) -> Preset:
    """The preset whose distinctive keys the observation carries."""
    if not all_str(observation):
        raise ObservationError("observation keys must be strings")
    if isinstance(observation.get("images"), Mapping):
        return PRESETS["aloha"]
    if any(map(str.startswith, observation, repeat("observation.images."))):
        return PRESETS["pi0"]
    if "observation/joint_position" in observation or "observation/exterior_image_1_left" in observation:
        return PRESETS["droid"]
    if "observation/state" in observation or "observation/image" in observation:
        return PRESETS["libero"]
    raise ObservationError(
        "observation matches no preset: send LIBERO ('observation/image', 'observation/state'), "
        "DROID ('observation/exterior_image_1_left', 'observation/joint_position'), ALOHA ('images', 'state') "
        "or pi0 ('observation.images.*', 'state') keys"
    )


@dataclass(frozen=True)
class Canonical:
    """A robot observation in model terms: one HWC uint8 image (or None) per camera slot, the
    float32 state vector. Images, and the state of a one-key preset, may be read-only views of
    the decoded wire arrays: copy before writing."""

    images: tuple[np.ndarray | None, ...]
    state: np.ndarray
    prompt: str


def _image(key: str, value: Any) -> np.ndarray:
    if not isinstance(value, np.ndarray):
        raise ObservationError(f"camera {key!r} must be an ndarray, got {type(value).__name__}")
    shape = value.shape
    if len(shape) != 3 or (shape[2] != 3 and shape[0] != 3):
        raise ObservationError(f"camera {key!r} must be HxWx3 or 3xHxW, got shape {list(shape)}")
    if shape[2] == 3:
        height, width = shape[0], shape[1]
    else:
        value = value.transpose(1, 2, 0)
        height, width = shape[1], shape[2]
    if not (0 < height <= MAX_IMAGE_SIDE and 0 < width <= MAX_IMAGE_SIDE):
        raise ObservationError(
            f"camera {key!r} sides must be in 1..{MAX_IMAGE_SIDE}, got shape {list(value.shape)}"
        )
    if value.dtype == np.uint8:
        return value
    if value.dtype.kind != "f":
        raise ObservationError(
            f"camera {key!r} must be uint8 or float in [0, 1], got dtype {value.dtype.str}"
        )
    low, high = float(value.min()), float(value.max())  # NaN propagates into both
    if not (np.isfinite(low) and np.isfinite(high)):
        raise ObservationError(f"camera {key!r}: float pixels must be finite, got NaN or infinity")
    if low < 0.0 or high > 1.0:
        raise ObservationError(
            f"camera {key!r}: float pixels must be in [0, 1], got values in [{low:g}, {high:g}]"
        )
    return (value * 255.0).astype(np.uint8)


_FLOAT32_MAX = float(np.finfo(np.float32).max)
_LARGEST = np.maximum.reduce  # ndarray.max() without its Python wrapper; NaN propagates


def _state_array(key: str, raw: Any) -> np.ndarray:
    """A state value that is not an ndarray already (the OpenPI codec decodes to ndarrays) as one."""
    try:
        return np.asarray(raw)
    except (ValueError, TypeError, OverflowError):  # ragged nested lists, unconvertible objects
        raise ObservationError(
            f"state {key!r} must be a numeric array, got a {type(raw).__name__} that is not one (ragged?)"
        ) from None


def _state(preset: Preset, observation: Mapping[str, Any]) -> np.ndarray:
    parts = []
    for spec in preset.state:
        if spec.key not in observation:
            raise ObservationError(f"missing state key {spec.key!r} (preset {preset.name})")
        value = observation[spec.key]
        if type(value) is not np.ndarray:
            value = _state_array(spec.key, value)
        if value.dtype.kind not in "biuf":
            raise ObservationError(f"state {spec.key!r} must be a numeric array, got dtype {value.dtype.str}")
        if value.ndim == 1:
            shape_ok = value.size == spec.size if spec.exact else 1 <= value.size <= spec.size
        else:
            shape_ok = spec.size == 1 and value.ndim == 0
        if not shape_ok:
            raise ObservationError(
                f"state {spec.key!r} must have {spec.rule} (preset {preset.name}), got shape {list(value.shape)}"
            )
        # finite and within float32's range in one reduction, without np.errstate (a slow context
        # manager on every request): max() propagates NaN, and a comparison with NaN is False.
        # Compared as a Python float: NumPy would cast the bound to a float16 array's dtype (inf)
        if value.dtype.kind == "f" and not float(_LARGEST(np.abs(value), axis=None)) <= _FLOAT32_MAX:
            raise ObservationError(f"state {spec.key!r} must be finite float32 values, got NaN or infinity")
        parts.append(value.astype(np.float32, copy=False).reshape(-1))
    return parts[0] if len(parts) == 1 else np.concatenate(parts)  # one key: no copy


def _text_array(prompt: np.ndarray, max_chars: int) -> str:
    """A 0-d ``U``/``S`` array as text, its length bounded before it is converted."""
    chars = prompt.dtype.itemsize // (4 if prompt.dtype.kind == "U" else 1)
    if chars > (max_chars if prompt.dtype.kind == "U" else 4 * max_chars):
        raise ObservationError(
            f"prompt must be at most {max_chars} characters, got a {prompt.dtype.str} array"
        )
    if prompt.dtype.kind == "S":
        return prompt.item().decode("utf-8", "replace")
    order = prompt.dtype.byteorder if prompt.dtype.byteorder in "<>" else "="
    points = np.frombuffer(prompt.tobytes(), dtype=np.dtype(f"{order}u4"))
    if bool(((points > 0x10FFFF) | ((points >= 0xD800) & (points <= 0xDFFF))).any()):
        raise ObservationError(
            "prompt must be valid Unicode text, got surrogates or code points above U+10FFFF"
        )
    return prompt.item()


def check_prompt(prompt: Any, max_chars: int) -> str:
    """The prompt as text: a str, UTF-8 bytes (invalid sequences replaced) or a 0-d ``U``/``S``
    array, at most ``max_chars`` characters and encodable as UTF-8 (no lone surrogates)."""
    if type(prompt) is str and len(prompt) <= max_chars and prompt.isascii():
        return prompt  # the common case, every request: ASCII always encodes
    if isinstance(prompt, np.ndarray) and prompt.ndim == 0 and prompt.dtype.kind in "US":
        prompt = _text_array(prompt, max_chars)
    if isinstance(prompt, bytes):  # np.bytes_ too
        if len(prompt) > 4 * max_chars:
            raise ObservationError(f"prompt must be at most {max_chars} characters, got {len(prompt)} bytes")
        prompt = bytes(prompt).decode("utf-8", "replace")
    if not isinstance(prompt, str):
        raise ObservationError(f"prompt must be a string, got {type(prompt).__name__}")
    if len(prompt) > max_chars:
        raise ObservationError(f"prompt must be at most {max_chars} characters, got {len(prompt)}")
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError:
        raise ObservationError("prompt must be valid Unicode text, got a lone surrogate") from None
    return str(prompt)


def canonicalize(
    preset: Preset,
    observation: Mapping[str, Any],
    max_cameras: int,
    default_prompt: str,
    max_prompt_chars: int = MAX_PROMPT_CHARS,
) -> Canonical:
    """Validate ``observation`` against ``preset``; the rules (each refusal names key and rule):

    - cameras: ndarrays ``HxWx3`` or ``3xHxW``, sides 1..:data:`MAX_IMAGE_SIDE`, uint8, or float
      (any width) with every pixel finite and in [0, 1]; the preset's required cameras present, at
      least one camera, no unknown camera in a nested ``images`` map;
    - state: each of the preset's state keys present, numeric (bool, int, uint or float: no
      object, text, ragged or nested lists), of the preset's shape (:class:`StateKey`), finite
      once converted to float32;
    - prompt (default ``default_prompt``): :func:`check_prompt` with ``max_prompt_chars``.
    """
    source = observation
    if preset.images_key is not None:
        source = observation.get(preset.images_key)
        if not isinstance(source, Mapping):
            raise ObservationError(f"{preset.images_key!r} must be a map of camera name to image")
        if not all_str(source):
            raise ObservationError(f"{preset.images_key!r} keys must be camera names (strings)")
        known = preset.accepted_cameras
        if not known.issuperset(source):
            unknown = sorted(set(source) - known)
            raise ObservationError(
                f"unknown camera {unknown[0]!r} (preset {preset.name} accepts {sorted(known)})"
            )
    images: list[np.ndarray | None] = [None] * max_cameras
    found = False
    for camera in preset.cameras:
        if camera.key in source:
            images[camera.slot] = _image(camera.key, source[camera.key])
            found = True
        elif camera.required:
            raise ObservationError(f"missing camera {camera.key!r} (preset {preset.name})")
    if not found:
        raise ObservationError(
            f"no camera image (preset {preset.name} reads {[c.key for c in preset.cameras]})"
        )
    prompt = check_prompt(observation.get("prompt", default_prompt), max_prompt_chars)
    return Canonical(tuple(images), _state(preset, observation), prompt)
