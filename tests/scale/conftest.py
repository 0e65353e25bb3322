"""One local Ray instance for the whole test session: ``realtime serve --replicas 2`` itself, run as
a process on loopback with two CPU replicas of the small default models, shared by the tests that
need it (``cluster``). Skipped, with the reason printed, only when Ray cannot start here (the
``ray`` extra missing, or Ray's processes failing to come up); a deployment that starts Ray but
fails afterwards is a failure, not a skip."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

REPLICAS = 2
READY_TIMEOUT_S = 420.0  # two replicas loading four kinds on a shared 2-core machine
CONFIG = {
    "server": {"shutdown_timeout_s": 5, "start_timeout_s": 30},
    "runtime": {"max_sessions": 8},
    "robot": {"enabled": True, "torch_threads": 1},
    "world": {
        "enabled": True,
        "model": "world-test",
        "max_batch": 2,
        "torch_threads": 1,
        "encode_threads": 1,
    },
    "voice": {"enabled": True, "max_sessions": 2},
    "duplex": {"enabled": True, "model": "duplex-test", "max_sessions": 2, "resume_grace_s": 4},
    "replicas": {
        "num_cpus": 0.5,
        "stats_period_s": 0.5,
        "peer_timeout_s": 10,
        "object_store_bytes": 100_000_000,
        "health_check_period_s": 2,
    },
}


@dataclass
class Cluster:
    url: str  # http://127.0.0.1:PORT
    process: subprocess.Popen
    log: Path

    @property
    def ws(self) -> str:
        return self.url.replace("http://", "ws://")

    def status(self) -> dict:
        return httpx.get(f"{self.url}/v1/status", timeout=30).json()

    def occupied(self, kind: str) -> dict[str, int]:
        """Sessions of ``kind`` per reachable replica."""
        return {
            r["replica"]: next(k["occupied"] for k in r["kinds"] if k["kind"] == kind)
            for r in self.status()["replicas"]
            if r["reachable"]
        }

    def wait_for(self, predicate, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: not within {timeout_s} s")
            time.sleep(0.25)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _tail(path: Path, lines: int = 15) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    if importlib.util.find_spec("ray") is None or importlib.util.find_spec("ray.serve") is None:
        reason = "Ray Serve cannot start: the ray extra is not installed (pip install -e '.[ray]')"
        print(reason, file=sys.stderr)
        pytest.skip(reason)
    folder = tmp_path_factory.mktemp("cluster")
    config, log = folder / "deploy.yaml", folder / "serve.log"
    config.write_text(yaml.safe_dump(CONFIG))
    port = _free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "realtime.cli", "serve", "--config", str(config)]
            + ["--replicas", str(REPLICAS), "--host", "127.0.0.1", "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # our signal reaches the CLI alone, never Ray's processes
        )
    deadline = time.monotonic() + READY_TIMEOUT_S
    try:
        while "msg=ready" not in log.read_text(errors="replace"):
            if process.poll() is not None:
                text = log.read_text(errors="replace")
                if "Started Serve" not in text:  # Ray itself did not come up here
                    reason = f"Ray cannot start on this machine:\n{_tail(log)}"
                    print(reason, file=sys.stderr)
                    pytest.skip(reason)
                raise AssertionError(
                    f"realtime serve --replicas exited {process.returncode}:\n{_tail(log, 40)}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(f"replicas not ready after {READY_TIMEOUT_S} s:\n{_tail(log, 40)}")
            time.sleep(0.5)
        yield Cluster(f"http://127.0.0.1:{port}", process, log)
    finally:
        if process.poll() is None:
            # two signals at once, as from a supervisor that escalates: one drained stop, exit 0
            process.send_signal(signal.SIGTERM)
            process.send_signal(signal.SIGINT)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)
                raise AssertionError(
                    f"realtime serve --replicas did not stop on its signals:\n{_tail(log, 20)}"
                ) from None
            assert process.returncode == 0 and "msg=stopped" in log.read_text(errors="replace"), _tail(
                log, 20
            )
