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
   the media clock needs them;
5. key-to-first-affected-frame latency **through the protocol**: ``realtime serve`` (world kind
   only) in a child process on loopback, a websockets client that starts a ``realtime``-paced JPEG
   session, plays it as the client model of docs/protocols/world.md ("Pacing and latency") and
   sends ``--presses`` keys controls at phases spread evenly over the block clock; latency = when the first
   frame of the first chunk whose ``applied_event_ids`` holds the event plays, minus when the
   event was sent (p50, p95), with the continuous-play ratio of the same run.

6. (``--e2e``, for the GPU issue) **end to end through the server**: ``realtime serve`` with the
   world kind (compute admission off), ``n`` = 1, 2, 4, 8 websocket clients at once, each a
   ``fast``-paced JPEG session read as fast as it arrives: time to first frame (``session.start``
   sent -> first frame received, p50 over the clients of ``n`` = 1 runs), frames per second per
   session (between its first and last chunk of the window: ``E2ESession.fps_in``) and their sum,
   over ``--e2e-seconds`` after a warm-up (``--e2e-warmup-s``, and at least until every
   session's window is full: the steady state), batched (``world.max_batch`` 8)
   vs time-sliced (``max_batch`` 1); DiT model-FLOPs utilisation = the DiT's FLOPs per block
   (counted by ``torch.utils.flop_counter`` on one steady-state block) x blocks per second of one
   session / the device's dense bf16 peak (``--peak-tflops``, 989 for an H200); ``mfu_dit_span``
   divides by the DiT's own span per block instead (the ``denoise`` + ``clean`` stage means, one
   session: what the passes reach while they run, without the time between blocks). The served
   ``world.cuda_graphs`` is ``--cuda-graphs``; ``--e2e-batched-only`` skips the time-sliced server. Its JSON keys:
   ``fps_1``, ``ttff_ms``, ``aggregate_ratio_4`` (aggregate fps at 4 sessions / fps at 1, batched),
   ``fps_each_4`` (the slowest of 4 sessions' fps, batched), ``sessions_at_16fps`` (the largest
   measured ``n`` whose slowest session plays >= 16 fps, batched: only the ``n`` of
   ``--e2e-sessions`` are tried), ``fps_at_bf16_peak`` (the aggregate fps the DiT's FLOPs per
   block allow at ``--peak-tflops``: the bound of any number of sessions), ``fps_each`` (slowest
   session per mode and ``n``),
   ``mfu``, ``mfu_dit_span``, ``e2e_fps`` (per mode and ``n``), ``stage_ms`` (per mode and ``n``: where a chunk's
   time went, stage by stage, from the server's ``world_stage_seconds`` histogram scraped before
   and after each run, ``realtime.bench.world_stages``: ``mean``, ``p50`` and ``max`` of the later blocks,
   ``first_block`` the mean of the run's first blocks, ``n`` the later blocks counted).

``--model self-forcing`` / ``causvid`` with ``--checkpoint PATH`` (and ``--vae``, ``--text-encoder``
or ``--prompt-embeddings``: the served ``world.*`` files, docs/models.md) runs every section on the
checkpoint, with Wan's VAE decoder or, ``--decoder taehv`` and ``--vae taew2_1.pth``, TAEHV's;
``--write-random-checkpoint DIR`` writes random files of the real size in the real layouts first
(``realtime.bench.world_checkpoint``).

Last line: JSON with ``tick_ratio_100_vs_5``, ``recompute_ratio_100``, ``batched_vs_sliced_4``,
``pipeline_overlap_ratio``, ``continuous_play_ratio``, ``key_to_frame_ms_p50``,
``key_to_frame_ms_p95``, ``key_to_frame_continuous_play_ratio``; on a CPU device also the first
three in this thread's CPU time (``tick_cpu_ratio_100_vs_5``, ``recompute_cpu_ratio_100``,
``batched_vs_sliced_cpu_4``: DiT ticks one by one / batched), which other jobs on a shared box move
far less than the wall-clock ratios, so two trees can be compared there.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
import websockets
import yaml
from prometheus_client import CollectorRegistry

from models.world.attention import KERNEL_CHOICES
from models.world.configs import CONFIGS
from models.world.kv_cache import KVGeometry
from models.world.model import WorldModel, WorldTick
from models.world.sampler import BlockRequest, recompute_generate
from models.world.stage import WorldBlockInput, WorldBlockStage, WorldDecodeStage
from realtime.bench import world_stages
from realtime.config import WorldConfig
from realtime.kinds.world import prompt_context, resolve_model
from realtime.kinds.world_pacing import PlaybackPacer
from realtime.media.stage import MediaEncodeStage, MediaSettings
from sessions.engine import Pipeline, StageEngine


def _act(i: int) -> torch.Tensor:
    a = torch.zeros(6)
    a[i % 4] = 1.0
    return a


def _files(args) -> dict[str, str]:
    """The served world config's checkpoint files (``--checkpoint`` and its companions)."""
    names = ("checkpoint", "vae", "text_encoder", "prompt_embeddings")
    return {n: getattr(args, n) for n in names if getattr(args, n)}


def _build(args, slots: int) -> WorldModel:
    """The served model: the committed weights (with their own config) where they exist, or the
    checkpoint files of ``--checkpoint``."""
    cfg, weights = resolve_model(args.model, None, args.decoder)
    files = _files(args)
    dtype = getattr(torch, args.dtype)
    prompts = prompt_context(WorldConfig(device=args.device, **files), cfg, dtype) if files else None
    return WorldModel.build(
        cfg,
        slots=slots,
        weights=weights,
        device=args.device,
        dtype=dtype,
        attention=args.attention,
        checkpoint=Path(args.checkpoint) if args.checkpoint else None,
        vae=Path(args.vae) if args.vae else None,
        prompts=prompts,
    )


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def tick_latency(args) -> dict[str, float]:
    """Section 1 in wall time (medians over ``--reps``) and, beside it, in this thread's CPU time
    (minimums): ``*_cpu_ms_*``, what a tick costs the tree, which other jobs on a shared CPU box
    move far less than the wall time (that waits for a core). The CPU keys mean the device's work
    only on a CPU device."""
    model = _build(args, 1)
    model.open("s", seed=0)
    times: dict[int, list[float]] = {}
    cpu: dict[int, float] = {}
    history = []
    for b in range(args.blocks + args.reps):
        _sync(args.device)
        t0, c0 = time.perf_counter(), time.thread_time()
        x0 = model.generate([WorldTick("s", b, "stone", _act(b))])
        _sync(args.device)
        times.setdefault(b, []).append(time.perf_counter() - t0)
        cpu[b] = (time.thread_time() - c0) * 1000
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
    cross = model.dit.cross_kv(model.prompts(["stone"]).to(hist))
    req = [BlockRequest("s", args.blocks, 0, _act(0).expand(cfg.frames_per_block, -1))]
    rec, rec_cpu = [], []
    for _ in range(args.reps):
        _sync(args.device)
        t0, c0 = time.perf_counter(), time.thread_time()
        recompute_generate(model.dit, ctx, pos, acts, req, cross)  # no clean pass: nothing is cached
        _sync(args.device)
        rec.append(time.perf_counter() - t0)
        rec_cpu.append((time.thread_time() - c0) * 1000)
    late = args.blocks - args.reps
    return {
        "resident_ms_5": at(5),
        "resident_ms_100": at(late),
        "recompute_ms_100": statistics.median(rec) * 1000,
        "resident_cpu_ms_5": min(cpu[b] for b in range(5, 5 + args.reps)),
        "resident_cpu_ms_100": min(cpu[b] for b in range(late, late + args.reps)),
        "recompute_cpu_ms_100": min(rec_cpu),
    }


def batched_cpu_gain(args, sessions: int = 4) -> float:
    """This thread's CPU time for ``sessions`` ticks one by one / for one batched tick of them (the
    DiT with full windows, minimums over ``--reps``, interleaved): the work batching saves, which
    the fps ratios of section 2 show only where a core is idle."""
    model = _build(args, sessions)
    ids = [f"s{i}" for i in range(sessions)]
    for sid in ids:
        model.open(sid, seed=0)
    block = dict.fromkeys(ids, 0)

    def tick(group: list[str]) -> None:
        model.generate([WorldTick(sid, block[sid], "stone", _act(block[sid])) for sid in group])
        for sid in group:
            block[sid] += 1

    def cpu_ms(run) -> float:
        start = time.thread_time()
        run()
        return (time.thread_time() - start) * 1000

    for _ in range(model.cfg.sink_frames + model.cfg.window_frames):  # fill every window
        tick(ids)
    batched, one_by_one = [], []
    for _ in range(args.reps):
        batched.append(cpu_ms(lambda: tick(ids)))
        one_by_one.append(cpu_ms(lambda: [tick([sid]) for sid in ids]))
    return min(one_by_one) / min(batched)


def _pipeline(args, model: WorldModel, max_batch: int, encode: bool = True) -> Pipeline:
    """The world kind's pipeline: DiT block -> decode (-> JPEG encode), one engine each."""
    registry = CollectorRegistry()
    stages = [WorldBlockStage(model, device=args.device), WorldDecodeStage(model, device=args.device)]
    if encode:
        stages.append(MediaEncodeStage(model.pool.slots))
    engines = [StageEngine(s, registry=registry, max_batch=max_batch, coalesce_window_s=0.05) for s in stages]
    return Pipeline(engines, registry=registry, channel_size=3)


def _input(sid: str, i: int, block: int) -> WorldBlockInput:
    return WorldBlockInput(WorldTick(sid, block, "stone", _act(block + i)), i, MediaSettings("jpeg", 16))


async def _pipeline_fps(args, sessions: int, max_batch: int, ahead: int = 1, encode: bool = True) -> float:
    """Decoded + encoded frames per second of ``sessions`` sessions through the pipeline.

    ``ahead`` = 1: each session waits for a block's media before submitting the next (no overlap
    inside a session); 2: the next block is submitted once the DiT stage returned (the world
    kind's generate-ahead), so decode and encode of block k overlap the denoising of k + 1.
    """
    model = _build(args, sessions)
    pipeline = _pipeline(args, model, max_batch, encode)
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
                if block >= args.warmup:  # EncodedMedia, or WorldFrames without the encode stage
                    counted["frames"] += getattr(media, "frame_count", None) or media.frames.shape[0]

    await asyncio.gather(*(session(i, sid) for i, sid in enumerate(ids)))
    _sync(args.device)
    fps = counted["frames"] / (time.perf_counter() - counted["t0"])
    await pipeline.close()
    return fps


def aggregate_fps(args, sessions: int, batched: bool, encode: bool = True) -> float:
    """Frames per second of ``sessions`` sessions ticking through the world pipeline, generating
    one block ahead as the world kind does, batched (``max_batch = sessions`` in every stage) or
    time-sliced (``max_batch = 1``); ``encode=False``: the model stages only (DiT + decode, the
    figure recorded before the encoder became a pipeline stage)."""
    return asyncio.run(_pipeline_fps(args, sessions, sessions if batched else 1, ahead=2, encode=encode))


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


@contextlib.contextmanager
def world_server(args, **world: object) -> Iterator[str]:
    """``realtime serve`` with only the world kind (``world`` overrides its config fields), in a
    child process on a free loopback port; yields its websocket base URL once ``/readyz`` answers
    200."""
    config = {
        "server": {"log_level": "warning"},
        "robot": {"enabled": False},
        "world": {
            "enabled": True,
            "model": args.model,
            "device": args.device,
            "dtype": args.dtype,
            "torch_threads": args.threads,
            "attention": args.attention,
            **_files(args),
            **({"decoder": args.decoder} if args.decoder != "wan2.1" else {}),
            **({} if args.pacing_margin_s is None else {"pacing_margin_s": args.pacing_margin_s}),
            **world,
        },
    }
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "deploy.yaml"
        path.write_text(yaml.safe_dump(config))
        cmd = [sys.executable, "-m", "realtime.cli", "serve", "--config", str(path), "--port", str(port)]
        proc = subprocess.Popen(cmd)
        try:
            deadline = time.monotonic() + 180
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"realtime serve exited with {proc.returncode} during startup")
                with contextlib.suppress(OSError):
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
                        if r.status == 200:
                            break
                if time.monotonic() > deadline:
                    raise RuntimeError("realtime serve not ready after 180 s")
                time.sleep(0.1)
            yield f"ws://127.0.0.1:{port}"
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


_PRESSES = (["a"], ["d"], ["w"], [])  # each event changes the held keys


@dataclass
class KeyToFrame:
    """One protocol run: per-press latencies (ms) and the client's playback."""

    latencies_ms: list[float] = field(default_factory=list)
    echo_mismatches: int = 0
    chunks: int = 0
    stalls: int = 0
    lead_ms: list[float] = field(default_factory=list)

    def continuous_ratio(self) -> float:
        """Share of chunks after the first that arrived before the client ran dry."""
        return 1.0 - self.stalls / max(1, self.chunks - 1)


async def _key_to_frame(url: str, fps: int, presses: int, warmup_s: float, seed: int) -> KeyToFrame:
    out = KeyToFrame()
    sent_at: dict[int, float] = {}  # event id -> time.monotonic() of the send
    player = PlaybackPacer(fps, 0.0, 1, float("inf"))  # the client model: plays at fps, stalls
    first_chunk = asyncio.get_running_loop().create_future()
    async with websockets.connect(f"{url}/v1/realtime/world?protocol_version=1", max_size=2**24) as ws:

        async def read() -> None:
            meta = None
            async for message in ws:
                now = time.monotonic()
                if isinstance(message, str):
                    msg = json.loads(message)
                    if msg["type"] == "chunk.metadata":
                        meta = msg
                    elif msg["type"] == "error":
                        raise RuntimeError(f"server error: {msg['error']}")
                    continue
                assert meta is not None and len(message) == meta["byte_length"]
                shows_at = player.sent(meta["frame_count"], now, 0.0)
                out.chunks += 1
                if meta["timing"].get("lead_ms") is not None:
                    out.lead_ms.append(meta["timing"]["lead_ms"])
                applied = [i for i in meta["applied_event_ids"] if i in sent_at]
                for event_id in applied:
                    out.latencies_ms.append((shows_at - sent_at.pop(event_id)) * 1000)
                if applied and meta["client_ts_ms"] != round(1000 * max(applied), 3):
                    out.echo_mismatches += 1
                if not first_chunk.done():
                    first_chunk.set_result(now)
                if len(out.latencies_ms) == presses:
                    return

        start = {"type": "session.start", "prompt": "stone", "seed": seed, "fps": fps, "pacing": "realtime"}
        await ws.send(json.dumps(start))
        created = json.loads(await asyncio.wait_for(ws.recv(), 60))
        assert created["type"] == "session.created", created
        block_s = created["capabilities"]["frames_per_chunk"]["later"] / fps
        reader = asyncio.create_task(read())
        await asyncio.wait_for(asyncio.shield(first_chunk), 60)
        await asyncio.sleep(warmup_s)
        out.stalls = player.stalls = 0
        out.chunks = 1
        t0 = time.monotonic()
        for i in range(1, presses + 1):
            # press i at block i + frac(i * golden ratio): phases spread evenly over the block
            # clock whatever its offset, so the median is not a lucky draw of a few phases
            await asyncio.sleep(max(0.0, t0 + block_s * (i + (i * 0.6180339887) % 1) - time.monotonic()))
            controls = [{"track": "keys", "schema": "world.keys.v1", "data": {"pressed": _PRESSES[i % 4]}}]
            sent_at[i] = time.monotonic()
            # the echo is the event's own id here, so a mismatch is a real echo bug
            event = {"type": "session.event", "event_id": i, "client_ts_ms": 1000.0 * i, "controls": controls}
            await ws.send(json.dumps(event))
        await asyncio.wait_for(reader, 30)
        out.stalls = player.stalls
        await ws.send(json.dumps({"type": "session.close"}))
        async for _ in ws:  # read on until the server's close: a reader that stops reading
            pass  # would leave the server's connection open while it shuts down
    return out


def key_to_frame(args) -> KeyToFrame:
    """Key-to-first-affected-frame latency through the protocol (section 5 of the docstring)."""
    with world_server(args) as url:
        return asyncio.run(_key_to_frame(url, args.fps, args.presses, args.press_warmup_s, args.seed))


@dataclass
class E2ESession:
    """One client of section 6: when its first frame arrived, and when each chunk did."""

    ttff_s: float = float("nan")
    arrivals: list[tuple[float, int]] = field(default_factory=list)  # (time.monotonic(), frames)

    def fps_in(self, start: float, end: float) -> float:
        """Frames per second between the first and the last chunk that arrived in ``[start,
        end)``: the frames of every chunk after the first over the time between them (0 under two
        chunks). Unlike frames counted in the window, it does not move in steps of one chunk
        (12 frames in 10 s = 1.2 fps)."""
        inside = [(at, frames) for at, frames in self.arrivals if start <= at < end]
        if len(inside) < 2:
            return 0.0
        return sum(frames for _, frames in inside[1:]) / (inside[-1][0] - inside[0][0])


@dataclass
class E2EWindow:
    """The measured window of one run of section 6, shared by its clients: it opens at
    ``earliest`` or once every session's window is full (the chunk of its first steady block
    arrived), whichever is later, so a run never measures sessions still filling their windows
    (their blocks cost less, or more under a mask, than the steady state's)."""

    sessions: int
    earliest: float
    seconds: float
    steady_at: list[float] = field(default_factory=list)

    @property
    def start(self) -> float | None:
        if len(self.steady_at) < self.sessions:
            return None
        return max(self.earliest, *self.steady_at)

    @property
    def end(self) -> float | None:
        start = self.start
        return None if start is None else start + self.seconds


async def _e2e_client(url: str, fps: int, seed: int, window: E2EWindow, steady_chunk: int) -> E2ESession:
    out = E2ESession()
    async with websockets.connect(f"{url}/v1/realtime/world?protocol_version=1", max_size=2**26) as ws:
        start = {"type": "session.start", "prompt": "stone", "seed": seed, "fps": fps, "pacing": "fast"}
        sent = time.monotonic()
        await ws.send(json.dumps(start))
        frames_of_chunk = 0
        async for message in ws:
            now = time.monotonic()
            if isinstance(message, str):
                msg = json.loads(message)
                if msg["type"] == "chunk.metadata":
                    frames_of_chunk = msg["frame_count"]
                elif msg["type"] == "error":
                    raise RuntimeError(f"server error: {msg['error']}")
                continue
            if out.ttff_s != out.ttff_s:  # NaN: the first media message
                out.ttff_s = now - sent
            out.arrivals.append((now, frames_of_chunk))
            if len(out.arrivals) == steady_chunk + 1:
                window.steady_at.append(now)
            end = window.end
            if end is not None and now >= end:
                break
        await ws.send(json.dumps({"type": "session.close"}))
        async for _ in ws:
            pass
    return out


async def _e2e_run(
    url: str, sessions: int, fps: int, warm_s: float, seconds: float, steady_chunk: int = 0
) -> tuple[list[E2ESession], E2EWindow]:
    """``sessions`` clients at once; ``steady_chunk``: the chunk index whose arrival means the
    session's window is full (0: any first chunk)."""
    window = E2EWindow(sessions, time.monotonic() + warm_s, seconds)
    clients = (_e2e_client(url, fps, i, window, steady_chunk) for i in range(sessions))
    return list(await asyncio.gather(*clients)), window


def _dit_flops_per_block(args) -> tuple[float, int]:
    """FLOPs of the DiT (denoise passes + clean pass) for one steady-state block of one session,
    and the video frames such a block decodes to."""
    from torch.utils.flop_counter import FlopCounterMode

    model = _build(args, 1)
    act = torch.zeros(model.cfg.action_dim)
    model.open("probe", seed=0)
    with torch.no_grad():
        for _ in range(model.pool.geometry.steady_block):  # fill the window: steady-state attention cost
            model.generate([WorldTick("probe", model.next_block("probe"), "stone", act)])
        with FlopCounterMode(display=False) as counter:
            model.generate([WorldTick("probe", model.next_block("probe"), "stone", act)])
    frames = model.cfg.frames_for_block(False)
    del model
    if args.device.startswith("cuda"):
        torch.cuda.empty_cache()
    return float(counter.get_total_flops()), frames


REAL_TIME_FPS = 16  # Wan-2.1 / Self-Forcing play at 16 fps: issue 30's real time per session

# --compile / --cuda-graphs -> world.compile / world.cuda_graphs
COMPILE = {"auto": "auto", "on": True, "off": False}


def e2e_section(args) -> dict[str, object]:
    """Section 6: end to end through ``realtime serve`` (see the module docstring)."""
    flops, video_frames_per_block = _dit_flops_per_block(args)
    steady = KVGeometry.of(resolve_model(args.model, None, args.decoder)[0], torch.float32).steady_block
    modes = [("batched", max(args.e2e_sessions))] + ([] if args.e2e_batched_only else [("sliced", 1)])
    figures: dict[str, dict[str, float]] = {mode: {} for mode, _ in modes}
    stage_ms: dict[str, dict[str, world_stages.Breakdown]] = {mode: {} for mode, _ in modes}
    slowest: dict[str, dict[str, float]] = {mode: {} for mode, _ in modes}  # the slowest session's fps
    ttff: list[float] = []
    print(
        f"end to end through realtime serve, {args.model} on {args.device} ({args.dtype}), fast pacing, JPEG"
    )
    counts = [str(n) for n in args.e2e_sessions]
    for mode, max_batch in modes:
        served = {
            "max_batch": max_batch,
            "compute_admission": False,
            "compile": COMPILE[args.compile],
            "cuda_graphs": COMPILE[args.cuda_graphs],
        }
        if args.encode_threads is not None:
            served["encode_threads"] = args.encode_threads
        with world_server(args, **served) as url:
            http = url.replace("ws://", "http://", 1)
            asyncio.run(_e2e_run(url, 1, args.fps, 0.0, 1.0))  # warm the server (first-use allocations)
            for n in args.e2e_sessions:
                before = world_stages.scrape(http)
                t0 = time.monotonic()
                runs, window = asyncio.run(
                    _e2e_run(url, n, args.fps, args.e2e_warmup_s, args.e2e_seconds, steady)
                )
                assert window.start is not None and window.end is not None
                each = [r.fps_in(window.start, window.end) for r in runs]
                figures[mode][str(n)] = round(sum(each), 2)
                slowest[mode][str(n)] = round(min(each), 2)
                print(f"  {mode}, {n} sessions: {figures[mode][str(n)]:.1f} fps in aggregate, measured "
                      f"{window.start - t0:.1f}-{window.end - t0:.1f} s after the start "
                      f"(every window full from block {steady})")  # fmt: skip
                stage_ms[mode][str(n)] = world_stages.breakdown(before, world_stages.scrape(http))
                print(world_stages.format_breakdown(f"{mode}, {n} sessions", stage_ms[mode][str(n)]))
                if mode == "batched" and n == 1:
                    ttff.extend(r.ttff_s for r in runs)
    print(
        f"{'sessions':>8} {'batched fps':>12} {'slowest':>8} {'sliced fps':>11}   (aggregate; slowest session)"
    )
    for n in counts:
        sliced = f"{figures['sliced'][n]:>11.1f}" if "sliced" in figures else f"{'-':>11}"
        print(f"{n:>8} {figures['batched'][n]:>12.1f} {slowest['batched'][n]:>8.1f} {sliced}")
    fps_1 = figures["batched"]["1"]
    peak = args.peak_tflops * 1e12
    mfu = flops * (fps_1 / video_frames_per_block) / peak
    at_peak = peak / flops * video_frames_per_block  # aggregate fps if the DiT ran at the peak
    realtime = [int(n) for n in counts if slowest["batched"][n] >= REAL_TIME_FPS]
    print(f"every session at >= {REAL_TIME_FPS} fps up to {max(realtime, default=0)} sessions (of {', '.join(counts)} "
          f"measured); the DiT at the bf16 peak would give {at_peak:.1f} fps in aggregate "
          f"({at_peak / REAL_TIME_FPS:.2f} sessions at {REAL_TIME_FPS} fps)")  # fmt: skip
    means = stage_ms["batched"]["1"]["mean"]
    span_ms = (means["denoise"] or 0.0) + (means["clean"] or 0.0)  # type: ignore[index]
    mfu_span = flops / (span_ms / 1000) / peak if span_ms else None
    print(f"one session: {fps_1:.1f} fps end to end, time to first frame {1000 * statistics.median(ttff):.0f} ms; "
          f"DiT {flops / 1e12:.1f} TFLOP per block -> MFU {mfu:.3f} of {args.peak_tflops:g} TFLOP/s "
          f"(over the DiT's own span of {span_ms:.1f} ms per block: {mfu_span or 0:.3f})")  # fmt: skip
    return {
        "fps_1": fps_1,
        "ttff_ms": round(1000 * statistics.median(ttff), 1),
        **({"aggregate_ratio_4": round(figures["batched"]["4"] / fps_1, 3)} if "4" in counts else {}),
        **({"fps_each_4": slowest["batched"]["4"]} if "4" in counts else {}),
        "sessions_at_16fps": max(realtime, default=0),
        "fps_at_bf16_peak": round(at_peak, 1),
        "fps_each": slowest,
        "mfu": round(mfu, 3),
        "mfu_dit_span": None if mfu_span is None else round(mfu_span, 3),
        "dit_tflop_per_block": round(flops / 1e12, 2),
        "e2e_fps": figures,
        "stage_ms": stage_ms,
    }


def _pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


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
    p.add_argument("--presses", type=int, default=48, help="key presses of the protocol run (>= 20)")
    p.add_argument(
        "--pacing-margin-s", type=float, help="the served world.pacing_margin_s (default: its default)"
    )
    p.add_argument("--press-warmup-s", type=float, default=2.0, help="playback before the first press")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--key-to-frame-only", action="store_true", help="run section 5 alone")
    p.add_argument("--e2e", action="store_true", help="run section 6 (end to end through the server) alone")
    p.add_argument("--e2e-seconds", type=float, default=6.0, help="section 6: measured seconds per point")
    p.add_argument("--e2e-warmup-s", type=float, default=3.0, help="section 6: unmeasured seconds first")
    p.add_argument(
        "--e2e-sessions",
        type=int,
        nargs="+",
        default=[1, 2, 4, 8],
        help="section 6: session counts (must include 1: the one-session figures are the headline)",
    )
    p.add_argument(
        "--e2e-batched-only",
        action="store_true",
        help="section 6: skip the time-sliced server (half the run; the headline keys need only the batched one)",
    )
    p.add_argument(
        "--compile",
        choices=("auto", "on", "off"),
        nargs="?",
        const="on",
        default="auto",
        help="section 6: the served world.compile (auto, the server's default: on for CUDA; bare --compile: on)",
    )
    p.add_argument(
        "--cuda-graphs",
        choices=("auto", "on", "off"),
        default="auto",
        help="section 6: the served world.cuda_graphs (auto, the server's default: on for CUDA)",
    )
    p.add_argument(
        "--attention",
        choices=KERNEL_CHOICES,
        default="auto",
        help="the DiT's attention kernel (world.attention), every section",
    )
    p.add_argument(
        "--encode-threads", type=int, help="section 6: the served world.encode_threads (default: its default)"
    )
    p.add_argument("--peak-tflops", type=float, default=989.0, help="section 6: dense bf16 peak (H200: 989)")
    for flag, what in (
        ("--checkpoint", "the DiT checkpoint (--model self-forcing | causvid)"),
        ("--vae", "Wan 2.1's Wan2.1_VAE.pth, or TAEHV's taew2_1.pth with --decoder taehv"),
        ("--text-encoder", "Wan's umT5 encoder (.pth, Wan's folder or an HF folder)"),
        ("--prompt-embeddings", "precomputed prompt embeddings (holding the bench's prompt, 'stone')"),
    ):
        p.add_argument(flag, default="", help=f"world.{flag[2:].replace('-', '_')}: {what}, every section")
    p.add_argument(
        "--decoder",
        choices=("wan2.1", "taehv"),
        default="wan2.1",
        help="world.decoder of --model self-forcing | causvid: Wan's VAE or TAEHV's (--vae names its file)",
    )
    p.add_argument(
        "--write-random-checkpoint",
        type=Path,
        metavar="DIR",
        help="write random real-size --model files (DiT checkpoint, Wan VAE, TAEHV, prompt embeddings) into DIR and exit",
    )
    args = p.parse_args(argv)
    if args.e2e and 1 not in args.e2e_sessions:  # refused before the server and the model are built
        p.error("--e2e-sessions must include 1: fps_1, ttff_ms and mfu are one session's figures")
    if args.write_random_checkpoint:
        from realtime.bench.world_checkpoint import write_random_checkpoint

        paths = write_random_checkpoint(args.write_random_checkpoint, args.model)
        taehv = paths.pop("taehv")
        print(" ".join(f"--{k.replace('_', '-')} {v}" for k, v in paths.items()))
        print(f"TAEHV's decoder instead of Wan's: --decoder taehv --vae {taehv}")
        return 0
    if args.key_to_frame_only:
        return _print_key_to_frame(args, {})
    if args.e2e:
        print(
            json.dumps(
                {
                    **e2e_section(args),
                    "device": args.device,
                    "model": args.model,
                    "dtype": args.dtype,
                    "compile": args.compile,
                    "cuda_graphs": args.cuda_graphs,
                    "attention": args.attention,
                    "decoder": args.decoder,
                }
            )
        )
        return 0
    torch.set_num_threads(args.threads)
    with torch.no_grad():
        lat = tick_latency(args)
        print(
            f"tick latency, resident KV: block 5 {lat['resident_ms_5']:.2f} ms, block 100 {lat['resident_ms_100']:.2f} ms"
        )
        print(f"recompute-the-window baseline at block 100: {lat['recompute_ms_100']:.2f} ms "
              f"(x{lat['recompute_ms_100'] / lat['resident_ms_100']:.2f} of resident)")  # fmt: skip
        work = {}
        if args.device == "cpu":  # thread CPU time is the device's work only on a CPU
            work = {
                "tick_cpu_ratio_100_vs_5": round(lat["resident_cpu_ms_100"] / lat["resident_cpu_ms_5"], 3),
                "recompute_cpu_ratio_100": round(lat["recompute_cpu_ms_100"] / lat["resident_cpu_ms_100"], 3),
                "batched_vs_sliced_cpu_4": round(batched_cpu_gain(args), 3),
            }
            print(f"CPU time (this thread, min over {args.reps}): tick at block 100 / block 5 "
                  f"x{work['tick_cpu_ratio_100_vs_5']:.2f}, recompute / resident "
                  f"x{work['recompute_cpu_ratio_100']:.2f}, 4 ticks one by one / one batch of 4 "
                  f"x{work['batched_vs_sliced_cpu_4']:.2f}")  # fmt: skip
        print(
            f"{'sessions':>8} {'batched fps':>12} {'sliced fps':>11} {'ratio':>6}   model stages (DiT + decode)"
        )
        ratios, encoded = {}, {}
        for n in (1, 2, 4, 8):
            bf, sf = aggregate_fps(args, n, True, encode=False), aggregate_fps(args, n, False, encode=False)
            ratios[n] = bf / sf
            print(f"{n:>8} {bf:>12.1f} {sf:>11.1f} {ratios[n]:>6.2f}")
        print(f"{'sessions':>8} {'batched fps':>12} {'sliced fps':>11} {'ratio':>6}   + JPEG encode stage")
        for n in (1, 4):
            bf, sf = aggregate_fps(args, n, True), aggregate_fps(args, n, False)
            encoded[n] = bf / sf
            print(f"{n:>8} {bf:>12.1f} {sf:>11.1f} {encoded[n]:>6.2f}")
        overlapped, serial = overlap_fps(args)
        print(f"pipeline overlap, 1 session: {overlapped:.1f} fps generating ahead vs {serial:.1f} fps "
              f"block by block (x{overlapped / serial:.2f})")  # fmt: skip
        play = continuous_play(args)
        print(f"continuous-play ratio paced at {args.fps} fps (1 session): {play:.2f}")
    return _print_key_to_frame(args, {
        "tick_ratio_100_vs_5": round(lat["resident_ms_100"] / lat["resident_ms_5"], 3),
        "recompute_ratio_100": round(lat["recompute_ms_100"] / lat["resident_ms_100"], 3),
        "batched_vs_sliced_4": round(ratios[4], 3),
        "batched_vs_sliced_4_encoded": round(encoded[4], 3),
        "pipeline_overlap_ratio": round(overlapped / serial, 3),
        "continuous_play_ratio": round(play, 3),
        **work,
    })  # fmt: skip


def _print_key_to_frame(args, figures: dict[str, float]) -> int:
    """Run section 5, print it, then the final JSON line (``figures`` + the latency figures)."""
    run = key_to_frame(args)
    p50, p95 = statistics.median(run.latencies_ms), _pct(run.latencies_ms, 95)
    lead = statistics.median(run.lead_ms) if run.lead_ms else float("nan")
    print(f"key-to-frame latency through the protocol ({len(run.latencies_ms)} presses at {args.fps} fps): "
          f"p50 {p50:.0f} ms, p95 {p95:.0f} ms, max {max(run.latencies_ms):.0f} ms; server lead p50 {lead:.0f} ms; "
          f"continuous-play {run.continuous_ratio():.3f} ({run.stalls} stalls in {run.chunks} chunks); "
          f"echo mismatches {run.echo_mismatches}")  # fmt: skip
    print(json.dumps({
        **figures,
        "key_to_frame_ms_p50": round(p50, 1),
        "key_to_frame_ms_p95": round(p95, 1),
        "key_to_frame_continuous_play_ratio": round(run.continuous_ratio(), 3),
        "device": args.device,
        "model": args.model,
        "dtype": args.dtype,
    }))  # fmt: skip
    return 0 if run.echo_mismatches == 0 else 1
