"""Section (f) of ``realtime bench robot``: the policy's forward alone, compiled or not, and
its attention kernel.

What a robot tick costs on the device without the server around it: the served policy
(``realtime.kinds.robot.build_policy``, warmed up as the server warms it: CUDA graphs per bucket)
replays its forward on LIBERO observations at each batch size of ``--forward-batches``, timed with
CUDA events (median of ``reps`` replays after warm-up). Three policies are built in the same
process, so their ratios compare like with like on one device: uncompiled, compiled with the
masked SDPA attention kernel (``Pi0.attention = "sdpa"``, the model before its keys were packed)
and compiled as served (``robot.attention``: FlashAttention-2's variable-length kernel over
packed keys where it runs). MFU is the forward's FLOPs (``torch.utils.flop_counter`` over one
eager forward: the matmuls and attention) per second over the dense bf16 peak (``--peak-tflops``).

``--profile`` adds, per batch size and setting, the CUDA kernels of one forward without graphs
grouped by kind (GEMM, attention, normalisation, elementwise, copies), the split that says
where a forward's time goes.

JSON keys: ``forward_ms_N`` (compiled: the served default on CUDA), ``forward_ms_N_eager``,
``forward_ms_N_masked``, ``compile_speedup_N`` (uncompiled / served), ``packed_speedup_N``
(masked / served), ``tflop_N``, ``mfu_N`` (of the served forward).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch

from realtime.bench import examples


def _policy(config: Any, compile_layers: bool, max_batch: int, attention: str | None = None) -> Any:
    from realtime.kinds.robot import build_policy

    attention = attention or config.attention
    policy = build_policy(replace(config, compile=compile_layers, max_batch=max_batch, attention=attention))
    policy.warmup(max_batch)
    return policy


def _args(policy: Any, batch: int) -> tuple[torch.Tensor, ...]:
    items = [policy.prepare(examples.libero(seed=i)) for i in range(batch)]
    return policy.collate(items).as_args(policy.device)


def _median_ms(fn: Callable[[], Any], reps: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _flops(policy: Any, args: Sequence[torch.Tensor]) -> float:
    from torch.utils.flop_counter import FlopCounterMode

    model, attention = policy.model, policy.model.attention
    model.attention = "sdpa"  # the counter has no formula for the variable-length kernel
    try:
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            model(*args)
    finally:
        model.attention = attention
    return float(counter.get_total_flops())


KERNEL_KINDS = (
    ("attention", ("fmha", "flash", "attention", "sdpa", "cudnn")),
    ("gemm", ("gemm", "sm90", "cutlass", "nvjet", "matmul", "xmma")),
    ("norm", ("norm",)),
    ("copy", ("copy", "cat", "fill", "index")),
)


def kernel_split(policy: Any, args: Sequence[torch.Tensor]) -> dict[str, tuple[int, float]]:
    """Kernels of one eager forward by kind: ``{kind: (count, device ms)}``."""
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad():
        policy.model(*args)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            policy.model(*args)
            torch.cuda.synchronize()
    split: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for event in prof.key_averages():
        if event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        name = event.key.lower()
        kind = next((k for k, marks in KERNEL_KINDS if any(m in name for m in marks)), "elementwise")
        split[kind][0] += event.count
        split[kind][1] += event.device_time_total / 1000
    return {k: (int(n), round(ms, 2)) for k, (n, ms) in sorted(split.items())}


def forward_section(
    config: Any, batches: Sequence[int], peak_tflops: float, reps: int = 20, profile_kernels: bool = False
) -> dict[str, Any]:
    """Section (f) (the module docstring); ``config`` is the served ``RobotConfig`` on CUDA."""
    if not torch.cuda.is_available():
        print("(f) needs a CUDA device: skipped")
        return {}
    results: dict[str, Any] = {}
    policies = {
        "eager": _policy(config, False, max(batches)),
        "masked": _policy(config, True, max(batches), attention="sdpa"),
        "compiled": _policy(config, True, max(batches)),
    }
    served = policies["compiled"].model.attention_kernel()
    print(
        f"(f) {config.policy} forward alone, CUDA graphs, LIBERO; median of {reps} replays; served kernel {served}"
    )
    print("  batch | uncompiled ms | compiled, masked ms | compiled ms | speedups | TFLOP | MFU (compiled)")
    for n in batches:
        ms = {}
        for name, policy in policies.items():
            args = _args(policy, n)
            ms[name] = _median_ms(lambda p=policy, a=args: p.graphs(*a), reps)
        flops = _flops(policies["eager"], _args(policies["eager"], n))
        mfu = flops / (ms["compiled"] / 1000) / (peak_tflops * 1e12)
        speedups = ms["eager"] / ms["compiled"], ms["masked"] / ms["compiled"]
        print(
            f"  {n:5d} | {ms['eager']:13.2f} | {ms['masked']:18.2f} | {ms['compiled']:11.2f} "
            f"| {speedups[0]:.2f}, {speedups[1]:.2f} | {flops / 1e12:5.2f} | {mfu:.3f}"
        )
        results[f"forward_ms_{n}"] = round(ms["compiled"], 2)
        results[f"forward_ms_{n}_eager"] = round(ms["eager"], 2)
        results[f"forward_ms_{n}_masked"] = round(ms["masked"], 2)
        results[f"compile_speedup_{n}"] = round(speedups[0], 3)
        results[f"packed_speedup_{n}"] = round(speedups[1], 3)
        results[f"tflop_{n}"] = round(flops / 1e12, 3)
        results[f"mfu_{n}"] = round(mfu, 3)
        for name, policy in policies.items() if profile_kernels else ():
            split = kernel_split(policy, _args(policy, n))
            print(f"    {name}: kernels of one forward without graphs, batch {n} (kind: count, ms): {split}")
    return results
