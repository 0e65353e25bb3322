"""README's Python quickstarts run verbatim against a real ``realtime serve`` on loopback.

This is what "a fresh clone with a fresh venv runs every README quickstart verbatim" is checked by:
each ```python block of the README's "Quickstart per session kind" section (robot, world, voice at
least) runs as its own ``python`` process, unchanged but for the port, and must exit 0 within its
bound. One server for the module (robot, world and voice; world at one batch size so its warm-up
is short), started with ``--log-format json``: its whole log must be JSON lines (no third-party
progress bar leaks into it). After the voice quickstart's reply, ``/v1/status`` counts the
``voice-llm`` stage's requests.
"""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.realtime.test_serve_process import start_server

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
QUICKSTARTS = "## Quickstart per session kind"
README_PORT = "8000"
# seconds each quickstart may take; the voice reply runs SmolLM2 and hibari on a loaded CPU
BOUND_S = {"robot": 60, "world": 120, "voice": 300}
CONFIG = """
server: {log_format: json}
robot: {enabled: true}
world: {enabled: true, max_batch: 1, compute_admission: false, torch_threads: 1}
duplex: {enabled: false}
voice: {enabled: true}
"""

pytestmark = pytest.mark.timeout(900)


# the quickstart headings of the kinds that must have a Python quickstart
HEADINGS = {"robot": "Robot policy", "world": "AR-diffusion world", "voice": "Voice (OpenAI Realtime)"}


def quickstart_snippets(text: str) -> dict[str, str]:
    """Session kind -> the first python block under its ``###`` heading in the quickstart section
    of the README ``text`` (a heading not in :data:`HEADINGS` keys as itself)."""
    section = text.split(QUICKSTARTS, 1)[1].split("\n## ", 1)[0]
    kinds = {heading: kind for kind, heading in HEADINGS.items()}
    snippets = {}
    for part in section.split("\n### ")[1:]:
        heading, _, body = part.partition("\n")
        block = re.search(r"```python\n(.*?)```", body, re.S)
        if block:
            key = next((k for h, k in kinds.items() if heading.startswith(h)), heading)
            snippets.setdefault(key, block.group(1))
    return snippets


SNIPPETS = quickstart_snippets(README.read_text())


def test_the_readme_has_a_python_quickstart_per_kind():
    assert set(HEADINGS) <= set(SNIPPETS), sorted(SNIPPETS)
    for kind, code in SNIPPETS.items():
        assert README_PORT in code, f"the {kind} quickstart names no port to substitute"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("readme-server")
    proc, url = start_server(CONFIG, tmp, ready_timeout_s=600)
    try:
        yield url, tmp / "server.log"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


@pytest.fixture(scope="module")
def run_quickstart(server, tmp_path_factory):
    """``run_quickstart(kind)``: the README's snippet, verbatim but for the port, run once."""
    url, _log = server
    port = url.rsplit(":", 1)[1]
    workdir = tmp_path_factory.mktemp("readme-snippets")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # the checkout's clients package, as an editable install

    @functools.cache
    def run(kind: str) -> subprocess.CompletedProcess:
        script = workdir / f"{kind}.py"
        script.write_text(SNIPPETS[kind].replace(README_PORT, port))
        return subprocess.run(
            [sys.executable, str(script)],
            cwd=workdir,
            env=env,
            capture_output=True,
            text=True,
            timeout=BOUND_S.get(kind, 120),
        )

    return run


@pytest.mark.parametrize("kind", sorted(SNIPPETS))
def test_quickstart_runs_verbatim(run_quickstart, kind):
    done = run_quickstart(kind)
    assert done.returncode == 0, f"{kind} quickstart failed:\n{done.stdout}\n{done.stderr}"
    assert done.stdout.strip(), f"{kind} quickstart printed nothing"
    if kind == "robot":  # the actions' shape is the one the README's comment shows
        shown = re.search(r"\.shape\)\s+#\s+(\(\d+, \d+\))", SNIPPETS[kind])
        assert shown and done.stdout.strip().splitlines()[-1] == shown.group(1), done.stdout
    if kind == "world":  # it ends by itself after its chunks
        lines = done.stdout.strip().splitlines()
        assert len(lines) >= 2 and all(len(line.split()) == 2 for line in lines), done.stdout


def test_status_counts_the_voice_llm_stages_requests(server, run_quickstart):
    """The voice page's status row of ``voice-llm``: its replies are counted (the stage batches
    its own forwards, so its requests are)."""
    assert run_quickstart("voice").returncode == 0
    url, _log = server
    stages = {s["stage"]: s for s in httpx.get(f"{url}/v1/status", timeout=10).json()["stages"]}
    assert stages["voice-llm"]["item_ms"] is not None and stages["voice-llm"]["item_ms"]["count"] >= 1


def test_the_server_log_is_json_lines_only(server, run_quickstart):
    """Loading and serving (the quickstarts ran) wrote JSON lines only: no tqdm bar, no carriage
    return, no stray print."""
    run_quickstart("voice")
    _url, log = server
    raw = log.read_bytes()
    assert b"\r" not in raw
    for line in raw.decode().splitlines():
        assert isinstance(json.loads(line), dict), line
