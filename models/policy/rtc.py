"""Real-time chunking (RTC): guide a new action chunk toward the unexecuted rest of the previous one.

Black, Galliker, Levine, "Real-Time Execution of Action Chunking Flow Policies" (arXiv 2506.07339);
reference implementation ``real-time-chunking-kinetix/src/model.py::realtime_action`` (reference
``openpi-and-robot-policy-servers.md`` §4.1). While the robot executes the previous chunk, the
next one is sampled. Of the previous chunk, ``executed`` actions were already used when the
observation was taken, and the next ``delay`` actions run while the new chunk is computed: those
are *frozen* (the new chunk's first ``delay`` actions equal them exactly); the remaining overlap
is *inpainted* by guidance with weights that decay to 0 at the end of the overlap.

Time convention here is openpi's pi0 one: ``t`` runs from 1 (noise) to 0 (data), the model
predicts ``v = noise - action`` and the clean estimate is ``a = x_t - t * v``. The Kinetix code
runs ``tau = 1 - t`` the other way, so its ``v + w * correction`` becomes ``v - w * correction``.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from models.policy.interface import ObservationError

Schedule = Literal["ones", "zeros", "linear", "exp"]
LATENCY_WINDOW = 10


def prefix_weights(start: int, end: int, total: int, schedule: Schedule) -> np.ndarray:
    """Kinetix ``get_prefix_weights``: 1 on ``[0, start)``, decaying to 0 at ``end``, 0 after."""
    start = min(start, end)
    idx = np.arange(total, dtype=np.float64)
    if schedule == "ones":
        w = np.ones(total)
    elif schedule == "zeros":
        w = (idx < start).astype(np.float64)
    else:
        w = np.clip((start - 1 - idx) / (end - start + 1) + 1, 0.0, 1.0)
        if schedule == "exp":
            w = w * np.expm1(w) / (math.e - 1)
    return np.where(idx >= end, 0.0, w).astype(np.float32)


def guidance_weight(t: float, max_weight: float) -> float:
    """Kinetix's ``min(c * inv_r2, max)`` with ``tau = 1 - t``; infinite at the pure-noise end."""
    tau = 1.0 - t
    if tau <= 0.0:
        return max_weight
    inv_r2 = (tau**2 + (1 - tau) ** 2) / (1 - tau) ** 2 if tau < 1.0 else math.inf
    return min((1 - tau) / tau * inv_r2, max_weight)


@dataclass(frozen=True)
class RTCOptions:
    """Per-observation opt-in, from the observation's ``"rtc"`` key (``True`` or a map)."""

    control_hz: float = 50.0
    executed_steps: int | None = None
    inference_delay: int | None = None
    schedule: Schedule = "exp"
    max_guidance_weight: float = 10.0

    @classmethod
    def parse(cls, raw: Any) -> RTCOptions | None:
        if raw is None or raw is False:
            return None
        if raw is True:
            return cls()
        if not isinstance(raw, Mapping) or not all(isinstance(k, str) for k in raw):
            raise ObservationError("'rtc' must be true or a map of named options")
        unknown = sorted(
            set(raw) - {"control_hz", "executed_steps", "inference_delay", "schedule", "max_guidance_weight"}
        )
        if unknown:
            raise ObservationError(f"unknown rtc option {unknown[0]!r}")
        opts = cls(**{k: v.item() if isinstance(v, np.generic) else v for k, v in raw.items()})
        if not (isinstance(opts.control_hz, int | float) and 0 < opts.control_hz <= 10_000):
            raise ObservationError("rtc.control_hz must be in (0, 10000]")
        for name in ("executed_steps", "inference_delay"):
            value = getattr(opts, name)
            if value is not None and not (
                isinstance(value, int) and not isinstance(value, bool) and value >= 0
            ):
                raise ObservationError(f"rtc.{name} must be an integer >= 0")
        if not isinstance(opts.schedule, str) or opts.schedule not in ("ones", "zeros", "linear", "exp"):
            raise ObservationError("rtc.schedule must be one of ones, zeros, linear, exp")
        if not (isinstance(opts.max_guidance_weight, int | float) and 0 <= opts.max_guidance_weight <= 1e3):
            raise ObservationError("rtc.max_guidance_weight must be in [0, 1000]")
        return opts


@dataclass(frozen=True)
class Guide:
    """What one item of a batch needs for guided sampling (an immutable tick snapshot)."""

    target: np.ndarray  # [H, action_dim]: the previous chunk's unexecuted actions, zero padded
    weights: np.ndarray  # [H]
    frozen: int
    max_guidance_weight: float


class RTCState:
    """Per-session RTC state: the last delivered chunk, when it was delivered, recent latencies."""

    def __init__(self, horizon: int, action_dim: int) -> None:
        self.horizon = horizon
        self.action_dim = action_dim
        self.nbytes = horizon * action_dim * 4
        self.reset()

    def reset(self) -> None:
        self.prev: np.ndarray | None = None
        self.delivered_at = 0.0
        self.latencies: deque[float] = deque(maxlen=LATENCY_WINDOW)

    def commit(self, chunk: np.ndarray, latency_s: float, now: float) -> None:
        self.prev = chunk
        self.delivered_at = now
        self.latencies.append(latency_s)

    def guide(self, options: RTCOptions | None, now: float) -> Guide | None:
        """The guide for a chunk requested at ``now``, or None when there is nothing to follow."""
        if options is None or self.prev is None:
            return None
        executed = options.executed_steps
        if executed is None:
            executed = round((now - self.delivered_at) * options.control_hz)
        delay = options.inference_delay
        if delay is None:
            delay = math.ceil(max(self.latencies) * options.control_hz)
        overlap = self.horizon - executed
        if overlap <= 0:
            return None
        frozen = min(delay, overlap)
        target = np.zeros((self.horizon, self.prev.shape[1]), np.float32)  # the robot's dims
        target[:overlap] = self.prev[executed:]
        weights = prefix_weights(frozen, overlap, self.horizon, options.schedule)
        return Guide(target, weights, frozen, float(options.max_guidance_weight))


def guided_velocity(
    velocity: Callable[[torch.Tensor], torch.Tensor],
    x_t: torch.Tensor,
    t: float,
    target: torch.Tensor,
    weights: torch.Tensor,
    max_weight: torch.Tensor,
) -> torch.Tensor:
    """One guided flow step's velocity for a batch ``[B, H, D]``; items with zero weights are unguided.

    ``target`` is ``[B, H, D]`` (padded dims must carry zero weight through ``weights [B, H, D]``),
    ``max_weight`` is ``[B]``. The correction is the vector-Jacobian product of the clean estimate
    with the weighted error, as in the paper's pseudo-inverse guidance.
    """
    with torch.enable_grad():
        x = x_t.detach().requires_grad_(True)
        v = velocity(x)
        clean = x - t * v
        error = (target - clean) * weights
        (correction,) = torch.autograd.grad(clean, x, grad_outputs=error.detach())
    scale = torch.clamp(torch.full_like(max_weight, guidance_weight(t, math.inf)), max=max_weight)
    return v.detach() - scale[:, None, None] * correction
