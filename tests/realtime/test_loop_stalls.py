"""Cheap frames cannot stall the event loop: a real server process, hostile clients over loopback.

Regression for issue 26 defect 3: one client sending 5,000-deep nested msgpack (5 KB) on the robot
route took ``/healthz`` p99 to ~240 ms (each frame built ~1,000 nested lists before msgpack's own
stack limit refused it, and every few hundred frames that set off a full garbage collection that
walked the ~180,000 objects of the loaded models: 240-350 ms, measured with ``gc.callbacks``); a
100,000-key map (1.1 MB) held the loop ~46 ms each. Now the decoders bound depth and object counts
before building anything, frames with many objects decode on a worker thread, and the loaded heap
is frozen out of the collector after startup.
"""

from __future__ import annotations

import re
import signal
import statistics
import threading
import time

import httpx
import msgpack
import pytest
from websockets.sync.client import connect

from tests.realtime.test_serve_process import start_server

pytestmark = pytest.mark.timeout(240)

CONFIG = """
runtime: {memory_available_bytes: 1073741824}
robot: {enabled: true, policy: zeros, device: cpu}
world: {enabled: true, model: world-test, torch_threads: 1}
"""
NESTED = b"\x91" * 5000 + b"\xc0"  # 5,000 nested one-item arrays
WIDE = msgpack.packb({f"k{i}": i for i in range(100_000)})  # 1.1 MB, 100,000 keys
LONG_JSON = "[" + "0," * 30_000 + "0]"  # 60 KB of JSON values (under the world's 64 KiB)


def _attack(url: str, frame: bytes | str, path: str, stop: threading.Event, replies: list) -> None:
    with connect(url + path, max_size=None, open_timeout=30) as ws:
        if path == "/":
            ws.recv(timeout=30)  # the OpenPI metadata frame
        while not stop.is_set():
            ws.send(frame)
            replies.append(ws.recv(timeout=30))


def _gen2_pauses_over(metrics: str, seconds: str) -> int:
    """Generation-2 collections that took longer than ``seconds`` (a histogram bucket bound)."""
    count = re.search(r'realtime_gc_pause_seconds_count\{generation="2"\} (\S+)', metrics)
    within = re.search(rf'realtime_gc_pause_seconds_bucket\{{generation="2",le="{seconds}"\}} (\S+)', metrics)
    assert count is not None and within is not None, "the server reports its GC pauses"
    return int(float(count.group(1)) - float(within.group(1)))


def test_nested_and_wide_frames_get_typed_errors_and_do_not_stall_the_loop(tmp_path):
    proc, url = start_server(CONFIG, tmp_path)
    ws_url = url.replace("http://", "ws://")
    stop, threads = threading.Event(), []
    replies: dict[str, list] = {"nested": [], "wide": [], "json": []}
    try:
        for name, frame, path in (
            ("nested", NESTED, "/"),
            ("nested", NESTED, "/"),
            ("wide", WIDE, "/"),
            ("json", LONG_JSON, "/v1/realtime/world?protocol_version=1"),
        ):
            args = (ws_url, frame, path, stop, replies[name])
            threads.append(threading.Thread(target=_attack, args=args, daemon=True))
        latencies = []
        with httpx.Client(base_url=url) as client:
            slow_before = _gen2_pauses_over(client.get("/metrics").text, "0.05")  # loading's own
            for t in threads:
                t.start()
            time.sleep(1.0)
            deadline = time.monotonic() + 7  # within the world route's 10 s start deadline
            while time.monotonic() < deadline:
                t0 = time.perf_counter()
                assert client.get("/healthz").status_code == 200
                latencies.append((time.perf_counter() - t0) * 1000)
                time.sleep(0.01)
            stop.set()
            for t in threads:
                t.join(timeout=30)
            metrics = client.get("/metrics").text
    finally:
        stop.set()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    assert len(replies["nested"]) > 200, "the attackers kept sending"
    assert all(r == "invalid_payload: msgpack nested deeper than 32 levels" for r in replies["nested"])
    assert all("more than 65536 msgpack objects" in r for r in replies["wide"]) and replies["wide"]
    assert (
        all('"error"' in r and "more than 16384 JSON values" in r for r in replies["json"])
        and replies["json"]
    )
    assert _gen2_pauses_over(metrics, "0.05") == slow_before, re.findall(r"realtime_gc_pause.*", metrics)
    p99 = statistics.quantiles(latencies, n=100)[98]
    assert p99 < 50.0, f"/healthz p99 {p99:.1f} ms under nested and wide frames"
    assert "Traceback" not in (tmp_path / "server.log").read_text()
