"""Prometheus metrics of the stage engines, on the registry the app passes in.

One set of collectors per registry (several engines share it, labelled by ``stage``), so
several apps with their own registries can live in one process. An engine records through its
:class:`StageMetrics` (both flavours) or :class:`BatchMetrics` (batched engines): the collectors'
children for its stage, made once.

The per-forward and per-item histograms (``engine_batch_size``, ``engine_forward_seconds``,
``engine_item_seconds``) are :class:`LoopHistogram`: the engine observes them on every tick from
the event loop thread only, where prometheus_client's ``Histogram`` (a lock per bucket and per
sum, ~2 us an observation) was a measurable share of a robot's round trip. They export the same
families (``_bucket``, ``_count``, ``_sum``; no ``_created``). ``engine_queue_depth`` is read
from the engine when scraped (no write per submit).
"""

from __future__ import annotations

import bisect
import math
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.metrics_core import HistogramMetricFamily
from prometheus_client.utils import floatToGoString

if TYPE_CHECKING:
    from sessions.engine.slots import SlotTable


class LoopHistogramChild:
    """One label set's buckets; ``observe`` must be called from one thread (the event loop)."""

    __slots__ = ("_bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, amount: float) -> None:
        self.counts[bisect.bisect_left(self._bounds, amount)] += 1  # first bound >= amount: "le"
        self.sum += amount


class LoopHistogram:
    """A histogram collector labelled by ``stage`` whose observations take no lock.

    Single-writer by contract (the engine's loop thread). A scrape from another thread reads
    plain ints and floats: it may count an observation in one series a moment before another,
    never a torn value.
    """

    def __init__(
        self, name: str, documentation: str, buckets: Sequence[float], registry: CollectorRegistry
    ) -> None:
        self.name = name
        self.documentation = documentation
        self._bounds = tuple(float(b) for b in buckets if not math.isinf(b))
        self._labels = [floatToGoString(b) for b in self._bounds] + ["+Inf"]
        self._children: dict[str, LoopHistogramChild] = {}
        registry.register(self)

    def labels(self, stage: str) -> LoopHistogramChild:
        child = self._children.get(stage)
        if child is None:
            child = self._children[stage] = LoopHistogramChild(self._bounds)
        return child

    def describe(self) -> list[HistogramMetricFamily]:
        return [HistogramMetricFamily(self.name, self.documentation, labels=["stage"])]

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=["stage"])
        for stage, child in list(self._children.items()):
            cumulative, total = [], 0
            for label, count in zip(self._labels, list(child.counts), strict=True):
                total += count
                cumulative.append((label, total))
            family.add_metric([stage], cumulative, child.sum)
        yield family


_BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128)
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


@dataclass(frozen=True)
class EngineMetrics:
    batch_size: LoopHistogram
    queue_depth: Gauge
    forward_seconds: LoopHistogram
    item_seconds: LoopHistogram
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
        batch_size=LoopHistogram("engine_batch_size", "items per forward", _BATCH_BUCKETS, r),
        queue_depth=Gauge("engine_queue_depth", "items waiting for a forward", ["stage"], registry=r),
        forward_seconds=LoopHistogram(
            "engine_forward_seconds", "wall time of one batched forward", _LATENCY_BUCKETS, r
        ),
        item_seconds=LoopHistogram(
            "engine_item_seconds",
            "submit-to-output latency of one item (queueing + forward)",
            _LATENCY_BUCKETS,
            r,
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


class StageMetrics:
    """What every engine records, on its stage's children of the registry's collectors."""

    def __init__(self, registry: CollectorRegistry, stage: str) -> None:
        m = engine_metrics(registry)
        self.item_failures = m.failures.labels(stage=stage, scope="item")
        self.stale_dropped = m.stale_dropped.labels(stage=stage)
        self.backpressure_dropped = m.backpressure_dropped.labels(stage=stage)
        self.stalls = m.stalls.labels(stage=stage)
        self.slots_open = m.slots_open.labels(stage=stage)
        self.slot_bytes = m.slot_bytes.labels(stage=stage)
        self.channel_depth = m.channel_depth.labels(stage=stage)
        self.item_seconds = m.item_seconds.labels(stage=stage)  # submit to output (a stream: to its end)

    def chunk_dropped(self, _chunk: Any) -> None:
        """A ``drop_oldest`` channel shed a chunk (the channel's ``on_drop``)."""
        self.backpressure_dropped.inc()

    def slots_changed(self, slots: SlotTable) -> None:
        self.slots_open.set(len(slots))
        self.slot_bytes.set(slots.bytes_in_use)


class BatchMetrics(StageMetrics):
    """A batched engine's series: those of every engine plus batch sizes, forward latencies,
    batch failures and the queue depth."""

    def __init__(self, registry: CollectorRegistry, stage: str) -> None:
        super().__init__(registry, stage)
        m = engine_metrics(registry)
        self.batch_size = m.batch_size.labels(stage=stage)
        self.forward_seconds = m.forward_seconds.labels(stage=stage)
        self.batch_failures = m.failures.labels(stage=stage, scope="batch")
        self._queue_depth = m.queue_depth.labels(stage=stage)

    def read_queue_depth(self, queue: object) -> None:
        """Export ``queue.pending`` as the queue depth, read when scraped (no write per item)."""
        ref = weakref.ref(queue)  # the registry must not keep the engine alive
        self._queue_depth.set_function(lambda: getattr(ref(), "pending", 0))
