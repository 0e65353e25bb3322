"""Logs: no credential in any line at any level (a real server process at ``log_level: debug``),
and internal errors as one rate-limited ERROR line per session.

Regression for issue 11 defect 7: at ``debug`` every ``Authorization`` header was logged in plain
text, failed attempts included. Regression for issue 26 defect 4: a percent-encoded query name
(``?api%5Fkey=KEY``) passed auth but not the redaction, so the accept line carried the key.
"""

from __future__ import annotations

import logging
import signal

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from realtime.logs import REDACTED, InternalErrorLimiter, KeyValueFormatter, log_internal_error, redact
from tests.realtime.test_serve_process import start_server

GOOD, WRONG = "sekrit-good-4f1c", "sekrit-wrong-9a2e"


def test_no_key_reaches_the_log_at_debug_level(tmp_path):
    config = f"server: {{log_level: debug, api_keys: [{GOOD}]}}\nrobot: {{enabled: true, policy: zeros}}\n"
    proc, url = start_server(config, tmp_path)
    ws_url = url.replace("http://", "ws://")
    try:
        for headers in ({"Authorization": f"Api-Key {GOOD}"}, {"Authorization": f"Bearer {GOOD}"}):
            with connect(ws_url + "/", additional_headers=headers, open_timeout=30) as ws:
                ws.recv(timeout=30)
        for name in ("api_key", "api%5Fkey", "%61pi_key", "%61%70%69%5F%6B%65%79"):  # all decode to api_key
            with connect(f"{ws_url}/?{name}={GOOD}", open_timeout=30) as ws:
                ws.recv(timeout=30)
        for headers, path in (({"Authorization": f"Bearer {WRONG}"}, "/"), ({}, f"/?api_key={WRONG}")):
            with pytest.raises(InvalidStatus):
                connect(ws_url + path, additional_headers=headers, open_timeout=30)
        assert httpx.get(f"{url}/v1/models", params={"api_key": GOOD}).status_code == 200
        assert httpx.get(f"{url}/v1/models?api%5Fkey={GOOD}").status_code == 200
        assert httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {WRONG}"}).status_code == 401
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    log = (tmp_path / "server.log").read_text()
    assert (
        "level=debug" in log and "< authorization: " + REDACTED in log.lower()
    )  # the debug lines were there
    assert GOOD not in log and WRONG not in log


@pytest.mark.parametrize(
    "line",
    [
        "< Authorization: Api-Key {k}",
        "(b'authorization', b'Bearer {k}')",
        '127.0.0.1:5 - "WebSocket /v1/realtime/world?protocol_version=1&api_key={k}" [accepted]',
        "GET /demo/world?API_KEY={k}&x=1 HTTP/1.1",
        "< Sec-WebSocket-Protocol: realtime, openai-insecure-api-key.{k}",
        "headers={{'authorization': 'bearer {k}'}}",
        '127.0.0.1:5 - "WebSocket /v1/realtime?api%5Fkey={k}" [accepted]',
        "GET /v1/models?x=1&%61pi_key={k} HTTP/1.1",
        "GET /v1/models?%61%70%69%5f%6b%65%79={k}",
        "GET /v1/models%3Fapi%255Fkey%3D{k}",
        "query_string=b'api+key=1&api_key={k}'",
        "path=/?Api_Key={k}",
    ],
)
def test_redact_hides_credentials(line):
    assert GOOD not in redact(line.format(k=GOOD))
    assert REDACTED in redact(line.format(k=GOOD))


def test_extra_fields_and_tracebacks_are_redacted_too():
    try:
        raise ValueError(f"bad header Authorization: Bearer {GOOD}")
    except ValueError as exc:
        record = logging.LogRecord("t", logging.ERROR, "f", 1, "failed", None, (ValueError, exc, None))
    record.path = f"/?api_key={GOOD}"
    line = KeyValueFormatter().format(record)
    assert GOOD not in line and "ValueError" in line


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_internal_errors_are_one_traceback_line_rate_limited_per_session(caplog):
    clock = _Clock()
    limiter = InternalErrorLimiter(per_window=1, window_s=60.0, max_sessions=2, clock=clock)
    logger = logging.getLogger("test.internal")

    def fail(session: str) -> bool:
        try:
            raise RuntimeError("boom")
        except RuntimeError as exc:
            return log_internal_error(logger, session, "tick crashed", exc, limiter=limiter)

    with caplog.at_level(logging.ERROR, logger="test.internal"):
        assert [fail("s1") for _ in range(5)] == [True, False, False, False, False]
        assert fail("s2")  # another session has its own budget
        clock.now = 61.0
        assert fail("s1")
    records = caplog.records
    assert [r.levelno for r in records] == [logging.ERROR] * 3
    assert all(r.exc_info is not None and r.getMessage() == "tick crashed" for r in records)
    assert [getattr(r, "session_id", None) for r in records] == ["s1", "s2", "s1"]
    assert getattr(records[2], "suppressed", 0) == 4  # the next line counts what was dropped
    assert not hasattr(records[0], "suppressed")
    for session in ("s3", "s4", "s5"):  # memory stays bounded: the oldest sessions are forgotten
        fail(session)
    assert len(limiter._windows) == 2
