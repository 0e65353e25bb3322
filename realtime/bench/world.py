"""``realtime bench world``: resident rolling KV vs recompute, batched vs time-sliced sessions.

Runs the world model on this machine's device (CPU by default; ``--device cuda --model
wan2.1-1.3b-causal`` for GPU figures, which belong to the GPU-performance issue):

1. tick latency (denoise passes + clean pass, one session) at blocks 5 and 100 with the resident
   KV pool, against a recompute-the-window baseline that rebuilds the sink + window context from
   clean latents every step (Krea-style ``do_kv_recomp``; cost of one block at block 100);
2. aggregate fps (frames decoded and JPEG-encoded per second) for 1, 2, 4, 8 sessions ticking
   through the world kind's pipeline (DiT block -> decode -> encode engines): batched (one forward
   per stage for all sessions' blocks) vs time-sliced (``max_batch=1``, one session per forward,
   as vllm-omni's single-request AR runner);
3. pipeline overlap, one session: the next block submitted as soon as the DiT stage returned (the
   world kind's generate-ahead: decode and encode of block k overlap the denoising of k + 1) vs
   block by block;
4. continuous-play ratio when paced at ``--fps``: the share of blocks (one session) ready before
   the media clock needs them.

Last line: JSON with ``tick_ratio_100_vs_5``, ``recompute_ratio_100``, ``batched_vs_sliced_4``,
``pipeline_overlap_ratio``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

import torch
from prometheus_client import CollectorRegistry

from models.world.configs import CONFIGS, WEIGHTS_DIR
from models.world.model import WorldModel, WorldTick, tokenize
from models.world.sampler import BlockRequest, recompute_generate
from models.world.stage import WorldBlockInput, WorldBlockStage, WorldDecodeStage
from realtime.media.stage import MediaEncodeStage, MediaSettings
from sessions.engine import Pipeline, StageEngine


def _act(i: int) -> torch.Tensor:
    a = torch.zeros(6)
    a[i % 4] = 1.0
    return a


def _build(args, slots: int) -> WorldModel:
    weights = WEIGHTS_DIR / "world-tiny.safetensors" if args.model == "world-tiny" else None
    dtype = getattr(torch, args.dtype)
    return WorldModel.build(
        CONFIGS[args.model], slots=slots, weights=weights, device=args.device, dtype=dtype
    )


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def tick_latency(args) -> dict[str, float]:
    model = _build(args, 1)
    model.open("s", seed=0)
    times: dict[int, list[float]] = {}
    history = []
    for b in range(args.blocks + args.reps):
        _sync(args.device)
        t0 = time.perf_counter()
        x0 = model.generate([WorldTick("s", b, "stone", _act(b))])
        _sync(args.device)
        times.setdefault(b, []).append(time.perf_counter() - t0)
        history.append(x0)

    def at(block: int) -> float:
        return (
            statistics.median(t for b, ts in times.items() if block <= b < block + args.reps for t in ts)
            * 1000
        )

    cfg = model.cfg
    keep = cfg.sink_frames + cfg.window_frames
    hist = torch.cat(history[: args.blocks], 1)
    frames = list(range(cfg.sink_frames)) + list(range(hist.shape[1] - cfg.window_frames, hist.shape[1]))
    ctx, pos = hist[:, frames], torch.tensor(frames)
    acts = torch.zeros(1, keep, cfg.action_dim, device=hist.device, dtype=hist.dtype)
    cross = model.dit.cross_kv(tokenize("stone", cfg)[None].to(hist.device))
    req = [BlockRequest("s", args.blocks, 0, _act(0).expand(cfg.frames_per_block, -1))]
    rec = []
    for _ in range(args.reps):
        _sync(args.device)
        t0 = time.perf_counter()
        recompute_generate(model.dit, ctx, pos, acts, req, cross)  # no clean pass: nothing is cached
        _sync(args.device)
        rec.append(time.perf_counter() - t0)
    return {
        "resident_ms_5": at(5),
        "resident_ms_100": at(args.blocks - args.reps),
        "recompute_ms_100": statistics.median(rec) * 1000,
    }


def _pipeline(args, model: WorldModel, max_batch: int) -> Pipeline:
    """The world kind's pipeline: DiT block -> decode -> JPEG encode, one engine each."""
    registry = CollectorRegistry()
    stages = (
        WorldBlockStage(model, device=args.device),
        WorldDecodeStage(model, device=args.device),
        MediaEncodeStage(model.pool.slots),
    )
    engines = [StageEngine(s, registry=registry, max_batch=max_batch, coalesce_window_s=0.05) for s in stages]
    return Pipeline(engines, registry=registry, channel_size=3)


def _input(sid: str, i: int, block: int) -> WorldBlockInput:
    return WorldBlockInput(WorldTick(sid, block, "stone", _act(block + i)), i, MediaSettings("jpeg", 16))


async def _pipeline_fps(args, sessions: int, max_batch: int, ahead: int = 1) -> float:
    """Decoded + encoded frames per second of ``sessions`` sessions through the pipeline.

    ``ahead`` = 1: each session waits for a block's media before submitting the next (no overlap
    inside a session); 2: the next block is submitted once the DiT stage returned (the world
    kind's generate-ahead), so decode and encode of block k overlap the denoising of k + 1.
    """
    model = _build(args, sessions)
    pipeline = _pipeline(args, model, max_batch)
    ids = [f"s{i}" for i in range(sessions)]
    for sid in ids:
        await pipeline.open(sid)
    total = args.warmup + args.ticks
    counted = {"frames": 0, "t0": 0.0}

    async def session(i: int, sid: str) -> None:
        tails: list[tuple[int, asyncio.Future]] = []
        for b in range(total):
            if i == 0 and b == args.warmup:  # the measured window starts with block ``warmup``
                _sync(args.device)
                counted["t0"] = time.perf_counter()
            tails.append((b, (await pipeline.submit(sid, 0, _input(sid, i, b))).tail))
            while len(tails) >= ahead or (b == total - 1 and tails):
                block, tail = tails.pop(0)
                media = await tail
                if block >= args.warmup:
                    counted["frames"] += media.frame_count

    await asyncio.gather(*(session(i, sid) for i, sid in enumerate(ids)))
    _sync(args.device)
    fps = counted["frames"] / (time.perf_counter() - counted["t0"])
    await pipeline.close()
    return fps


def aggregate_fps(args, sessions: int, batched: bool) -> float:
    """Frames per second of ``sessions`` sessions ticking through the world pipeline, generating
    one block ahead as the world kind does, batched (``max_batch = sessions`` in every stage) or
    time-sliced (``max_batch = 1``)."""
    return asyncio.run(_pipeline_fps(args, sessions, sessions if batched else 1, ahead=2))


def overlap_fps(args) -> tuple[float, float]:
    """One session: (fps with the next block submitted after the DiT stage, fps block by block)."""
    return asyncio.run(_pipeline_fps(args, 1, 1, ahead=2)), asyncio.run(_pipeline_fps(args, 1, 1, ahead=1))


def continuous_play(args) -> float:
    model = _build(args, 1)
    model.open("s", seed=0)
    fps, ready, clock = args.fps, 0, None
    media = 0.0
    for b in range(args.ticks + 1):
        model.step([WorldTick("s", b, "stone", _act(b))])
        now = time.perf_counter()
        if clock is None:
            clock = now  # playback starts with the first chunk
        elif now - clock <= media:
            ready += 1
        media += model.cfg.frames_for_block(b == 0) / fps
    return ready / args.ticks


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="realtime bench world", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="world-tiny", choices=sorted(CONFIGS))
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--blocks", type=int, default=100)
    p.add_argument("--reps", type=int, default=9)
    p.add_argument("--ticks", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--fps", type=int, default=16)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    with torch.no_grad():
        lat = tick_latency(args)
        print(
            f"tick latency, resident KV: block 5 {lat['resident_ms_5']:.2f} ms, block 100 {lat['resident_ms_100']:.2f} ms"
        )
        print(f"recompute-the-window baseline at block 100: {lat['recompute_ms_100']:.2f} ms "
              f"(x{lat['recompute_ms_100'] / lat['resident_ms_100']:.2f} of resident)")  # fmt: skip
        print(f"{'sessions':>8} {'batched fps':>12} {'sliced fps':>11} {'ratio':>6}")
        ratios = {}
        for n in (1, 2, 4, 8):
            bf, sf = aggregate_fps(args, n, True), aggregate_fps(args, n, False)
            ratios[n] = bf / sf
            print(f"{n:>8} {bf:>12.1f} {sf:>11.1f} {ratios[n]:>6.2f}")
        overlapped, serial = overlap_fps(args)
        print(f"pipeline overlap, 1 session: {overlapped:.1f} fps generating ahead vs {serial:.1f} fps "
              f"block by block (x{overlapped / serial:.2f})")  # fmt: skip
        play = continuous_play(args)
        print(f"continuous-play ratio paced at {args.fps} fps (1 session): {play:.2f}")
    print(json.dumps({
        "tick_ratio_100_vs_5": round(lat["resident_ms_100"] / lat["resident_ms_5"], 3),
        "recompute_ratio_100": round(lat["recompute_ms_100"] / lat["resident_ms_100"], 3),
        "batched_vs_sliced_4": round(ratios[4], 3),
        "pipeline_overlap_ratio": round(overlapped / serial, 3),
        "continuous_play_ratio": round(play, 3),
        "device": args.device,
        "model": args.model,
        "dtype": args.dtype,
    }))  # fmt: skip
    return 0
