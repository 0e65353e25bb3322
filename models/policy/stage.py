"""A robot policy as a stateful batched stage (``models.stage.BatchedStage`` + ``StatefulStage``).

Each item's payload is a :class:`PolicyInput` (a prepared observation and when its request
arrived); the engine batches items of many sessions and this stage runs them through one
``policy.infer``. Per-session policy state (the previous action chunk for real-time chunking) lives
here, one :class:`~models.policy.interface.PolicyState` per slot of the runtime's slot table: the
stage snapshots it for the forward and commits the new chunk after it, so a forward that raises
changes nothing (the engine may re-run a batch in halves). Each output is a :class:`PolicyChunk`
carrying the forward's duration, which the OpenPI reply reports as ``policy_timing.infer_ms``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from models.policy.interface import Policy, PolicyState
from models.stage import StageItem

DEFAULT_SLOTS = 256


@dataclass(frozen=True, slots=True)
class PolicyInput:
    prepared: Any
    received_at: float  # time.perf_counter() when the request arrived (RTC measures latency from it)


@dataclass(frozen=True, slots=True)
class PolicyChunk:
    actions: np.ndarray
    forward_ms: float
    batch_size: int


def policy_input(snapshot: Any) -> PolicyInput:
    """The tick snapshot's payload is already the stage input (the robot kind builds it)."""
    return snapshot.payload


class PolicyStage:
    """``device`` defaults to the policy's, so the engine's worker thread runs on that device's stream."""

    def __init__(
        self,
        policy: Policy,
        name: str = "policy",
        device: str | None = None,
        slot_capacity: int = DEFAULT_SLOTS,
    ) -> None:
        self.policy = policy
        self.name = name
        self.device = device or getattr(policy, "device", "cpu")
        self.slot_capacity = slot_capacity
        self._states: list[PolicyState | None] = [None] * slot_capacity

    def state_bytes(self) -> int:
        return int(self.policy.new_state().nbytes)

    def open_state(self, session_id: str, slot: int) -> None:
        self._states[slot] = self.policy.new_state()

    def release_state(self, session_id: str, slot: int, state: object) -> None:
        self._states[slot] = None

    def seed_state(self, slot: int, chunk: np.ndarray, latency_s: float, delivered_at: float) -> None:
        """Continue a session's state from elsewhere (another replica's checkpoint): as if
        ``chunk`` was delivered at ``delivered_at`` (``time.monotonic()``) after ``latency_s``.
        Called on the loop thread between the session's ticks (none in flight)."""
        state = self._states[slot]
        if state is not None:
            state.commit(chunk, latency_s, delivered_at)

    def forward(self, items: Sequence[StageItem]) -> list[PolicyChunk]:
        start = time.perf_counter()
        now = time.monotonic()
        # The states are taken before the forward: a session released meanwhile (its slot emptied
        # on the loop thread) gets its commit on its own, dropped state object, never on None.
        states, prepared, snapshots = [], [], []
        for item in items:  # one pass: this runs on every tick, usually for a batch of one
            state, observation = self._states[item.slot], item.payload.prepared
            states.append(state)
            prepared.append(observation)
            snapshots.append(state.snapshot(observation, now))
        chunks = self.policy.infer(prepared, snapshots)
        done = time.perf_counter()
        committed = now + (done - start)
        for state, item, chunk in zip(states, items, chunks, strict=True):  # commit: the forward succeeded
            state.commit(chunk, done - item.payload.received_at, committed)
        ms = (done - start) * 1000.0
        size = len(items)
        return [PolicyChunk(chunk, ms, size) for chunk in chunks]
