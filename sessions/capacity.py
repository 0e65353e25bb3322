"""Memory-based session capacity (architecture invariant 7; seed reference §2.10).

A model declares what one resident session costs (:class:`MemoryDeclaration`): resident
bytes (KV pages, codec caches), model-owned bytes (e.g. an image-condition tensor or a VAE
temporal cache) and the scratch an uncommitted forward needs once, plus an optional cap.
Then, exactly as vllm-omni's AR-diffusion runner::

    required(c)      = scratch + c * (resident + model_owned)
    configured       = fraction * available
    effective_budget = max(configured, required(1))     # the fraction is a soft floor
    capacity         = largest c with required(c) <= effective_budget, capped by the model's
                       and the deployment's max_sessions

:func:`plan_capacity` raises :class:`CapacityError` naming both byte counts when
``required(1) > available`` (not even one session fits the memory actually there).

:func:`paced_capacity` is the compute side (issue: memory alone admitted 256 world sessions on two
cores, each then ran at an eighth of real time): from the measured step time at each batch size,
how many paced sessions keep their rate; :func:`with_compute_limit` caps a memory plan by it.

:func:`available_memory_bytes` measures free device memory: ``torch.cuda.mem_get_info`` on a
CUDA device, ``MemAvailable`` of ``/proc/meminfo`` (or ``sysconf``) on the CPU. Each kind
measures it once, before it allocates its own pools (so earlier kinds' pools are deducted and its
own are not), and sizes its pools and its admission from that one plan.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

from sessions.errors import CapacityError


@dataclass(frozen=True)
class MemoryDeclaration:
    """What a model says one resident session costs; all values in bytes."""

    resident_bytes_per_session: int
    model_owned_bytes_per_session: int = 0
    scratch_bytes: int = 0
    max_sessions: int | None = None

    def __post_init__(self) -> None:
        for name in ("resident_bytes_per_session", "model_owned_bytes_per_session", "scratch_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        if self.max_sessions is not None and self.max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, got {self.max_sessions}")

    @property
    def per_session_bytes(self) -> int:
        return self.resident_bytes_per_session + self.model_owned_bytes_per_session

    def required(self, sessions: int) -> int:
        """Bytes needed to keep ``sessions`` sessions resident."""
        return self.scratch_bytes + sessions * self.per_session_bytes


@dataclass(frozen=True)
class CapacityPlan:
    """The outcome of planning: how many sessions to admit and why."""

    capacity: int
    available_bytes: int
    fraction: float
    configured_budget_bytes: int
    effective_budget_bytes: int
    required_one_bytes: int
    per_session_bytes: int
    scratch_bytes: int
    limited_by: str  # "memory", "model", "config" or "compute"
    compute_capacity: int | None = None  # paced sessions the device keeps at their rate (None: not planned)

    def to_dict(self) -> dict[str, object]:
        return dict(self.__dict__)


def plan_capacity(
    declaration: MemoryDeclaration,
    *,
    available_bytes: int,
    fraction: float,
    max_sessions: int | None = None,
) -> CapacityPlan:
    """Plan how many sessions fit (see the module contract); raises ``CapacityError``."""
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    required_one = declaration.required(1)
    if required_one > available_bytes:
        raise CapacityError(
            f"cannot fit one session: available={available_bytes} bytes, required={required_one} bytes",
            available_bytes=available_bytes,
            required_bytes=required_one,
        )
    configured = int(fraction * available_bytes)
    effective = max(configured, required_one)
    caps = {"model": declaration.max_sessions, "config": max_sessions}
    per_session = declaration.per_session_bytes
    if per_session == 0:
        finite = {k: v for k, v in caps.items() if v is not None}
        if not finite:
            raise CapacityError(
                "per-session memory is 0 bytes, so memory does not bound the session count: "
                "declare the model's per-session bytes or set runtime.max_sessions"
            )
        limited_by = min(finite, key=lambda k: finite[k])
        capacity = finite[limited_by]
    else:
        capacity = (effective - declaration.scratch_bytes) // per_session
        limited_by = "memory"
        for name, cap in caps.items():
            if cap is not None and cap < capacity:
                capacity, limited_by = cap, name
    return CapacityPlan(
        capacity=capacity,
        available_bytes=available_bytes,
        fraction=fraction,
        configured_budget_bytes=configured,
        effective_budget_bytes=effective,
        required_one_bytes=required_one,
        per_session_bytes=per_session,
        scratch_bytes=declaration.scratch_bytes,
        limited_by=limited_by,
    )


def paced_capacity(
    step_seconds: Mapping[int, float], period_s: float, max_batch: int, utilisation: float
) -> int:
    """How many paced sessions a stage keeps at their rate (architecture invariant 7, for compute).

    Every paced session needs one step per ``period_s`` (a world block: frames per block / fps).
    With ``n`` sessions and batches of at most ``B = max_batch``, one period runs
    ``ceil(n / B)`` forwards of ``min(n, B)`` items, so ``n`` is admitted while::

        ceil(n / B) * t(min(n, B)) <= utilisation * period_s

    ``t(b)`` is the measured time of one step at batch ``b`` (``step_seconds``, linearly
    interpolated between the measured sizes, extrapolated from the last two above them). The
    answer is at least 1 (one session is always admitted; whether it keeps pace is the model's).
    """
    if not step_seconds:
        raise ValueError("step_seconds needs at least one measured batch size")
    sizes = sorted(step_seconds)

    def t(b: int) -> float:
        if b in step_seconds:
            return step_seconds[b]
        lo = max([s for s in sizes if s < b], default=sizes[0])
        hi = min([s for s in sizes if s > b], default=None)
        if hi is None:  # beyond the largest measured size: extend the last slope
            if len(sizes) == 1:
                return step_seconds[lo] * b / lo
            lo, hi = sizes[-2], sizes[-1]
        slope = (step_seconds[hi] - step_seconds[lo]) / (hi - lo)
        return step_seconds[lo] + slope * (b - lo)

    budget = utilisation * period_s
    n = 1
    while n < 100_000 and math.ceil((n + 1) / max_batch) * t(min(n + 1, max_batch)) <= budget:
        n += 1
    return n


def with_compute_limit(plan: CapacityPlan, compute_capacity: int) -> CapacityPlan:
    """``plan`` capped by what the device can keep at pace (``limited_by="compute"`` if lower)."""
    if compute_capacity < plan.capacity:
        return dataclasses.replace(
            plan, capacity=compute_capacity, limited_by="compute", compute_capacity=compute_capacity
        )
    return dataclasses.replace(plan, compute_capacity=compute_capacity)


def available_memory_bytes(device: str = "cpu") -> int:
    """Free memory on ``device`` ("cpu", "cuda", "cuda:N") in bytes."""
    if device.startswith("cuda"):
        import torch

        free, _total = torch.cuda.mem_get_info(torch.device(device))
        return int(free)
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
