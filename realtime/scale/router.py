"""The session router: Serve's ``RequestRouter`` for the realtime deployment (Ray Serve 2.60).

It runs in every Serve proxy (and in the handles replicas use to reach each other) and places
each request by :func:`realtime.scale.placement.rank`: a request naming a session goes to the
replica that owns it; a new session goes to a ready replica with free capacity for its kind,
least loaded first; Serve then picks, within a rank, the replica with the fewest requests in
flight and enforces ``max_ongoing_requests``.

What a router can see of a request (checked against Ray 2.60's proxy): ``RequestMetadata``
(``session_id`` from the ``x-session-id`` header or a handle's ``options(session_id=...)``,
``is_http_request``) and the request's arguments. For an HTTP or websocket request from the proxy
the one argument is the pickled ``StreamingHTTPRequest`` whose ``asgi_scope`` holds the path,
the query string and the headers: :func:`request_of` reads the session named in the query and the
kind the path opens from it. The ingress (``realtime.scale.ingress``) asks with a handle call to
``direct_address`` whose one argument is the handshake's scope (the same keys), read the same way. Should a later Ray change that argument, only the header still names
a session and new sessions are placed without their kind (least loaded overall); nothing fails.

The replicas' capacity arrives as their routing stats (``ReplicaReport``), refreshed by Serve
every ``replicas.stats_period_s``; the sessions this router placed since a replica's last report
are counted here (:class:`~realtime.scale.placement.Placements`, after Serve accepted the request).
"""

from __future__ import annotations

import logging
import pickle
import time
from typing import Any

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from realtime.scale.affinity import SESSION_QUERY, kind_of, owner_of, query_value
from realtime.scale.placement import Placements, ReplicaReport, Request, rank

log = logging.getLogger("realtime.scale.router")


def _scope(pending: PendingRequest) -> dict[str, Any] | None:
    """The ASGI scope of a request from the HTTP proxy, the handshake's scope the ingress passes to
    ``direct_address``, or ``None`` (the replicas' calls to each other)."""
    if not pending.args:
        return None
    arg = pending.args[0]
    if not pending.metadata.is_http_request:
        return arg if isinstance(arg, dict) and arg.get("type") == "websocket" else None
    try:
        request = pickle.loads(arg) if isinstance(arg, bytes | bytearray) else arg
        scope = request.asgi_scope
    except Exception:  # noqa: BLE001 - another Ray's argument: route without the scope
        return None
    return scope if isinstance(scope, dict) else None


def request_of(pending: PendingRequest | None, reports: dict[str, ReplicaReport | None]) -> Request:
    """What placement needs of ``pending`` (the module docstring says where it comes from)."""
    if pending is None:
        return Request()
    name = pending.metadata.session_id or None
    scope = _scope(pending)
    if scope is None:
        return Request(owner=owner_of(name))
    name = query_value(scope.get("query_string", b""), SESSION_QUERY) or name
    kind = None
    if scope.get("type") == "websocket":
        routes = next((r.routes for r in reports.values() if r is not None and r.routes), ())
        kind = kind_of(scope.get("path", ""), scope.get("query_string", b""), routes)
    return Request(owner=owner_of(name), kind=kind)


class SessionRouter(RequestRouter):
    """Session-affine, capacity-aware placement (module docstring)."""

    def initialize_state(self, **kwargs: Any) -> None:
        self._placements = Placements()

    def _reports(self, replicas: list[RunningReplica]) -> dict[str, ReplicaReport | None]:
        return {r.replica_id.unique_id: ReplicaReport.from_stats(r.routing_stats) for r in replicas}

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        by_tag = {r.replica_id.unique_id: r for r in candidate_replicas}
        reports = self._reports(candidate_replicas)
        self._placements.forget_missing(set(by_tag))
        ranks = rank(request_of(pending_request, reports), reports, self._placements)
        return [[by_tag[tag] for tag in tags] for tags in ranks]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any) -> None:
        tag = replica_id.unique_id
        replica = self.curr_replicas.get(replica_id)
        reports = self._reports([replica]) if replica is not None else {}
        request = request_of(pending_request, reports)
        if request.kind is not None:
            self._placements.add(tag, request.kind, time.time())
