"""The duplex kind's model side: which stage ``duplex.model`` builds, and the adapter that
carries a step's typed error to the frame clock."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from models.duplex.stage import DuplexError
from models.stage import StageItem
from realtime.config import DuplexConfig
from realtime.kinds.duplex_session import StepFailed


def build_stage(config: DuplexConfig, slots: int, capture: bool = True) -> Any:
    """The model ``config.model`` names as a duplex stage of ``slots`` slots: the cascade that
    converses (``duplex-cascade``: the offline voice parts, loaded once per process), the
    Moshi-architecture model (random weights from ``seed``; its step replayed from CUDA graphs on
    CUDA when ``config.cuda_graphs`` and ``capture``), Moshi's tiny random test config, or Moshi
    from the local folder ``config.weights`` (``model.safetensors``, ``tokenizer-*.safetensors``
    (Mimi), ``tokenizer_spm_*.model``)."""
    if config.model == "duplex-cascade":
        from models.duplex.cascade import CascadeStage, load_parts

        c = config.cascade
        return CascadeStage(
            load_parts(c.llm_context_tokens, config.max_sessions), slots, cascade_settings(config)
        )
    if config.model in ("moshi-test", "moshi"):
        from models.duplex.moshi_adapter import SMALL_LM_KWARGS, SMALL_MIMI_CONFIG, MoshiDuplexStage

        if config.model == "moshi-test":
            return MoshiDuplexStage.from_config(
                config.device, slots, SMALL_LM_KWARGS, SMALL_MIMI_CONFIG, seed=config.seed
            )
        folder = Path(config.weights or ".")
        return MoshiDuplexStage.from_config(
            config.device,
            slots,
            lm_weights=folder / "model.safetensors",
            mimi_weights=_one(folder, "tokenizer-*.safetensors"),
            tokenizer=_one(folder, "tokenizer_spm_*.model"),
            dtype=torch.bfloat16 if config.device.startswith("cuda") else torch.float32,
            seed=config.seed,
        )
    from models.duplex.configs import CONFIGS
    from models.duplex.stage import build_duplex_stage

    mode = None if config.cuda_graphs and capture else "eager"
    return build_duplex_stage(
        CONFIGS[config.model],
        config.device,
        slots,
        config.seed,
        step_mode=mode,
        kv_fp8=config.kv_cache == "fp8",
    )


def cascade_settings(config: DuplexConfig) -> Any:
    """``duplex.cascade`` (and ``duplex.barge_in_ms``) as the cascade's settings, field by field
    (the names match; a field missing on either side fails here, at load)."""
    from models.duplex.cascade import CascadeSettings
    from models.duplex.turns import TurnRules

    c = config.cascade
    rules = {f.name: getattr(c, f.name) for f in dataclasses.fields(TurnRules) if f.name != "barge_in_ms"}
    settings = {f.name: getattr(c, f.name) for f in dataclasses.fields(CascadeSettings) if f.name != "rules"}
    return CascadeSettings(rules=TurnRules(barge_in_ms=config.barge_in_ms, **rules), **settings)


def per_session_bytes(config: DuplexConfig) -> int:
    """One session's resident bytes, from a one-slot build freed at once (memory is then
    measured before the real pools exist; no CUDA graphs are captured for it)."""
    probe = build_stage(config, 1, capture=False)
    per_session = int(probe.state_bytes())
    del probe
    if config.device.startswith("cuda"):
        torch.cuda.empty_cache()
    return per_session


def _one(folder: Path, pattern: str) -> Path:
    found = sorted(folder.glob(pattern))
    if len(found) != 1:
        raise FileNotFoundError(f"duplex.weights: expected one {pattern} in {folder}, found {len(found)}")
    return found[0]


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
