"""One view of the cluster: a replica's snapshot, its routing report, and the cluster-wide
``/readyz``, ``/metrics``, ``/v1/models`` and ``/v1/status`` built from every replica's snapshot.

No Ray import: a replica (``realtime.scale.replica``) gives :class:`ClusterViews` a ``gather``
coroutine that returns every replica's :func:`snapshot` (its own made locally, the others'
through Serve), or an unreachable marker for a replica that did not answer in time.

- ``/readyz``: 200 while, for each configured kind, at least one replica serves it (loaded and not
  draining); a replica that is ready itself answers without asking the others.
- ``/metrics``: every replica's series with a ``replica="<tag>"`` label, one exposition (one
  scrape target: the proxy), plus ``realtime_replica_up{replica}`` (0 for a replica that did not
  answer within ``replicas.peer_timeout_s``).
- ``/v1/models``: the models every replica serves, each with the ``replicas`` serving it.
- ``/v1/status``: the single server's document summed across replicas (kinds' capacity,
  occupied, free, counters; connections), the stages and key latencies from the replicas' merged
  metric families (histograms and counters summed exactly; a quantile gauge, ``*_p99_seconds``,
  is the worst replica's), ``replicas``: each replica's tag, node, pid, readiness and kinds, and
  ``checkpoints``: what the cluster's checkpoint store holds (``sessions``, ``bytes``; ``null``
  when it does not answer in time).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import socket
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from realtime import __version__
from realtime.app import models_document
from realtime.scale.affinity import Routes
from realtime.scale.placement import KindLoad, ReplicaReport
from realtime.status import KindStatus, app_status, server_status

Snapshot = dict[str, Any]  # one replica's, or {"replica": tag, "reachable": False}
Gather = Callable[[bool], Awaitable[list[Snapshot]]]  # (with metrics?) -> every replica's snapshot

_SUMMED = ("capacity", "occupied", "free", "queued", "created", "closed", "evicted", "expired", "rejected")
_WORST_OF_SUFFIX = "_p99_seconds"  # quantile gauges: a cluster's is its worst replica's


def kinds_serving(state: Any) -> list[str]:
    """The kinds of this replica that admit sessions now (started, and the app not draining)."""
    if state.draining:
        return []
    return [k.name for k in state.kinds if getattr(k, "manager", None) is not None]


def report(state: Any, tag: str, routes: Routes) -> ReplicaReport:
    """This replica's routing stats: its readiness and each serving kind's admission."""
    kinds = {}
    for kind in state.kinds:
        manager = getattr(kind, "manager", None)
        if manager is not None and not state.draining:
            kinds[kind.name] = KindLoad(manager.capacity, manager.occupied)
    return ReplicaReport(tag, time.time(), state.ready and not state.draining, kinds, routes)


def snapshot(state: Any, tag: str, with_metrics: bool, address: str | None = None) -> Snapshot:
    """What this replica tells the cluster views (module docstring); ``address``: its own server's,
    where the ingress relays websockets (``None`` until the first)."""
    return {
        "replica": tag,
        "reachable": True,
        "address": address,
        "node": socket.gethostname(),
        "pid": os.getpid(),
        "ready": state.ready,
        "draining": state.draining,
        "load_error": state.load_error,
        "kinds_serving": kinds_serving(state),
        "status": app_status(state),
        "models": models_document(state.kinds, state.unavailable),
        "metrics": generate_latest(state.context.registry).decode() if with_metrics else None,
    }


def cluster_ready(snapshots: Iterable[Snapshot], kinds: Iterable[str]) -> tuple[bool, str]:
    """Whether each of ``kinds`` has a replica serving it; else the first kind that has none."""
    serving = {k for s in snapshots if s.get("reachable") for k in s["kinds_serving"]}
    for kind in kinds:
        if kind not in serving:
            return False, f"no replica serves {kind} yet"
    return True, "ready"


def merged_families(texts: Mapping[str, str]) -> dict[str, list[Metric]]:
    """Each replica's exposition (tag -> text) parsed, every sample labelled ``replica=<tag>``."""
    families: dict[str, list[Metric]] = {}
    for tag, text in texts.items():
        for family in text_string_to_metric_families(text):
            family.samples = [
                Sample(s.name, {**s.labels, "replica": tag}, s.value, s.timestamp, s.exemplar)
                for s in family.samples
            ]
            families.setdefault(family.name, []).append(family)
    return families


def summed_samples(families: Mapping[str, list[Metric]]) -> dict[str, list[Sample]]:
    """The replicas' samples with the ``replica`` label dropped and equal series combined: summed
    (counters, histograms, additive gauges), or the largest for a quantile gauge."""
    out: dict[str, list[Sample]] = {}
    for name, parts in families.items():
        worst = name.endswith(_WORST_OF_SUFFIX)
        combined: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        for family in parts:
            for s in family.samples:
                labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "replica"))
                key = (s.name, labels)
                old = combined.get(key)
                combined[key] = s.value if old is None else (max(old, s.value) if worst else old + s.value)
        out[name] = [Sample(n, dict(labels), value, None, None) for (n, labels), value in combined.items()]
    return out


def exposition(snapshots: Iterable[Snapshot]) -> bytes:
    """The cluster's ``/metrics`` text (module docstring)."""
    snapshots = list(snapshots)
    families = merged_families({s["replica"]: s["metrics"] for s in snapshots if s.get("reachable")})
    up = GaugeMetricFamily("realtime_replica_up", "1 if the replica answered this scrape", labels=["replica"])
    for s in snapshots:
        up.add_metric([s["replica"]], 1.0 if s.get("reachable") else 0.0)

    class _Merged:
        def collect(self) -> list[Metric]:
            merged = []
            for name, parts in families.items():
                family = Metric(name, parts[0].documentation, parts[0].type, parts[0].unit)
                family.samples = [s for p in parts for s in p.samples]
                merged.append(family)
            return [*merged, up]

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Merged())
    return generate_latest(registry)


def cluster_models(snapshots: Iterable[Snapshot]) -> dict[str, Any]:
    """The ``/v1/models`` document of every replica, each model with the replicas serving it."""
    models: dict[str, dict[str, Any]] = {}
    kinds: list[str] = []
    for s in snapshots:
        if not s.get("reachable"):
            continue
        for entry in s["models"]["data"]:
            models.setdefault(entry["id"], {**entry, "replicas": []})["replicas"].append(s["replica"])
        kinds.extend(k for k in s["models"]["session_kinds"] if k not in kinds)
    return {"object": "list", "data": list(models.values()), "session_kinds": kinds}


def _summed_kind(name: str, statuses: list[dict[str, Any]]) -> KindStatus:
    by_state: dict[str, int] = {}
    for status in statuses:
        for state, n in status["sessions_by_state"].items():
            by_state[state] = by_state.get(state, 0) + n
    started = [s for s in statuses if s["capacity"] is not None]
    fields = {f: sum(s[f] for s in started) if started else None for f in _SUMMED[:4]}
    counters = {f: sum(s[f] for s in statuses) for f in _SUMMED[4:]}
    return KindStatus(
        kind=name,
        websockets=sum(s["websockets"] for s in statuses),
        sessions_by_state=by_state,
        **fields,
        **counters,
    )


def cluster_status(snapshots: Iterable[Snapshot], configured: Iterable[str]) -> dict[str, Any]:
    """The cluster's ``/v1/status`` document (module docstring)."""
    snapshots = list(snapshots)
    live = [s for s in snapshots if s.get("reachable")]
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for s in live:
        for kind in s["status"]["kinds"]:
            by_kind.setdefault(kind["kind"], []).append(kind)
    families = summed_samples(merged_families({s["replica"]: s["metrics"] for s in live if s["metrics"]}))
    ready, _ = cluster_ready(live, configured)
    document = server_status(
        ready=ready,
        draining=bool(live) and all(s["draining"] for s in live),
        version=__version__,
        open_connections=sum(s["status"]["connections"]["open"] for s in live),
        max_connections=sum(s["status"]["connections"]["max"] for s in live),
        kinds=[_summed_kind(name, statuses) for name, statuses in by_kind.items()],
        families=families,
    )
    document["replicas"] = [
        {
            "replica": s["replica"],
            "reachable": bool(s.get("reachable")),
            **(
                {
                    "node": s["node"],
                    "address": s.get("address"),
                    "pid": s["pid"],
                    "ready": s["ready"],
                    "draining": s["draining"],
                    "load_error": s["load_error"],
                    "kinds": s["status"]["kinds"],
                }
                if s.get("reachable")
                else {}
            ),
        }
        for s in snapshots
    ]
    return document


@dataclasses.dataclass
class ClusterViews:
    """The cluster-wide routes a replica serves in place of its own (``create_app(routes_first)``)."""

    gather: Gather
    configured: tuple[str, ...]
    checkpoints: Callable[[], Awaitable[dict[str, int]]] | None = None
    timeout_s: float = 2.0

    def routes(self) -> list[Route]:
        return [
            Route("/readyz", self.readyz),
            Route("/metrics", self.metrics),
            Route("/v1/models", self.models),
            Route("/v1/status", self.status),
        ]

    async def readyz(self, request: Request) -> Response:
        if request.app.state.rt.ready:
            return PlainTextResponse("ready\n")
        ready, reason = cluster_ready(await self.gather(False), self.configured)
        return PlainTextResponse("ready\n" if ready else f"not ready: {reason}\n", 200 if ready else 503)

    async def metrics(self, _: Request) -> Response:
        return Response(exposition(await self.gather(True)), media_type=CONTENT_TYPE_LATEST)

    async def models(self, _: Request) -> Response:
        return JSONResponse(cluster_models(await self.gather(False)))

    async def status(self, _: Request) -> Response:
        document = cluster_status(await self.gather(True), self.configured)
        document["checkpoints"] = None
        if self.checkpoints is not None:
            with contextlib.suppress(Exception):  # the store is slow or gone: reported as null
                document["checkpoints"] = await asyncio.wait_for(self.checkpoints(), self.timeout_s)
        return JSONResponse(document)
