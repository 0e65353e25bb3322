"""``realtime serve`` as a real process: ready line with URL, health over HTTP, clean SIGTERM exit."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

READY = re.compile(r'msg=ready url=(http://\S+)|"msg": "ready", "url": "(http://[^"]+)"')


def start_server(
    config_text: str, tmp_path: Path, *extra: str, ready_timeout_s: float = 120
) -> tuple[subprocess.Popen, str]:
    """Start ``realtime serve`` on an ephemeral port; return the process and its URL once ready
    (its log, stdout and stderr together, is ``tmp_path / "server.log"``)."""
    config = tmp_path / "deploy.yaml"
    config.write_text(config_text)
    log_path = tmp_path / "server.log"
    log = log_path.open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "realtime.cli", "serve", "--config", str(config), "--port", "0", *extra],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    deadline = time.monotonic() + ready_timeout_s
    while time.monotonic() < deadline:
        match = READY.search(log_path.read_text())
        if match:
            return proc, match.group(1) or match.group(2)
        if proc.poll() is not None:
            raise AssertionError(f"server exited early:\n{log_path.read_text()}")
        time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"no ready line:\n{log_path.read_text()}")


def test_serve_reports_ready_url_and_exits_zero_on_sigterm(tmp_path):
    proc, url = start_server("robot: {enabled: false}\nworld: {enabled: false}\n", tmp_path)
    try:
        assert httpx.get(f"{url}/healthz").text == "OK\n"
        assert httpx.get(f"{url}/readyz").status_code == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0


def test_json_log_format_tags_lines(tmp_path):
    proc, url = start_server("server: {log_format: json}\nrobot: {enabled: false}\n", tmp_path)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 0
    import json

    lines = [
        json.loads(line)
        for line in (tmp_path / "server.log").read_text().splitlines()
        if line.startswith("{")
    ]
    assert any(line["msg"] == "ready" and line["url"] == url for line in lines)


def test_sigterm_closes_open_websocket_with_1001_and_exits_within_bound(tmp_path):
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    shutdown_bound_s = 5
    proc, url = start_server(
        f"server: {{shutdown_timeout_s: {shutdown_bound_s}}}\nrobot: {{enabled: true}}\n", tmp_path
    )
    try:
        with connect(url.replace("http://", "ws://") + "/", max_size=None, open_timeout=30) as ws:
            ws.recv(timeout=30)  # the OpenPI handshake metadata frame: the session is live
            started = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            try:
                while True:
                    ws.recv(timeout=shutdown_bound_s + 5)
            except ConnectionClosed as closed:
                assert closed.rcvd is not None, "server must send a close frame"
                assert closed.rcvd.code == 1001
                assert closed.rcvd.reason == "server shutting down"
        assert proc.wait(timeout=shutdown_bound_s + 10) == 0
        assert time.monotonic() - started < shutdown_bound_s + 5
    finally:
        if proc.poll() is None:
            proc.kill()
