"""The ``realtime`` command as a user runs it: help, version, bad configs, serve."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from realtime import __version__


def _run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "realtime.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )


def test_help_and_version():
    helped = _run("--help")
    assert helped.returncode == 0
    assert "serve" in helped.stdout and "bench" in helped.stdout
    assert _run("serve", "--help").returncode == 0
    versioned = _run("--version")
    assert versioned.returncode == 0
    assert versioned.stdout.strip() == f"realtime-sessions {__version__}"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (None, "file not found"),
        ("server: [1, 2\n", "invalid YAML"),
        ("server:\n  colour: red\n", "field 'server.colour': unknown key"),
        ("runtime:\n  max_pending_events: many\n", "field 'runtime.max_pending_events': expected an integer"),
    ],
)
def test_bad_config_is_one_clear_line_without_traceback(tmp_path, text, expected):
    path = tmp_path / "deploy.yaml"
    if text is not None:
        path.write_text(text)
    result = _run("serve", "--config", str(path), timeout=30)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert str(path) in lines[0] and expected in lines[0]
    assert "Traceback" not in result.stderr
