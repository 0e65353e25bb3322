"""``realtime bench robot``: this server vs PyPI ``openpi-server`` 0.1.0, the same policy objects.

Both servers run as their own processes on loopback, each serving a policy built by
``realtime.kinds.robot.build_policy`` (openpi-server through :class:`OpenPIPolicy`, the
``BasePolicy`` adapter doing ``prepare`` + a batch-of-one ``infer``), with the same torch thread
count. Clients are :class:`~realtime.bench.openpi_robot.OpenPIRobot` on threads of this process (the
calls ``openpi_client.WebsocketClientPolicy`` makes, plus a public ``close``).

(a) Round-trip overhead: one client, the trivial ``zeros`` policy, LIBERO (2x224x224x3 uint8 +
    state + prompt) and ALOHA (4x3x224x224 uint8 + state) observations; blocks of 10 requests
    alternate between the servers (short blocks: load drift on a shared machine hits both
    alike). Goal: ours <= 1.1x openpi-server's p50 round trip. Where the OS places a server's
    threads moves its round trip by 10-25 % on a VM (two processes of the same server differ
    that much), so ``--rounds`` fresh pairs of server processes are measured and the headline
    ratio is the median of the rounds' ratios; each round's ratio is printed.
(a') The same with the embedded pi0-tiny policy (LIBERO), for reference: the overhead a real
    forward sees.
(b) Throughput: 8 concurrent clients with the embedded pi0-tiny policy for a fixed time. Goals
    (issue 30, one H200): ``throughput_ratio_8`` (ours / peer chunks/s) and ``p99_ratio_8`` as in
    :data:`realtime.bench.goals.GOALS`, which every goal this bench prints comes from.

(c) Idle robots: one active client with the embedded pi0-tiny (LIBERO) alone, then with 7 more
    clients connected that each sent one request and went silent (between episodes, at a
    breakpoint); blocks alternate over ``--idle-rounds`` (the paused clients connect before and
    disconnect after each block). Goal: p50 among the paused <= 1.1x p50 alone, for the default
    ``robot.dispatch: arrival``; the same is measured with ``robot.dispatch: window`` (the plain
    coalescing window, which waits ``coalesce_window_s`` for the paused robots) for reference.

``--device`` (``auto``, ``cpu`` or ``cuda``) is ``robot.device`` for both servers' pi0-tiny (the
trivial policy of (a) always runs on the CPU). On a GPU machine, one run of the defaults takes
about a minute: ``realtime bench robot --device cuda``. ``--policy pi0-shaped`` runs (a'), (b)
and (c) with pi0 at its real shapes (``realtime.kinds.robot`` builds ``models.policy.pi0.PI0``, bf16, CUDA graphs in
both servers: the same policy objects); ``--clients 8,32`` measures (b) at each count and
``--parts`` picks the sections, e.g. the GPU-issue run
``realtime bench robot --device cuda --policy pi0-shaped --parts a',b --clients 8,32 --max-batch 32``.
``--process true|false`` sets ``robot.process`` for ours (the policy in a child process; ``auto``
by default, which is a process for pi0-tiny on the CPU): ``--parts "a',b" --process false`` and
``--process true`` price the hop at batch 1 and under 8 clients.
``--policy pi0 --checkpoint PATH`` (or ``pi0.5``) serves a checkpoint folder in both servers
(``robot.checkpoint``; ``--tokenizer`` for ``robot.tokenizer``); ``--write-checkpoint`` first
writes a random-weight one at the real size in openpi's layout into PATH (LIBERO assets, a
stand-in tokenizer: ``models.policy.checkpoint_writer.write_random_openpi``), e.g.
``realtime bench robot --device cuda --policy pi0 --checkpoint /tmp/pi0 --write-checkpoint --parts a',b``.

The last line is JSON: ``overhead_ratio_libero``, ``overhead_ratio_aloha`` (ours / peer p50
round trip, median over rounds), ``throughput_ratio_8`` (ours / peer chunks/s) with
``mean_batch_8`` (ours), ``p99_ratio_8`` (ours' p99 at 8 clients / ``latency_ms_1``, the p50 round
trip of one client with the policy in (a')) and ``idle_p50_ratio`` ((c): p50 among 7 paused /
p50 alone), the same ``_N`` keys for every other ``--clients`` count, plus the raw
figures (``overhead_rounds_*``: each round's ratio; ``overhead_ratio_pi0_libero``: (a');
``idle_p50_ms``, ``idle_p50_ratio_window``: (c) under ``robot.dispatch: window``).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from realtime.bench import examples
from realtime.bench.goals import goal_note


class OpenPIPolicy:
    """An ``openpi_client.base_policy.BasePolicy`` over one of our policies (for openpi-server)."""

    def __init__(self, policy: Any) -> None:
        self.policy = policy

    def infer(self, obs: Mapping[str, Any]) -> dict[str, Any]:
        start = time.perf_counter()
        (actions,) = self.policy.infer([self.policy.prepare(obs)], [None])
        return {"actions": actions, "policy_timing": {"infer_ms": (time.perf_counter() - start) * 1000}}

    def reset(self) -> None:
        return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(url: str, proc: subprocess.Popen, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} during startup")
        with contextlib.suppress(OSError, http.client.HTTPException):  # refused, 503 while loading
            with urllib.request.urlopen(url, timeout=1.0) as reply:
                if reply.status == 200:
                    return
        time.sleep(0.1)
    raise TimeoutError(f"{url} not ready after {timeout_s:g} s")


@contextlib.contextmanager
def _process(args: list[str], ready_url: str) -> Iterator[None]:
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_http(ready_url, proc)
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def ours(policy: str, threads: int, robot: Mapping[str, Any] | None = None) -> Iterator[str]:
    """Our server (``realtime serve``) in a child process; ``robot`` overrides robot config fields."""
    port = _free_port()
    config = {
        "server": {"log_level": "warning"},
        "robot": {
            "enabled": True,
            "policy": policy,
            "torch_threads": threads,
            "idle_timeout_s": 0,
            **(robot or {}),
        },
        "world": {"enabled": False},
    }
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "deploy.yaml"
        path.write_text(yaml.safe_dump(config))
        cmd = [sys.executable, "-m", "realtime.cli", "serve", "--config", str(path), "--port", str(port)]
        with _process(cmd, f"http://127.0.0.1:{port}/readyz"):
            yield f"ws://127.0.0.1:{port}"


@contextlib.contextmanager
def peer(
    policy: str, threads: int, device: str = "auto", files: Mapping[str, Any] | None = None
) -> Iterator[str]:
    """openpi-server serving ``policy``; ``files``: its ``robot.checkpoint`` / ``robot.tokenizer``
    / ``robot.compile``."""
    port = _free_port()
    cmd = [sys.executable, "-m", "realtime.bench.robot", "--serve-peer", policy, "--port", str(port)]
    cmd += [
        "--torch-threads",
        str(threads),
        "--device",
        device,
        "--robot-files",
        json.dumps(dict(files or {})),
    ]
    with _process(cmd, f"http://127.0.0.1:{port}/healthz"):
        yield f"ws://127.0.0.1:{port}"


def _files(robot: Mapping[str, Any]) -> dict[str, Any]:
    """The robot settings both servers share: the checkpoint files and ``compile``."""
    return {k: robot[k] for k in ("checkpoint", "tokenizer", "compile") if k in robot}


def write_checkpoint(policy: str, folder: str, device: str) -> None:
    """A random-weight pi0 / pi0.5 checkpoint at the real size in openpi's layout (bf16 on CUDA)."""
    from dataclasses import replace

    import torch

    from models.policy.checkpoint_writer import write_random_openpi
    from models.policy.pi0 import PI0, PI05

    on = "cuda" if device != "cpu" and torch.cuda.is_available() else "cpu"
    config = PI05 if policy == "pi0.5" else PI0
    dtype = "bfloat16" if on == "cuda" else "float32"
    print(f"writing a random {policy} checkpoint ({dtype}, openpi layout, LIBERO) to {folder}")
    write_random_openpi(folder, replace(config, dtype=dtype), "libero", on)
    if on == "cuda":
        torch.cuda.empty_cache()


def serve_peer(policy: str, port: int, threads: int, device: str, files: Mapping[str, Any]) -> int:
    """Child process: openpi-server 0.1.0 serving our policy object."""
    import torch
    from openpi_server import WebsocketPolicyServer

    from realtime.config import RobotConfig
    from realtime.kinds.robot import build_policy, handshake_metadata

    torch.set_num_threads(threads)
    config = RobotConfig(policy=policy, device=device, **files)
    built = build_policy(config)
    built.warmup(1)
    server = WebsocketPolicyServer(
        OpenPIPolicy(built), host="127.0.0.1", port=port, metadata=handshake_metadata(built, config)
    )
    server.serve_forever()
    return 0


def _client(url: str):
    from realtime.bench.openpi_robot import OpenPIRobot

    return OpenPIRobot(url)


def _round_trips(client: Any, obs: dict, n: int, timings: list | None = None) -> list[float]:
    out = []
    for _ in range(n):
        start = time.perf_counter()
        reply = client.infer(obs)
        out.append(time.perf_counter() - start)
        if "actions" not in reply:
            raise RuntimeError(f"server answered {reply}")
        if timings is not None:
            timings.append(reply["policy_timing"])
    return out


def overhead(url_ours: str, url_peer: str, obs: dict, requests: int, blocks: int) -> dict[str, list[float]]:
    clients = {"ours": _client(url_ours), "peer": _client(url_peer)}
    samples: dict[str, list[float]] = {"ours": [], "peer": []}
    for client in clients.values():
        _round_trips(client, obs, 10)
    for _ in range(blocks):
        for name, client in clients.items():
            samples[name] += _round_trips(client, obs, requests // blocks)
    for client in clients.values():
        client.close()
    return samples


def throughput(url: str, clients: int, seconds: float) -> tuple[float, list[float], list[dict]]:
    robots = [_client(url) for _ in range(clients)]
    for i, robot in enumerate(robots):
        _round_trips(robot, examples.libero(i), 2)
    latencies: list[list[float]] = [[] for _ in robots]
    timings: list[dict] = []
    barrier = threading.Barrier(clients + 1)
    stop_at = [0.0]

    def run(i: int) -> None:
        obs = examples.libero(i)
        barrier.wait()
        while time.perf_counter() < stop_at[0]:
            latencies[i] += _round_trips(robots[i], obs, 1, timings)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    stop_at[0] = time.perf_counter() + seconds
    start = time.perf_counter()
    barrier.wait()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    for robot in robots:
        robot.close()
    flat = [x for per in latencies for x in per]
    return len(flat) / elapsed, flat, timings


PAUSED_ROBOTS = 7
PAUSE_S = 0.2  # the paused clients' silence before a measured block: many times their one interval


def idle_robots(url: str, requests: int, rounds: int) -> dict[str, list[float]]:
    """(c): the active client's round trips alone and with :data:`PAUSED_ROBOTS` paused ones."""
    active, obs = _client(url), examples.libero(0)
    _round_trips(active, obs, 10)
    samples: dict[str, list[float]] = {"alone": [], "paused": []}
    per_block = max(10, requests // rounds)
    for _ in range(rounds):
        samples["alone"] += _round_trips(active, obs, per_block)
        paused = [_client(url) for _ in range(PAUSED_ROBOTS)]
        for i, robot in enumerate(paused):
            _round_trips(robot, examples.libero(i + 1), 1)  # one request, then silence
        time.sleep(PAUSE_S)
        samples["paused"] += _round_trips(active, obs, per_block)
        for robot in paused:
            robot.close()
    active.close()
    return samples


PEER_EXTRA = "pip install 'realtime-sessions[test]'"


def missing_peer() -> str | None:
    """One line naming what this bench needs and lacks (openpi-server is the peer, openpi-client's
    msgpack-numpy codec the robots'; both are in the ``test`` extra), or ``None`` when everything
    imports."""
    try:
        import openpi_client.msgpack_numpy  # noqa: F401
        import openpi_server  # noqa: F401
    except ImportError as exc:
        return f"realtime bench robot: needs {exc.name or 'openpi-client and openpi-server'}: {PEER_EXTRA}"
    return None


def _describe_device(name: str) -> str:
    import torch

    if name == "cpu" or (name == "auto" and not torch.cuda.is_available()):
        return "cpu"
    if not torch.cuda.is_available():
        raise SystemExit("realtime bench robot: --device cuda, but torch finds no CUDA device")
    return torch.cuda.get_device_name()


def _print_round_trips(by_payload: Mapping[str, Mapping[str, list[float]]]) -> None:
    print(f"{'payload':<8} {'server':<14} {'p50':>7} {'p90':>7} {'p99':>7} {'mean':>7}")
    for name, samples in by_payload.items():
        for who, label in (("ours", "ours"), ("peer", "openpi-server")):
            s = samples[who]
            print(
                f"{name:<8} {label:<14} {_ms(s, 50):7.3f} {_ms(s, 90):7.3f} {_ms(s, 99):7.3f} "
                f"{statistics.fmean(s) * 1000:7.3f}"
            )


def _ms(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values) * 1000.0, q))


def trivial_overhead(requests: int, rounds_n: int, threads: int) -> dict[str, Any]:
    """(a): the trivial policy's round trip, ours vs openpi-server, over fresh process pairs."""
    results: dict[str, Any] = {}
    payloads = {"libero": examples.libero(0), "aloha": examples.aloha(0)}
    pooled: dict[str, dict[str, list[float]]] = {name: {"ours": [], "peer": []} for name in payloads}
    rounds: dict[str, list[float]] = {name: [] for name in payloads}
    per_round = max(10, requests // rounds_n)
    for _ in range(rounds_n):
        with ours("zeros", threads) as url_ours, peer("zeros", threads) as url_peer:
            for name, obs in payloads.items():
                samples = overhead(url_ours, url_peer, obs, per_round, blocks=max(1, per_round // 10))
                rounds[name].append(_ms(samples["ours"], 50) / _ms(samples["peer"], 50))
                for who in ("ours", "peer"):
                    pooled[name][who] += samples[who]
    print(f"(a) single client, trivial policy: round trip ms ({rounds_n} rounds of fresh server processes)")
    _print_round_trips(pooled)
    for name in payloads:
        results[f"overhead_ratio_{name}"] = round(statistics.median(rounds[name]), 3)
        results[f"overhead_rounds_{name}"] = [round(r, 3) for r in rounds[name]]
        results[f"{name}_p50_ms"] = {who: round(_ms(pooled[name][who], 50), 3) for who in ("ours", "peer")}
        print(f"{name}: ours / openpi-server p50 per round: {results[f'overhead_rounds_{name}']}")
    print(
        f"ratios: overhead libero {results['overhead_ratio_libero']}x"
        f"{goal_note('robot', 'overhead_ratio_libero')}, "
        f"aloha {results['overhead_ratio_aloha']}x{goal_note('robot', 'overhead_ratio_aloha')}"
    )
    return results


def concurrent(
    policy: str, clients: int, seconds: float, threads: int, device: str, robot: Mapping[str, Any]
) -> dict[str, Any]:
    """(b): ``clients`` robots at once for ``seconds``, ours (batched) vs openpi-server (serial);
    ``robot`` (ours' config overrides) also names the checkpoint files both serve."""
    print(f"(b) {clients} concurrent clients, {policy}, {seconds:g} s each")
    print(f"{'server':<14} {'chunks/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'forward ms':>11} {'mean batch':>11}")
    figures, results = {}, {}
    servers = (
        ("peer", lambda: peer(policy, threads, device, _files(robot))),
        ("ours", lambda: ours(policy, threads, robot)),
    )
    for who, serve in servers:
        with serve() as url:
            rate, lat, timings = throughput(url, clients, seconds)
        figures[who] = (rate, _ms(lat, 50), _ms(lat, 99))
        forward = statistics.fmean(t["infer_ms"] for t in timings)
        batch = statistics.fmean(t.get("batch_size", 1.0) for t in timings)
        label = "ours" if who == "ours" else "openpi-server"
        print(
            f"{label:<14} {rate:9.1f} {_ms(lat, 50):8.1f} {_ms(lat, 99):8.1f} {forward:11.1f} {batch:11.2f}"
        )
        if who == "ours":
            results[f"mean_batch_{clients}"] = round(batch, 2)
    results[f"throughput_ratio_{clients}"] = round(figures["ours"][0] / figures["peer"][0], 3)
    results[f"p99_ms_{clients}"] = {
        "ours": round(figures["ours"][2], 1),
        "peer": round(figures["peer"][2], 1),
    }
    results[f"chunks_per_s_{clients}"] = {
        "ours": round(figures["ours"][0], 1),
        "peer": round(figures["peer"][0], 1),
    }
    print(
        f"throughput at {clients} clients {results[f'throughput_ratio_{clients}']}x"
        f"{goal_note('robot', f'throughput_ratio_{clients}')} "
        f"with p99 {figures['ours'][2]:.1f} vs {figures['peer'][2]:.1f} ms"
    )
    return results


def idle_section(
    policy: str, threads: int, robot: Mapping[str, Any], requests: int, rounds: int
) -> dict[str, Any]:
    """(c): one active robot alone vs among paused ones, under both dispatch rules."""
    print(f"(c) 1 active client alone vs with {PAUSED_ROBOTS} paused ones connected, {policy}, LIBERO")
    print(f"{'robot.dispatch':<15} {'p50 alone':>10} {'p50 paused':>11} {'ratio':>6}")
    results: dict[str, Any] = {}
    idle_p50: dict[str, dict[str, float]] = {}
    for dispatch in ("arrival", "window"):
        with ours(policy, threads, {**robot, "dispatch": dispatch}) as url:
            samples = idle_robots(url, requests, rounds)
        idle_p50[dispatch] = {case: round(_ms(samples[case], 50), 3) for case in ("alone", "paused")}
        ratio = idle_p50[dispatch]["paused"] / idle_p50[dispatch]["alone"]
        results["idle_p50_ratio" if dispatch == "arrival" else "idle_p50_ratio_window"] = round(ratio, 3)
        print(
            f"{dispatch:<15} {idle_p50[dispatch]['alone']:10.2f} {idle_p50[dispatch]['paused']:11.2f} "
            f"{ratio:6.2f}"
        )
    results["idle_p50_ms"] = idle_p50
    print(f"idle robots: p50 ratio {results['idle_p50_ratio']}x{goal_note('robot', 'idle_p50_ratio')}")
    return results


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="realtime bench robot", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--requests", type=int, default=1500, help="round trips per payload and server in (a), all rounds"
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="(a): fresh pairs of server processes (median ratio)"
    )
    parser.add_argument("--policy-requests", type=int, default=200, help="round trips per server in (a')")
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds per server in (b)")
    parser.add_argument(
        "--clients", default="8", help="(b): concurrent clients, or a comma list such as 8,32"
    )
    parser.add_argument(
        "--policy",
        choices=["pi0-tiny", "pi0-shaped", "pi0", "pi0.5"],
        default="pi0-tiny",
        help="the policy of (a'), (b) and (c) for both servers (pi0, pi0.5: --checkpoint)",
    )
    parser.add_argument("--checkpoint", default="", help="robot.checkpoint: a pi0 / pi0.5 checkpoint folder")
    parser.add_argument("--tokenizer", default="", help="robot.tokenizer (default: in the checkpoint folder)")
    parser.add_argument(
        "--write-checkpoint",
        action="store_true",
        help="first write a random real-size checkpoint in openpi's layout into --checkpoint",
    )
    parser.add_argument(
        "--parts",
        default="a,a',b,c",
        help="sections to run (comma list of a, a', b, c, f; default a,a',b,c; f: the forward alone, CUDA)",
    )
    parser.add_argument("--forward-batches", default="1,8,32", help="(f): batch sizes")
    parser.add_argument(
        "--peak-tflops", type=float, default=989.0, help="(f): dense bf16 peak (H100/H200: 989)"
    )
    parser.add_argument("--profile", action="store_true", help="(f): kernel time by kind per batch size")
    parser.add_argument(
        "--attention",
        choices=["auto", "flash2", "sdpa"],
        default="auto",
        help="robot.attention for both servers and (f)'s served policy",
    )
    parser.add_argument(
        "--compile",
        choices=["auto", "on", "off"],
        default="auto",
        help="robot.compile for both servers in (a'), (b), (c) (auto: on CUDA)",
    )
    parser.add_argument(
        "--process",
        choices=["auto", "true", "false"],
        default="auto",
        help="robot.process for ours in (a'), (b), (c): the policy in a child process (auto: on the CPU)",
    )
    parser.add_argument("--torch-threads", type=int, default=1)
    parser.add_argument(
        "--device",
        choices=["auto", "cpu", "cuda"],
        default="auto",
        help="robot.device of pi0-tiny in (b), for both servers (default auto: CUDA when available)",
    )
    parser.add_argument(
        "--coalesce-window-s",
        type=float,
        help="robot.coalesce_window_s for ours in (b) (default: the config's)",
    )
    parser.add_argument(
        "--max-batch", type=int, help="robot.max_batch for ours in (b) (default: the config's, 8)"
    )
    parser.add_argument(
        "--idle-requests", type=int, default=240, help="(c): the active client's round trips per case"
    )
    parser.add_argument("--idle-rounds", type=int, default=4, help="(c): alternating blocks per case")
    parser.add_argument(
        "--serve-peer", choices=["zeros", "pi0-tiny", "pi0-shaped", "pi0", "pi0.5"], help=argparse.SUPPRESS
    )
    parser.add_argument("--robot-files", default="{}", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    missing = missing_peer()
    if missing is not None:
        print(missing, file=sys.stderr)
        return 2
    if args.serve_peer:
        return serve_peer(
            args.serve_peer, args.port, args.torch_threads, args.device, json.loads(args.robot_files)
        )
    if args.policy in ("pi0", "pi0.5") and not args.checkpoint:
        parser.error(f"--policy {args.policy} needs --checkpoint")
    if args.write_checkpoint:
        write_checkpoint(args.policy, args.checkpoint, args.device)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    threads = args.torch_threads
    device = _describe_device(args.device)
    print(
        f"robot bench: ours (realtime serve) vs openpi-server 0.1.0, same policy objects, loopback, "
        f"torch threads={threads}, cpu count={os.cpu_count()}, {args.policy} device={device}, "
        f"robot.process={args.process}"
    )
    results: dict[str, Any] = {}
    parts = set(args.parts.split(","))
    unknown = parts - {"a", "a'", "b", "c", "f"}
    if unknown:
        parser.error(f"--parts: unknown sections {sorted(unknown)}")
    counts = [int(n) for n in args.clients.split(",")]
    files = {k: v for k, v in (("checkpoint", args.checkpoint), ("tokenizer", args.tokenizer)) if v}
    compile_setting = {"auto": "auto", "on": True, "off": False}[args.compile]
    files = {**files, "compile": compile_setting, "attention": args.attention}
    process = {"auto": "auto", "true": True, "false": False}[args.process]
    robot: dict[str, Any] = {"device": args.device, "process": process, **files}
    if args.coalesce_window_s is not None:
        robot["coalesce_window_s"] = args.coalesce_window_s
    if args.max_batch is not None:
        robot["max_batch"] = args.max_batch
    if "f" in parts:
        from realtime.bench.robot_forward import forward_section
        from realtime.config import RobotConfig

        served = RobotConfig(policy=args.policy, device="cuda", **files)
        batches = [int(n) for n in args.forward_batches.split(",")]
        results.update(forward_section(served, batches, args.peak_tflops, profile_kernels=args.profile))
    if "a" in parts:
        results.update(trivial_overhead(args.requests, args.rounds, threads))
    if "a'" in parts:
        with (
            peer(args.policy, threads, args.device, files) as url_peer,
            ours(args.policy, threads, {"device": args.device, "process": process, **files}) as url_ours,
        ):
            samples = overhead(
                url_ours,
                url_peer,
                examples.libero(0),
                args.policy_requests,
                blocks=max(1, args.policy_requests // 10),
            )
        print(f"(a') single client, {args.policy}, LIBERO: round trip ms")
        _print_round_trips({"libero": samples})
        results["overhead_ratio_pi0_libero"] = round(_ms(samples["ours"], 50) / _ms(samples["peer"], 50), 3)
        results["latency_ms_1"] = round(_ms(samples["ours"], 50), 2)
        results["latency_ms_1_peer"] = round(_ms(samples["peer"], 50), 2)
        print(f"latency_ms_1 {results['latency_ms_1']}{goal_note('robot', 'latency_ms_1')}")
    if "b" in parts:
        for clients in counts:
            results.update(concurrent(args.policy, clients, args.seconds, threads, args.device, robot))
            if "latency_ms_1" in results:
                p99 = results[f"p99_ms_{clients}"]["ours"]
                results[f"p99_ratio_{clients}"] = round(p99 / results["latency_ms_1"], 3)
                key = f"p99_ratio_{clients}"
                print(f"{key} (p99 / latency_ms_1) {results[key]}{goal_note('robot', key)}")
    if "c" in parts:
        results.update(idle_section(args.policy, threads, robot, args.idle_requests, args.idle_rounds))
    results["device"] = device
    results["process"] = args.process
    results["clients"] = counts
    results["policy"] = args.policy
    if args.checkpoint:
        results["checkpoint"] = args.checkpoint
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
