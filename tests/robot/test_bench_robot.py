"""``realtime bench robot`` after the plain install: no httpx needed, one clear line for its extra."""

from __future__ import annotations

import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from realtime.bench import robot


def test_the_bench_imports_without_httpx():
    code = "import sys; sys.modules['httpx'] = None; import realtime.bench.robot"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("module", ["openpi_server", "openpi_client.msgpack_numpy"])
def test_a_missing_peer_package_is_one_line_naming_it_and_exit_2(monkeypatch, capsys, module):
    monkeypatch.setitem(sys.modules, module, None)  # import of it raises ImportError(name=module)
    assert robot.main([]) == 2
    out = capsys.readouterr()
    lines = out.err.strip().splitlines()
    assert out.out == "" and len(lines) == 1, out
    assert module.split(".")[0] in lines[0] and "realtime-sessions[test]" in lines[0]


class _Readiness(BaseHTTPRequestHandler):
    """503 for the first two polls (models loading), then 200, like ``/readyz``."""

    polls = 0

    def do_GET(self) -> None:
        type(self).polls += 1
        self.send_response(200 if type(self).polls > 2 else 503)
        self.end_headers()

    def log_message(self, *args) -> None:
        return None


def test_readiness_is_polled_with_the_standard_library_until_200():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Readiness)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        robot._wait_http(f"http://127.0.0.1:{server.server_port}/readyz", proc, timeout_s=20)
        assert _Readiness.polls == 3
    finally:
        proc.kill()
        proc.wait()
        server.shutdown()
        server.server_close()
