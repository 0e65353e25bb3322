"""The duplex kind's model side: which stage ``duplex.model`` builds, and the adapter that
carries a step's typed error to the frame clock."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from models.duplex.stage import DuplexError
from models.stage import StageItem
from realtime.config import DuplexConfig
from realtime.kinds.duplex_session import StepFailed


def build_stage(config: DuplexConfig, slots: int) -> Any:
    """The model ``config.model`` names as a duplex stage of ``slots`` slots (random weights,
    seeded: see docs/protocols/duplex.md, "Models")."""
    if config.model == "moshi-test":
        from models.duplex.moshi_adapter import MoshiDuplexStage

        return MoshiDuplexStage.from_config(None, device=config.device, slot_capacity=slots, seed=config.seed)
    from models.duplex.configs import CONFIGS
    from models.duplex.stage import build_duplex_stage

    return build_duplex_stage(CONFIGS[config.model], config.device, slots, config.seed)


class FrameStage:
    """The duplex stage as the engine drives it under a frame clock: a step's ``DuplexError``
    comes back as a :class:`StepFailed` *output* (the clock hands outputs of silent steps to its
    ``on_output`` and drops exceptions), everything else is the model's own."""

    def __init__(self, stage: Any) -> None:
        self.stage = stage
        self.name = stage.name
        self.device = stage.device
        self.slot_capacity = stage.slot_capacity

    def state_bytes(self) -> int:
        return int(self.stage.state_bytes())

    def open_state(self, session_id: str, slot: int) -> Any:
        return self.stage.open_state(session_id, slot)

    def release_state(self, session_id: str, slot: int, state: Any) -> None:
        self.stage.release_state(session_id, slot, state)

    def forward(self, items: Sequence[StageItem]) -> list[Any]:
        outputs = self.stage.forward(items)
        return [StepFailed(o) if isinstance(o, DuplexError) else o for o in outputs]
