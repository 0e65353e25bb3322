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
observation into per-slot HWC uint8 images, a float32 state vector and a prompt, raising
:class:`ObservationError` with the offending key for anything it cannot use. Images may be uint8
or float in [0, 1] (LeRobot style), HWC or CHW, any size. Inputs are never written to.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from models.policy.interface import ObservationError

MAX_IMAGE_SIDE = 4096


@dataclass(frozen=True)
class Camera:
    key: str
    slot: int
    required: bool


@dataclass(frozen=True)
class Preset:
    name: str
    cameras: tuple[Camera, ...]
    state_keys: tuple[str, ...]
    action_dim: int
    images_key: str | None = None  # cameras nested under this key (ALOHA's "images" dict)
    ignored_cameras: tuple[str, ...] = ()
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        """This preset's entry in the handshake metadata."""
        return {
            "camera_keys": [c.key for c in self.cameras],
            "required_cameras": [c.key for c in self.cameras if c.required],
            "images_key": self.images_key,
            "state_keys": list(self.state_keys),
            "action_dim": self.action_dim,
            **self.metadata,
        }


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            "libero",
            (Camera("observation/image", 0, True), Camera("observation/wrist_image", 1, True)),
            ("observation/state",),
            action_dim=7,
        ),
        Preset(
            "droid",
            (
                Camera("observation/exterior_image_1_left", 0, True),
                Camera("observation/wrist_image_left", 1, True),
            ),
            ("observation/joint_position", "observation/gripper_position"),
            action_dim=8,
        ),
        Preset(
            "aloha",
            (
                Camera("cam_high", 0, True),
                Camera("cam_left_wrist", 1, False),
                Camera("cam_right_wrist", 2, False),
            ),
            ("state",),
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
            ("state",),
            action_dim=32,
        ),
    )
}


def detect(observation: Mapping[str, Any]) -> Preset:
    """The preset whose distinctive keys the observation carries."""
    if isinstance(observation.get("images"), Mapping):
        return PRESETS["aloha"]
    if any(k.startswith("observation.images.") for k in observation):
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
    """A robot observation in model terms: one HWC uint8 image (or None) per camera slot."""

    images: tuple[np.ndarray | None, ...]
    state: np.ndarray
    prompt: str


def _image(key: str, value: Any) -> np.ndarray:
    if not isinstance(value, np.ndarray):
        raise ObservationError(f"camera {key!r} must be an ndarray, got {type(value).__name__}")
    if value.ndim != 3 or (value.shape[-1] != 3 and value.shape[0] != 3):
        raise ObservationError(f"camera {key!r} must be HxWx3 or 3xHxW, got shape {list(value.shape)}")
    if value.shape[-1] != 3:
        value = value.transpose(1, 2, 0)
    if not 0 < min(value.shape[:2]) <= max(value.shape[:2]) <= MAX_IMAGE_SIDE:
        raise ObservationError(
            f"camera {key!r} sides must be in 1..{MAX_IMAGE_SIDE}, got {list(value.shape)}"
        )
    if value.dtype == np.uint8:
        return value
    if value.dtype.kind == "f":
        if not np.isfinite(value).all():
            raise ObservationError(f"camera {key!r} has non-finite pixels")
        return (np.clip(value, 0.0, 1.0) * 255.0).astype(np.uint8)
    raise ObservationError(f"camera {key!r} must be uint8 or float in [0, 1], got dtype {value.dtype.str}")


def _state(preset: Preset, observation: Mapping[str, Any]) -> np.ndarray:
    parts = []
    for key in preset.state_keys:
        if key not in observation:
            raise ObservationError(f"missing state key {key!r} (preset {preset.name})")
        value = np.asarray(observation[key])
        if value.dtype.kind not in "biuf":
            raise ObservationError(f"state {key!r} must be numeric, got dtype {value.dtype.str}")
        value = value.astype(np.float32).reshape(-1)
        if not np.isfinite(value).all():
            raise ObservationError(f"state {key!r} has non-finite values")
        parts.append(value)
    return np.concatenate(parts)


def _prompt(observation: Mapping[str, Any], default: str) -> str:
    prompt = observation.get("prompt", default)
    if isinstance(prompt, bytes | np.bytes_):
        prompt = bytes(prompt).decode("utf-8", "replace")
    if isinstance(prompt, np.ndarray) and prompt.ndim == 0 and prompt.dtype.kind == "U":
        prompt = str(prompt)
    if not isinstance(prompt, str):
        raise ObservationError(f"prompt must be a string, got {type(prompt).__name__}")
    return prompt


def canonicalize(
    preset: Preset, observation: Mapping[str, Any], max_cameras: int, default_prompt: str
) -> Canonical:
    source = observation
    if preset.images_key is not None:
        source = observation.get(preset.images_key)
        if not isinstance(source, Mapping):
            raise ObservationError(f"{preset.images_key!r} must be a map of camera name to image")
        known = {c.key for c in preset.cameras} | set(preset.ignored_cameras)
        unknown = sorted(set(source) - known)
        if unknown:
            raise ObservationError(
                f"unknown camera {unknown[0]!r} (preset {preset.name} accepts {sorted(known)})"
            )
    images: list[np.ndarray | None] = [None] * max_cameras
    for camera in preset.cameras:
        if camera.key in source:
            images[camera.slot] = _image(camera.key, source[camera.key])
        elif camera.required:
            raise ObservationError(f"missing camera {camera.key!r} (preset {preset.name})")
    if all(image is None for image in images):
        raise ObservationError(
            f"no camera image (preset {preset.name} reads {[c.key for c in preset.cameras]})"
        )
    return Canonical(tuple(images), _state(preset, observation), _prompt(observation, default_prompt))
