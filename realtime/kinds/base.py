"""The plug-in surface of a session kind (robot, world, voice, duplex).

The app factory builds one :class:`SessionKindService` per enabled kind in the deploy config.
Contract, in call order:

1. ``build_<kind>(config, ctx)`` constructs the service cheaply (no model loading).
2. ``routes()`` gives the Starlette routes (websocket endpoints) to mount; they must be usable
   only after ``load`` finished, which the app guarantees by refusing websockets with close code
   1013 ("try again later") while not ready.
3. ``load(progress)`` runs on a worker thread at startup: load and warm models, report each step
   through ``progress(step_name, done, total)``.
4. ``start()`` runs on the event loop after ``load``: start engines, reapers.
5. ``stop()`` on shutdown, after every websocket was closed with 1001: release everything.

``models()`` lists what ``GET /v1/models`` reports.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from prometheus_client import CollectorRegistry
from starlette.routing import BaseRoute

from realtime.config import DeployConfig
from realtime.connections import ConnectionRegistry

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


class SessionKindService(Protocol):
    name: str

    def routes(self) -> list[BaseRoute]: ...

    def models(self) -> list[ServedModel]: ...

    def load(self, progress: ProgressFn) -> None: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...
