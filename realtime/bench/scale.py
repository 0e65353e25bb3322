"""``realtime bench scale``: robot sessions through the replicas' ingress (and Ray Serve's proxy) vs
direct to one server, and two replicas vs one at the same offered load, side by side in one run,
on CPU replicas.

One local Ray instance (``realtime.scale.launch``: the same app ``realtime serve --replicas``
runs, robot kind only) and one single-process ``realtime serve`` beside it, both on loopback;
clients are the real ``openpi_client.WebsocketClientPolicy`` on threads of this process.

(a) The ingress's cost: one robot, the trivial ``zeros`` policy (LIBERO observations), blocks of
    requests alternating between the single server and the ingress of ``realtime serve
    --replicas`` (``realtime.scale.ingress``) with one replica; then the same against Serve's
    HTTP proxy behind it. ``proxy_added_p50_ms`` = the ingress's p50 round trip - direct p50
    (goal <= 1.0); ``serve_proxy_added_p50_ms`` the same through Serve's proxy.
(b) Replicas: ``--clients`` robots (closed loop: each sends its next observation when its
    actions arrive) with the embedded ``pi0-tiny`` policy for ``--seconds``, through the ingress with
    one replica, then two (the same app scaled up, the same clients and load), and direct to the
    single server for reference. ``throughput_ratio_2_vs_1`` = chunks/s with two / with one (goal
    >= 1.8 where each replica has its own cores or GPU: on a machine with fewer cores than
    replicas x ``--threads`` it cannot be, and the table says how many cores there were). The
    ratio is a ratio of capacities only when the load fills both replicas: the default is two
    full batches of robots (2 x ``robot.max_batch``, 16), so one replica runs full batches with
    a batch waiting and two replicas run full batches each; with fewer (``--clients 8``) two
    replicas run half batches, and the ratio measures how much a half batch costs instead. Each
    run's mean batch (from the replies' ``policy_timing``) is printed beside it.
(c) Losing a replica: ``--clients`` robots, each naming its episode (openpi's ``session_id``
    observation key), and ``--voice-sessions`` voice sessions (the official ``openai`` SDK, each
    holding a user item), over two replicas; one replica's process is killed. A robot whose socket
    closes (1012 from the ingress) reconnects at once and sends its next observation with the same
    episode: the session router places it on the live replica, which resumes the episode from its
    checkpoint (the last chunk, for real-time chunking). A voice session's SDK reconnects by
    itself on the 1012, its ``on_reconnecting`` hook naming the session (``scale_voice.py``); the
    live replica restores it (same id, its item replayed), and the bench asks for a reply.
    ``resume_after_loss_ms`` = the slowest resumed session's time from the kill to its first reply
    on the live replica (a robot's actions, a voice reply's first audio; goal <= 2000), with each
    kind's own (``resume_after_loss_ms_robot``, ``_voice``, and ``restore_after_loss_ms_voice``:
    the conversation back, before the reply); ``lost_sessions`` = sessions of either kind not
    served again within :data:`RESUME_DEADLINE_S` (goal 0). Where the voice kind cannot serve
    (its packages missing) the line says so and only robots count.

``--cores LIST`` gives each replica cores of its own (``replicas.cpu_affinity``): replica ``r``
pins itself to the ``r``-th block of ``--cpus-per-replica`` cores of ``LIST``, the single server
of (a) and (b) runs on the first block (one replica's cores), and this process, its client
threads, the ingress and every other process of the Ray instance (Serve's proxy and controller,
Ray's own) on the cores of ``LIST`` after the two blocks, or on all of ``LIST`` when none are left
(then the load generator and the ingress share the replicas' cores, and the table says so). Give
``--threads`` the same number as ``--cpus-per-replica``.

``--device cuda`` gives each replica one GPU (``replicas.num_gpus: 1``; two GPUs for (b)) and the
single server the first one: on the 2-GPU device machine, ``realtime bench scale --device cuda
--policy pi0-shaped --threads 4 --cpus-per-replica 4`` measures the ratio where each replica has
its own GPU. Needs the ``ray`` extra (``pip install -e '.[ray]'``) and ``openpi-client``.
``--parts`` picks the sections (default ``a,b,c``; ``c`` alone deploys two replicas at once).
The last line is JSON: ``proxy_added_p50_ms``, ``throughput_ratio_2_vs_1``,
``resume_after_loss_ms``, ``lost_sessions``, plus the raw figures.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import signal
import socket
import statistics
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from realtime.bench import examples
from realtime.bench.goals import goal_note
from realtime.bench.robot import _client, ours, overhead, throughput
from realtime.bench.scale_voice import Resumed, VoiceEpisode, why_voice_cannot_serve
from realtime.config import ConfigError, RobotConfig, config_from_mapping
from realtime.scale.cores import pin_process, replica_block
from sessions.identities import session_replica_tag


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _mean_batch(timings: list[dict]) -> float:
    """The mean batch a run's replies were computed in (their ``policy_timing``'s ``batch_size``)."""
    return statistics.fmean(t.get("batch_size", 1.0) for t in timings) if timings else 0.0


def _ms(values: list[float], q: float) -> float:
    return round(statistics.quantiles(values, n=100)[int(q) - 1] * 1000, 2) if len(values) > 1 else 0.0


ROBOT_MAX_BATCH = RobotConfig().max_batch


def replica_config(policy: str, args: argparse.Namespace, voice: bool = False) -> Any:
    robot = {"policy": policy, "torch_threads": args.threads, "idle_timeout_s": 0, "device": args.device}
    return config_from_mapping(
        {
            "server": {"log_level": "warning", "shutdown_timeout_s": 5},
            "robot": {"enabled": True, **robot},
            "world": {"enabled": False},
            "voice": {"enabled": voice, "torch_threads": args.threads},
            "replicas": {
                "num_cpus": args.cpus_per_replica,
                "num_gpus": 1.0 if args.device == "cuda" else 0.0,
                "stats_period_s": 0.5,
                "object_store_bytes": 100_000_000,
                "cpu_affinity": args.cores,
            },
        }
    )


@dataclass(frozen=True)
class CoreSplit:
    """``--cores``: the first replica's cores (the single server's too) and this process's (the
    load generator, the ingress, Serve's proxy, Ray's processes); ``shared`` when the list had no cores left
    after two replicas' blocks, so ``rest`` is the whole list."""

    first: tuple[int, ...]
    rest: tuple[int, ...]
    shared: bool

    @classmethod
    def of(cls, config: Any) -> CoreSplit:
        cores, per = config.replicas.cores(), int(config.replicas.num_cpus)
        rest = cores[2 * per :]
        return cls(first=replica_block(cores, per, 0), rest=rest or cores, shared=not rest)

    def describe(self) -> str:
        first, rest = ",".join(map(str, self.first)), ",".join(map(str, self.rest))
        shared = " (the replicas' cores: none left)" if self.shared else ""
        return f"replicas on cores of their own (the first on {first}), clients and Ray on {rest}{shared}"


@contextlib.contextmanager
def direct_on(cores: tuple[int, ...] | None, policy: str, threads: int, robot: dict) -> Iterator[str]:
    """The single server (``realtime.bench.robot.ours``) started on ``cores`` (it inherits this
    thread's affinity at its start, which is restored at once: the clients stay where they were)."""
    with contextlib.ExitStack() as stack:
        before = os.sched_getaffinity(0) if cores else None
        if cores:
            os.sched_setaffinity(0, cores)
        try:
            url = stack.enter_context(ours(policy, threads, robot))
        finally:
            if before is not None:
                os.sched_setaffinity(0, before)
        yield url


@dataclass(frozen=True)
class Ports:
    """The ingress's port (what clients dial, as with ``realtime serve --replicas``) and Serve's
    proxy's behind it."""

    ingress: int
    proxy: int

    def url(self, which: str = "ingress") -> str:
        return f"ws://127.0.0.1:{getattr(self, which)}"


@contextlib.contextmanager
def serve_app(config: Any, replicas: int, ports: Ports) -> Iterator[str]:
    """The robot app on Serve with ``replicas`` replicas behind the ingress, ready; yields the
    ingress's ws:// URL."""
    from realtime.scale.launch import start_ingress, undeploy

    ingress = start_ingress(config, replicas, "127.0.0.1", ports.ingress, ports.proxy)
    try:
        scale_to(config, replicas, ports)
        try:
            yield ports.url()
        finally:
            undeploy(config)
    finally:
        ingress.stop()


def scale_to(config: Any, replicas: int, ports: Ports) -> None:
    """Deploy ``replicas`` replicas (a running app is scaled), wait until each is ready, then until
    the routers have each one's routing report: a replica a router has no report of gets no new
    session (docs/scaling.md), so robots connecting sooner would all land on the older replica."""
    from realtime.scale.launch import deploy, wait_ready

    http = deploy(config, replicas, ports.proxy)
    failure = wait_ready(http, replicas, threading.Event())
    if failure is not None:
        raise RuntimeError(f"replicas did not start: {failure}")
    time.sleep(2 * config.replicas.stats_period_s)  # a report reaches every router within two periods


def status(url: str) -> dict:
    with urllib.request.urlopen(url.replace("ws://", "http://") + "/v1/status", timeout=30) as r:
        return json.loads(r.read())


RESUME_DEADLINE_S = 10.0


def _served_again(url: str, robot: Any, obs: dict, killed_at: float) -> tuple[float | None, bool]:
    """One robot after the kill: (seconds from the kill to its first reply on a new socket, or
    ``None`` when its own socket still served it; whether it was served before the deadline)."""
    try:
        robot.infer(obs)
        return None, True
    except Exception:  # noqa: BLE001 - closed by the ingress (1012): its replica is gone
        pass
    with contextlib.suppress(Exception):
        robot.close()
    while time.monotonic() - killed_at < RESUME_DEADLINE_S:
        try:
            again = _client(url)
            try:
                again.infer(obs)
                return time.monotonic() - killed_at, True
            finally:
                again.close()
        except Exception:  # noqa: BLE001 - the router still places it on the dead replica: retry
            time.sleep(0.05)
    return None, False


@dataclass(frozen=True)
class LossOutcome:
    """(c)'s figures per kind: seconds from the kill to each resumed session's first reply on the
    other replica, how many were on the lost replica, how many of them were not served again."""

    resumed: list[float]
    on_lost_replica: int
    lost: int
    restored: list[float] = dataclasses.field(default_factory=list)  # voice: before its reply
    reply_before: list[float] = dataclasses.field(default_factory=list)  # voice: a reply, no loss
    why_lost: list[str] = dataclasses.field(default_factory=list)


def open_voices(url: str, voices: int) -> list[VoiceEpisode]:
    """The voice sessions of (c); none, with the reason printed, where the kind does not serve
    (the voice kind's packages missing: the device image has none of them)."""
    try:
        return [VoiceEpisode.open(url, i) for i in range(voices)]
    except Exception as exc:  # noqa: BLE001 - the reason is the figure's caveat
        print(f"(c) voice sessions not measured: {type(exc).__name__}: {exc}")
        return []


def replica_loss(url: str, clients: int, voices: int) -> dict[str, LossOutcome]:
    """(c): ``clients`` robots and ``voices`` voice sessions over two replicas, one replica killed."""
    robots = [_client(url) for _ in range(clients)]
    episodes = [{**examples.libero(0), "session_id": f"bench-episode-{i}"} for i in range(clients)]
    for client, obs in zip(robots, episodes, strict=True):
        client.infer(obs)
        client.infer(obs)  # a chunk to checkpoint
    spoken = open_voices(url, voices)
    replying = [threading.Thread(target=episode.reply) for episode in spoken]  # all at once, as after
    for thread in replying:
        thread.start()
    for thread in replying:
        thread.join()
    time.sleep(0.5)  # > replicas.checkpoint_interval_s: every episode's last chunk is stored
    victim = status(url)["replicas"][0]
    os.kill(victim["pid"], signal.SIGKILL)
    killed_at = time.monotonic()
    robot_outcomes: list[tuple[float | None, bool]] = [(None, False)] * clients
    lost_voices = [v for v in spoken if session_replica_tag(v.session_id) == victim["replica"]]
    voice_outcomes: list[Resumed | str] = ["not run"] * len(lost_voices)

    def robot(i: int) -> None:
        robot_outcomes[i] = _served_again(url, robots[i], episodes[i], killed_at)

    def voice(i: int) -> None:
        voice_outcomes[i] = lost_voices[i].reply_after_loss(killed_at, RESUME_DEADLINE_S)

    threads = [threading.Thread(target=robot, args=(i,)) for i in range(clients)]
    threads += [threading.Thread(target=voice, args=(i,)) for i in range(len(lost_voices))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for robot_client in robots:
        with contextlib.suppress(Exception):
            robot_client.close()
    for spoken_episode in spoken:
        spoken_episode.close()
    robot_resumed = [s for s, _ in robot_outcomes if s is not None]
    return {
        "robot": LossOutcome(
            robot_resumed,
            on_lost_replica=len(robot_resumed) + sum(1 for _, served in robot_outcomes if not served),
            lost=sum(1 for _, served in robot_outcomes if not served),
        ),
        "voice": LossOutcome(
            [s.first_audio_s for s in voice_outcomes if isinstance(s, Resumed)],
            restored=[s.restored_s for s in voice_outcomes if isinstance(s, Resumed)],
            reply_before=[v.reply_before_s for v in lost_voices if v.reply_before_s is not None],
            on_lost_replica=len(lost_voices),
            lost=sum(1 for s in voice_outcomes if isinstance(s, str)),
            why_lost=sorted({s for s in voice_outcomes if isinstance(s, str)}),
        ),
    }


def proxy_cost(args: argparse.Namespace, zeros: Any, first: tuple[int, ...] | None, ports: Ports) -> dict:
    """(a): one robot, the zeros policy, alternating blocks direct and through the ingress; then
    direct and through Serve's proxy (the path of HTTP requests, and of ``serve run``)."""
    direct_robot = {"device": args.device}
    with (
        direct_on(first, "zeros", args.threads, direct_robot) as direct,
        serve_app(zeros, 1, ports) as ingress,
    ):
        samples = overhead(ingress, direct, examples.libero(0), args.requests, args.blocks)
        via_proxy = overhead(ports.url("proxy"), direct, examples.libero(0), args.requests, args.blocks)
    direct_p50, ingress_p50 = _ms(samples["peer"], 50), _ms(samples["ours"], 50)
    proxy_direct_p50, proxy_p50 = _ms(via_proxy["peer"], 50), _ms(via_proxy["ours"], 50)
    print(
        f"(a) zeros policy, LIBERO, one robot: direct p50 {direct_p50} ms, through the ingress "
        f"{ingress_p50} ms; direct {proxy_direct_p50} ms, through Serve's proxy {proxy_p50} ms"
    )
    return {
        "proxy_added_p50_ms": round(ingress_p50 - direct_p50, 2),
        "direct_p50_ms": direct_p50,
        "proxy_p50_ms": ingress_p50,
        "serve_proxy_added_p50_ms": round(proxy_p50 - proxy_direct_p50, 2),
    }


def replicas_and_loss(
    args: argparse.Namespace, model: Any, first: tuple[int, ...] | None, ports: Ports, parts: set[str]
) -> dict:
    """(b): direct, one replica, two replicas at the same load; (c): one of two replicas killed."""
    runs: dict[str, tuple[float, list[float], list[dict]]] = {}
    results: dict[str, Any] = {}
    if "b" in parts:
        with direct_on(first, args.policy, args.threads, {"device": args.device}) as direct:
            runs["direct"] = throughput(direct, args.clients, args.seconds)
    with serve_app(model, 1 if "b" in parts else 2, ports) as proxied:
        if "b" in parts:
            runs["1 replica"] = throughput(proxied, args.clients, args.seconds)
            scale_to(model, 2, ports)
            runs["2 replicas"] = throughput(proxied, args.clients, args.seconds)
        if "c" in parts:
            outcomes = replica_loss(proxied, args.clients, args.voice_sessions)
    if runs:
        where = f"{os.cpu_count()} cores" + (", one GPU per replica" if args.device == "cuda" else "")
        if first:
            where += f", {CoreSplit.of(model).describe()}"
        print(f"(b) {args.policy}, {args.clients} robots closed loop, {args.seconds:g} s each, {where}:")
        print("    server        chunks/s   p50 ms   p99 ms  mean batch")
        for name, (rate, latencies, timings) in runs.items():
            line = f"    {name:<12} {rate:9.1f} {_ms(latencies, 50):8.1f} {_ms(latencies, 99):8.1f}"
            print(f"{line} {_mean_batch(timings):11.2f}")
        rate_1, rate_2 = runs["1 replica"][0], runs["2 replicas"][0]
        results |= {
            "throughput_ratio_2_vs_1": round(rate_2 / rate_1, 3) if rate_1 else None,
            "chunks_per_s": {name: round(rate, 1) for name, (rate, _, _) in runs.items()},
            "p99_ms": {name: _ms(latencies, 99) for name, (_, latencies, _) in runs.items()},
            "mean_batch": {name: round(_mean_batch(timings), 2) for name, (_, _, timings) in runs.items()},
        }
    if "c" in parts:
        results |= loss_figures(outcomes, args)
    return results


def _slowest_ms(seconds: list[float]) -> float | None:
    return round(max(seconds) * 1000, 1) if seconds else None


def loss_figures(outcomes: dict[str, LossOutcome], args: argparse.Namespace) -> dict:
    """(c)'s lines and keys: ``resume_after_loss_ms`` is the slowest resumed session of any kind,
    ``lost_sessions`` the sessions of every kind not served again; each kind's own beside them."""
    offered = {"robot": args.clients, "voice": args.voice_sessions}
    results: dict[str, Any] = {}
    for kind, outcome in outcomes.items():
        if not offered[kind]:
            continue
        slowest = _slowest_ms(outcome.resumed)
        reply = "reply" if kind == "robot" else "audio of a reply"
        line = (
            f"(c) one of two replicas killed: {offered[kind]} {kind} sessions, {outcome.on_lost_replica} "
            f"on it, {len(outcome.resumed)} resumed on the other: slowest first {reply} {slowest} ms after the kill"
        )
        if outcome.restored:
            results[f"restore_after_loss_ms_{kind}"] = _slowest_ms(outcome.restored)
            results[f"reply_ms_before_loss_{kind}"] = _slowest_ms(outcome.reply_before)
            line += (
                f" (its conversation back after {_slowest_ms(outcome.restored)} ms; the same sessions' "
                f"replies before the loss, all at once: first audio after {_slowest_ms(outcome.reply_before)} ms)"
            )
        print(f"{line}; {outcome.lost} not served again within {RESUME_DEADLINE_S:g} s")
        for why in outcome.why_lost:
            print(f"    lost: {why}")
        results |= {
            f"resume_after_loss_ms_{kind}": slowest,
            f"lost_sessions_{kind}": outcome.lost,
            f"resumed_after_loss_{kind}": len(outcome.resumed),
        }
    return {
        "resume_after_loss_ms": _slowest_ms([s for outcome in outcomes.values() for s in outcome.resumed]),
        "lost_sessions": sum(outcome.lost for outcome in outcomes.values()),
        **results,
    }


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="realtime bench scale", description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=200, help="(a): round trips per server")
    p.add_argument("--blocks", type=int, default=10, help="(a): alternating blocks")
    p.add_argument(
        "--clients",
        type=int,
        default=2 * ROBOT_MAX_BATCH,
        help="(b), (c): concurrent robots (default: two full batches, so both replicas run full ones)",
    )
    p.add_argument(
        "--voice-sessions",
        type=int,
        default=4,
        help="(c): voice sessions through the openai SDK beside the robots (0: robots only)",
    )
    p.add_argument("--seconds", type=float, default=10.0, help="(b): seconds per measurement")
    p.add_argument("--threads", type=int, default=1, help="torch threads per server and replica")
    p.add_argument("--policy", default="pi0-tiny", help="(b), (c): the policy (pi0-shaped on a GPU)")
    p.add_argument(
        "--device", choices=["cpu", "cuda"], default="cpu", help="robot.device; cuda: one GPU per replica"
    )
    p.add_argument("--cpus-per-replica", type=float, default=0.5, help="replicas.num_cpus")
    p.add_argument(
        "--cores",
        metavar="LIST",
        help="a CPU list ('12-15'): each replica on --cpus-per-replica cores of its own, the rest for "
        "the clients and Ray (module docstring)",
    )
    p.add_argument("--parts", default="a,b,c", help="the sections to run, e.g. 'a' or 'b' (module docstring)")
    return p


def main(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    parts = set(args.parts.split(","))
    if not parts or parts - {"a", "b", "c"}:
        parser.error(f"--parts: sections are a, b, c; got {args.parts!r}")
    if args.device == "cuda":
        import torch

        if torch.cuda.device_count() < 2:
            print(
                f"bench scale --device cuda: needs 2 CUDA devices, found {torch.cuda.device_count()}; skipped"
            )
            return 0
    try:
        import ray

        from realtime.scale.launch import check_config, start_ray
    except ImportError:
        print("bench scale needs Ray Serve: pip install -e '.[ray]'", file=sys.stderr)
        return 2
    cores, load = os.cpu_count() or 1, os.getloadavg()
    try:
        voice = "c" in parts and args.voice_sessions > 0
        if voice and (why := why_voice_cannot_serve()) is not None:
            print(f"(c) voice sessions not measured: this machine cannot serve the voice kind ({why})")
            voice, args.voice_sessions = False, 0
        zeros, model = replica_config("zeros", args), replica_config(args.policy, args, voice)
        check_config(model, "--cores", 2)
    except ConfigError as exc:
        print(f"bench scale: {exc}", file=sys.stderr)
        return 2
    split = CoreSplit.of(model) if args.cores else None
    if split is not None:
        pin_process(split.rest)  # before Ray starts: its processes inherit it
    first = split.first if split else None
    ports = Ports(ingress=_free_port(), proxy=_free_port())
    start_ray(model, 2, None)
    results: dict[str, Any] = {}
    try:
        if "a" in parts:
            results |= proxy_cost(args, zeros, first, ports)
        if parts & {"b", "c"}:
            results |= replicas_and_loss(args, model, first, ports, parts)
    finally:
        ray.shutdown()
    results |= {
        "clients": args.clients,
        "cores": cores,
        "replica_cores": args.cores,
        "load_avg_at_start": [round(x, 2) for x in load],
    }
    for key in ("proxy_added_p50_ms", "throughput_ratio_2_vs_1", "resume_after_loss_ms", "lost_sessions"):
        if key in results:
            print(f"{key}: {results[key]}{goal_note('scale', key)}")
    print(json.dumps(results))
    return 0
