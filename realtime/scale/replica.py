"""The Serve deployment: each replica is the single server's ASGI app (``realtime.app.create_app``)
behind Serve's HTTP proxy, websockets included (a websocket stays on the replica that accepted it
for its whole life).

A replica, at startup (``__serve_build_asgi_app__``, in the replica's process):

- takes its Serve replica id as its **replica tag** (``sessions.identities.set_replica_tag``): every
  session id it allocates names it, which is what the session router routes on;
- builds the app of the deploy config with the cluster-wide views in front of its own
  (``realtime.scale.views``) and the session check behind the guard
  (``realtime.scale.session_check``: a gone replica's sessions are restored here), with a client
  of the cluster's checkpoint store (``realtime.scale.checkpoints``; ``/v1/status`` reports what
  it holds) and the ``Checkpointer`` its kinds save their sessions through
  (``realtime.scale.resume``);
- loads its models as the single server does (the app's lifespan: ``/readyz`` and the routing
  report say when it is ready; Serve's health check fails once a load failed).

Serve calls :meth:`RealtimeReplica.record_routing_stats` every ``replicas.stats_period_s``: the
replica's :class:`~realtime.scale.placement.ReplicaReport` (free capacity per kind), which Serve
hands to every session router. Replicas reach each other for the cluster views through Serve
itself: a handle call to :meth:`RealtimeReplica.replica_snapshot` whose session name is
``replica:<tag>`` is routed to that replica by the session router (:class:`Peers`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import ray
from ray import serve
from starlette.applications import Starlette
from starlette.middleware import Middleware

from realtime.app import create_app
from realtime.config import DeployConfig
from realtime.logs import configure_logging
from realtime.scale.affinity import replica_key, websocket_routes
from realtime.scale.checkpoints import RayCheckpointStore
from realtime.scale.cores import pin_process, replica_block
from realtime.scale.direct import DirectServer
from realtime.scale.resume import Checkpointer
from realtime.scale.session_check import SessionCheck
from realtime.scale.views import ClusterViews, Snapshot, report, snapshot
from sessions.identities import set_replica_tag

log = logging.getLogger("realtime.scale.replica")

DEPLOYMENT = "RealtimeReplica"
_REPLICA_ACTOR_PREFIX = (
    "SERVE_REPLICA::"  # Serve names each replica actor SERVE_REPLICA::<app>#<deployment>#<tag>
)


class Peers:
    """Every replica of this deployment, reached through Serve (module docstring)."""

    def __init__(self, app_name: str, tag: str, timeout_s: float) -> None:
        self.app_name = app_name
        self.tag = tag
        self.timeout_s = timeout_s
        self._handle: Any = None

    def tags(self) -> list[str]:
        """Tags of the live replicas (Ray's named actors; a dead replica's name is gone)."""
        prefix = f"{_REPLICA_ACTOR_PREFIX}{self.app_name}#{DEPLOYMENT}#"
        names = ray.util.list_named_actors(all_namespaces=True)
        return sorted(n["name"][len(prefix) :] for n in names if n["name"].startswith(prefix))

    async def _ask(self, tag: str, with_metrics: bool) -> Snapshot:
        try:
            call = self.call("replica_snapshot", tag).remote(tag, with_metrics)
            answer = await asyncio.wait_for(call, self.timeout_s)
        except Exception:  # noqa: BLE001 - dead, starting, or slow: listed as unreachable
            answer = None
        return answer if answer is not None else {"replica": tag, "reachable": False}

    def call(self, method: str, tag: str) -> Any:
        """A handle to ``method`` of replica ``tag`` (the session router brings it there)."""
        if self._handle is None:
            self._handle = serve.get_deployment_handle(DEPLOYMENT, self.app_name)
        return self._handle.options(method_name=method, session_id=replica_key(tag))

    async def gather(self, own: Snapshot, with_metrics: bool) -> list[Snapshot]:
        tags = await asyncio.to_thread(self.tags)
        others = await asyncio.gather(*(self._ask(t, with_metrics) for t in tags if t != self.tag))
        return sorted([own, *others], key=lambda s: s["replica"])


@serve.ingress()
class RealtimeReplica:
    """One replica of the realtime server (module docstring); ``config`` is the deploy config."""

    def __init__(self, config: DeployConfig) -> None:
        self.config = config
        self.tag = ""
        self._app: Starlette | None = None
        self._direct: DirectServer | None = None
        self.routes: tuple[tuple[str, str], ...] = ()

    def __serve_build_asgi_app__(self) -> Starlette:
        config = self.config
        configure_logging(config.server.log_level, config.server.log_format)
        context = serve.get_replica_context()  # the app's name is Serve's (serve run may rename it)
        self.tag = context.replica_id.unique_id
        set_replica_tag(self.tag)
        self._pin(context)
        peers = Peers(context.app_name, self.tag, config.replicas.peer_timeout_s)
        self.store = RayCheckpointStore(config.replicas, context.app_name)
        views = ClusterViews(
            self._gather(peers),
            tuple(config.enabled_kinds()),
            checkpoints=self.store.stats,
            timeout_s=config.replicas.peer_timeout_s,
        )
        self.checkpointer = Checkpointer(self.store, config.replicas.checkpoint_interval_s)
        app = self._app = create_app(config, routes_first=views.routes(), checkpointer=self.checkpointer)
        # appended, so it runs after the guard (keys, origin) and before the routes
        app.user_middleware.append(
            Middleware(SessionCheck, tag=self.tag, store=self.store, timeout_s=config.replicas.peer_timeout_s)
        )
        state = app.state.rt
        state.open_connections = lambda: len(state.context.connections)  # Serve counts the rest
        self.routes = websocket_routes(state.kinds)
        log.info("replica built", extra={"replica": self.tag, "kinds": ",".join(config.enabled_kinds())})
        return app

    def _pin(self, context: Any) -> None:
        """``replicas.cpu_affinity``: this process onto the block of cores of its node rank
        (``realtime.scale.cores``), before the models load and start their threads."""
        rc = self.config.replicas
        if rc.cpu_affinity is None:
            return
        rank = context.rank.local_rank
        block = replica_block(rc.cores(), int(rc.num_cpus), rank)
        if not block:
            log.warning(
                "no cores left for this replica: it runs unpinned",
                extra={"replica": self.tag, "rank": rank, "cpu_affinity": rc.cpu_affinity},
            )
            return
        pin_process(block)
        log.info(
            "replica pinned", extra={"replica": self.tag, "rank": rank, "cores": ",".join(map(str, block))}
        )

    def _gather(self, peers: Peers):
        async def gather(with_metrics: bool) -> list[Snapshot]:
            return await peers.gather(self._snapshot(with_metrics), with_metrics)

        return gather

    def _state(self) -> Any:
        assert self._app is not None, "the app is built before Serve calls the replica"
        return self._app.state.rt

    async def record_routing_stats(self) -> dict[str, Any]:
        """Serve's routing stats: this replica's report (``realtime.scale.placement``)."""
        if self._app is None:
            return {}
        return report(self._state(), self.tag, self.routes).to_stats()

    async def direct_address(self, scope: dict[str, Any]) -> str | None:
        """The ingress's question for a websocket handshake (``scope``) the session router placed
        here: ``host:port`` of this replica's own server (``realtime.scale.direct``), started on
        the first call; ``None`` before the app is built."""
        if self._app is None:
            return None
        if self._direct is None:
            self._direct = DirectServer(self._app, self.config, ray.util.get_node_ip_address())
        return await self._direct.address()

    async def replica_snapshot(self, tag: str, with_metrics: bool) -> Snapshot | None:
        """A peer's question; ``None`` when the router could not bring it to replica ``tag``."""
        if tag != self.tag or self._app is None:
            return None
        return self._snapshot(with_metrics)

    def _snapshot(self, with_metrics: bool) -> Snapshot:
        address = self._direct.started_address if self._direct is not None else None
        return snapshot(self._state(), self.tag, with_metrics, address)

    async def drain(self, tag: str) -> dict[str, int] | None:
        """Close every websocket of this replica with 1001 ``server shutting down`` within
        ``server.shutdown_timeout_s`` and admit nothing more (``realtime serve`` calls it on
        every replica before it deletes the app); ``None`` when the call reached another replica."""
        if tag != self.tag or self._app is None:
            return None
        if self._direct is not None:
            self._direct.stop_listening()
        result = await self._state().drain()
        return {"closed": result.closed, "aborted": result.aborted, "undrained": result.undrained}

    async def move_sessions(self, tag: str) -> dict[str, int] | None:
        """``realtime drain``: move this replica's sessions away (``AppState.move_sessions``: the
        routers hear it is draining within two stats periods, every session's state is
        checkpointed, every websocket closed with 1012 and its client's reconnect resumed on
        another replica). The replica stays, serving nothing new, until Serve removes it.
        ``None`` when the call reached another replica."""
        if tag != self.tag or self._app is None:
            return None
        result = await self._state().move_sessions(2 * self.config.replicas.stats_period_s)
        log.info("drained", extra={"replica": self.tag, "closed": result.closed})
        return {"closed": result.closed, "aborted": result.aborted, "undrained": result.undrained}

    async def check_health(self) -> None:
        """Serve's health check: fails once the model load failed."""
        if self._app is not None and self._state().load_error:
            raise RuntimeError(f"model loading failed: {self._state().load_error}")
