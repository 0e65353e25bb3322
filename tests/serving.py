"""Test helpers that run the real server over loopback.

``serve_in_process(config)`` runs the real uvicorn ``GracefulServer`` on an ephemeral port in
the current event loop (so tests can measure event-loop lag and drive real clients) and yields
its base URL once it listens and is ready. ``wait_ready`` polls ``/readyz``. ``robots_at_once``
sends one observation from each of several openpi-client robots at the same instant.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator

import httpx

from realtime.config import DeployConfig
from realtime.server import GracefulServer, build_server


async def wait_ready(base_url: str, timeout_s: float = 120.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    async with httpx.AsyncClient() as client:
        while True:
            try:
                if (await client.get(f"{base_url}/readyz")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"{base_url} not ready after {timeout_s}s")
            await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def serve_in_process(
    config: DeployConfig, ready: bool = True
) -> AsyncIterator[tuple[str, GracefulServer]]:
    server = build_server(config, host="127.0.0.1", port=0)
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            if task.done():
                task.result()
                raise RuntimeError("server exited during startup")
            await asyncio.sleep(0.01)
        base_url = server.rt_app.state.rt.url
        if ready:
            await wait_ready(base_url)
        yield base_url, server
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, timeout=60)


def robots_at_once(url: str, observations: list[dict]) -> list[object]:
    """One openpi-client robot per observation, all sending at once (blocking: call it in a
    thread from a test's event loop); each one's reply, or the exception its ``infer`` raised."""
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    results: list[object] = [None] * len(observations)
    barrier = threading.Barrier(len(observations))

    def run(i: int) -> None:
        client = WebsocketClientPolicy(url)
        try:
            barrier.wait(timeout=30)
            results[i] = client.infer(observations[i])
        except Exception as exc:  # noqa: BLE001 (the reply is the subject)
            results[i] = exc
        finally:
            client._ws.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(observations))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return results
