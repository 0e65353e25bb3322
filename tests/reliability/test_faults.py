"""Faults injected into a real server (in this process, real clients over loopback).

The model is the one layer replaced, and only where a fault needs it: the policy's ``infer``
raises for one observation, or sleeps; a stage's worker thread is killed with an asynchronous
exception (``PyThreadState_SetAsyncExc``, as an interpreter fault would). Everything else (the
engine, sessions, connections, codecs, uvicorn, the clients) is real.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import json
import logging
import socket
import struct
import threading
import time

import httpx
import pytest
from websockets.asyncio.client import connect

from realtime.bench.reliability import libero_observation
from realtime.config import config_from_mapping
from sessions.engine.worker import dead_workers
from tests.realtime.rawws import RawClient
from tests.serving import robots_at_once, serve_in_process

pytestmark = pytest.mark.timeout(180)

CONFIG = {
    "runtime": {"memory_available_bytes": 1 << 30},
    "robot": {
        "enabled": True,
        "policy": "zeros",
        "device": "cpu",
        "dispatch": "window",
        "coalesce_window_s": 0.1,
    },
    "world": {"enabled": True, "model": "world-test", "torch_threads": 1, "default_pacing": "fast"},
    "server": {"max_outbound_bytes": 1 << 20, "max_send_wait_s": 3},
}
WORLD = "/v1/realtime/world?protocol_version=1"


def _kind(server, name: str):
    return next(kind for kind in server.rt_app.state.rt.kinds if kind.name == name)


async def _settled(base: str, timeout_s: float = 20.0) -> dict:
    """Wait for no open websocket and no occupied session; the status at that point."""
    async with httpx.AsyncClient(base_url=base) as client:
        deadline = time.monotonic() + timeout_s
        while True:
            status = (await client.get("/v1/status")).json()
            busy = sum(status["connections"]["websockets"].values()) + sum(
                k["occupied"] or 0 for k in status["kinds"]
            )
            if not busy or time.monotonic() > deadline:
                return status
            await asyncio.sleep(0.1)


def _no_leak(status: dict) -> None:
    assert not any(status["connections"]["websockets"].values()), status["connections"]
    assert not any(k["occupied"] for k in status["kinds"]), [k["sessions_by_state"] for k in status["kinds"]]


def _errors(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def _robots(url: str, prompts: list[str]) -> list[object]:
    """One openpi-client robot per prompt (a LIBERO observation), all sending at once."""
    return robots_at_once(url, [{**libero_observation(0), "prompt": prompt} for prompt in prompts])


async def test_a_forward_raising_for_one_item_fails_only_that_session(monkeypatch, caplog):
    async with serve_in_process(config_from_mapping(CONFIG)) as (base, server):
        policy = _kind(server, "robot").policy
        real, batches = policy.infer, []

        def infer(batch, snapshots):
            batches.append([c.prompt for c in batch])
            if any(c.prompt == "poison" for c in batch):
                raise RuntimeError("the model's forward exploded")
            return real(batch, snapshots)

        monkeypatch.setattr(policy, "infer", infer)
        url = base.replace("http://", "ws://") + "/"
        for _ in range(8):  # until the poisoned request shared a forward (arrival times vary)
            results = await asyncio.to_thread(_robots, url, ["poison", "a", "b", "c"])
            poisoned, others = results[0], results[1:]
            assert isinstance(poisoned, RuntimeError) and "Error in inference server" in str(poisoned)
            assert "Traceback" not in str(poisoned) and "exploded" not in str(poisoned)  # typed
            assert all(isinstance(r, dict) and r["actions"].shape[0] > 0 for r in others), others
            if any(len(b) > 1 and "poison" in b for b in batches):
                break
        assert any(len(b) > 1 and "poison" in b for b in batches), batches
        _no_leak(await _settled(base))


def _kill(thread: threading.Thread) -> None:
    """Raise SystemExit in ``thread`` at its next bytecode (when its next job arrives)."""
    done = ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread.ident), ctypes.py_object(SystemExit)
    )
    assert done == 1


async def test_a_dead_stage_worker_fails_its_sessions_typed_readyz_503_and_nothing_hangs(caplog):
    async with serve_in_process(config_from_mapping(CONFIG)) as (base, server):
        (worker,) = [t for t in threading.enumerate() if t.name == "stage-robot-policy"]
        _kill(worker)
        url = base.replace("http://", "ws://") + "/"
        first, second = await asyncio.to_thread(_robots, url, ["a", "b"])
        for reply in (first, second):
            assert isinstance(reply, RuntimeError) and "StageWorkerDied" in str(reply), reply
        worker.join(timeout=10)
        assert not worker.is_alive()
        async with httpx.AsyncClient(base_url=base) as client:
            ready = await client.get("/readyz")
            assert ready.status_code == 503 and "stage worker died: stage-robot-policy" in ready.text
            assert (await client.get("/healthz")).status_code == 200  # alive: the orchestrator decides
        later = await asyncio.to_thread(_robots, url, ["c"])
        assert isinstance(later[0], RuntimeError) and "StageWorkerDied" in str(later[0])
        async with connect(base.replace("http://", "ws://") + WORLD) as ws:  # other kinds go on
            await ws.send(json.dumps({"type": "session.ping", "data": 1}))
            assert json.loads(await asyncio.wait_for(ws.recv(), 30))["type"] == "session.pong"
        _no_leak(await _settled(base))
    # the server stopped (nothing hung); the error was logged once, as an ERROR with its cause
    assert any("stage worker thread died" in m for m in _errors(caplog))
    gc.collect()
    assert dead_workers() == []  # gone with its server: no other test sees it


def _reset(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


async def test_clients_vanishing_mid_tick_and_mid_response_leak_nothing(monkeypatch, caplog):
    async with serve_in_process(config_from_mapping(CONFIG)) as (base, server):
        policy = _kind(server, "robot").policy
        real, in_forward = policy.infer, threading.Event()

        def slow(batch, snapshots):
            in_forward.set()
            time.sleep(0.3)
            return real(batch, snapshots)

        monkeypatch.setattr(policy, "infer", slow)
        ws_base = base.replace("http://", "ws://")

        def mid_tick() -> None:
            from realtime.protocols import openpi

            client = RawClient(ws_base + "/")
            client.protocol.send_binary(openpi.packb(libero_observation(0)))
            client.sock.sendall(b"".join(client.protocol.data_to_send()))
            assert in_forward.wait(10)
            _reset(client.sock)  # gone while its forward runs

        def mid_response() -> None:
            client = RawClient(ws_base + WORLD, rcvbuf=4096)
            client.send_text(json.dumps({"type": "session.start", "pacing": "fast"}))
            time.sleep(0.5)  # chunks stream at it, its buffers fill
            _reset(client.sock)

        for _ in range(3):
            in_forward.clear()
            await asyncio.to_thread(mid_tick)
            await asyncio.to_thread(mid_response)
        _no_leak(await _settled(base))
        (reply,) = await asyncio.to_thread(_robots, ws_base + "/", ["after"])
        assert isinstance(reply, dict), reply  # the server goes on
    assert not _errors(caplog), _errors(caplog)


async def test_a_slow_reader_is_bounded_and_does_not_slow_the_others(caplog):
    async with serve_in_process(config_from_mapping(CONFIG)) as (base, _):
        ws_base = base.replace("http://", "ws://")
        slow = await asyncio.to_thread(RawClient, ws_base + WORLD, None, 10.0, 4096)  # off the server's loop
        await asyncio.to_thread(slow.send_text, json.dumps({"type": "session.start", "pacing": "fast"}))
        slow.sock.settimeout(0.2)

        async def read_slowly() -> None:
            for _ in range(40):  # a few bytes every 50 ms: far slower than the chunks come
                with_data = await asyncio.to_thread(_recv_some, slow.sock)
                if not with_data:
                    return
                await asyncio.sleep(0.05)

        reader = asyncio.create_task(read_slowly())
        chunks = 0
        async with connect(ws_base + WORLD, max_size=None) as ws:
            await ws.send(json.dumps({"type": "session.start", "pacing": "fast"}))
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and chunks < 20:
                if isinstance(await asyncio.wait_for(ws.recv(), 10), bytes):
                    chunks += 1
        assert chunks == 20  # the well-behaved client got its stream meanwhile
        await reader
        slow.close()
        _no_leak(await _settled(base))
    assert not _errors(caplog), _errors(caplog)


def _recv_some(sock: socket.socket) -> bool:
    try:
        return bool(sock.recv(64))
    except TimeoutError:
        return True
    except OSError:
        return False
