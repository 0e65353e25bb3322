"""Prometheus metrics of the stage engines, on the registry the app passes in.

One set of collectors per registry (several engines share it, labelled by ``stage``), so
several apps with their own registries can live in one process.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128)
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


@dataclass(frozen=True)
class EngineMetrics:
    batch_size: Histogram
    queue_depth: Gauge
    forward_seconds: Histogram
    item_seconds: Histogram
    failures: Counter
    stale_dropped: Counter
    backpressure_dropped: Counter
    stalls: Counter
    slots_open: Gauge
    slot_bytes: Gauge
    channel_depth: Gauge


_BY_REGISTRY: weakref.WeakKeyDictionary[CollectorRegistry, EngineMetrics] = weakref.WeakKeyDictionary()


def engine_metrics(registry: CollectorRegistry) -> EngineMetrics:
    """The engine collectors registered on ``registry`` (created on first use)."""
    found = _BY_REGISTRY.get(registry)
    if found is not None:
        return found
    r = registry
    metrics = EngineMetrics(
        batch_size=Histogram(
            "engine_batch_size", "items per forward", ["stage"], buckets=_BATCH_BUCKETS, registry=r
        ),
        queue_depth=Gauge("engine_queue_depth", "items waiting for a forward", ["stage"], registry=r),
        forward_seconds=Histogram(
            "engine_forward_seconds",
            "wall time of one batched forward",
            ["stage"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        ),
        item_seconds=Histogram(
            "engine_item_seconds",
            "submit-to-output latency of one item (queueing + forward)",
            ["stage"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        ),
        failures=Counter(
            "engine_failures_total", "failed items by scope (item or batch)", ["stage", "scope"], registry=r
        ),
        stale_dropped=Counter(
            "engine_stale_chunks_dropped_total",
            "chunks and results dropped for a stale epoch",
            ["stage"],
            registry=r,
        ),
        backpressure_dropped=Counter(
            "engine_backpressure_dropped_total",
            "chunks dropped by the drop_oldest policy",
            ["stage"],
            registry=r,
        ),
        stalls=Counter("engine_stalls_total", "streams failed by the stall deadline", ["stage"], registry=r),
        slots_open=Gauge(
            "engine_slots_open", "sessions holding a resident-state slot", ["stage"], registry=r
        ),
        slot_bytes=Gauge("engine_slot_bytes", "resident bytes held by session slots", ["stage"], registry=r),
        channel_depth=Gauge(
            "engine_channel_depth", "chunks buffered in output channels", ["stage"], registry=r
        ),
    )
    _BY_REGISTRY[registry] = metrics
    return metrics
