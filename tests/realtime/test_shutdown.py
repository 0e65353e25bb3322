"""Shutdown is bounded whatever clients do: a real server process, real sockets over loopback.

Regression for issue 11 defect 2: a client flooding ``session.ping`` with large data and never
reading made the one-at-a-time drain wait on its write buffer forever; other clients never got
1001 and the process did not exit.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import threading
import time
from pathlib import Path

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from tests.realtime.rawws import RawClient
from tests.realtime.test_serve_process import start_server

pytestmark = pytest.mark.timeout(180)

BOUND_S = 3.0
SLACK_S = 3.0  # process teardown after the drain: kinds stop, interpreter exit
CONFIG = f"""
server: {{shutdown_timeout_s: {BOUND_S}}}
runtime: {{memory_available_bytes: 1073741824}}
robot: {{enabled: true, policy: zeros, device: cpu}}
world: {{enabled: true, model: world-test, torch_threads: 1, default_pacing: fast}}
"""


def _flood_pings(client: RawClient, stop: threading.Event) -> None:
    """Send large ``session.ping`` messages as fast as the server takes them; never read."""
    text = json.dumps({"type": "session.ping", "data": "x" * 60_000})
    while not stop.is_set():
        try:
            client.send_text(text)
        except OSError:  # timed out on a full buffer, or the server aborted the connection
            return


def test_sigterm_with_non_reading_flooders_exits_within_bound_and_others_get_1001(tmp_path):
    proc, url = start_server(CONFIG, tmp_path)
    ws_url = url.replace("http://", "ws://")
    stop = threading.Event()
    flooders, threads, polite = [], [], []
    idle_reader = None
    with contextlib.ExitStack() as stack:
        try:
            for _ in range(3):  # session.ping floods that never read a pong
                client = RawClient(ws_url + "/v1/realtime/world?protocol_version=1", rcvbuf=4096, timeout_s=2)
                flooders.append(client)
                threads.append(threading.Thread(target=_flood_pings, args=(client, stop), daemon=True))
            # a world session generating as fast as it can for a client that never reads a chunk
            idle_reader = RawClient(ws_url + "/v1/realtime/world?protocol_version=1", rcvbuf=4096)
            idle_reader.send_text(json.dumps({"type": "session.start", "pacing": "fast"}))
            for t in threads:
                t.start()
            for _ in range(4):
                ws = stack.enter_context(
                    connect(ws_url + "/v1/realtime/world?protocol_version=1", open_timeout=30)
                )
                ws.send(json.dumps({"type": "session.ping", "data": 1}))
                assert json.loads(ws.recv(timeout=30))["type"] == "session.pong"
                polite.append(ws)
            robot = stack.enter_context(connect(ws_url + "/", open_timeout=30, max_size=None))
            robot.recv(timeout=30)  # the OpenPI metadata frame
            polite.append(robot)
            time.sleep(2.0)  # the flooders' and the idle reader's buffers fill up on both sides

            started = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            codes = []
            for ws in polite:
                try:
                    while True:
                        ws.recv(timeout=BOUND_S + SLACK_S)
                except ConnectionClosed as closed:
                    codes.append(closed.rcvd.code if closed.rcvd is not None else None)
                except TimeoutError:
                    codes.append("timeout")
            assert codes == [1001] * len(polite)
            assert proc.wait(timeout=BOUND_S + SLACK_S + 30) == 0
            elapsed = time.monotonic() - started
            assert elapsed < BOUND_S + SLACK_S, f"exit took {elapsed:.1f}s for a {BOUND_S}s drain bound"
            log = (tmp_path / "server.log").read_text()
            assert "shutdown drain timed out" in log and "aborted=" in log  # the flooders were aborted
        finally:
            stop.set()
            for client in flooders + ([idle_reader] if idle_reader else []):
                client.close()
            if proc.poll() is None:
                proc.kill()


def _infer_until_closed(url: str, codes: list, ready: threading.Barrier) -> None:
    """An openpi-client robot calling ``infer`` back to back until the server closes it."""
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    from realtime.bench.examples import libero

    policy = WebsocketClientPolicy(url)
    observation = libero(0)
    policy.infer(observation)
    ready.wait(timeout=60)
    try:
        while True:
            policy.infer(observation)
    except ConnectionClosed as closed:
        codes.append(closed.rcvd.code if closed.rcvd is not None else None)
    except Exception as exc:  # noqa: BLE001 (anything else is the failure this test reports)
        codes.append(repr(exc))
    finally:
        policy._ws.close()


def test_sigterm_during_robot_inference_is_a_clean_1001_without_error_lines(tmp_path):
    """Regression for issue 26 defect 7: SIGTERM during a robot inference logged ERROR ``robot
    connection failed ... WebSocketDisconnected`` with a traceback and ``closing websocket
    code=1011`` (the drain had closed the socket with 1001 under the handler's reply)."""
    proc, url = start_server(
        f"server: {{shutdown_timeout_s: {BOUND_S}}}\nrobot: {{enabled: true, policy: pi0-tiny, device: cpu}}\n",
        tmp_path,
    )
    robots, codes = 3, []
    ready = threading.Barrier(robots + 1)
    threads = [
        threading.Thread(
            target=_infer_until_closed, args=(url.replace("http", "ws"), codes, ready), daemon=True
        )
        for _ in range(robots)
    ]
    try:
        for t in threads:
            t.start()
        ready.wait(timeout=120)
        time.sleep(0.5)  # every robot is mid-request: the next forward is always in flight
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=BOUND_S + SLACK_S + 30) == 0
        for t in threads:
            t.join(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert codes == [1001] * robots
    log = (tmp_path / "server.log").read_text()
    assert "level=error" not in log and "Traceback" not in log, log[-4000:]
    assert "code=1011" not in log, log[-4000:]
    # robot.process auto: pi0-tiny on the CPU ran in a child process, which ended with the server
    pid = int(re.search(r"policy_pid=(\d+)", log).group(1))  # type: ignore[union-attr]
    assert not Path(f"/proc/{pid}").exists()
