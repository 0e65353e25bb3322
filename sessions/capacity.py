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

:func:`available_memory_bytes` measures free device memory: ``torch.cuda.mem_get_info`` on a
CUDA device, ``MemAvailable`` of ``/proc/meminfo`` (or ``sysconf``) on the CPU. Kinds measure
it after loading their models, so earlier kinds' preallocated pools are already deducted.
"""

from __future__ import annotations

import os
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
    limited_by: str  # "memory", "model" or "config"

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
