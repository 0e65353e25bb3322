"""A trivial policy: validates observations like pi0-tiny, answers an all-zero chunk.

For smoke tests and for measuring serving overhead (``realtime bench robot`` serves it from both
this server and openpi-server): everything but the model forward is the same work.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from models.policy import presets
from models.policy.interface import PolicySpec, StatelessState

HORIZON, ACTION_DIM, STATE_DIM, MAX_CAMERAS = 50, 32, 32, 3


class ZerosPolicy:
    device = "cpu"  # nothing to compute: its stage never needs an accelerator

    def __init__(
        self,
        preset: str | None = None,
        default_prompt: str = "",
        max_prompt_chars: int = presets.MAX_PROMPT_CHARS,
    ) -> None:
        self.preset = presets.PRESETS[preset] if preset else None
        self.default_prompt = default_prompt
        self.max_prompt_chars = max_prompt_chars
        camera_source = self.preset or presets.PRESETS["pi0"]
        self.spec = PolicySpec(
            name="zeros",
            action_horizon=HORIZON,
            action_dim=self.preset.action_dim if self.preset else ACTION_DIM,
            action_space="joint_position",
            image_resolution=(224, 224),
            camera_keys=tuple(c.key for c in camera_source.cameras),
            state_dim=STATE_DIM,
            max_cameras=MAX_CAMERAS,
            extra={
                "observation_preset": self.preset.name if self.preset else "auto",
                **(dict(self.preset.metadata) if self.preset else {}),
            },
        )

    def prepare(self, observation: Mapping[str, Any]) -> presets.Canonical:
        preset = self.preset or presets.detect(observation)
        return presets.canonicalize(
            preset, observation, MAX_CAMERAS, self.default_prompt, self.max_prompt_chars
        )

    def new_state(self) -> StatelessState:
        return StatelessState()

    def front(self) -> ZerosPolicy:
        """Itself: it holds no weights and pickles small."""
        return self

    def infer(self, batch: Sequence[presets.Canonical], snapshots: Sequence[None]) -> list[np.ndarray]:
        return [np.zeros((HORIZON, self.spec.action_dim), np.float32) for _ in batch]

    def warmup(self, max_batch: int) -> None:
        return None
