"""Deploy config -> session runtime: one place that maps ``runtime.*`` and a kind's section
onto a :class:`sessions.manager.SessionManager`, so every kind gets the same limits.

``build_session_manager`` plans capacity from the model's :class:`MemoryDeclaration` against
``runtime.memory_available_bytes`` or the memory measured now on ``device`` (call it after the
kind's models and pools are loaded), then builds the manager with the admission, expiry and
per-session limits of the config. A model that cannot fit one session raises
:class:`sessions.errors.CapacityError` naming available and required bytes (startup fails).

The reaper checks every ``runtime.reaper_interval_s``, or a quarter of the kind's idle timeout
when that is shorter, so an idle session closes within 1.25x its timeout.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from prometheus_client import CollectorRegistry

from realtime.config import RuntimeConfig
from sessions.capacity import CapacityPlan, MemoryDeclaration, available_memory_bytes, plan_capacity
from sessions.identities import RequestIdFactory, default_request_id
from sessions.lifecycle import LifecycleBackend
from sessions.manager import AdmissionPolicy, SessionManager
from sessions.reaper import ExpiryPolicy
from sessions.reducer import ControlReducer
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


def capacity_plan(
    runtime: RuntimeConfig, declaration: MemoryDeclaration, device: str = "cpu"
) -> CapacityPlan:
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
    runtime: RuntimeConfig,
    kind_config: KindLimits,
    executor: TickExecutor,
    declaration: MemoryDeclaration,
    lifecycle: LifecycleBackend,
    registry: CollectorRegistry,
    device: str = "cpu",
    reducer_factory: Callable[[], ControlReducer] | None = None,
    state_factory: Callable[[], Any] | None = None,
    request_id_factory: RequestIdFactory = default_request_id,
) -> SessionManager:
    """A manager for ``kind`` with capacity planned from memory and limits from the config."""
    return SessionManager(
        kind,
        executor=executor,
        capacity=capacity_plan(runtime, declaration, device),
        lifecycle=lifecycle,
        admission=admission_policy(runtime),
        expiry=expiry_policy(runtime, kind_config),
        limits=session_limits(runtime),
        reducer_factory=reducer_factory,
        state_factory=state_factory,
        request_id_factory=request_id_factory,
        registry=registry,
    )
