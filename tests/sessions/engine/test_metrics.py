"""The engine's lock-free histogram exports what prometheus_client's ``Histogram`` would."""

from __future__ import annotations

import random

from prometheus_client import CollectorRegistry, Histogram

from sessions.engine.metrics import LoopHistogram

BUCKETS = (0.001, 0.005, 0.01, 0.1, 1.0)


def _samples(registry: CollectorRegistry, name: str) -> dict:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in registry.collect()
        for s in family.samples
        if s.name.startswith(name) and not s.name.endswith("_created")
    }


def test_loop_histogram_matches_prometheus_histogram_including_bucket_edges():
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    loop = LoopHistogram("h", "doc", BUCKETS, ours)
    reference = Histogram("h", "doc", ["stage"], buckets=BUCKETS, registry=theirs)
    rng = random.Random(0)
    values = [*BUCKETS, 0.0, 2.0, *(rng.uniform(0, 1.5) for _ in range(500))]  # edges are "le"
    for stage in ("a", "b"):
        for value in values:
            loop.labels(stage).observe(value)
            reference.labels(stage).observe(value)
    assert _samples(ours, "h") == _samples(theirs, "h")
    first = _samples(ours, "h")[("h_bucket", (("le", "0.001"), ("stage", "a")))]
    assert first == sum(v <= 0.001 for v in values) >= 2  # 0.0 and the edge itself
