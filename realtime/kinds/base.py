"""The plug-in surface of a session kind (robot, world, voice, duplex).

The app factory builds one :class:`SessionKindService` per enabled kind in the deploy config.
Contract, in call order:

1. ``build_<kind>(config, ctx)`` constructs the service cheaply (no model loading).
2. ``routes()`` gives the Starlette routes (websocket endpoints) to mount; they must be usable
   only after ``load`` finished, which the app guarantees by refusing websockets with close code
   1013 ("try again later") while not ready.
3. ``load(progress)`` runs on a worker thread at startup: load and warm models, report each step
   through ``progress(step_name, done, total)``. Raising :class:`models.voice.weights.WeightsMissing`
   (the package carrying a weight file is not installed) makes the kind *unavailable*: it is never
   started, its routes close websockets with 1008 naming the fix, the other kinds serve
   (``realtime/app.py``). Load what may be missing first, so nothing else is held for nothing.
4. ``start()`` runs on the event loop after ``load``: start engines, reapers.
5. ``stop()`` on shutdown, after every websocket was closed with 1001: release everything.

``models()`` lists what ``GET /v1/models`` reports.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from prometheus_client import CollectorRegistry
from starlette.routing import BaseRoute
from starlette.websockets import WebSocket

from realtime.client_secrets import ClientSecrets
from realtime.config import DeployConfig
from realtime.connection import KindHandler, run_connection
from realtime.connections import ConnectionRegistry
from realtime.scale.resume import Checkpointer
from realtime.ws import serve_websocket
from sessions.engine.protocol import StageRunner
from sessions.manager import SessionManager

ProgressFn = Callable[[str, int, int], None]


@dataclass(frozen=True)
class ServedModel:
    """One entry of ``GET /v1/models``."""

    id: str
    session_kind: str
    endpoints: tuple[str, ...]
    details: dict[str, object] = field(default_factory=dict)


@dataclass
class ServerContext:
    """What the app hands every session kind: config, metrics registry, live connections."""

    config: DeployConfig
    registry: CollectorRegistry
    connections: ConnectionRegistry
    #: Replicas only (``realtime serve --replicas``): where kinds checkpoint resumable sessions.
    checkpointer: Checkpointer | None = None
    #: Ephemeral keys minted by the voice kind's routes, redeemed by the app's guard.
    client_secrets: ClientSecrets = field(default_factory=lambda: ClientSecrets(10_000))


class SessionKindService(Protocol):
    name: str

    def routes(self) -> list[BaseRoute]: ...

    def models(self) -> list[ServedModel]: ...

    def load(self, progress: ProgressFn) -> None: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class KindServiceBase:
    """What every kind's service shares: the runner and manager it owns, their shutdown, and the
    endpoint body that hands a connection's handler to the skeleton. A kind sets ``name``, builds
    ``self.runner`` (an engine or a pipeline) and ``self.manager`` in ``start()``."""

    name: str

    def __init__(self, ctx: ServerContext) -> None:
        self.ctx = ctx
        self.runner: StageRunner | None = None
        self.manager: SessionManager | None = None

    async def stop(self) -> None:
        if self.manager is not None:
            await self.manager.shutdown()
        if self.runner is not None:
            await self.runner.close()

    async def serve(
        self,
        websocket: WebSocket,
        handler: KindHandler,
        *,
        subprotocol: str | None = None,
        headers: Iterable[tuple[bytes, bytes]] | None = None,
    ) -> None:
        """An endpoint's body: accept (answering ``subprotocol``, adding ``headers``; tracked for
        shutdown), then run ``handler`` on the skeleton."""
        manager = self.manager
        assert manager is not None, "start() runs before any websocket is served"
        await serve_websocket(
            websocket,
            self.ctx,
            self.name,
            lambda: run_connection(websocket, self.ctx, self.name, handler, manager),
            subprotocol=subprotocol,
            headers=headers,
        )
