"""A 2-second blocking forward must not delay /healthz or websocket ping/pong (invariant 1).

The real app (``create_app`` through ``build_server``) and a tiny echo-websocket Starlette app
run under real uvicorn servers on the same event loop as a StageEngine whose stage does 2 s of
torch matmuls on its worker thread. Meanwhile we poll /healthz with httpx, ping a websockets
client and measure the loop's own lag. Were the forward on the loop, each would wait ~2 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import httpx
import torch
import uvicorn
import websockets
from starlette.applications import Starlette
from starlette.routing import WebSocketRoute

from realtime.config import config_from_mapping
from sessions.engine import StageEngine
from tests.serving import serve_in_process

FORWARD_S = 2.0


class MatmulStage:
    """Blocks its caller for FORWARD_S seconds of real torch compute."""

    name = "matmul"
    device = "cpu"

    def __init__(self) -> None:
        self.a = torch.randn(256, 256)
        self.ran_s = 0.0

    def forward(self, items):
        start = time.perf_counter()
        x = self.a
        while time.perf_counter() - start < FORWARD_S:
            x = torch.tanh(x @ self.a)
        self.ran_s = time.perf_counter() - start
        return [float(x[0, 0]) for _ in items]


async def echo(websocket) -> None:
    await websocket.accept()
    with contextlib.suppress(Exception):
        while True:
            await websocket.send_text(await websocket.receive_text())


@contextlib.asynccontextmanager
async def echo_server():
    app = Starlette(routes=[WebSocketRoute("/echo", echo)])
    config = uvicorn.Config(
        app, host="127.0.0.1", port=0, log_config=None, ws="websockets-sansio", lifespan="off"
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"ws://127.0.0.1:{port}/echo"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, timeout=10)


async def test_blocking_forward_does_not_delay_healthz_or_ping(registry):
    stage = MatmulStage()
    engine = StageEngine(stage, registry=registry)
    async with serve_in_process(config_from_mapping({})) as (base_url, _server), echo_server() as ws_url:
        async with httpx.AsyncClient() as http, websockets.connect(ws_url) as ws:
            await http.get(f"{base_url}/healthz")  # warm the connection
            await engine.open("a")
            forward = engine.submit("a", 0, None)
            loop_lag, health, pings = [], [], []

            async def measure_lag() -> None:
                while not forward.done():
                    t0 = time.perf_counter()
                    await asyncio.sleep(0.01)
                    loop_lag.append(time.perf_counter() - t0 - 0.01)

            lag_task = asyncio.create_task(measure_lag())
            t_start = time.perf_counter()
            while not forward.done():
                t0 = time.perf_counter()
                response = await http.get(f"{base_url}/healthz")
                health.append(time.perf_counter() - t0)
                assert response.status_code == 200 and response.text == "OK\n"
                t0 = time.perf_counter()
                await (await ws.ping())
                pings.append(time.perf_counter() - t0)
                await ws.send("hi")
                assert await ws.recv() == "hi"
                await asyncio.sleep(0.05)
            await forward
            elapsed = time.perf_counter() - t_start
            await lag_task
    await engine.close()
    assert stage.ran_s >= FORWARD_S and elapsed >= FORWARD_S - 0.1
    assert len(health) >= 10 and len(pings) >= 10  # probes kept flowing during the forward
    # generous bounds for a shared 2-core CI box; a forward on the loop would show ~2 s
    assert max(health) < 0.5 and sorted(health)[len(health) // 2] < 0.1
    assert max(pings) < 0.5 and sorted(pings)[len(pings) // 2] < 0.1
    assert max(loop_lag) < 0.3
