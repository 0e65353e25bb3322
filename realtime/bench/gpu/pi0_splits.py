"""pi0's forward at its real size with FlashAttention-2's keys split and whole, on one GPU.

``models.policy.pi0.key_splits`` cuts each row's keys into parts where a call leaves the GPU
idle (an action step at batch 1 is 8 CTAs); this times the whole forward (SigLIP, the prefix, the
state token, the 10 flow steps) replayed from a CUDA graph at each batch size, with the splits the
model chooses and with every call whole, in one process on random weights (pi0's shape, bf16,
LIBERO-like inputs: 2 cameras, a 9-token prompt in a 16-token width). ``--compile`` compiles the
layers as served (``robot.compile``); without it the layers run eagerly inside the graph.
The last line is one JSON object: ``forward_ms_N_split``, ``forward_ms_N_whole``,
``split_speedup_N`` and ``max_abs_diff_N`` (actions, split against whole).

Usage on the device machine: ``python3 realtime/bench/gpu/pi0_splits.py [--compile] [--batches 1,8]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import replace

import torch

from models.policy.pi0 import PI0, Pi0, build


def _inputs(batch: int, c) -> tuple[torch.Tensor, ...]:  # noqa: ANN001
    gen = torch.Generator(device="cuda").manual_seed(0)
    images = torch.randint(0, 256, (batch, 2, c.image_size, c.image_size, 3), device="cuda", generator=gen)
    tokens = torch.randint(0, c.vocab_size, (batch, 16), device="cuda", generator=gen)
    token_mask = torch.arange(16, device="cuda")[None].expand(batch, 16) < 9
    state = torch.randn(batch, c.state_dim, device="cuda", generator=gen)
    image_mask = torch.ones(batch, 2, dtype=torch.bool, device="cuda")
    return images.to(torch.uint8), image_mask, tokens, token_mask.contiguous(), state


def _graph_ms(model: Pi0, args: tuple[torch.Tensor, ...], reps: int) -> tuple[float, torch.Tensor]:
    """Median ms of one graph replay of the whole forward, and its actions."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.no_grad():
        for _ in range(3):
            model(*args)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        out = model(*args)
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times), out.clone()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compile", action="store_true", help="compile the layers (robot.compile)")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--reps", type=int, default=30)
    opts = parser.parse_args()
    config = replace(PI0, vocab_size=257)
    t0 = time.perf_counter()
    model = build(config, "cuda")
    if opts.compile:
        model.compile_layers()
    print(
        f"{torch.cuda.get_device_name()} torch {torch.__version__}; pi0 shape built in {time.perf_counter() - t0:.1f} s"
    )
    chosen = model._key_splits  # the model's own choice of parts
    results: dict[str, float] = {}
    for batch in (int(b) for b in opts.batches.split(",")):
        args = _inputs(batch, config)
        model._key_splits = chosen
        split_ms, split_out = _graph_ms(model, args, opts.reps)
        model._key_splits = lambda b, kernel: lambda queries, keys: 1  # every call whole
        whole_ms, whole_out = _graph_ms(model, args, opts.reps)
        diff = (split_out - whole_out).abs().max().item()
        print(
            f"batch {batch}: split {split_ms:.2f} ms, whole {whole_ms:.2f} ms "
            f"({whole_ms / split_ms:.3f}x); actions max abs diff {diff:.2e}",
            flush=True,
        )
        results[f"forward_ms_{batch}_split"] = round(split_ms, 2)
        results[f"forward_ms_{batch}_whole"] = round(whole_ms, 2)
        results[f"split_speedup_{batch}"] = round(whole_ms / split_ms, 3)
        results[f"max_abs_diff_{batch}"] = float(f"{diff:.3g}")
    print(json.dumps({"compiled": opts.compile, **results}))


if __name__ == "__main__":
    main()
