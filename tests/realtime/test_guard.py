"""The guard in front of every route, over real loopback: API keys, Origin, loading, connection limit.

Regressions for issue 11 defects 3 and 7: with keys configured ``/v1/models``, ``/metrics`` and
demo pages answered without one; while models loaded a websocket was accepted (101, then 1013)
before any key check; no ``Origin`` check; nothing bounded the number of connections. Issue 26
defect 9: the origin check trusted the request's ``Host`` header.
"""

from __future__ import annotations

import asyncio
import socket
import sys
import threading
import types

import httpx
import pytest
import websockets
from starlette.responses import PlainTextResponse
from starlette.routing import Route, WebSocketRoute
from websockets.exceptions import ConnectionClosed, InvalidStatus

from realtime import auth
from realtime import kinds as kinds_registry
from realtime import server as server_module
from realtime.config import ConfigError, config_from_mapping
from realtime.ws import serve_websocket
from tests.realtime.rawws import RawClient
from tests.serving import serve_in_process, wait_ready

pytestmark = pytest.mark.timeout(120)

KEYS = ["k-first", "k-second"]


class _EchoKind:
    """A session kind with a websocket echo route and a page; ``load`` waits for ``gate``."""

    name = "robot"

    def __init__(self, ctx, gate: threading.Event) -> None:
        self.ctx = ctx
        self.gate = gate

    def routes(self):
        return [WebSocketRoute("/echo", self._echo), Route("/demo/page", self._page)]

    async def _page(self, _request):
        return PlainTextResponse("page\n")

    async def _echo(self, websocket):
        async def handler():
            async for text in websocket.iter_text():
                await websocket.send_text(text)

        await serve_websocket(websocket, self.ctx, self.name, handler)

    def models(self):
        return []

    def load(self, progress):
        self.gate.wait(timeout=60)

    async def start(self):
        return None

    async def stop(self):
        self.gate.set()


@pytest.fixture
def gate(monkeypatch):
    """Install the echo kind as ``robot``; the returned event lets its ``load`` finish."""
    gate = threading.Event()
    module = types.ModuleType("echo_kind")
    module.build = lambda ctx: _EchoKind(ctx, gate)
    monkeypatch.setitem(sys.modules, "echo_kind", module)
    monkeypatch.setitem(kinds_registry.KIND_FACTORIES, "robot", "echo_kind:build")
    yield gate
    gate.set()


def _config(**server):
    return config_from_mapping({"server": server, "robot": {"enabled": True}, "world": {"enabled": False}})


def _ws(base: str, path: str = "/echo") -> str:
    return base.replace("http://", "ws://") + path


async def _echo_once(url: str, **kwargs) -> str:
    async with websockets.connect(url, open_timeout=10, **kwargs) as ws:
        await ws.send("hello")
        return await asyncio.wait_for(ws.recv(), 10)


async def test_every_route_but_the_probes_needs_a_key(gate):
    gate.set()
    async with (
        serve_in_process(_config(api_keys=KEYS)) as (base, _),
        httpx.AsyncClient(base_url=base) as client,
    ):
        for path in ("/healthz", "/readyz"):
            assert (await client.get(path)).status_code == 200, path
        for path in ("/metrics", "/v1/models", "/demo/page"):
            assert (await client.get(path)).status_code == 401, path
            assert (await client.get(path, headers={"Authorization": "Bearer nope"})).status_code == 401
            assert (await client.get(path, headers={"Authorization": "Api-Key k-second"})).status_code == 200
            assert (await client.get(path, headers={"Authorization": "Bearer k-first"})).status_code == 200
            assert (await client.get(path, params={"api_key": "k-first"})).status_code == 200, path
        with pytest.raises(InvalidStatus) as refused:
            await _echo_once(_ws(base))
        assert refused.value.response.status_code == 401
        with pytest.raises(InvalidStatus):
            await _echo_once(_ws(base), additional_headers={"Authorization": "Bearer k-firs"})
        assert await _echo_once(_ws(base, "/echo?api_key=k-second")) == "hello"
        assert await _echo_once(_ws(base), additional_headers={"Authorization": "Api-Key k-first"}) == "hello"
        assert await _echo_once(_ws(base), subprotocols=["openai-insecure-api-key.k-first"]) == "hello"


async def test_keys_are_checked_before_accept_while_models_load(gate):
    async with serve_in_process(_config(api_keys=KEYS), ready=False) as (base, _):
        async with httpx.AsyncClient(base_url=base) as client:
            assert (await client.get("/readyz")).status_code == 503
        with pytest.raises(InvalidStatus) as refused:  # refused at the handshake, not accepted then 1013
            await _echo_once(_ws(base))
        assert refused.value.response.status_code == 401
        with pytest.raises(ConnectionClosed) as closed:
            await _echo_once(_ws(base), additional_headers={"Authorization": "Bearer k-second"})
        assert closed.value.rcvd.code == 1013
        gate.set()
        await wait_ready(base)
        assert await _echo_once(_ws(base), additional_headers={"Authorization": "Bearer k-second"}) == "hello"


async def _origin_status(url: str, origin: str, host: str | None = None) -> int:
    """The handshake's answer (101 or the refusal) for ``Origin: origin`` (and ``Host: host``)."""
    headers = {"Origin": origin} if host is None else {"Origin": origin, "Host": host}
    client = await asyncio.to_thread(RawClient, url, headers)
    client.close()
    return client.status


async def test_origins_are_scheme_host_and_port_of_the_loopback_names_by_default(gate):
    """Regression for issue 26 defect 9: ``Host: evil.example:P`` with ``Origin:
    http://evil.example:P`` was accepted (DNS rebinding: the attacker's name resolves to the
    server), and the scheme was ignored."""
    gate.set()
    async with serve_in_process(_config()) as (base, _):
        port = int(base.rsplit(":", 1)[1])
        url = _ws(base)
        for origin in (f"http://127.0.0.1:{port}", f"http://localhost:{port}", f"http://[::1]:{port}/"):
            assert await _origin_status(url, origin) == 101, origin
        assert await _origin_status(url, f"http://LOCALHOST:{port}") == 101  # hosts are case-blind
        for origin in (
            f"http://evil.example:{port}",
            f"https://127.0.0.1:{port}",  # another scheme is another origin
            f"http://127.0.0.1:{port + 1}",
            "http://localhost",  # port 80
            "null",
            f"ws://127.0.0.1:{port}",
        ):
            assert await _origin_status(url, origin) == 403, origin
        # DNS rebinding: the request names the attacker's host, and its page's origin matches it
        assert await _origin_status(url, f"http://evil.example:{port}", host=f"evil.example:{port}") == 403
        assert await _echo_once(url) == "hello"  # no Origin: not a browser


async def test_configured_origins_replace_the_defaults_and_compare_default_ports(gate):
    gate.set()
    async with serve_in_process(_config(allowed_origins=["https://app.example", "http://10.0.0.5:8080"])) as (
        base,
        _,
    ):
        port = int(base.rsplit(":", 1)[1])
        url = _ws(base)
        for origin in ("https://app.example", "https://APP.example:443", "http://10.0.0.5:8080"):
            assert await _origin_status(url, origin) == 101, origin
        for origin in ("http://app.example", "https://app.example:8443", f"http://127.0.0.1:{port}"):
            assert await _origin_status(url, origin) == 403, origin
        assert await _echo_once(url, origin="https://app.example") == "hello"
    async with serve_in_process(_config(allowed_origins=["*"])) as (base, _):
        assert await _origin_status(_ws(base), "http://anything.example") == 101


def test_allowed_origins_must_be_origins():
    with pytest.raises(ConfigError, match="allowed_origins"):
        config_from_mapping({"server": {"allowed_origins": ["https://app.example/path"]}})
    with pytest.raises(ConfigError, match="ssl_keyfile"):
        config_from_mapping({"server": {"ssl_certfile": "cert.pem"}})


def test_keys_are_compared_with_every_configured_key(monkeypatch):
    calls = []
    real = auth.hmac.compare_digest
    monkeypatch.setattr(auth.hmac, "compare_digest", lambda a, b: calls.append(1) or real(a, b))
    keys = ["a" * 40, "b", "c" * 7]
    assert auth.key_matches("a" * 40, keys)  # the first key matches: the others are still compared
    assert len(calls) == 3
    assert not auth.key_matches("a" * 39, keys)
    assert len(calls) == 6


async def _until(predicate, timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


def _idle_sockets(port: int, n: int) -> list[socket.socket]:
    return [socket.create_connection(("127.0.0.1", port)) for _ in range(n)]


def _request(port: int, path: str, connection: str = "keep-alive") -> tuple[bytes, bool]:
    """One keep-alive ``GET path`` on a new connection: the answer, and whether the server then
    closed the connection (it ends refused connections at once)."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.settimeout(3.0)
    try:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: {connection}\r\n\r\n".encode())
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except TimeoutError:  # still open: a keep-alive connection
            return answer, False
        return answer, True
    finally:
        sock.close()


async def test_connection_limit_answers_503_and_closes_but_keeps_the_probes(gate, monkeypatch):
    """Regression for issue 26 defect 2 (and item 10): over the limit, requests got 503 but their
    connections stayed open and filled the probe reserve, so ``/healthz`` and ``/readyz`` answered
    503 to an orchestrator; websockets over the limit got the documented 1013 only sometimes."""
    monkeypatch.setattr(server_module, "FIRST_REQUEST_TIMEOUT_S", 1.5)
    gate.set()
    limit = 3
    async with serve_in_process(_config(max_connections=limit)) as (base, server):
        port = int(base.rsplit(":", 1)[1])
        hard_limit = limit + server_module.PROBE_RESERVE
        idle = _idle_sockets(port, limit + 2)  # TCP connections that never send a request
        try:
            await _until(lambda: len(server.server_state.connections) == limit + 2)
            # over the limit: answered 503 and closed at once, again and again (keep-alive asked)
            for _ in range(3 * hard_limit):
                answer, closed = await asyncio.to_thread(_request, port, "/v1/models")
                assert answer.startswith(b"HTTP/1.1 503 ") and b"connection: close" in answer.lower()
                assert closed
            with pytest.raises(InvalidStatus) as refused:  # websockets too: refused, not upgraded
                await _echo_once(_ws(base))
            assert refused.value.response.status_code == 503
            # a flood of idle connections past the reserve: the probes make room by evicting them
            idle += _idle_sockets(port, 2 * hard_limit)
            for _ in range(2 * hard_limit):
                for path in ("/healthz", "/readyz"):
                    answer, _ = await asyncio.to_thread(_request, port, path, "close")
                    assert answer.startswith(b"HTTP/1.1 200 "), (path, answer[:40])
            assert len(server.server_state.connections) <= hard_limit
            # connections that never send a request are closed after the first-request deadline
            for sock in idle:
                sock.settimeout(5)
                try:
                    assert await asyncio.to_thread(sock.recv, 1) in (b"", b"H")  # closed (or refused)
                except ConnectionResetError:
                    pass
            async with httpx.AsyncClient(base_url=base) as client:
                assert (await client.get("/v1/models")).status_code == 200
        finally:
            for sock in idle:
                sock.close()


async def test_the_probes_refuse_websocket_upgrades(gate):
    gate.set()
    async with serve_in_process(_config()) as (base, _):
        for path in ("/healthz", "/readyz"):
            with pytest.raises(InvalidStatus) as refused:
                await _echo_once(_ws(base, path))
            assert refused.value.response.status_code == 404, path


def test_connection_limit_stays_below_the_fd_limit(monkeypatch):
    monkeypatch.setattr(server_module.resource, "getrlimit", lambda _: (1024, 4096))
    fits = 1024 - server_module.FD_HEADROOM - server_module.PROBE_RESERVE
    assert server_module.connection_limit(100) == 100
    assert server_module.connection_limit(5000) == fits
