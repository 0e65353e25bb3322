"""Deploy config -> session runtime: one place that maps ``runtime.*`` and a kind's section onto a
:class:`sessions.manager.SessionManager`, so every kind gets the same limits.

Capacity is planned **once** per kind (architecture invariant 7): :func:`capacity_plan` measures
the memory available (``runtime.memory_available_bytes`` if set, else free memory on the device,
measured *before* the kind allocates its pools), and the same :class:`CapacityPlan` sizes the
model's pools and the manager's admission, so the manager admits exactly what the pools hold. A
model that cannot fit one session raises :class:`sessions.errors.CapacityError` naming available
and required bytes (startup fails). :func:`stage_declaration` turns a stage's ``state_bytes()``
(summed over a pipeline's stages) into the declaration the plan reads.

The reaper checks every ``runtime.reaper_interval_s``, or a quarter of the kind's idle timeout
when that is shorter, so an idle session closes within 1.25x its timeout.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from realtime.config import RuntimeConfig
from sessions.capacity import CapacityPlan, MemoryDeclaration, available_memory_bytes, plan_capacity
from sessions.lifecycle import LifecycleBackend
from sessions.manager import AdmissionPolicy, SessionManager
from sessions.reaper import ExpiryPolicy
from sessions.session import SessionLimits
from sessions.tick import TickExecutor


class KindLimits(Protocol):
    """The per-kind fields every kind section (``robot``, ``world``) has."""

    idle_timeout_s: float
    max_lifetime_s: float


def admission_policy(runtime: RuntimeConfig) -> AdmissionPolicy:
    return AdmissionPolicy(
        over_capacity=runtime.over_capacity,
        max_queued=runtime.max_queued_sessions,
        queue_timeout_s=runtime.admission_queue_timeout_s,
        evict_idle_lru=runtime.evict_idle_lru,
        evict_min_idle_s=runtime.evict_min_idle_s,
    )


def expiry_policy(runtime: RuntimeConfig, kind: KindLimits) -> ExpiryPolicy:
    interval = runtime.reaper_interval_s
    if kind.idle_timeout_s > 0:
        interval = min(interval, kind.idle_timeout_s / 4)
    return ExpiryPolicy(
        idle_timeout_s=kind.idle_timeout_s,
        max_lifetime_s=kind.max_lifetime_s,
        lifetime_warning_s=runtime.lifetime_warning_s if kind.max_lifetime_s > 0 else 0.0,
        interval_s=interval,
    )


def session_limits(runtime: RuntimeConfig) -> SessionLimits:
    return SessionLimits(
        max_pending_events=runtime.max_pending_events,
        release_timeout_s=runtime.release_timeout_s,
        max_event_id_ranges=runtime.max_event_id_ranges,
    )


def stage_declaration(
    *stages: Any, scratch_bytes: int = 0, max_sessions: int | None = None
) -> MemoryDeclaration:
    """The declaration of one session over ``stages``: their ``state_bytes()`` summed, capped by
    the smallest ``slot_capacity`` and ``max_sessions`` (a stateless stage declares 0 bytes and
    no cap, so a kind of stateless stages must pass ``max_sessions``)."""
    caps: Sequence[int] = [s.slot_capacity for s in stages if hasattr(s, "slot_capacity")]
    if max_sessions is not None:
        caps = [*caps, max_sessions]
    return MemoryDeclaration(
        resident_bytes_per_session=sum(int(s.state_bytes()) for s in stages if hasattr(s, "state_bytes")),
        scratch_bytes=scratch_bytes,
        max_sessions=min(caps) if caps else None,
    )


def capacity_plan(
    runtime: RuntimeConfig, declaration: MemoryDeclaration, device: str = "cpu"
) -> CapacityPlan:
    """The kind's one plan: call it once, before allocating pools (see the module docstring)."""
    available = runtime.memory_available_bytes
    return plan_capacity(
        declaration,
        available_bytes=available if available is not None else available_memory_bytes(device),
        fraction=runtime.memory_budget_fraction,
        max_sessions=runtime.max_sessions,
    )


def build_session_manager(
    kind: str,
    *,
    ctx: Any,
    kind_config: KindLimits,
    plan: CapacityPlan,
    executor: TickExecutor,
    lifecycle: LifecycleBackend,
    resume_grace_s: float = 0.0,
) -> SessionManager:
    """A manager for ``kind`` admitting ``plan.capacity`` sessions, limits from the config;
    ``resume_grace_s`` > 0 keeps a dropped socket's session detached that long (duplex resume)."""
    runtime = ctx.config.runtime
    return SessionManager(
        kind,
        executor=executor,
        capacity=plan,
        lifecycle=lifecycle,
        admission=admission_policy(runtime),
        expiry=expiry_policy(runtime, kind_config),
        limits=session_limits(runtime),
        registry=ctx.registry,
        resume_grace_s=resume_grace_s,
        on_release=ctx.checkpointer.discard if ctx.checkpointer is not None else None,
    )
