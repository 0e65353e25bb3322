"""Example observations of the common robots, as their OpenPI clients send them.

Shapes and keys follow ``../shared/reference/openpi-and-robot-policy-servers.md`` §2.6: LIBERO and
DROID send HWC uint8 images under flat ``observation/...`` keys; ALOHA sends CHW uint8 images under
``images`` and a 14-dim ``state``. Used by the benchmarks, the tests and the docs' quickstarts;
seeded, so a seed always gives the same observation.
"""

from __future__ import annotations

from typing import Any

import numpy as np

ALOHA_CAMERAS = ("cam_high", "cam_low", "cam_left_wrist", "cam_right_wrist")


def _hwc(rng: np.random.Generator) -> np.ndarray:
    return rng.integers(0, 256, (224, 224, 3), dtype=np.uint8)


def libero(seed: int = 0, **extra: Any) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    return {
        "observation/image": _hwc(rng),
        "observation/wrist_image": _hwc(rng),
        "observation/state": rng.standard_normal(8).astype(np.float32),
        "prompt": "put the bowl on the plate",
        **extra,
    }


def droid(seed: int = 0, **extra: Any) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    return {
        "observation/exterior_image_1_left": _hwc(rng),
        "observation/wrist_image_left": _hwc(rng),
        "observation/joint_position": rng.standard_normal(7),
        "observation/gripper_position": np.float64(0.5),
        "prompt": "open the drawer",
        **extra,
    }


def aloha(seed: int = 0, **extra: Any) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    return {
        "state": rng.standard_normal(14).astype(np.float32),
        "images": {c: rng.integers(0, 256, (3, 224, 224), dtype=np.uint8) for c in ALOHA_CAMERAS},
        "prompt": "transfer the cube",
        **extra,
    }
