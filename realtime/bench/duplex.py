"""``realtime bench duplex``: how many duplex sessions keep the 80 ms frame deadline, lockstep
batching vs stepping sessions one by one (Moshi's server: one session per forward).

The real duplex stage (``--model``, the embedded ``duplex-small`` by default) steps ``n``
sessions for ``--periods`` frames, for ``n`` = 1, 2, 4, ... up to ``--max-sessions``:

- **lockstep**: one batched forward of all ``n`` sessions per period (what the duplex kind's frame
  clock runs); a period meets its deadline when that forward took under the period;
- **serial**: ``n`` forwards of one session each per period, back to back; session ``i``'s frame
  is on time when the first ``i + 1`` forwards finished within the period.

Compute only (no sleeping between periods): the figures are the device's, not the loop's. For
each ``n`` and mode: p50/p99 of the period's compute, and the **continuous-play ratio** per
session (frames on time / frames; its minimum over sessions is shown). ``max_sessions_<mode>`` is
the largest ``n`` whose p99 period compute is under the period. Finally the lockstep maximum is
served through the real ``StageEngine`` + ``FrameClock`` for ``--periods`` frames (late and missed
steps counted, from the first full-batch steps on), which adds the scheduler's own overhead.

``--cuda-graphs off`` steps the embedded model eagerly on CUDA (the default replays its step
from CUDA graphs, ``duplex.cuda_graphs``); ``--sizes`` picks the session counts (default 1, 2,
4, ... up to ``--max-sessions``); ``--serial-max`` caps the serial mode's session counts (0: no
serial runs; serial at large counts costs ``n`` forwards per period).

The last line is one JSON object: ``max_sessions_80ms`` (= ``max_sessions_lockstep``),
``max_sessions_serial``, the step time (ms, p50 and p99) per batch size, the step mode that ran
(``graph_error`` if a capture fell back to eager), the engine check, and on CUDA
``max_sessions_memory``: the sessions the device's memory holds in all at ``state_bytes_per_session``
(``--kv-cache fp8``: the temporal KV in FP8, ``duplex.kv_cache``), the bound ``--max-sessions``
cannot pass.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

from prometheus_client import CollectorRegistry

from models.duplex.stage import FRAME_MS
from models.stage import StageItem
from realtime.config import DuplexConfig
from realtime.kinds.duplex_model import build_stage
from sessions.engine import StageEngine
from sessions.engine.dispatch import FrameClock

PERIOD_S = FRAME_MS / 1000


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _items(stage: Any, n: int) -> list[StageItem]:
    return [
        StageItem(f"s{i}", 0, stage.silence(), slot=i, state=stage.open_state(f"s{i}", i)) for i in range(n)
    ]


def run_mode(stage: Any, n: int, periods: int, serial: bool) -> dict[str, float]:
    """One mode at ``n`` sessions: period compute p50/p99 (ms) and the worst session's on-time ratio."""
    items = _items(stage, n)
    stage.forward(items)  # warm-up
    period_s, on_time = [], [0] * n
    for _ in range(periods):
        t0 = time.perf_counter()
        if serial:
            for i, item in enumerate(items):
                stage.forward([item])
                on_time[i] += time.perf_counter() - t0 <= PERIOD_S
        else:
            stage.forward(items)
            done = time.perf_counter() - t0 <= PERIOD_S
            on_time = [k + done for k in on_time]
        period_s.append(time.perf_counter() - t0)
    for item in items:
        stage.release_state(item.session_id, item.slot, item.state)
    return {
        "p50_ms": 1000 * statistics.median(period_s),
        "p99_ms": 1000 * _p(period_s, 0.99),
        "min_continuous_play": min(on_time) / periods,
    }


async def engine_check(stage: Any, n: int, periods: int) -> dict[str, float]:
    """``n`` sessions through the real engine under the frame clock for ``periods`` frames."""
    outputs: dict[str, int] = {}
    clock = FrameClock(
        PERIOD_S,
        silence=lambda sid: stage.silence(),
        on_output=lambda sid, out: outputs.update({sid: outputs.get(sid, 0) + 1}),
    )
    engine = StageEngine(stage, registry=CollectorRegistry(), max_batch=n, dispatch=clock, max_sessions=n)
    for i in range(n):
        await engine.open(f"e{i}")
    # measure from the first full-batch steps on: opening a session (its slot reset) queues behind
    # the steps already running, and the first step at each new batch size warms kernels up
    while len(outputs) < n or min(outputs.values()) < 2:
        await asyncio.sleep(PERIOD_S / 4)
    base = (clock.steps, clock.late_steps, clock.missed_steps, dict(outputs))
    await asyncio.sleep(periods * PERIOD_S)
    await engine.close()
    steps = max(1, clock.steps - base[0])
    return {
        "sessions": n,
        "steps": clock.steps - base[0],
        "late_steps": clock.late_steps - base[1],
        "missed_steps": clock.missed_steps - base[2],
        "min_outputs_per_step": min(outputs[sid] - base[3][sid] for sid in outputs) / steps,
    }


def memory_bound(stage: Any, slots: int, device: str) -> int | None:
    """Sessions the device holds in all: the stage's ``slots`` (allocated) plus what its free
    memory would hold more at ``state_bytes`` each (None off CUDA). The step's activations and the
    graphs' pool are already allocated, so this is the capacity plan's ceiling, not a margin."""
    if not device.startswith("cuda"):
        return None
    import torch

    free, _ = torch.cuda.mem_get_info(torch.device(device))
    return slots + int(free // stage.state_bytes())


def _sizes(spec: str, max_sessions: int) -> list[int]:
    """The session counts to measure: ``spec`` (comma-separated, each in ``1 .. max_sessions``)
    or 1, 2, 4, ... and ``max_sessions``."""
    if spec:
        sizes = sorted({int(n) for n in spec.split(",")})
        if sizes[0] < 1 or sizes[-1] > max_sessions:
            raise SystemExit(f"--sizes must lie in 1 .. --max-sessions ({max_sessions})")
        return sizes
    sizes, b = [], 1
    while b < max_sessions:
        sizes.append(b)
        b *= 2
    return [*sizes, max_sessions]


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="realtime bench duplex", description=__doc__.splitlines()[0])
    p.add_argument(
        "--model",
        default="duplex-small",
        choices=["duplex-small", "duplex-test", "moshi-7b-shaped", "moshi-test"],
    )
    p.add_argument("--device", default="cpu")
    p.add_argument("--max-sessions", type=int, default=16)
    p.add_argument("--periods", type=int, default=25, help="frames per measurement (25 = 2 s of audio)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--cuda-graphs", choices=["on", "off"], default="on", help="embedded models on CUDA")
    p.add_argument("--sizes", default="", help="session counts, comma-separated (default: powers of two)")
    p.add_argument("--serial-max", type=int, default=None, help="largest serial session count (0: none)")
    p.add_argument(
        "--kv-cache",
        choices=["model", "fp8"],
        default="model",
        help="duplex.kv_cache: the temporal KV's storage",
    )
    args = p.parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    config = DuplexConfig(
        model=args.model, device=args.device, cuda_graphs=args.cuda_graphs == "on", kv_cache=args.kv_cache
    )
    t0 = time.perf_counter()
    stage = build_stage(config, args.max_sessions)
    build_s = time.perf_counter() - t0
    memory = memory_bound(stage, args.max_sessions, args.device)
    sizes = _sizes(args.sizes, args.max_sessions)
    serial_max = args.max_sessions if args.serial_max is None else args.serial_max
    mode = getattr(stage, "step_mode", "eager")
    graph_error = getattr(stage, "graph_error", None)
    table: dict[str, dict[int, dict[str, float]]] = {"lockstep": {}, "serial": {}}
    print(
        f"duplex {args.model} on {args.device}: period {FRAME_MS} ms, {args.periods} frames per point, "
        f"step mode {mode} (built in {build_s:.1f} s)"
    )
    if graph_error:
        print(f"CUDA graphs fell back to eager: {graph_error}")
    print(
        f"KV {args.kv_cache}: {stage.state_bytes() / 1e9:.3f} GB per session"
        + (f"; the device's free memory admits {memory} sessions in all" if memory else "")
    )
    print(
        f"{'sessions':>8} | {'lockstep p50/p99 ms':>20} {'play':>5} | {'serial p50/p99 ms':>18} {'play':>5}"
    )
    for n in sizes:
        table["lockstep"][n] = lo = run_mode(stage, n, args.periods, serial=False)
        line = f"{n:>8} | {lo['p50_ms']:>9.1f} / {lo['p99_ms']:>7.1f} {lo['min_continuous_play']:>5.2f} | "
        if n <= serial_max:
            table["serial"][n] = se = run_mode(stage, n, args.periods, serial=True)
            line += f"{se['p50_ms']:>7.1f} / {se['p99_ms']:>7.1f} {se['min_continuous_play']:>5.2f}"
        print(line)
    best = {
        mode: max([n for n, r in rows.items() if r["p99_ms"] < FRAME_MS], default=0)
        for mode, rows in table.items()
    }
    check = (
        asyncio.run(engine_check(stage, max(1, best["lockstep"]), args.periods)) if best["lockstep"] else {}
    )
    print(f"max sessions within the deadline: lockstep {best['lockstep']}, serial {best['serial']}")
    print(f"engine check at {best['lockstep']} sessions: {check}")
    figures = {
        "max_sessions_80ms": best["lockstep"],
        "max_sessions_lockstep": best["lockstep"],
        "max_sessions_serial": best["serial"],
        "max_sessions_memory": memory,
        "kv_cache": args.kv_cache,
        "state_bytes_per_session": stage.state_bytes(),
        "model": args.model,
        "device": args.device,
        "period_ms": FRAME_MS,
        "step_mode": getattr(stage, "step_mode", "eager"),
        "graph_error": graph_error,
        "build_s": round(build_s, 1),
        "step_ms_by_batch": {n: round(r["p50_ms"], 2) for n, r in table["lockstep"].items()},
        "step_p99_ms_by_batch": {n: round(r["p99_ms"], 2) for n, r in table["lockstep"].items()},
        "continuous_play_lockstep": {n: r["min_continuous_play"] for n, r in table["lockstep"].items()},
        "continuous_play_serial": {n: r["min_continuous_play"] for n, r in table["serial"].items()},
        "engine_check": check,
    }
    print(json.dumps(figures))
    return 0
