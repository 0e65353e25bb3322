"""Per-route message limits enforced by the transport, and hostile JSON, against a real server process.

Regressions for issue 11 defects 5 and 6: the world route accepted 64 MiB frames (its protocol's
limit is 64 KiB), assembling and decoding them on the event loop (``/healthz`` p99 400-620 ms
meanwhile); ``NaN``, ``1e999``, 4,300-digit integers and a ``client_ts_ms`` of 10**400 closed the
world socket with 1011 and a server traceback.

Regression for issue 26 defect 1: the limit was looked up by path alone, so ``/v1/realtime?mode=duplex``
(the duplex kind on the voice kind's path) took the voice limit (21 MB): a 2 MiB duplex frame was
read whole, and no 1009 came. The limit now comes from the route the handshake reaches, query
included, and is set in the parser the moment the request is parsed.
"""

from __future__ import annotations

import json
import signal
import statistics
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from websockets.frames import Opcode
from websockets.sync.client import connect

from realtime.protocols import openpi
from tests.realtime.rawws import RawClient
from tests.realtime.test_serve_process import start_server

pytestmark = pytest.mark.timeout(180)

ROBOT_LIMIT = 1 << 20
CONFIG = f"""
runtime: {{memory_available_bytes: 1073741824}}
robot: {{enabled: true, policy: zeros, device: cpu, max_message_bytes: {ROBOT_LIMIT}}}
world: {{enabled: true, model: world-test, torch_threads: 1}}
duplex: {{enabled: true, model: duplex-test, opus: false, compute_admission: false}}
"""
DUPLEX_LIMIT = 1 << 20  # duplex.max_message_bytes' default
WORLD = "/v1/realtime/world?protocol_version=1"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp: Path = tmp_path_factory.mktemp("limits")
    proc, url = start_server(CONFIG, tmp)
    try:
        yield url, tmp / "server.log"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0


def _ws(url: str) -> str:
    return url.replace("http://", "ws://")


def test_oversized_frames_close_1009_from_the_frame_header(served):
    url, _ = served
    world = RawClient(_ws(url) + WORLD)
    world.send_text(json.dumps({"type": "session.ping", "data": "x" * 70_000}))  # 70 KB > 64 KiB
    assert world.close_code() == 1009
    world.close()
    for path, size in ((WORLD, 64 * 1024 * 1024), ("/", ROBOT_LIMIT + 1)):
        client = RawClient(_ws(url) + path)
        client.send_frame_header(Opcode.BINARY if path == "/" else Opcode.TEXT, size)
        assert client.close_code() == 1009, path  # refused with no payload sent: nothing assembled
        client.close()
    with connect(_ws(url) + WORLD, open_timeout=30) as ws:  # within the limit: served
        ws.send(json.dumps({"type": "session.ping", "data": "x" * 60_000}))
        assert json.loads(ws.recv(timeout=30))["type"] == "session.pong"


def _sent_before_close(url: str, path: str, size: int) -> int:
    """Stream one ``size``-byte text frame at ``path`` 64 KiB at a time; the bytes sent before the
    server's close stopped us (its close frame or reset), or ``size`` if it never did."""
    client = RawClient(_ws(url) + path)
    client.send_frame_header(Opcode.TEXT, size)
    chunk, sent = b" " * (64 * 1024), 0
    try:
        while sent < size:
            client.sock.sendall(chunk)
            sent += len(chunk)
    except OSError:  # reset: the server closed while we were still sending
        pass
    code = client.close_code()
    client.close()
    assert code == 1009, (path, code)
    return sent


def test_duplex_frames_over_its_limit_close_1009_on_both_of_its_paths_before_the_payload(served):
    url, _ = served
    for path in ("/v1/duplex", "/v1/realtime?mode=duplex"):
        client = RawClient(_ws(url) + path)
        client.send_frame_header(Opcode.TEXT, DUPLEX_LIMIT + 1)
        assert client.close_code() == 1009, path  # from the header alone: no payload was sent
        client.close()
        # a 48 MiB frame: the server closes while the client is still sending, long before the end
        assert _sent_before_close(url, path, 48 << 20) < 16 << 20, path


def test_the_limit_is_the_route_the_handshake_reaches_query_included():
    from realtime.app import create_app
    from realtime.config import config_from_mapping

    config = config_from_mapping(
        {
            "robot": {"enabled": True, "max_message_bytes": ROBOT_LIMIT},
            "world": {"enabled": True},
            "voice": {"enabled": True},
            "duplex": {"enabled": True},
            "echo": {"enabled": True},
        }
    )
    state = create_app(config).state.rt  # routes only: nothing loads before the lifespan starts
    limit = state.websocket_limit
    assert limit("/v1/realtime/world", b"protocol_version=1") == config.world.max_message_bytes == 64 * 1024
    assert (
        limit("/v1/realtime", b"mode=duplex") == limit("/v1/duplex", b"") == config.duplex.max_message_bytes
    )
    assert limit("/v1/realtime", b"model=x") == limit("/v1/realtime", b"") == config.voice.max_message_bytes
    assert limit("/", b"") == limit("/v1/realtime/robot/openpi", b"") == ROBOT_LIMIT
    assert limit("/v1/realtime/echo", b"") == config.echo.max_message_bytes
    assert limit("/nowhere", b"") == config.server.max_message_bytes


def _stream_oversized(url: str, stop: threading.Event, refused: list[int]) -> None:
    """Open world sockets and stream 64 MiB frames at them, one after another, until stopped.

    At most ~50 sockets a second: the subject is frame size, not handshake churn.
    """
    chunk = b"x" * (1 << 20)
    while not stop.wait(0.02):
        client = RawClient(_ws(url) + WORLD)
        client.send_frame_header(Opcode.TEXT, 64 * 1024 * 1024)
        try:
            for _ in range(64):
                client.sock.sendall(chunk)
        except OSError:  # the server refused the frame and closed
            refused.append(1)
        client.close()


def test_healthz_stays_fast_while_oversized_frames_stream_in(served):
    url, _ = served
    stop, refused = threading.Event(), []
    attacker = threading.Thread(target=_stream_oversized, args=(url, stop, refused), daemon=True)
    latencies = []
    with httpx.Client(base_url=url) as client:
        client.get("/healthz")
        attacker.start()
        try:
            time.sleep(0.5)
            for _ in range(300):
                t0 = time.perf_counter()
                assert client.get("/healthz").status_code == 200
                latencies.append((time.perf_counter() - t0) * 1000)
                time.sleep(0.005)
        finally:
            stop.set()
            attacker.join(timeout=30)
    p99 = statistics.quantiles(latencies, n=100)[98]
    assert p99 < 20.0, f"/healthz p99 {p99:.1f} ms while oversized frames stream in"
    assert len(refused) >= 10, "the attacker must have kept streaming oversized frames"


HOSTILE = [
    '{"type": "session.ping", "data": NaN}',
    '{"type": "session.ping", "data": [Infinity]}',
    '{"type": "session.ping", "data": -Infinity}',
    '{"type": "session.ping", "data": 1e999}',
    '{"type": "session.ping", "data": ' + "9" * 4301 + "}",
    '{"type": "session.ping", "data": 1, "extra": true}',
    '{"type": "session.ping", "data": ' + "[" * 40 + "]" * 40 + "}",
]


def test_hostile_json_gets_typed_errors_and_the_socket_stays_open(served):
    url, log = served
    with connect(_ws(url) + WORLD, open_timeout=30, max_size=None) as ws:
        for text in HOSTILE:
            ws.send(text)
            reply = json.loads(ws.recv(timeout=30))
            assert reply["type"] == "error" and reply["error"]["code"] == "invalid_message", text[:60]
        ws.send(json.dumps({"type": "session.start", "pacing": "realtime", "fps": 1}))
        while json.loads(ws.recv(timeout=30))["type"] != "session.created":
            pass
        for text in (
            '{"type": "session.event", "event_id": 1, "client_ts_ms": ' + "1" + "0" * 400 + "}",
            '{"type": "session.event", "event_id": 2, "client_ts_ms": 1e400}',
            '{"type": "session.event", "event_id": 3, "turbo": true}',
        ):
            ws.send(text)
            while True:
                reply = ws.recv(timeout=30)
                if isinstance(reply, str) and json.loads(reply)["type"] in ("error", "session.event.ack"):
                    break
            assert json.loads(reply)["error"]["code"] == "invalid_message", text[:60]
        ws.send(json.dumps({"type": "session.ping", "data": 7}))
        while True:
            reply = ws.recv(timeout=30)
            if isinstance(reply, str) and json.loads(reply)["type"] == "session.pong":
                assert json.loads(reply)["data"] == 7
                break
    assert "Traceback" not in log.read_text()


def _invalid_utf8_frames(url: str, frames: int) -> int | None:
    """Connect to the world route, send ``frames`` text frames of invalid UTF-8 in one TCP
    segment, and return the close code the server answered with."""
    client = RawClient(_ws(url) + WORLD)
    for _ in range(frames):
        client.protocol.send_text(b'{"type": "session.ping", "data": "\xff\xfe"}')
    client.sock.sendall(b"".join(client.protocol.data_to_send()))
    code = client.close_code()
    client.close()
    return code


def test_invalid_utf8_closes_1007_with_one_rate_limited_line_and_no_traceback(served):
    url, log = served
    before = log.read_text()
    assert [_invalid_utf8_frames(url, 1) for _ in range(20)] == [1007] * 20
    assert _invalid_utf8_frames(url, 2) == 1007  # two in one segment: still a close frame
    with connect(_ws(url) + WORLD, open_timeout=30) as ws:  # the server is fine
        ws.send(json.dumps({"type": "session.ping", "data": 1}))
        assert json.loads(ws.recv(timeout=30))["type"] == "session.pong"
    new = log.read_text()[len(before) :]
    assert "Traceback" not in new and "Fatal error" not in new and "level=error" not in new, new[-3000:]
    assert new.count("invalid UTF-8") == 1, new[-3000:]  # 21 connections, one line a minute


def test_a_frame_the_transport_refuses_while_a_request_is_in_flight_is_no_internal_error(served):
    """Found by the reliability bench's fuzzer: a robot request and a refused frame (here invalid
    UTF-8, 1007) in one TCP segment; the transport closed the connection before the inline handler
    replied, and the reply raised uvicorn's RuntimeError: ERROR 'robot connection failed' with a
    traceback and a 1011 log line."""
    url, log = served
    before = len(log.read_text())
    for _ in range(3):
        client = RawClient(_ws(url) + "/")
        client.protocol.send_binary(openpi.packb({"observation/state": np.zeros(8, np.float32)}))
        client.protocol.send_text(b"\xff")
        client.sock.sendall(b"".join(client.protocol.data_to_send()))
        assert client.close_code() == 1007
        client.close()
    time.sleep(0.5)
    new = log.read_text()[before:]
    assert "level=error" not in new and "Traceback" not in new and "code=1011" not in new, new[-3000:]
