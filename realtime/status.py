"""``GET /v1/status``: a small JSON summary of what the server is doing, for the demo's status page.

The same numbers as ``/metrics`` (and the same API-key rule), shaped for a page rather than a
scraper. Contract of :func:`server_status` (read on the event loop; nothing is reset by a read):

- ``ready``, ``draining``, ``version``, ``connections`` (``open`` TCP connections as the server
  counts them, ``max``, and open websockets per kind);
- ``kinds``: per enabled kind, from its ``SessionManager.stats()``: ``capacity``, ``occupied``,
  ``free`` (capacity - occupied, never below 0), ``queued`` (waiting for admission),
  ``sessions_by_state`` and the lifetime counters ``created``, ``closed``, ``evicted``,
  ``expired``, ``rejected``; ``null`` stats while the kind is still loading or when it is
  unavailable (``unavailable``: the reason, naming the fix; ``null`` otherwise);
- ``stages``: per stage engine, from the engine histograms of the app's registry (cumulative since
  start): ``batch_size``, ``forward_ms`` (one batched forward) and ``item_ms`` (submit to output:
  queueing + forward; for a self-batching streaming stage such as ``voice-llm``, whose batch and
  forward figures stay ``null``, one request from start to its last chunk), each ``{count, mean, p50, p95, p99}`` (quantiles interpolated within the
  histogram's buckets, as Prometheus' ``histogram_quantile``; ``null`` before any observation),
  plus ``queue_depth`` and ``slots_open`` now;
- ``latencies``: the key latency of each enabled kind (:data:`_LATENCIES`), ``{kind, name, what,
  ms, counts}``: voice time to first audio, duplex step time (``counts``: steps, late and missed
  steps, start lateness p99 in ms), world event to chunk, robot request; ``ms`` as above.

:func:`app_status` is this process's document. A Ray Serve replica serves a cluster-wide one
built from every replica's (``realtime.scale.views``): the same fields, summed across replicas,
with the stages and latencies computed from the replicas' merged metric families
(:func:`server_status` takes ``families`` for that) and a ``replicas`` list.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.samples import Sample

from realtime import __version__

# engine histogram family -> (status field, scale to the field's unit)
_HISTOGRAMS = {
    "engine_batch_size": ("batch_size", 1.0),
    "engine_forward_seconds": ("forward_ms", 1000.0),
    "engine_item_seconds": ("item_ms", 1000.0),
}
_GAUGES = {"engine_queue_depth": "queue_depth", "engine_slots_open": "slots_open"}
_MS = 1000.0


@dataclass(frozen=True)
class Distribution:
    count: int
    mean: float
    p50: float
    p95: float
    p99: float


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
    unavailable: str | None = None


@dataclass(frozen=True)
class KeyLatency:
    """One latency a person watches for a kind: ``ms`` from the named histogram (``null`` before
    the first observation), ``counts`` of related events, and what exactly is measured."""

    kind: str
    name: str
    what: str
    ms: Distribution | None
    counts: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class _LatencySource:
    kind: str
    name: str
    what: str
    histogram: str
    labels: dict[str, str] = field(default_factory=dict)
    # status key -> (metric family, scale); counters are read by family name (no ``_total``)
    counts: dict[str, tuple[str, float]] = field(default_factory=dict)


# The key latency of each kind. Stage names are the kinds' own: "robot-policy"
# (realtime/kinds/robot.py), "duplex" (models/duplex/stage.py).
_LATENCIES = (
    _LatencySource(
        "voice",
        "time_to_first_audio",
        "committed user turn (speech_stopped or commit) -> the answer's first audio delta",
        "voice_time_to_first_audio_seconds",
    ),
    _LatencySource(
        "duplex",
        "step",
        "one lockstep step of every session (batched forward), against the 80 ms period",
        "engine_forward_seconds",
        {"stage": "duplex"},
        {
            "steps": ("duplex_steps", 1.0),
            "late_steps": ("duplex_late_steps", 1.0),
            "missed_steps": ("duplex_missed_steps", 1.0),
            "lateness_p99_ms": ("duplex_step_lateness_p99_seconds", _MS),
        },
    ),
    _LatencySource(
        "world",
        "event_to_chunk",
        "accepted control event -> the chunk that applied it handed to the socket "
        "(key-to-photon adds the page's jitter buffer and decode: see the world page)",
        "world_event_to_chunk_seconds",
    ),
    _LatencySource(
        "robot",
        "request",
        "observation submitted -> action chunk out (queue + batched forward; msgpack decode and "
        "encode excluded)",
        "engine_item_seconds",
        {"stage": "robot-policy"},
    ),
)


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


def registry_families(registry: CollectorRegistry) -> dict[str, list[Sample]]:
    """Every sample of ``registry``, by metric family name."""
    return {family.name: list(family.samples) for family in registry.collect()}


def _matches(sample: Sample, labels: dict[str, str]) -> bool:
    return all(sample.labels.get(k) == v for k, v in labels.items())


def _histogram(samples: list[Sample], labels: dict[str, str], scale: float) -> Distribution | None:
    """The distribution of the one histogram series of ``samples`` with ``labels``."""
    buckets = sorted(
        (float(s.labels["le"]), s.value)
        for s in samples
        if s.name.endswith("_bucket") and _matches(s, labels)
    )
    count = int(buckets[-1][1]) if buckets else 0
    if count == 0:
        return None
    total = sum(s.value for s in samples if s.name.endswith("_sum") and _matches(s, labels))
    return Distribution(
        count=count,
        mean=round(total / count * scale, 3),
        p50=round(bucket_quantile(0.5, buckets) * scale, 3),
        p95=round(bucket_quantile(0.95, buckets) * scale, 3),
        p99=round(bucket_quantile(0.99, buckets) * scale, 3),
    )


def _value(samples: list[Sample]) -> float:
    """A counter's or gauge's one unlabelled value (counters: the ``_total`` sample)."""
    return sum(s.value for s in samples if not s.name.endswith(("_created", "_bucket", "_sum", "_count")))


def stage_statuses(families: dict[str, list[Sample]]) -> list[StageStatus]:
    """Per-stage engine figures (module docstring), sorted by stage name."""
    stages: dict[str, StageStatus] = {}
    for name in (*_HISTOGRAMS, *_GAUGES):
        for sample in families.get(name, ()):
            stage = sample.labels.get("stage")
            if stage is not None and stage not in stages:
                stages[stage] = StageStatus(stage)
    for stage, status in stages.items():
        for name, (attr, scale) in _HISTOGRAMS.items():
            setattr(status, attr, _histogram(families.get(name, []), {"stage": stage}, scale))
        for name, attr in _GAUGES.items():
            found = [s for s in families.get(name, ()) if s.labels.get("stage") == stage]
            setattr(status, attr, int(_value(found)))
    return [stages[name] for name in sorted(stages)]


def key_latencies(families: dict[str, list[Sample]], kinds: Iterable[str]) -> list[KeyLatency]:
    """The key latency of each of ``kinds`` that has one (:data:`_LATENCIES`), in that order."""
    enabled = set(kinds)
    return [
        KeyLatency(
            source.kind,
            source.name,
            source.what,
            _histogram(families.get(source.histogram, []), source.labels, _MS),
            {key: round(_value(families.get(f, [])) * scale, 3) for key, (f, scale) in source.counts.items()},
        )
        for source in _LATENCIES
        if source.kind in enabled
    ]


def kind_status(kind: Any, websockets: int, unavailable: str | None = None) -> KindStatus:
    """One kind's admission figures (``kind.manager`` is ``None`` until the kind started, and for
    an ``unavailable`` kind, never started)."""
    manager = getattr(kind, "manager", None)
    if manager is None:
        return KindStatus(kind.name, websockets, unavailable=unavailable)
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
    registry: CollectorRegistry | None = None,
    families: dict[str, list[Sample]] | None = None,
) -> dict[str, Any]:
    """The ``/v1/status`` document (module docstring), from ``registry`` or its ``families``."""
    kinds = list(kinds)
    if families is None:
        assert registry is not None, "server_status needs a registry or its families"
        families = registry_families(registry)
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
        "stages": [asdict(s) for s in stage_statuses(families)],
        "latencies": [asdict(k) for k in key_latencies(families, (k.kind for k in kinds))],
    }


def app_status(state: Any) -> dict[str, Any]:
    """This process's ``/v1/status`` document from the app's state (``realtime.app.AppState``)."""
    connections = state.context.connections
    return server_status(
        ready=state.ready,
        draining=state.draining,
        version=__version__,
        open_connections=state.open_connections(),
        max_connections=state.max_connections,
        kinds=[kind_status(k, connections.count(k.name), state.unavailable.get(k.name)) for k in state.kinds],
        registry=state.context.registry,
    )
