"""``realtime serve --replicas N [--ray-address ADDR]``: the deploy config as a Ray Serve app.

:func:`application` is the Serve application (``deploy/ray/app.py`` builds the same for ``serve
run``): ``N`` replicas of :class:`~realtime.scale.replica.RealtimeReplica`, each with the
``replicas.*`` resources, ``server.max_connections`` as its ``max_ongoing_requests``,
``server.shutdown_timeout_s`` as its graceful shutdown bound, and the session router
(``realtime.scale.router``) fed by routing stats every ``replicas.stats_period_s``.

:func:`serve_replicas` runs it: a local Ray instance of its own (or the cluster at ``ADDR``),
the ingress (``realtime.scale.ingress``) on ``server.host``/``server.port`` (the single server's
address, TLS included, so every client works unchanged) relaying each websocket to its replica's
own server and everything else to Serve's HTTP proxy on a loopback port, the app under the route
prefix ``/``; it logs ``ready`` with the URL
once every replica loaded its models, and on SIGTERM/SIGINT drains every replica (its websockets
closed with 1001 like the single server's), deletes the app and its checkpoint store and
disconnects from Ray (a local instance ends with it). Exit status: 0 after
a signal, 1 when a replica's model load failed or the app did not deploy, 2 for a config the
replicas cannot run or an address the ingress cannot listen on.

:func:`drain_replica` is ``realtime drain REPLICA``: one replica's sessions moved to the others.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import signal
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import ray
from ray import serve
from ray.serve.config import HTTPOptions, RequestRouterConfig

from realtime.config import ConfigError, DeployConfig
from realtime.scale.affinity import named_session
from realtime.scale.checkpoints import remove_store
from realtime.scale.ingress import Choose, Ingress, IngressThread, tls_context
from realtime.scale.replica import DEPLOYMENT, Peers, RealtimeReplica
from realtime.scale.router import SessionRouter
from realtime.server import PROBE_RESERVE

log = logging.getLogger("realtime.scale.launch")

PROXY_CALLBACK_ENV = "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"
PROXY_CALLBACK = "realtime.scale.proxy:middlewares"
# Every websocket message crosses Ray between the proxy and the replica as an object; Ray moves
# one above 100 KiB (its default) through the object store, which costs a LIBERO observation
# (300 KB) ~1 ms more per round trip than sending it inline (docs/scaling.md, "The proxy's cost").
INLINE_OBJECTS_ENV = "RAY_max_direct_call_object_size"
INLINE_OBJECT_BYTES = 1 << 20
POLL_S = 0.5
PROXY_HOST = "127.0.0.1"  # Serve's proxy, behind the ingress on this node


def check_config(config: DeployConfig, config_name: str, num_replicas: int) -> None:
    """What a deployment of ``num_replicas`` replicas needs of a config beyond the schema; raises
    ``ConfigError``."""
    rc = config.replicas
    if 0 < rc.num_gpus < 1 and config.runtime.memory_available_bytes is None:
        raise ConfigError(
            config_name,
            "replicas.num_gpus",
            f"{rc.num_gpus:g} GPU per replica shares a GPU: set runtime.memory_available_bytes to each "
            "replica's share, or every replica plans its pools from the whole GPU's free memory",
        )
    if rc.cpu_affinity is not None and len(rc.cores()) < num_replicas * rc.num_cpus:
        raise ConfigError(
            config_name,
            "replicas.cpu_affinity",
            f"{len(rc.cores())} cores for {num_replicas} replicas of num_cpus {rc.num_cpus:g}: each "
            "replica on a node needs cores of its own",
        )


def application(config: DeployConfig, num_replicas: int) -> serve.Application:
    """The Serve application of ``config`` with ``num_replicas`` replicas (module docstring)."""
    rc = config.replicas
    actor_options: dict[str, Any] = {"num_cpus": rc.num_cpus, "num_gpus": rc.num_gpus}
    if rc.memory_bytes is not None:
        actor_options["memory"] = rc.memory_bytes
    deployment = serve.deployment(
        RealtimeReplica,
        name=DEPLOYMENT,
        num_replicas=num_replicas,
        ray_actor_options=actor_options,
        max_ongoing_requests=config.server.max_connections,
        max_queued_requests=rc.max_queued_requests,
        health_check_period_s=rc.health_check_period_s,
        health_check_timeout_s=rc.health_check_timeout_s,
        graceful_shutdown_timeout_s=config.server.shutdown_timeout_s,
        request_router_config=RequestRouterConfig(
            request_router_class=SessionRouter,
            request_routing_stats_period_s=rc.stats_period_s,
            request_routing_stats_timeout_s=max(rc.stats_period_s, rc.peer_timeout_s) * 3,
        ),
    )
    return deployment.bind(config)


def _free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _status(url: str, api_key: str | None) -> dict[str, Any] | None:
    request = urllib.request.Request(f"{url}/v1/status")
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())
    except (OSError, urllib.error.URLError, ValueError):  # the proxy not up yet, a slow answer
        return None


def wait_ready(url: str, num_replicas: int, stop: threading.Event, api_key: str | None = None) -> str | None:
    """Block until ``num_replicas`` replicas are ready (``None``), a replica's load failed (its
    error), or ``stop`` is set (``"stopped"``), polling the cluster's ``/v1/status`` (with
    ``api_key`` when ``server.api_keys`` has keys)."""
    while not stop.wait(POLL_S):
        status = _status(url, api_key)
        if status is None:
            continue
        replicas = status.get("replicas", [])
        failed = [r["load_error"] for r in replicas if r.get("load_error")]
        if failed:
            return failed[0]
        if sum(1 for r in replicas if r.get("ready")) >= num_replicas:
            return None
    return "stopped"


def start_ray(config: DeployConfig, num_replicas: int, ray_address: str | None) -> None:
    """A local Ray instance sized for ``num_replicas`` replicas (the proxy callback and
    :data:`INLINE_OBJECT_BYTES` in its environment, unless the caller's environment sets them), or
    the cluster at ``ray_address``."""
    if ray_address is not None:
        ray.init(address=ray_address, logging_level=logging.WARNING)
        return
    os.environ.setdefault(PROXY_CALLBACK_ENV, PROXY_CALLBACK)  # the local proxy inherits it
    os.environ.setdefault(INLINE_OBJECTS_ENV, str(INLINE_OBJECT_BYTES))  # so do Ray's processes
    ray.init(
        address="local",
        num_cpus=max(os.cpu_count() or 1, math.ceil(num_replicas * config.replicas.num_cpus)),
        include_dashboard=False,
        object_store_memory=config.replicas.object_store_bytes,
        logging_level=logging.WARNING,
    )


def deploy(config: DeployConfig, num_replicas: int, proxy_port: int) -> str:
    """Serve's proxy on ``127.0.0.1:proxy_port`` (behind the ingress) and the app of ``config``
    with ``num_replicas`` replicas (a running app of the same name is updated); returns the proxy's
    URL. Raises ``RuntimeError`` when the app does not deploy."""
    serve.start(http_options=HTTPOptions(host=PROXY_HOST, port=proxy_port))
    serve.run(application(config, num_replicas), name=config.replicas.app_name, route_prefix="/")
    return f"http://{PROXY_HOST}:{proxy_port}"


def direct_chooser(app_name: str) -> Choose:
    """The ingress's question for a websocket handshake: a handle call to
    ``RealtimeReplica.direct_address`` that the session router places as it would place the
    handshake (the session it names goes with the call, its scope is the call's argument)."""
    handle: Any = None

    async def choose(scope: dict[str, Any]) -> str | None:
        nonlocal handle
        if handle is None:
            handle = serve.get_deployment_handle(DEPLOYMENT, app_name)
        options: dict[str, Any] = {"method_name": "direct_address"}
        if name := named_session(scope):
            options["session_id"] = name
        return await handle.options(**options).remote(scope)

    return choose


def start_ingress(
    config: DeployConfig, num_replicas: int, host: str, port: int, proxy_port: int
) -> IngressThread:
    """The ingress (``realtime.scale.ingress``) on ``host:port`` in front of Serve's proxy on
    ``proxy_port``, terminating TLS when ``server.ssl_certfile`` is set. Raises ``OSError`` when
    the address is taken."""
    server = config.server
    ingress = Ingress(
        direct_chooser(config.replicas.app_name),
        (PROXY_HOST, proxy_port),
        max_connections=num_replicas * server.max_connections + PROBE_RESERVE,
        ssl_context=tls_context(server.ssl_certfile, server.ssl_keyfile),
    )
    return IngressThread(ingress, host, port)


def undeploy(config: DeployConfig) -> dict[str, int]:
    """Drain every replica, delete the app and its checkpoint store; returns the drain's counts."""
    app_name = config.replicas.app_name
    drained = drain(app_name, config.server.shutdown_timeout_s)
    serve.delete(app_name)
    remove_store(app_name)
    return drained


def serve_replicas(
    config: DeployConfig,
    config_name: str,
    num_replicas: int,
    ray_address: str | None,
    host: str | None = None,
    port: int | None = None,
) -> int:
    """Run the deployment until SIGTERM/SIGINT (module docstring); returns the exit status."""
    try:
        check_config(config, config_name, num_replicas)
    except ConfigError as exc:
        print(f"realtime: {exc}", flush=True, file=sys.stderr)
        return 2
    host = host or config.server.host
    port = config.server.port if port is None else port
    try:
        proxy_port = _free_port(PROXY_HOST)
        ingress = start_ingress(config, num_replicas, host, port, proxy_port)
    except OSError as exc:
        print(f"realtime: cannot listen on {host}:{port}: {exc.strerror or exc}", flush=True, file=sys.stderr)
        return 2
    scheme = "https" if config.server.ssl_certfile else "http"
    url = f"{scheme}://{host}:{ingress.port}"
    start_ray(config, num_replicas, ray_address)
    stop = threading.Event()

    signalled: list[int] = []

    def on_signal(signum: int, _frame: Any) -> None:
        # A second signal may land while the first handler is inside stop.set(), holding the
        # Event's lock (not reentrant): setting it again there would deadlock the main thread.
        if not signalled:
            signalled.append(signum)
            stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    status = 0
    try:
        proxy_url = deploy(config, num_replicas, proxy_port)
        api_key = config.server.api_keys[0] if config.server.api_keys else None
        failure = wait_ready(proxy_url, num_replicas, stop, api_key)
        if failure is None:
            log.info(
                "ready",
                extra={
                    "url": url,
                    "replicas": num_replicas,
                    "kinds": ",".join(config.enabled_kinds()),
                    "ray_address": ray.get_runtime_context().gcs_address,  # for realtime drain
                },
            )
            # Polled: a signal delivered to one of Ray's threads runs its handler only when the
            # main thread next runs Python, which a wait without a timeout never does.
            while not stop.wait(POLL_S):
                pass
        elif failure != "stopped":
            print(f"realtime: model loading failed: {failure}", flush=True, file=sys.stderr)
            status = 1
    except RuntimeError as exc:  # the app did not deploy (Serve names the replica's error)
        print(f"realtime: the replicas did not start: {str(exc).splitlines()[0]}", file=sys.stderr)
        status = 1
    finally:
        started = time.monotonic()
        try:
            drained = undeploy(config)
        finally:
            ingress.stop()
            ray.shutdown()  # a local instance ends with it; a cluster keeps Serve for its other apps
        log.info("stopped", extra={"seconds": round(time.monotonic() - started, 1), **drained})
    return status


def drain_replica(config: DeployConfig, tag: str, ray_address: str | None) -> int:
    """``realtime drain REPLICA``: move replica ``tag``'s sessions to the others
    (``RealtimeReplica.move_sessions``) on the local Ray instance (``auto``) or the cluster at
    ``ray_address`` (the ``ray_address=`` of ``realtime serve --replicas``'s ready line). Prints
    the counts; exit 0, 1 when the call (or joining the cluster) failed, 2 for no such replica."""
    try:
        ray.init(address=ray_address or "auto", logging_level=logging.WARNING)
    except ConnectionError as exc:
        print(
            f"realtime: cannot join the Ray cluster at {ray_address or 'auto'}: {str(exc).splitlines()[0]} "
            "(a cluster with token authentication, as a local one of Ray 2.60, needs RAY_AUTH_MODE=token "
            "in the environment when its address is given)",
            file=sys.stderr,
        )
        return 1
    try:
        peers = Peers(config.replicas.app_name, tag="", timeout_s=config.server.shutdown_timeout_s)
        tags = peers.tags()
        if tag not in tags:
            print(f"realtime: no replica {tag!r}; replicas: {', '.join(tags) or 'none'}", file=sys.stderr)
            return 2
        settle_s = 2 * config.replicas.stats_period_s
        call = peers.call("move_sessions", tag).remote(tag)
        try:
            result = call.result(timeout_s=settle_s + config.server.shutdown_timeout_s + 30)
        except Exception as exc:  # noqa: BLE001 - the replica died, or did not answer: say so
            print(f"realtime: draining {tag} failed: {str(exc).splitlines()[0]}", file=sys.stderr)
            return 1
        if result is None:
            print(f"realtime: the call did not reach replica {tag}", file=sys.stderr)
            return 1
        print(json.dumps({"replica": tag, **result}), flush=True)
        return 0
    finally:
        ray.shutdown()


def drain(app_name: str, timeout_s: float) -> dict[str, int]:
    """Every replica closes its websockets with 1001 (``RealtimeReplica.drain``), so deleting the
    app does not wait for them (Serve would hold each replica until its graceful shutdown bound,
    then kill it: its clients would get 1012 instead of 1001). Returns the summed counts."""
    peers = Peers(app_name, tag="", timeout_s=timeout_s + 5)

    async def all_replicas() -> list[dict[str, int] | None]:
        calls = [peers.call("drain", tag).remote(tag) for tag in peers.tags()]
        return await asyncio.gather(
            *(asyncio.wait_for(c, peers.timeout_s) for c in calls), return_exceptions=True
        )

    totals = {"closed": 0, "aborted": 0, "undrained": 0}
    try:
        results = asyncio.run(all_replicas())
    except Exception:  # noqa: BLE001 - nothing deployed yet: nothing to drain
        return totals
    for result in results:
        if isinstance(result, dict):
            for key in totals:
                totals[key] += result[key]
    return totals
