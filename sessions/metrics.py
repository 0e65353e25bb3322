"""Prometheus metrics of the session runtime, registered once per ``CollectorRegistry``.

Several managers (one per session kind) and several apps (tests) share metric families through
:meth:`RuntimeMetrics.for_registry`; every family carries a ``kind`` label. Never the global
registry: the app passes its own.

Families (Prometheus adds ``_total`` to counters):

- ``realtime_sessions{kind,state}``: sessions per state (tombstones are ``cleanup_failed``)
- ``realtime_session_capacity{kind}``: admitted-session capacity from the memory plan
- ``realtime_session_ticks_total{kind,outcome}``: committed / failed / superseded / cancelled
- ``realtime_session_failures_total{kind,code}``: tick failures by error code
- ``realtime_session_evictions_total{kind}``: LRU evictions
- ``realtime_session_expiries_total{kind,reason}``: idle / lifetime expiries
- ``realtime_session_release_failures_total{kind,reason}``: lifecycle releases that failed
- ``realtime_admission_rejections_total{kind,reason}``: capacity / queue_full / queue_timeout
- ``realtime_admission_queue_depth{kind}`` and ``realtime_admission_queue_wait_seconds{kind}``
"""

from __future__ import annotations

import weakref

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_QUEUE_WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class RuntimeMetrics:
    _by_registry: weakref.WeakKeyDictionary[CollectorRegistry, RuntimeMetrics] = weakref.WeakKeyDictionary()

    def __init__(self, registry: CollectorRegistry) -> None:
        self.sessions = Gauge(
            "realtime_sessions", "Sessions by kind and state", ["kind", "state"], registry=registry
        )
        self.capacity = Gauge(
            "realtime_session_capacity", "Session capacity from the memory plan", ["kind"], registry=registry
        )
        self.ticks = Counter(
            "realtime_session_ticks", "Ticks by outcome", ["kind", "outcome"], registry=registry
        )
        self.failures = Counter(
            "realtime_session_failures", "Tick failures by error code", ["kind", "code"], registry=registry
        )
        self.evictions = Counter(
            "realtime_session_evictions", "Idle sessions evicted (LRU)", ["kind"], registry=registry
        )
        self.expiries = Counter(
            "realtime_session_expiries",
            "Sessions expired by the reaper",
            ["kind", "reason"],
            registry=registry,
        )
        self.release_failures = Counter(
            "realtime_session_release_failures",
            "Lifecycle releases that raised or timed out",
            ["kind", "reason"],
            registry=registry,
        )
        self.admission_rejections = Counter(
            "realtime_admission_rejections",
            "Sessions refused at admission",
            ["kind", "reason"],
            registry=registry,
        )
        self.queue_depth = Gauge(
            "realtime_admission_queue_depth", "Sessions waiting for admission", ["kind"], registry=registry
        )
        self.queue_wait = Histogram(
            "realtime_admission_queue_wait_seconds",
            "Time spent waiting in the admission queue",
            ["kind"],
            buckets=_QUEUE_WAIT_BUCKETS,
            registry=registry,
        )

    @classmethod
    def for_registry(cls, registry: CollectorRegistry) -> RuntimeMetrics:
        """The one ``RuntimeMetrics`` of ``registry`` (created on first use)."""
        metrics = cls._by_registry.get(registry)
        if metrics is None:
            metrics = cls._by_registry[registry] = cls(registry)
        return metrics
