"""``realtime bench engine``: cross-session batching vs one session per forward (``max_batch=1``).

A real torch stage on CPU whose forward costs roughly ``a + b * batch``: a fixed block of
matmuls per forward (standing in for what a GPU forward pays regardless of batch: streaming the
weights, kernel launches) plus a per-item block (each item's tokens through the same weights).
No sleeps. N sessions tick at a target rate on one event loop through one ``StageEngine``;
each tick awaits its result before the next (a robot's control loop). Runs, side by side:

- single session (batched engine): the single-session tick latency the goal compares against;
- N sessions, ``max_batch=1`` (time-sliced: every tick is its own forward);
- N sessions, ``max_batch=N`` with phases aligned (every session ticks on the same clock);
- N sessions, ``max_batch=N`` with random phases (ticks spread over the period; shown, not a goal).

Headline (last line, JSON): ``throughput_ratio`` = batched / unbatched aggregate ticks/s at N
sessions; ``p99_ratio`` = batched p99 tick latency / single-session p50 tick latency. Goal at 8
sessions: throughput_ratio >= 3 and p99_ratio <= 2. The default rate (``--rate auto``) loads
the batched engine to about 70 % of its measured capacity.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from dataclasses import dataclass

import torch
from prometheus_client import CollectorRegistry

from realtime.bench.goals import goal_note
from sessions.engine import StageEngine


class MatmulStage:
    """Cost ~ a + b*batch: ``fixed_reps`` square matmuls, then ``item_reps`` over the batch's tokens."""

    device = "cpu"

    def __init__(
        self, width: int, tokens: int, fixed_reps: int, item_reps: int, name: str = "bench-matmul"
    ) -> None:
        self.name = name
        gen = torch.Generator().manual_seed(0)
        self.weight = torch.randn(width, width, generator=gen) / width**0.5
        self.context = torch.randn(width, width, generator=gen)
        self.tokens = tokens
        self.fixed_reps = fixed_reps
        self.item_reps = item_reps

    def make_input(self, seed: int) -> torch.Tensor:
        return torch.randn(self.tokens, self.weight.shape[0], generator=torch.Generator().manual_seed(seed))

    def forward(self, items):
        h = self.context
        for _ in range(self.fixed_reps):
            h = torch.tanh(h @ self.weight)
        x = torch.stack([item.payload for item in items])
        for _ in range(self.item_reps):
            x = torch.tanh(x @ self.weight)
        return list((x[:, 0, 0] + h[0, 0]).tolist())


@dataclass
class RunResult:
    label: str
    sessions: int
    max_batch: int
    ticks_per_s: float
    p50_ms: float
    p99_ms: float
    mean_batch: float
    forward_ms: float


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def calibrate(stage: MatmulStage, repeats: int = 7) -> tuple[float, float]:
    """Fit ``a`` and ``b`` (seconds) from median forward times at batch 1 and 8."""
    from models.stage import StageItem

    def timed(batch: int) -> float:
        items = [StageItem(f"s{i}", 0, stage.make_input(i)) for i in range(batch)]
        samples = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            stage.forward(items)
            samples.append(time.perf_counter() - t0)
        return statistics.median(samples)

    timed(1)  # warm up
    one, eight = timed(1), timed(8)
    b = max((eight - one) / 7, 1e-6)
    return max(one - b, 1e-6), b


async def run(
    stage: MatmulStage,
    label: str,
    sessions: int,
    max_batch: int,
    rate_hz: float,
    duration_s: float,
    phases: str,
) -> RunResult:
    registry = CollectorRegistry()
    engine = StageEngine(stage, registry=registry, max_batch=max_batch, coalesce_window_s=0.005)
    ids = [f"s{i}" for i in range(sessions)]
    for sid in ids:
        await engine.open(sid)
    inputs = {sid: stage.make_input(i) for i, sid in enumerate(ids)}
    period = 1.0 / rate_hz
    rng = random.Random(0)
    loop = asyncio.get_running_loop()
    warmup_s = min(0.5, duration_s / 4)
    start = loop.time() + 0.05
    measure_from, end = start + warmup_s, start + warmup_s + duration_s
    latencies: list[float] = []
    done = 0

    async def session(sid: str) -> None:
        nonlocal done
        next_t = start + (rng.random() * period if phases == "random" else 0.0)
        while True:
            await asyncio.sleep(max(0.0, next_t - loop.time()))
            t0 = loop.time()
            if t0 >= end:
                return
            await engine.submit(sid, 0, inputs[sid])
            t1 = loop.time()
            if t0 >= measure_from and t1 <= end:
                latencies.append(t1 - t0)
                done += 1
            next_t = max(next_t + period, loop.time())  # a late tick runs at once; no backlog

    await asyncio.gather(*(session(sid) for sid in ids))
    await engine.close()
    if not latencies:
        raise SystemExit(
            f"realtime bench engine: no tick of '{label}' both started and ended within the measured "
            f"{duration_s:g} s: raise --duration"
        )
    labels = {"stage": stage.name}
    count = registry.get_sample_value("engine_batch_size_count", labels) or 1
    total = registry.get_sample_value("engine_batch_size_sum", labels) or 0
    forward_s = registry.get_sample_value("engine_forward_seconds_sum", labels) or 0
    return RunResult(
        label,
        sessions,
        max_batch,
        done / duration_s,
        _percentile(latencies, 0.5) * 1000,
        _percentile(latencies, 0.99) * 1000,
        total / count,
        forward_s / count * 1000,
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="realtime bench engine", description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--duration", type=float, default=4.0, help="measured seconds per run")
    parser.add_argument(
        "--rate", default="auto", help="ticks/s per session, or 'auto' (~70%% of batched capacity)"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=16, help="tokens per item (per-item cost b)")
    parser.add_argument("--fixed-reps", type=int, default=24, help="fixed matmuls per forward (cost a)")
    parser.add_argument("--item-reps", type=int, default=16)
    args = parser.parse_args(argv)
    threads_before = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        return _bench(args)
    finally:
        torch.set_num_threads(threads_before)


def _bench(args: argparse.Namespace) -> int:
    stage = MatmulStage(args.width, args.tokens, args.fixed_reps, args.item_reps)
    a, b = calibrate(stage)
    n = args.sessions
    rate = 0.7 / (a + n * b) if args.rate == "auto" else float(args.rate)
    print(
        f"engine bench: stage cost a={a * 1000:.2f} ms + b={b * 1000:.2f} ms/item (fit at batch 1 and 8), "
        f"{n} sessions at {rate:.1f} ticks/s each, {args.duration:.1f} s per run, torch threads={args.threads}"
    )

    async def all_runs() -> list[RunResult]:
        return [
            await run(stage, "single session", 1, n, rate, args.duration, "aligned"),
            await run(stage, "unbatched (max_batch=1)", n, 1, rate, args.duration, "aligned"),
            await run(stage, "batched", n, n, rate, args.duration, "aligned"),
            await run(stage, "batched, random phases", n, n, rate, args.duration, "random"),
        ]

    single, unbatched, batched, random_phases = asyncio.run(all_runs())
    print(
        f"{'run':<26}{'sessions':>9}{'max_batch':>10}{'ticks/s':>10}{'p50 ms':>9}{'p99 ms':>9}{'mean batch':>11}{'forward ms':>11}"
    )
    for r in (single, unbatched, batched, random_phases):
        print(
            f"{r.label:<26}{r.sessions:>9}{r.max_batch:>10}{r.ticks_per_s:>10.1f}"
            f"{r.p50_ms:>9.1f}{r.p99_ms:>9.1f}{r.mean_batch:>11.2f}{r.forward_ms:>11.1f}"
        )
    throughput_ratio = batched.ticks_per_s / unbatched.ticks_per_s
    p99_ratio = batched.p99_ms / single.p50_ms
    throughput_goal, p99_goal = goal_note("engine", "throughput_ratio"), goal_note("engine", "p99_ratio")
    print(
        f"ratios at {n} sessions: throughput batched/unbatched = {throughput_ratio:.2f}x{throughput_goal}; "
        f"p99 batched / single-session p50 = {p99_ratio:.2f}x{p99_goal}; "
        f"unbatched p99 / single = {unbatched.p99_ms / single.p50_ms:.2f}x; "
        f"random-phase p99 / single = {random_phases.p99_ms / single.p50_ms:.2f}x"
    )
    print(
        json.dumps(
            {
                "throughput_ratio": round(throughput_ratio, 3),
                "p99_ratio": round(p99_ratio, 3),
                "sessions": n,
                "batched_ticks_per_s": round(batched.ticks_per_s, 1),
                "unbatched_ticks_per_s": round(unbatched.ticks_per_s, 1),
                "single_p50_ms": round(single.p50_ms, 2),
                "batched_p99_ms": round(batched.p99_ms, 2),
                "random_phase_p99_ratio": round(random_phases.p99_ms / single.p50_ms, 3),
            }
        )
    )
    return 0
