"""A robot policy as a stage of the stage engine (``models.stage.ModelStage``).

Each item's payload is a :class:`PolicyTick` (a prepared observation and the session's immutable
state snapshot); the engine batches items of many sessions and this stage runs them through one
``policy.infer``. Each output is a :class:`PolicyChunk` carrying the forward's duration, which
the OpenPI reply reports as ``policy_timing.infer_ms``. Per-session state lives with the session
(its runner commits chunks), so the stage itself is stateless.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from models.policy.interface import Policy
from models.stage import StageItem


@dataclass(frozen=True)
class PolicyTick:
    prepared: Any
    snapshot: Any


@dataclass(frozen=True)
class PolicyChunk:
    actions: np.ndarray
    forward_ms: float
    batch_size: int


class PolicyStage:
    """``device`` defaults to the policy's, so the engine's worker thread runs on that device's stream."""

    def __init__(self, policy: Policy, name: str = "policy", device: str | None = None) -> None:
        self.policy = policy
        self.name = name
        self.device = device or getattr(policy, "device", "cpu")

    def forward(self, items: Sequence[StageItem]) -> list[PolicyChunk]:
        start = time.perf_counter()
        chunks = self.policy.infer([i.payload.prepared for i in items], [i.payload.snapshot for i in items])
        ms = (time.perf_counter() - start) * 1000.0
        return [PolicyChunk(chunk, ms, len(items)) for chunk in chunks]
