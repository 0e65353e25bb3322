"""Where a request goes: the placement policy of the session router, as pure functions.

Inputs are what Serve gives a request router: each replica's **report** (its routing stats, made
by the replica every ``replicas.stats_period_s``: :class:`ReplicaReport`) and what the request
says (:class:`Request`: the replica that owns the session it names, the kind it opens). The
router adds the new sessions it placed itself since each replica's last report
(:class:`Placements`), so a burst inside one stats period is not piled onto one replica.

:func:`rank` returns ranks of replica tags, best first (Serve tries them in order, and within a
rank picks the replica with the fewest requests in flight):

1. a request naming a session whose replica is live: that replica alone (affinity); a websocket
   opening a kind whose owner is draining (not ready: ``realtime drain``) is placed as in 2, so
   its session resumes elsewhere (calls between replicas, which open no kind, still reach it);
2. a new session of kind K (also one naming a session whose replica is gone): the ready replicas
   with free capacity for K, grouped by load (occupied + placed, over capacity) from the least
   loaded; a tie is broken by Serve's in-flight count, never by a hash;
3. then every ready replica: nothing has room, and the one chosen answers with the same typed
   capacity error as a full single server (``session_limit_reached``), or queues the session
   under ``runtime.over_capacity: queue``;
4. then every replica: nothing is ready yet, and the one chosen answers 1013 "try again later".

Requests that open no session (plain HTTP) skip step 2.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from realtime.scale.affinity import Routes


@dataclass(frozen=True)
class KindLoad:
    """One kind's admission on one replica: ``capacity`` sessions, ``occupied`` now."""

    capacity: int
    occupied: int


@dataclass(frozen=True)
class ReplicaReport:
    """A replica's routing stats: made by the replica, read by every router."""

    tag: str
    at: float  # time.time() when the replica made it
    ready: bool  # every kind loaded and not draining
    kinds: Mapping[str, KindLoad] = field(default_factory=dict)  # kinds that admit sessions now
    routes: Routes = ()

    def to_stats(self) -> dict[str, Any]:
        """The plain dict Serve carries (``record_routing_stats``)."""
        return {
            "replica": self.tag,
            "at": self.at,
            "ready": self.ready,
            "kinds": {k: [v.capacity, v.occupied] for k, v in self.kinds.items()},
            "routes": [list(r) for r in self.routes],
        }

    @classmethod
    def from_stats(cls, stats: Mapping[str, Any] | None) -> ReplicaReport | None:
        """The report in a replica's routing stats; ``None`` before its first report (or for
        stats of another shape)."""
        if not stats:
            return None
        try:
            return cls(
                tag=str(stats["replica"]),
                at=float(stats["at"]),
                ready=bool(stats["ready"]),
                kinds={str(k): KindLoad(int(c), int(o)) for k, (c, o) in stats["kinds"].items()},
                routes=tuple((str(p), str(k)) for p, k in stats["routes"]),
            )
        except (KeyError, TypeError, ValueError):
            return None


@dataclass(frozen=True)
class Request:
    """What placement needs of a request: the replica owning the session it names (``None``: it
    names none, or one no replica issued) and the kind of session it opens (``None``: none)."""

    owner: str | None = None
    kind: str | None = None


SETTLE_S = 1.0  # a placed websocket's session is in its replica's count within this (handshake)


class Placements:
    """Websockets opening a kind that a router sent to each replica (a socket naming its session
    may open a new one there too), counted until a report made :data:`SETTLE_S` after them
    arrives. Counting a session twice for that second (in the report and here) only steers the
    next one elsewhere; the replica's own admission decides."""

    def __init__(self) -> None:
        self._by_tag: dict[str, collections.deque[tuple[float, str]]] = {}

    def add(self, tag: str, kind: str, at: float) -> None:
        self._by_tag.setdefault(tag, collections.deque()).append((at, kind))

    def since(self, tag: str, kind: str, report_at: float) -> int:
        """Sessions of ``kind`` placed on ``tag`` that its report of ``report_at`` may not hold yet
        (older ones are in it, and forgotten)."""
        placed = self._by_tag.get(tag)
        if not placed:
            return 0
        while placed and placed[0][0] <= report_at - SETTLE_S:
            placed.popleft()
        return sum(1 for _, k in placed if k == kind)

    def forget_missing(self, live: set[str]) -> None:
        for tag in [t for t in self._by_tag if t not in live]:
            del self._by_tag[tag]


def rank(
    request: Request, reports: Mapping[str, ReplicaReport | None], placed: Placements
) -> list[list[str]]:
    """Ranks of replica tags for ``request``, best first (module docstring)."""
    if request.owner is not None and request.owner in reports:
        owner = reports[request.owner]
        if request.kind is None or owner is None or owner.ready:
            return [[request.owner]]
    ready = [tag for tag, r in reports.items() if r is not None and r.ready]
    ranks: list[list[str]] = []
    kind = request.kind
    if kind is not None:
        by_load: dict[Fraction, list[str]] = collections.defaultdict(list)
        for tag in ready:
            report = reports[tag]
            assert report is not None
            load = report.kinds.get(kind)
            if load is None or load.capacity <= 0:
                continue
            occupied = load.occupied + placed.since(tag, kind, report.at)
            if occupied < load.capacity:
                by_load[Fraction(occupied, load.capacity)].append(tag)
        ranks.extend(by_load[key] for key in sorted(by_load))
    ranks.append(ready)
    ranks.append(list(reports))
    return [r for i, r in enumerate(ranks) if r and r not in ranks[:i]]
