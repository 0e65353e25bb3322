"""``GET /v1/status``: a small JSON summary of what the server is doing, for the demo's status page.

The same numbers as ``/metrics`` (and the same API-key rule), shaped for a page rather than a
scraper. Contract of :func:`server_status` (read on the event loop; nothing is reset by a read):

- ``ready``, ``draining``, ``version``, ``connections`` (``open`` TCP connections as the server
  counts them, ``max``, and open websockets per kind);
- ``kinds``: per enabled kind, from its ``SessionManager.stats()``: ``capacity``, ``occupied``,
  ``free`` (capacity - occupied, never below 0), ``queued`` (waiting for admission),
  ``sessions_by_state`` and the lifetime counters ``created``, ``closed``, ``evicted``,
  ``expired``, ``rejected``; ``null`` stats while the kind is still loading;
- ``stages``: per stage engine, from the engine histograms of the app's registry (cumulative since
  start): ``batch_size``, ``forward_ms`` (one batched forward) and ``item_ms`` (submit to output:
  queueing + forward), each ``{count, mean, p50, p95}`` (quantiles interpolated within the
  histogram's buckets, as Prometheus' ``histogram_quantile``; ``null`` before any observation),
  plus ``queue_depth`` and ``slots_open`` now.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry

# engine histogram family -> (status field, scale to the field's unit)
_HISTOGRAMS = {
    "engine_batch_size": ("batch_size", 1.0),
    "engine_forward_seconds": ("forward_ms", 1000.0),
    "engine_item_seconds": ("item_ms", 1000.0),
}
_GAUGES = {"engine_queue_depth": "queue_depth", "engine_slots_open": "slots_open"}


@dataclass(frozen=True)
class Distribution:
    count: int
    mean: float
    p50: float
    p95: float


@dataclass
class StageStatus:
    stage: str
    batch_size: Distribution | None = None
    forward_ms: Distribution | None = None
    item_ms: Distribution | None = None
    queue_depth: int = 0
    slots_open: int = 0


@dataclass(frozen=True)
class KindStatus:
    kind: str
    websockets: int
    capacity: int | None = None
    occupied: int | None = None
    free: int | None = None
    queued: int | None = None
    sessions_by_state: dict[str, int] = field(default_factory=dict)
    created: int = 0
    closed: int = 0
    evicted: int = 0
    expired: int = 0
    rejected: int = 0


def bucket_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """The ``q`` quantile of cumulative ``(upper bound, count)`` buckets (last bound ``inf``),
    linearly interpolated inside the bucket that holds it; the first bucket's bound when it falls
    there (so a batch size of always 1 reads 1, not 0.5), the highest finite bound when it falls
    in the ``+Inf`` bucket."""
    total = buckets[-1][1]
    rank, lower, below = q * total, 0.0, 0.0
    for upper, cumulative in buckets:
        if cumulative >= rank and cumulative > below:
            if math.isinf(upper):
                return lower
            if below == 0 and lower == 0:
                return upper
            return lower + (upper - lower) * (rank - below) / (cumulative - below)
        lower, below = upper, cumulative
    return lower


def _distribution(buckets: list[tuple[float, float]], total: float, scale: float) -> Distribution | None:
    buckets.sort()
    count = int(buckets[-1][1]) if buckets else 0
    if count == 0:
        return None
    return Distribution(
        count=count,
        mean=round(total / count * scale, 3),
        p50=round(bucket_quantile(0.5, buckets) * scale, 3),
        p95=round(bucket_quantile(0.95, buckets) * scale, 3),
    )


def stage_statuses(registry: CollectorRegistry) -> list[StageStatus]:
    """Per-stage engine figures from ``registry`` (module docstring), sorted by stage name."""
    stages: dict[str, StageStatus] = {}
    buckets: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    sums: dict[tuple[str, str], float] = defaultdict(float)
    for family in registry.collect():
        for sample in family.samples:
            stage = sample.labels.get("stage")
            if stage is None:
                continue
            status = stages.setdefault(stage, StageStatus(stage))
            if family.name in _HISTOGRAMS:
                if sample.name.endswith("_bucket"):
                    buckets[family.name, stage].append((float(sample.labels["le"]), sample.value))
                elif sample.name.endswith("_sum"):
                    sums[family.name, stage] = sample.value
            elif family.name in _GAUGES:
                setattr(status, _GAUGES[family.name], int(sample.value))
    for (name, stage), found in buckets.items():
        attr, scale = _HISTOGRAMS[name]
        setattr(stages[stage], attr, _distribution(found, sums[name, stage], scale))
    return [stages[name] for name in sorted(stages)]


def kind_status(kind: Any, websockets: int) -> KindStatus:
    """One kind's admission figures (``kind.manager`` is ``None`` until the kind started)."""
    manager = getattr(kind, "manager", None)
    if manager is None:
        return KindStatus(kind.name, websockets)
    s = manager.stats()
    return KindStatus(
        kind=kind.name,
        websockets=websockets,
        capacity=s.capacity,
        occupied=s.occupied,
        free=max(0, s.capacity - s.occupied),
        queued=s.queued,
        sessions_by_state=dict(s.by_status),
        created=s.created,
        closed=s.closed,
        evicted=s.evicted,
        expired=s.expired,
        rejected=s.rejected,
    )


def server_status(
    *,
    ready: bool,
    draining: bool,
    version: str,
    open_connections: int,
    max_connections: int,
    kinds: Iterable[KindStatus],
    registry: CollectorRegistry,
) -> dict[str, Any]:
    """The ``/v1/status`` document (module docstring)."""
    kinds = list(kinds)
    return {
        "object": "status",
        "ready": ready,
        "draining": draining,
        "version": version,
        "connections": {
            "open": open_connections,
            "max": max_connections,
            "websockets": {k.kind: k.websockets for k in kinds},
        },
        "kinds": [asdict(k) for k in kinds],
        "stages": [asdict(s) for s in stage_statuses(registry)],
    }
