"""``realtime bench reliability``: the server under hostile clients, churn, a soak and SIGTERM.

Everything goes through public interfaces: one ``realtime serve`` process on loopback (a
generated deploy config), real clients (``websockets``, ``openpi-client``), ``/v1/status``,
``/metrics``, ``/healthz``, the process's ``/proc`` entry and its log. Parts (``--parts``):

fuzz       every websocket route of the enabled kinds (``realtime.bench.hostile``) for
           ``--fuzz-seconds`` each; then the gauges and sessions must come back to zero.
isolation  a well-behaved ``openpi-client`` robot's round-trip p99 alone, then while other
           clients flood garbage, nested and oversized frames, sockets that never read and a
           connection flood on every route; ``/healthz`` is polled throughout.
churn      ``--churn-cycles`` connect / one tick / disconnect cycles across the kinds (clean and
           abrupt ends alternate); sessions, websockets, slots, event-loop tasks, threads and fds
           must be back at their baseline.
soak       one client per kind, busy for ``--soak-minutes``; RSS growth after the first fifth
           (warm-up) and the error rate.
sigterm    clients of every kind mid-work, then SIGTERM: every client must get 1001, the process
           exit 0 within the drain bound (``--shutdown-timeout``) plus :data:`EXIT_SLACK_S`,
           with no ERROR line.

Across all parts: ``crashes`` (the process died), ``closes_1011`` (internal-error closes seen
by any client), ``tracebacks`` (in the server log). The figures print side by side with the
goals; the last line is one JSON object with ``fuzz_frames``, ``crashes``, ``closes_1011``,
``tracebacks``, ``leaked_sessions``, ``isolation_p99_ratio``, ``healthz_p99_ms``,
``churn_cycles``, ``soak_rss_growth_pct``, ``sigterm_exit_s`` (and a few more). Exit status 1
when a zero-goal (crashes, 1011s, tracebacks, leaks, ERROR lines) is missed.

Full size: ``realtime bench reliability`` (60 s of fuzz per route, 10,000 churn cycles, a
30-minute soak, every kind). CI size: ``--fuzz-seconds 3 --isolation-seconds 8 --churn-cycles
200 --soak-minutes 1 --kinds robot,world,echo,duplex`` (tests/reliability).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import functools
import json
import logging
import multiprocessing
import os
import re
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from websockets.exceptions import ConnectionClosed, InvalidHandshake
from websockets.sync.client import connect

from realtime.bench import hostile
from realtime.bench.goals import GOALS
from realtime.protocols import openpi
from realtime.scale.cores import parse_cpu_list

KINDS = ("robot", "world", "echo", "voice", "duplex")
PROCESS_CHOICES: dict[str, bool | str] = {"auto": "auto", "true": True, "false": False}  # --robot-process
EXIT_SLACK_S = 3.0  # process teardown after the drain: kinds stop, the interpreter exits
READY = re.compile(r'msg=ready url=(https?://\S+)|"msg": "ready", "url": "(https?://[^"]+)"')


# -- the server process ------------------------------------------------------------------------


def deploy_config(
    kinds: tuple[str, ...], shutdown_timeout_s: float, small: bool, robot_process: bool | str = "auto"
) -> dict[str, Any]:
    """The bench's deploy config: every kind it exercises, small models when ``small``;
    ``robot_process`` is ``robot.process``."""
    robot = {"policy": "pi0-tiny", "device": "cpu", "torch_threads": 1, "process": robot_process}
    return {
        "server": {"shutdown_timeout_s": shutdown_timeout_s, "max_connections": 400, "start_timeout_s": 10},
        "runtime": {"memory_available_bytes": 4 << 30},
        "robot": {"enabled": "robot" in kinds, **robot},
        "world": {
            "enabled": "world" in kinds,
            "model": "world-test" if small else "world-tiny",
            "torch_threads": 1,
        },
        "echo": {"enabled": "echo" in kinds},
        "voice": {"enabled": "voice" in kinds, "max_output_tokens": 8},
        "duplex": {
            "enabled": "duplex" in kinds,
            "model": "duplex-test" if small else "duplex-small",
            "resume_grace_s": 2.0,
            "compute_admission": False,
        },
    }


def _rss(pid: int) -> int:
    """A process's resident bytes (0 once it is gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    found = re.search(r"VmRSS:\s+(\d+) kB", status)
    return int(found.group(1)) * 1024 if found else 0


def descendants(pid: int) -> list[int]:
    """``pid``'s child processes and theirs, from every process's parent in ``/proc/*/stat``."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])  # after "(comm)": state, then ppid
        children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


class ServerProcess:
    """``realtime serve`` in a child process on an ephemeral port, its log in ``workdir``."""

    def __init__(self, config: dict[str, Any], workdir: Path, cores: tuple[int, ...] = ()) -> None:
        """``cores``: the server process and its threads confined to them (none: not pinned)."""
        self.workdir = workdir
        self.cores = cores
        self.config_path = workdir / "deploy.yaml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.log_path = workdir / "server.log"
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def start(self, timeout_s: float = 300.0) -> None:
        log = self.log_path.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "realtime.cli", "serve", "--config", str(self.config_path), "--port", "0"],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
        )
        if self.cores:  # before the interpreter starts any thread: they all inherit it
            os.sched_setaffinity(self.proc.pid, self.cores)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            match = READY.search(self.log())
            if match:
                self.url = match.group(1) or match.group(2)
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited during startup:\n{self.log()[-3000:]}")
            time.sleep(0.2)
        raise TimeoutError("server not ready")

    @property
    def ws_url(self) -> str:
        return self.url.replace("http://", "ws://")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def proc_stat(self) -> dict[str, int]:
        """RSS bytes of the server process and its child processes (the robot policy's,
        ``robot.process``), the server's threads and open fds, and its child processes' count
        (Linux ``/proc``)."""
        assert self.proc is not None
        base = Path(f"/proc/{self.proc.pid}")
        status = (base / "status").read_text()
        threads = int(re.search(r"Threads:\s+(\d+)", status).group(1))  # type: ignore[union-attr]
        children = descendants(self.proc.pid)
        rss = _rss(self.proc.pid) + sum(_rss(pid) for pid in children)
        return {
            "rss": rss,
            "threads": threads,
            "fds": len(os.listdir(base / "fd")),
            "children": len(children),
        }

    def sigterm(self, timeout_s: float) -> tuple[int | None, float]:
        """SIGTERM; the exit status (None: killed after ``timeout_s``) and seconds to exit."""
        assert self.proc is not None
        started = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            code: int | None = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            code = None
        return code, time.monotonic() - started

    def stop(self) -> None:
        if self.alive():
            self.sigterm(60.0)


def _get(url: str, timeout_s: float = 10.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


def occupancy(url: str) -> dict[str, int]:
    """Open TCP connections (a flood's idle sockets count until the server has closed them), open
    websockets and occupied sessions per kind, and open slots per stage, from the public
    ``/v1/status``; event-loop ``tasks`` and resident slot bytes (KV, model state) per
    stage from ``/metrics``."""
    _, body = _get(url + "/v1/status")
    status = json.loads(body)
    # TCP connections, this request's own included
    counts: dict[str, int] = {"connections": status["connections"]["open"]}
    for kind, n in status["connections"]["websockets"].items():
        counts[f"websockets.{kind}"] = n
    for kind in status["kinds"]:
        counts[f"sessions.{kind['kind']}"] = kind["occupied"] or 0
    for stage in status.get("stages", []):
        counts[f"slots.{stage['stage']}"] = stage.get("slots_open", 0)
    _, metrics = _get(url + "/metrics")
    match = re.search(r"^realtime_event_loop_tasks (\S+)", metrics, re.M)
    counts["tasks"] = int(float(match.group(1))) if match else 0
    for stage, value in re.findall(r'^engine_slot_bytes\{stage="([^"]+)"\} (\S+)', metrics, re.M):
        counts[f"slot_bytes.{stage}"] = int(float(value))  # resident KV and model state
    return counts


def settle(url: str, baseline: dict[str, int], timeout_s: float) -> dict[str, int]:
    """Wait until every count is back at ``baseline`` (or ``timeout_s``); what is left over."""
    deadline = time.monotonic() + timeout_s
    while True:
        now = occupancy(url)
        left = {k: v - baseline.get(k, 0) for k, v in now.items() if v > baseline.get(k, 0)}
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.25)


# -- well-behaved clients, one per kind ----------------------------------------------------------


PATHS = {
    "robot": hostile.ROBOT,
    "world": hostile.WORLD,
    "echo": hostile.ECHO,
    "voice": hostile.VOICE,
    "duplex": hostile.DUPLEX,
}


@functools.cache
def libero_observation(seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    image = lambda: rng.integers(0, 256, (224, 224, 3), dtype=np.uint8)  # noqa: E731
    return {
        "observation/image": image(),
        "observation/wrist_image": image(),
        "observation/state": rng.standard_normal(8).astype(np.float32),
        "prompt": "put the bowl on the plate",
    }


def _close_code(ws: Any) -> int | None:
    rcvd = ws.protocol.close_rcvd
    return rcvd.code if rcvd is not None else None


def _pcm_b64(ms: int) -> str:
    samples = np.zeros(24 * ms, dtype="<i2")
    return base64.b64encode(samples.tobytes()).decode()


def _until(ws: Any, predicate: Callable[[Any], bool], timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        message = ws.recv(timeout=max(0.01, deadline - time.monotonic()))
        if predicate(message):
            return message


def _json_type(types: tuple[str, ...]) -> Callable[[Any], bool]:
    return lambda m: isinstance(m, str) and json.loads(m).get("type") in types


def tick(base_ws: str, kind: str, seed: int, abrupt: bool) -> int | None:
    """One connect / one unit of work / disconnect cycle of ``kind``; the close code the server
    sent (None when the client ended it or none came). ``abrupt``: the client resets the TCP
    connection instead of closing."""
    ws = connect(base_ws + PATHS[kind], max_size=None, open_timeout=60, close_timeout=5)
    try:
        _work(ws, kind, seed)
    except ConnectionClosed:
        ws.close()
        return _close_code(ws)
    if abrupt:
        # RST, no close frame: close_socket's shutdown wakes the client's reading thread (a
        # plain close() would not, and the kernel would keep the connection until it returns)
        ws.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        ws.close_socket()
        return None
    ws.close()
    code = _close_code(ws)
    return code if code not in (1000, None) else None


def _work(ws: Any, kind: str, seed: int) -> None:
    if kind == "robot":
        ws.recv(timeout=30)  # the metadata frame
        ws.send(openpi.packb(libero_observation(seed)))
        reply = ws.recv(timeout=60)
        if not isinstance(reply, bytes):
            raise RuntimeError(f"robot answered {reply!r}")
    elif kind == "world":
        ws.send(json.dumps({"type": "session.start", "pacing": "fast", "seed": seed % 1000}))
        _until(ws, lambda m: isinstance(m, bytes), 60)  # the first media chunk
    elif kind == "echo":
        ws.send(json.dumps({"type": "echo", "text": "one two three"}))
        _until(ws, _json_type(("echo.done",)), 30)
    elif kind == "voice":
        _until(ws, _json_type(("session.created",)), 30)
        item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
        ws.send(json.dumps({"type": "conversation.item.create", "item": item}))
        ws.send(json.dumps({"type": "response.create", "response": {"output_modalities": ["text"]}}))
        _until(ws, _json_type(("response.done",)), 120)
    elif kind == "duplex":
        _until(ws, _json_type(("session.created",)), 30)
        ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": _pcm_b64(160)}))
        _until(ws, lambda m: isinstance(m, str) and json.loads(m).get("server_event_seq", 0) >= 3, 30)


# -- the parts ---------------------------------------------------------------------------------


@dataclass
class Figures:
    fuzz_frames: int = 0
    fuzz_connections: int = 0
    crashes: int = 0
    closes_1011: int = 0
    closes_1009: int = 0  # frames over a route's limit, refused from their header
    tracebacks: int = 0
    error_lines: int = 0
    leaked_sessions: int = 0
    leaks: dict[str, int] = field(default_factory=dict)
    isolation_p99_ratio: float | None = None
    robot_p99_alone_ms: float | None = None
    robot_p99_attack_ms: float | None = None
    healthz_p99_ms: float | None = None
    probe_failures: int = 0
    churn_cycles: int = 0
    churn_errors: int = 0
    soak_rss_growth_pct: float | None = None
    soak_errors: int = 0
    soak_requests: int = 0
    sigterm_exit_s: float | None = None
    sigterm_exit_code: int | None = None
    sigterm_closes: dict[str, int] = field(default_factory=dict)


def fuzz_part(server: ServerProcess, kinds: tuple[str, ...], seconds: float, figures: Figures) -> None:
    limits = {"world": 65536, "echo": 65536, "duplex": 1 << 20, "voice": 21_037_056, "robot": 64 << 20}
    routes = hostile.routes(limits)
    names = [n for n in routes if n.removesuffix("_on_realtime") in kinds]
    for n, name in enumerate(names):
        result = asyncio.run(hostile.fuzz(server.url, routes[name], seconds, seed=n + 1))
        figures.fuzz_frames += result.frames
        figures.fuzz_connections += result.connections
        figures.closes_1011 += result.closes_1011
        figures.closes_1009 += result.closes.get(1009, 0)
        print(
            f"  fuzz {name:20s} {result.connections:6d} connections {result.frames:8d} frames  closes "
            f"{dict(sorted(result.closes.items(), key=str))}  refused {result.refused}  held {result.held}"
        )


def leak_check(server: ServerProcess, baseline: dict[str, int], figures: Figures, grace_s: float) -> None:
    left = settle(server.url, baseline, grace_s)
    figures.leaks.update({k: figures.leaks.get(k, 0) + v for k, v in left.items()})
    figures.leaked_sessions += sum(v for k, v in left.items() if k.startswith(("sessions.", "websockets.")))


def _robot_client(url: str) -> Any:
    from realtime.bench.openpi_robot import OpenPIRobot

    return OpenPIRobot(url)


def _robot_p99(client: Any, seconds: float, seed: int = 0) -> tuple[float, int]:
    """p99 round trip (ms) of back-to-back ``infer`` calls for ``seconds``, and how many."""
    obs = libero_observation(seed)
    for _ in range(5):
        client.infer(obs)
    samples = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        started = time.perf_counter()
        client.infer(obs)
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.quantiles(samples, n=100)[98], len(samples)


class _Attack:
    """Hostile clients on every route, in a process of their own (so the measuring clients of
    this process never wait on the attackers' work), at a bounded rate (a 2-core machine: the
    attack must not simply take the server's CPU)."""

    def __init__(self, url: str, kinds: tuple[str, ...]) -> None:
        context = multiprocessing.get_context("spawn")
        self.stop = context.Event()
        self._closes_1011 = context.Value("i", 0)
        self.process = context.Process(target=_attack_main, args=(url, kinds, self.stop, self._closes_1011))

    @property
    def closes_1011(self) -> int:
        return int(self._closes_1011.value)

    def __enter__(self) -> _Attack:
        self.process.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        # its 1011 count is shared as it goes: nothing is lost by killing an attacker that lingers
        # in its own shutdown (some did, for the whole of a longer timeout)
        self.process.join(timeout=5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()


class _AttackClients:
    """The attack process's clients, until ``stop`` is set; 1011 closes they saw are added to
    the shared counter ``closes_1011``."""

    def __init__(self, url: str, kinds: tuple[str, ...], stop: Any, closes_1011: Any) -> None:
        self.url, self.kinds, self.stop, self.closes_1011 = url, kinds, stop, closes_1011

    async def run(self) -> None:
        limits = {"world": 65536, "echo": 65536, "duplex": 1 << 20, "voice": 21_037_056, "robot": 64 << 20}
        routes = [r for n, r in hostile.routes(limits).items() if n in self.kinds]
        tasks = [asyncio.create_task(self._fuzzer(route, n)) for n, route in enumerate(routes)]
        tasks += [
            asyncio.create_task(self._non_reader(route))
            for route in routes
            if route.path in (hostile.WORLD, hostile.ROBOT)
        ]
        tasks.append(asyncio.create_task(self._connection_flood()))
        while not self.stop.is_set():
            await asyncio.sleep(0.1)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _fuzzer(self, route: hostile.Route, n: int) -> None:
        """Garbage only (no valid message: other clients' real work is load, not an attack)."""
        import random

        rng = random.Random(n)
        while True:
            result = await hostile.fuzz_connection(self.url, route, rng, max_frames=10, valid_share=0.0)
            with self.closes_1011.get_lock():
                self.closes_1011.value += result.closes_1011
            await asyncio.sleep(0.05)

    async def _non_reader(self, route: hostile.Route) -> None:
        """A client that never reads: world pings with large data (the pongs pile up on its side),
        or one robot request whose reply it never takes."""
        from websockets.asyncio.client import connect as aconnect

        ping = json.dumps({"type": "session.ping", "data": "x" * 60_000})
        while True:
            with contextlib.suppress(Exception):
                url = self.url.replace("http://", "ws://") + route.path
                async with aconnect(url, max_size=None, ping_interval=None, close_timeout=1) as ws:
                    ws.transport.pause_reading()  # nothing is read, whatever the server sends
                    if route.path == hostile.ROBOT:
                        await ws.send(openpi.packb(libero_observation(2)))
                        await asyncio.sleep(30)
                    for _ in range(600):
                        await asyncio.wait_for(ws.send(ping), 5)
                        await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)

    async def _connection_flood(self) -> None:
        """Idle TCP connections and refused requests past the server's connection limit (400 +
        16 for the probes): 450 held, each one the server closes opened again, 20 a second."""
        host, port = self.url.removeprefix("http://").rsplit(":", 1)
        held: list[Any] = []
        try:
            while True:
                held = [w for w in held if not w.is_closing() and not w.transport.is_closing()]
                for _ in range(min(20, 450 - len(held))):
                    with contextlib.suppress(OSError):
                        reader, writer = await asyncio.open_connection(host, int(port))
                        if len(held) % 2:  # half ask for a page: refused with 503 and closed
                            writer.write(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
                        held.append(writer)
                await asyncio.sleep(1.0)
        finally:
            for writer in held:
                writer.close()


def _attack_main(url: str, kinds: tuple[str, ...], stop: Any, closes_1011: Any) -> None:
    """The attack process's entry point (a module-level function: the spawn context pickles it)."""
    logging.getLogger("websockets").setLevel(logging.CRITICAL)
    asyncio.run(_AttackClients(url, kinds, stop, closes_1011).run())


class _Probe:
    """``GET /healthz`` every 20 ms on a thread: latencies and non-200 answers."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.latencies: list[float] = []
        self.failures = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> _Probe:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=30)

    def _run(self) -> None:
        while not self.stop.wait(0.02):
            started = time.perf_counter()
            try:
                code, _ = _get(self.url + "/healthz", timeout_s=5)
            except OSError:
                code = 0
            self.latencies.append((time.perf_counter() - started) * 1000)
            self.failures += code != 200

    @property
    def p99(self) -> float:
        return statistics.quantiles(self.latencies, n=100)[98] if len(self.latencies) > 1 else float("nan")


def isolation_part(server: ServerProcess, kinds: tuple[str, ...], seconds: float, figures: Figures) -> None:
    """One robot, connected before the attack (a connection flood past the limit refuses new
    sockets: that is the point), alone, then under attack."""
    robot = _robot_client(server.ws_url + hostile.ROBOT)
    try:
        alone, n_alone = _robot_p99(robot, seconds)
        with _Probe(server.url) as probe, _Attack(server.url, kinds) as attack:
            time.sleep(1.0)
            under, n_under = _robot_p99(robot, seconds, seed=1)
    finally:
        robot.close()
    figures.robot_p99_alone_ms, figures.robot_p99_attack_ms = alone, under
    figures.isolation_p99_ratio = under / alone
    figures.healthz_p99_ms = probe.p99
    figures.probe_failures += probe.failures
    figures.closes_1011 += attack.closes_1011
    print(
        f"  isolation: robot p99 {alone:.1f} ms alone ({n_alone} requests), {under:.1f} ms under attack "
        f"({n_under}); /healthz p99 {probe.p99:.1f} ms, {probe.failures} non-200 of {len(probe.latencies)}"
    )


def churn_part(
    server: ServerProcess, kinds: tuple[str, ...], cycles: int, figures: Figures
) -> dict[str, int]:
    """Returns the process's threads and fds before, for the leak check after."""
    for n, kind in enumerate(kinds):  # warm each kind once: lazy allocations are not leaks
        tick(server.ws_url, kind, n, abrupt=False)
    baseline = {
        **occupancy(server.url),
        **{f"proc.{k}": v for k, v in server.proc_stat().items() if k != "rss"},
    }
    for n in range(cycles):
        kind = kinds[n % len(kinds)]
        try:
            code = tick(server.ws_url, kind, n, abrupt=bool(n // len(kinds) % 2))
        except (ConnectionClosed, InvalidHandshake, OSError, TimeoutError, RuntimeError) as exc:
            figures.churn_errors += 1
            print(f"  churn cycle {n} ({kind}) failed: {type(exc).__name__}: {str(exc)[:200]}")
            continue
        figures.churn_cycles += 1
        figures.closes_1011 += code == 1011
    return baseline


def churn_leaks(server: ServerProcess, baseline: dict[str, int], figures: Figures, grace_s: float) -> None:
    leak_check(server, {k: v for k, v in baseline.items() if not k.startswith("proc.")}, figures, grace_s)
    deadline = time.monotonic() + grace_s  # sockets and worker threads wind down asynchronously
    while True:
        now = server.proc_stat()
        grown = {
            k: now[k] - baseline[f"proc.{k}"]
            for k in ("threads", "fds", "children")
            if now[k] > baseline[f"proc.{k}"]
        }
        if not grown or time.monotonic() > deadline:
            break
        time.sleep(0.25)
    figures.leaks.update({f"proc.{k}": v for k, v in grown.items()})
    print(
        f"  churn: {figures.churn_cycles} cycles, {figures.churn_errors} errors; left over: {figures.leaks or 'nothing'}"
    )


def soak_part(server: ServerProcess, kinds: tuple[str, ...], minutes: float, figures: Figures) -> None:
    stop = threading.Event()
    counts = {"requests": 0, "errors": 0}

    def client(kind: str, offset: int) -> None:
        n = offset
        while not stop.is_set():
            try:
                code = tick(server.ws_url, kind, n, abrupt=False)
                counts["requests"] += 1
                if code == 1011:
                    counts["errors"] += 1
            except (ConnectionClosed, InvalidHandshake, OSError, TimeoutError, RuntimeError):
                if not stop.is_set():
                    counts["errors"] += 1
            n += 1

    threads = [
        threading.Thread(target=client, args=(kind, i * 100_000), daemon=True) for i, kind in enumerate(kinds)
    ]
    for t in threads:
        t.start()
    seconds = minutes * 60
    samples: list[tuple[float, int]] = []
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        samples.append((time.monotonic() - started, server.proc_stat()["rss"]))
        time.sleep(min(5.0, seconds / 20))
    stop.set()
    for t in threads:
        t.join(timeout=120)
    warm = [rss for t, rss in samples if t >= seconds / 5]
    after_warmup, end = warm[0], statistics.median(warm[-3:])
    figures.soak_rss_growth_pct = (end - after_warmup) / after_warmup * 100
    figures.soak_requests, figures.soak_errors = counts["requests"], counts["errors"]
    print(
        f"  soak: {minutes:g} min, {counts['requests']} cycles, {counts['errors']} errors; RSS {after_warmup / 2**20:.0f} MiB after warm-up -> {end / 2**20:.0f} MiB"
    )


def sigterm_part(server: ServerProcess, kinds: tuple[str, ...], bound_s: float, figures: Figures) -> None:
    """Clients of every kind mid-work, then SIGTERM."""
    codes: dict[str, int | str | None] = {}
    started = threading.Barrier(len(kinds) + 1)

    def client(kind: str) -> None:
        try:
            with connect(
                server.ws_url
                + {
                    "robot": hostile.ROBOT,
                    "world": hostile.WORLD,
                    "echo": hostile.ECHO,
                    "voice": hostile.VOICE,
                    "duplex": hostile.DUPLEX,
                }[kind],
                max_size=None,
                open_timeout=60,
            ) as ws:
                _work(ws, kind, 0)
                started.wait(timeout=120)
                while True:  # keep the session busy until the server closes it
                    if kind == "robot":
                        ws.send(openpi.packb(libero_observation(1)))
                    elif kind == "echo":
                        ws.send(json.dumps({"type": "echo", "text": "a b c d e f"}))
                    elif kind in ("voice", "duplex"):
                        ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": _pcm_b64(80)}))
                    ws.recv(timeout=bound_s + EXIT_SLACK_S + 10)
        except ConnectionClosed as closed:
            codes[kind] = closed.rcvd.code if closed.rcvd is not None else None
        except Exception as exc:  # noqa: BLE001 (reported as the figure)
            codes[kind] = type(exc).__name__

    threads = [threading.Thread(target=client, args=(kind,), daemon=True) for kind in kinds]
    for t in threads:
        t.start()
    started.wait(timeout=180)
    time.sleep(0.3)
    log_before = len(server.log())
    code, seconds = server.sigterm(bound_s + EXIT_SLACK_S + 30)
    for t in threads:
        t.join(timeout=30)
    tail = server.log()[log_before:]
    figures.sigterm_exit_s, figures.sigterm_exit_code = seconds, code
    figures.sigterm_closes = {k: v for k, v in codes.items()}  # type: ignore[misc]
    figures.error_lines += tail.count("level=error")
    print(
        f"  sigterm: exit {code} after {seconds:.2f} s (bound {bound_s:g} s + {EXIT_SLACK_S:g} s); client closes {codes}; ERROR lines after SIGTERM {tail.count('level=error')}"
    )


# -- the report --------------------------------------------------------------------------------


def _row(name: str, value: Any, goal: str, ok: bool | None) -> str:
    shown = f"{value:.2f}" if isinstance(value, float) else str(value)
    verdict = "" if ok is None else ("ok" if ok else "MISSED")
    return f"{name:28s} {shown:>14s}   {goal:<24s} {verdict}"


def report(figures: Figures, bound_s: float) -> bool:
    zero = lambda v: v == 0  # noqa: E731
    rows = [
        ("fuzz_frames", figures.fuzz_frames, "", None),
        ("crashes", figures.crashes, "0", zero(figures.crashes)),
        ("closes_1011", figures.closes_1011, "0", zero(figures.closes_1011)),
        ("tracebacks", figures.tracebacks, "0", zero(figures.tracebacks)),
        ("error_lines", figures.error_lines, "0", zero(figures.error_lines)),
        ("leaked_sessions", figures.leaked_sessions, "0", zero(figures.leaked_sessions)),
        (
            "other_leaks",
            sum(figures.leaks.values()) - figures.leaked_sessions,
            "0",
            zero(sum(figures.leaks.values()) - figures.leaked_sessions),
        ),
        ("probe_failures", figures.probe_failures, "0 (probes 200 throughout)", zero(figures.probe_failures)),
    ]
    for key in ("isolation_p99_ratio", "healthz_p99_ms", "soak_rss_growth_pct"):
        value, goal = getattr(figures, key), GOALS["reliability"][key]
        if value is not None:
            rows.append((key, value, str(goal), value <= goal.value))
    rows.append(
        ("churn_cycles", figures.churn_cycles, f"{figures.churn_errors} errors", zero(figures.churn_errors))
    )
    if figures.sigterm_exit_s is not None:
        limit = bound_s + EXIT_SLACK_S
        ok = figures.sigterm_exit_s <= limit and figures.sigterm_exit_code == 0
        ok = ok and all(code == 1001 for code in figures.sigterm_closes.values())
        rows.append(("sigterm_exit_s", figures.sigterm_exit_s, f"<= {limit:g}, exit 0, all 1001", ok))
    print(f"{'figure':28s} {'value':>14s}   {'goal':<24s}")
    for row in rows:
        print(_row(*row))
    hard = ("crashes", "closes_1011", "tracebacks", "error_lines", "leaked_sessions", "probe_failures")
    return all(ok for name, _, _, ok in rows if name in hard or name == "sigterm_exit_s")


PARTS = ("fuzz", "isolation", "churn", "soak", "sigterm")


def check_run_args(
    parser: argparse.ArgumentParser, args: argparse.Namespace, kinds: tuple[str, ...], parts: set[str]
) -> None:
    """Refuse (exit 2, one line) unknown parts or kinds, and a part's duration or count that is
    not positive, before the server starts."""
    for name, given, known in (("--parts", parts, PARTS), ("--kinds", set(kinds), KINDS)):
        if not given or not given <= set(known):
            parser.error(
                f"{name}: {','.join(sorted(given - set(known))) or 'none given'}; choose from {','.join(known)}"
            )
    for part, flag, value in (
        ("fuzz", "--fuzz-seconds", args.fuzz_seconds),
        ("isolation", "--isolation-seconds", args.isolation_seconds),
        ("churn", "--churn-cycles", args.churn_cycles),
        ("soak", "--soak-minutes", args.soak_minutes),
        ("sigterm", "--shutdown-timeout", args.shutdown_timeout),
    ):
        if part in parts and not value > 0:
            parser.error(
                f"{flag} must be > 0 for the {part} part, got {value:g} (or leave {part} out of --parts)"
            )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="realtime bench reliability", description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default="fuzz,isolation,churn,soak,sigterm")
    parser.add_argument("--kinds", default=",".join(KINDS), help="session kinds to serve and exercise")
    parser.add_argument("--fuzz-seconds", type=float, default=60.0, help="per route")
    parser.add_argument(
        "--isolation-seconds", type=float, default=30.0, help="robot alone, then under attack"
    )
    parser.add_argument("--churn-cycles", type=int, default=10_000)
    parser.add_argument("--soak-minutes", type=float, default=30.0)
    parser.add_argument("--shutdown-timeout", type=float, default=10.0, help="server.shutdown_timeout_s")
    parser.add_argument("--small", action="store_true", help="the test-sized world and duplex models")
    parser.add_argument("--workdir", help="where the config and the server log go (default: a temp dir)")
    parser.add_argument(
        "--robot-process",
        choices=["auto", "true", "false"],
        default="auto",
        help="robot.process: the robot's policy in a child process (auto: yes, pi0-tiny on the CPU)",
    )
    parser.add_argument(
        "--server-cores",
        type=parse_cpu_list,
        default=(),
        help="a CPU list: the server on these cores, the bench and every client it runs (the "
        "attackers too) on the rest of its own, as when clients run on other machines",
    )
    args = parser.parse_args(argv)
    kinds = tuple(k for k in args.kinds.split(",") if k)
    parts = set(args.parts.split(","))
    check_run_args(parser, args, kinds, parts)
    if args.server_cores:  # checked before anything starts; the bench moves off the server's cores
        own = os.sched_getaffinity(0)
        if not set(args.server_cores) <= own:
            parser.error(f"--server-cores: this bench may run on cores {sorted(own)} only")
        if not own - set(args.server_cores):
            parser.error("--server-cores leaves the bench no core of its own")
        os.sched_setaffinity(0, own - set(args.server_cores))
    logging.getLogger("websockets").setLevel(logging.CRITICAL)  # our clients' own view of resets
    figures = Figures()
    with contextlib.ExitStack() as stack:
        workdir = (
            Path(args.workdir) if args.workdir else Path(stack.enter_context(tempfile.TemporaryDirectory()))
        )
        workdir.mkdir(parents=True, exist_ok=True)
        server = ServerProcess(
            deploy_config(kinds, args.shutdown_timeout, args.small, PROCESS_CHOICES[args.robot_process]),
            workdir,
            args.server_cores,
        )
        stack.callback(server.stop)
        print(
            f"realtime bench reliability: kinds {','.join(kinds)}; parts {','.join(sorted(parts))}; "
            f"robot.process {args.robot_process}; load {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
        )
        with _timed("startup"):
            server.start()
        baseline = occupancy(server.url)
        grace = 10.0 + (2.0 if "duplex" in kinds else 0.0)
        if "fuzz" in parts:
            with _timed("fuzz"):
                fuzz_part(server, kinds, args.fuzz_seconds, figures)
                leak_check(server, baseline, figures, grace)
        if "isolation" in parts and "robot" in kinds:
            with _timed("isolation"):
                isolation_part(server, kinds, args.isolation_seconds, figures)
                leak_check(server, baseline, figures, grace + 30)
        if "churn" in parts:
            with _timed("churn"):
                churn_baseline = churn_part(server, kinds, args.churn_cycles, figures)
                churn_leaks(server, churn_baseline, figures, grace)
        if "soak" in parts:
            with _timed("soak"):
                soak_part(server, kinds, args.soak_minutes, figures)
        figures.crashes += not server.alive()
        if "sigterm" in parts and server.alive():
            sigterm_part(server, kinds, args.shutdown_timeout, figures)
        server.stop()
        log = server.log()
        figures.tracebacks = log.count("Traceback")
        figures.error_lines = max(figures.error_lines, log.count("level=error"))
        if figures.tracebacks or figures.error_lines:
            for line in log.splitlines():
                if "level=error" in line or "Traceback" in line:
                    print("  log:", line[:300])
    ok = report(figures, args.shutdown_timeout)
    headline = {
        "fuzz_frames": figures.fuzz_frames,
        "crashes": figures.crashes,
        "closes_1011": figures.closes_1011,
        "tracebacks": figures.tracebacks,
        "leaked_sessions": figures.leaked_sessions,
        "isolation_p99_ratio": _round(figures.isolation_p99_ratio),
        "healthz_p99_ms": _round(figures.healthz_p99_ms),
        "churn_cycles": figures.churn_cycles,
        "soak_rss_growth_pct": _round(figures.soak_rss_growth_pct),
        "sigterm_exit_s": _round(figures.sigterm_exit_s),
        "error_lines": figures.error_lines,
        "closes_1009": figures.closes_1009,
        "probe_failures": figures.probe_failures,
        "leaks": figures.leaks,
        "robot_p99_alone_ms": _round(figures.robot_p99_alone_ms),
        "robot_p99_attack_ms": _round(figures.robot_p99_attack_ms),
        "sigterm_closes": figures.sigterm_closes,
        "sigterm_exit_code": figures.sigterm_exit_code,
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "robot_process": args.robot_process,
    }
    print(json.dumps(headline))
    return 0 if ok else 1


@contextlib.contextmanager
def _timed(part: str) -> Iterator[None]:
    started = time.monotonic()
    yield
    print(f"  [{part}: {time.monotonic() - started:.1f} s]")


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
