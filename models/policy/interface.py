"""The robot policy interface the session runtime drives.

One tick of a robot session is ``observation -> action chunk``. The runtime calls, in order:

1. ``policy.prepare(observation)`` once per observation, on the session's runner (the event
   loop): validate the robot's native observation dict (wire keys, dtypes, shapes) and keep what
   the model needs. It must stay cheap (checks, no image copies or conversions: those belong in
   ``infer``, which runs batched on the worker thread). Bad input raises
   :class:`ObservationError`; nothing else is raised for client mistakes. ``prepare`` validates
   everything ``infer`` will read, so an accepted observation can never fail a batch shared with
   other sessions. Decoded wire arrays are read-only views: neither ``prepare`` nor ``infer``
   writes into them.
2. ``state.snapshot(prepared, now)`` on the session's runner: an immutable view of the
   per-session state this tick needs (for example the previous chunk for real-time chunking).
3. ``policy.infer(batch, snapshots)`` on the stage's worker thread, batching observations of
   many sessions into one forward; returns one ``[spec.action_horizon, spec.action_dim]`` float32
   chunk per item, in order. ``infer`` is pure: it never mutates session state.
4. ``state.commit(chunk, latency_s, now)`` on the runner once the chunk is delivered, or
   ``state.reset()`` on reset (and on a change of the client's ``session_id``).

``policy.front()`` is what of a policy runs on the event loop (``spec``, ``prepare``,
``new_state``): a small picklable object, so a policy built in another process (the server's
``robot.process``) answers ``prepare`` in the server's with the same code.

``PolicySpec`` is the single source of truth for what the policy expects and returns; the OpenPI
handshake metadata is derived from it (``spec.metadata()``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np


class ObservationError(ValueError):
    """An observation the policy cannot use; ``str()`` names the key and the rule it breaks (safe
    for the wire: one line, no traceback)."""


@dataclass(frozen=True)
class PolicySpec:
    """What a policy advertises to clients (the OpenPI handshake) and to the runtime."""

    name: str
    action_horizon: int
    action_dim: int
    action_space: str
    image_resolution: tuple[int, int]
    camera_keys: tuple[str, ...]
    state_dim: int
    max_cameras: int
    needs_session_id: bool = False
    extra: Mapping[str, Any] = field(default_factory=dict)

    def metadata(self) -> dict[str, Any]:
        """The handshake metadata map (msgpack-safe: str keys, lists, scalars)."""
        return {
            "policy": self.name,
            "action_horizon": self.action_horizon,
            "action_dim": self.action_dim,
            "action_space": self.action_space,
            "image_resolution": list(self.image_resolution),
            "camera_keys": list(self.camera_keys),
            "state_dim": self.state_dim,
            "max_cameras": self.max_cameras,
            "needs_session_id": self.needs_session_id,
            **self.extra,
        }


class PolicyState(Protocol):
    """Per-session policy state, owned and mutated only by the session's runner."""

    nbytes: int

    def snapshot(self, prepared: Any, now: float) -> Any:
        """Immutable view handed to ``infer`` for this tick (``None`` when nothing applies)."""
        ...

    def commit(self, chunk: np.ndarray, latency_s: float, now: float) -> None: ...

    def reset(self) -> None: ...


class PolicyFront(Protocol):
    """The part of a policy the session's runner calls (see the module docstring); picklable and
    holding no weights."""

    spec: PolicySpec

    def prepare(self, observation: Mapping[str, Any]) -> Any: ...

    def new_state(self) -> PolicyState: ...


class Policy(PolicyFront, Protocol):
    device: str  # torch device of the weights and forwards ("cpu", "cuda:0"); the stage's worker device

    def front(self) -> PolicyFront:
        """This policy's ``spec``, ``prepare`` and ``new_state`` as a picklable object (no weights)."""
        ...

    def infer(self, batch: Sequence[Any], snapshots: Sequence[Any]) -> list[np.ndarray]: ...

    def warmup(self, max_batch: int) -> None:
        """Run throwaway forwards (batch 1 and ``max_batch``) before serving."""
        ...


class StatelessState:
    """The per-session state of a policy that keeps none."""

    nbytes = 0

    def snapshot(self, prepared: Any, now: float) -> None:
        return None

    def commit(self, chunk: np.ndarray, latency_s: float, now: float) -> None:
        return None

    def reset(self) -> None:
        return None
