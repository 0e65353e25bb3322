"""AR-diffusion world sessions over the public world protocol (docs/protocols/world.md).

Route ``/v1/realtime/world?protocol_version=1`` (its browser page, ``clients/web/world.html``, is
served at ``/demo/world`` by ``realtime.demo``). Each connection is one session of the session
runtime on the shared connection skeleton (``realtime.connection``). Every tick generates one
latent block through the world **pipeline** — DiT block (commits the session's rolling KV) ->
causal VAE decode -> media encode (JPEG batch, or fMP4 continuing the session's H.264 stream) —
each stage an engine batching across sessions on its own worker thread, so decode and encode of
block k overlap the denoising of block k + 1. The tick commits when the DiT stage returns; the
media follows through the pipeline and the writer sends it in order.

The handler is the session's single owner: commands (start, events, reset, close, ping), tick
outcomes and pacing wake-ups all arrive through the runner's mailbox, one at a time.

Pacing: ``realtime`` starts the next block when the media the client still holds (as
``realtime.kinds.world_pacing.PlaybackPacer`` models its playback) has fallen to the measured
tick-to-send time plus ``world.pacing_margin_s`` — the least generate-ahead that keeps playback
continuous, so a control waits for as little buffered media as possible; ``fast`` generates as
fast as possible. Both are bounded by ``world.max_ahead_blocks`` chunks generated but not yet
sent (and ``realtime`` by as many blocks of media ahead). Controls apply at the next block
boundary: ``keys`` is sticky, ``mouse`` deltas of the events applied in one block are summed
(``models.world.stage.world_input``). Prompt changes reset the session's cross-attention KV
(``models.world.model``); a tick failure moves the session to FAILED until ``session.reset``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from prometheus_client import Counter, Histogram
from starlette.routing import BaseRoute, WebSocketRoute
from starlette.websockets import WebSocket

from models.world.configs import CONFIGS, WEIGHTS_DIR, WorldModelConfig, read_config, with_decoder
from models.world.controls import CONTROL_SCHEMAS, validate_control
from models.world.kv_cache import KVGeometry
from models.world.memory import decoder_state_bytes, fixed_bytes
from models.world.model import HeldBlock, WorldModel, WorldTick, resident_blocks, restorable
from models.world.profiling import OFF, DeviceProfiler
from models.world.stage import WorldBlockStage, WorldDecodeStage, world_input
from models.world.text_encoder import (
    PrecomputedEmbeddings,
    PromptEmbedder,
    UMT5TextEncoder,
    UnknownPromptError,
)
from realtime.config import WorldConfig
from realtime.connection import Close, Connection, runtime_close
from realtime.kinds.base import KindServiceBase, ProgressFn, ServedModel, ServerContext
from realtime.kinds.runtime import build_session_manager, capacity_plan, stage_declaration
from realtime.kinds.world_pacing import PlaybackPacer
from realtime.kinds.world_timing import StageTimer
from realtime.media.stage import EncodedMedia, MediaEncodeStage, MediaSettings
from realtime.protocols import world as proto
from realtime.scale.resume import WorldState, decode, restoring
from sessions.capacity import CapacityPlan, MemoryDeclaration, paced_capacity, with_compute_limit
from sessions.engine import Pipeline, PipelineResult, StageEngine
from sessions.errors import SessionError, TickSupersededError, TransientError
from sessions.executor import StageExecutor
from sessions.session import SessionStatus
from sessions.tick import TickOutput

log = logging.getLogger("realtime.world")

PATH = "/v1/realtime/world"
_STATE_OVERHEAD_BYTES = 64 * 1024  # a world checkpoint besides its held latents (start, controls, pickle)
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class WorldTickPayload:
    """What a world tick carries besides the snapshot: the session seed, start prompt, media."""

    seed: int
    prompt: str | None
    extra: MediaSettings
    restore: tuple[HeldBlock, ...] = ()  # a session moved here: its model state rebuilt from these


def resolve_model(
    name: str, weights: str | None, decoder: str = "wan2.1"
) -> tuple[WorldModelConfig, Path | None]:
    """(config, weights path or None) for ``world.model`` / ``world.weights`` / ``world.decoder``: a
    weights file's own config (its safetensors metadata) wins over the named config of the code;
    ``decoder`` ``taehv`` serves a checkpoint model with TAEHV's decoder (``configs.with_decoder``)."""
    if weights:
        return read_config(Path(weights)), Path(weights)
    if name not in CONFIGS:
        raise ValueError(f"unknown world model {name!r} (known: {', '.join(CONFIGS)})")
    trained = WEIGHTS_DIR / f"{name}.safetensors"
    return (
        (read_config(trained), trained) if trained.is_file() else (with_decoder(CONFIGS[name], decoder), None)
    )


def prompt_context(wc: WorldConfig, cfg: WorldModelConfig, dtype: torch.dtype) -> PromptEmbedder:
    """A checkpoint model's prompt embeddings (``models.world.text_encoder``): Wan's umT5 encoder
    on ``world.device``, or the embeddings file of ``world.prompt_embeddings``; encoded once per
    prompt while it stays in use (the embedder's LRU)."""
    if wc.text_encoder:
        source = UMT5TextEncoder.load(
            Path(wc.text_encoder), device=wc.device, dtype=dtype, text_len=cfg.text_len
        )
    else:
        source = PrecomputedEmbeddings.load(
            Path(wc.prompt_embeddings), dim=cfg.text_dim, device=wc.device, dtype=dtype, text_len=cfg.text_len
        )
    return PromptEmbedder(source, cfg.text_len)


class WorldService(KindServiceBase):
    """The ``world`` session kind (``realtime.kinds.base.SessionKindService``)."""

    name = "world"

    def __init__(self, ctx: ServerContext) -> None:
        super().__init__(ctx)
        self.config = ctx.config.world
        self.model: WorldModel | None = None
        self.plan: CapacityPlan | None = None
        self.step_seconds: dict[int, float] = {}
        self.pipeline: Pipeline | None = None
        self.errors = Counter(
            "realtime_world_errors", "world protocol errors by code", ["code"], registry=ctx.registry
        )
        self.event_to_chunk = Histogram(
            "world_event_to_chunk_seconds",
            "accepted control event -> the first chunk that applied it handed to the socket",
            buckets=(0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0),
            registry=ctx.registry,
        )
        self.stages = StageTimer(ctx.registry)

    @property
    def engine(self) -> StageEngine | None:
        """The DiT block engine (the pipeline's first stage, which holds the resident KV)."""
        return self.pipeline.runners[0] if self.pipeline is not None else None  # type: ignore[return-value]

    def unknown_prompt(self, prompt: str | None) -> str | None:
        """Why ``prompt`` cannot be served, or ``None``: with ``world.prompt_embeddings`` only the
        file's prompts can (its lookup reads one small tensor; any prompt goes with a text encoder
        or a model of its own word table)."""
        if not self.config.prompt_embeddings or self.model is None:
            return None
        try:
            self.model.prompts([prompt])
        except UnknownPromptError as exc:
            return str(exc)
        return None

    def routes(self) -> list[BaseRoute]:
        return [WebSocketRoute(PATH, self._endpoint)]

    def models(self) -> list[ServedModel]:
        return [ServedModel(self.config.model, self.name, (PATH,), self.capabilities() if self.model else {})]

    def capabilities(self) -> dict[str, Any]:
        assert self.model is not None
        cfg, wc = self.model.cfg, self.config
        return {
            "model": cfg.name,
            "width": cfg.frame_width,
            "height": cfg.frame_height,
            "fps": wc.fps,
            "fps_range": [wc.min_fps, wc.max_fps],
            "latent_frames_per_block": cfg.frames_per_block,
            "frames_per_chunk": {"first": cfg.frames_for_block(True), "later": cfg.frames_for_block(False)},
            "formats": list(proto.FORMATS),
            "pacing": list(proto.PACING),
            "control_schemas": CONTROL_SCHEMAS,
            "prompt_policy": "cross_attention_reset",
            "limits": {
                "max_message_bytes": wc.max_message_bytes,
                "max_prompt_chars": wc.max_prompt_chars,
                "max_pending_events": self.ctx.config.runtime.max_pending_events,
                "max_ahead_blocks": wc.max_ahead_blocks,
            },
        }

    def load(self, progress: ProgressFn) -> None:
        """Plan capacity once (memory measured before the pools exist), then build the pools."""
        wc = self.config
        if wc.torch_threads:
            torch.set_num_threads(wc.torch_threads)
        progress("plan capacity", 0, 3)
        cfg, weights = resolve_model(wc.model, wc.weights, wc.decoder)
        # a checkpoint model's umT5 source first: what it holds on the device is not free for the plan
        prompts = prompt_context(wc, cfg, _DTYPES[wc.dtype]) if wc.checkpoint else None
        self.plan = capacity_plan(
            self.ctx.config.runtime,
            world_declaration(cfg, _DTYPES[wc.dtype], wc.max_batch, wc.graphs),
            wc.device,
        )
        progress("load model", 1, 3)
        self.model = WorldModel.build(
            cfg,
            slots=self.plan.capacity,
            weights=weights,
            device=wc.device,
            dtype=_DTYPES[wc.dtype],
            attention=wc.attention,
            profiler=DeviceProfiler(wc.device.startswith("cuda")) if wc.stage_timing else OFF,
            checkpoint=Path(wc.checkpoint) if wc.checkpoint else None,
            vae=Path(wc.vae) if wc.vae else None,
            prompts=prompts,
        )
        if wc.compiles:
            self.model.dit.compile_blocks()
            self.model.compile_decoder()
        if wc.graphs:
            progress("capture CUDA graphs", 2, 3)
            self._capture_graphs()
        self.step_seconds = measure_step_seconds(
            self.model, wc.max_batch, on_probe=lambda b: progress(f"warm up and time steps: batch {b}", 2, 3)
        )
        if wc.compute_admission:
            period_s = cfg.frames_for_block(False) / wc.fps
            paced = paced_capacity(self.step_seconds, period_s, wc.max_batch, wc.compute_utilisation)
            self.plan = with_compute_limit(self.plan, paced)
        log.info(
            "world capacity planned",
            extra={
                "capacity": self.plan.capacity,
                "limited_by": self.plan.limited_by,
                "paced": self.plan.compute_capacity,
            },
        )
        progress("ready", 3, 3)

    def _capture_graphs(self) -> None:
        """``world.cuda_graphs``: capture (before the warm-up, which then times replayed passes);
        under ``auto`` a failure leaves eager passes, with one warning line."""
        assert self.model is not None
        try:
            self.model.capture_graphs(self.config.max_batch)
        except Exception as exc:  # noqa: BLE001 - auto: any failure means eager passes
            if self.config.cuda_graphs is True:
                raise
            reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
            log.warning("world CUDA graphs: capture failed (%s); eager DiT passes", reason)

    async def start(self) -> None:
        wc, model, plan = self.config, self.model, self.plan
        assert model is not None and plan is not None, "load() runs before start()"
        stages = (
            WorldBlockStage(model, device=wc.device),
            WorldDecodeStage(model, device=wc.device),
            MediaEncodeStage(model.pool.slots, threads=wc.encode_threads),
        )
        declared = stage_declaration(*stages).per_session_bytes
        assert declared == plan.per_session_bytes, (
            f"stages hold {declared} bytes per session, planned {plan.per_session_bytes}"
        )
        registry = self.ctx.registry
        self.runner = self.pipeline = Pipeline(
            [
                StageEngine(
                    s, registry=registry, max_batch=wc.max_batch, coalesce_window_s=wc.coalesce_window_s
                )
                for s in stages
            ],
            registry=registry,
            channel_size=wc.max_ahead_blocks + 1,
        )
        self.manager = build_session_manager(
            self.name,
            ctx=self.ctx,
            kind_config=wc,
            plan=plan,
            executor=StageExecutor(self.pipeline, world_input),
            lifecycle=self.pipeline,
        )
        await self.manager.start()
        log.info("world sessions ready", extra={"capacity": self.manager.capacity, "max_batch": wc.max_batch})

    async def _endpoint(self, websocket: WebSocket) -> None:
        await self.serve(websocket, _WorldHandler(self, websocket.query_params.get("protocol_version")))


def measure_step_seconds(
    model: WorldModel, max_batch: int, reps: int = 2, on_probe: Callable[[int], None] | None = None
) -> dict[int, float]:
    """Seconds of one steady-state block step (DiT + decode, the window full) at batch 1, 2, 4,
    ... up to ``max_batch`` (and the pool's slots): the compute side of admission.

    Each probe runs from block 0 until its window is full, and the first batch of two or more
    then steps once more with one session starting afresh beside the others, so the warm-up
    meets every shape class a session meets (no past, a window filling, the full window, a
    batch mixing phases) at batch 1 and at a batch of 2 or more: with ``world.compile`` these
    are all the graphs there are (``CausalDiT.compile_blocks``), so no session compiles in
    service. ``on_probe(batch)`` runs before each batch size's probe (the load's progress: with
    ``world.compile`` each probe may compile for seconds)."""
    sizes = sorted({min(b, max_batch, model.pool.slots) for b in (1, 2, 4, 8, 16, 32, 64, max_batch)})
    action = torch.zeros(model.cfg.action_dim)
    steady = model.pool.geometry.steady_block
    seconds: dict[int, float] = {}
    for b in sizes:
        if on_probe is not None:
            on_probe(b)
        ids = [f"probe-{i}" for i in range(b)]
        for sid in ids:
            model.open(sid, seed=0)
        try:
            times = []
            for block in range(steady + reps):
                t0 = time.perf_counter()
                model.step([WorldTick(sid, block, None, action) for sid in ids])
                times.append(time.perf_counter() - t0)
            seconds[b] = min(times[steady:])
            if b > 1 and len(seconds) == 2:  # once: a session joining the others (masked)
                model.reset(ids[0])
                joined = [WorldTick(sid, steady + reps, None, action) for sid in ids[1:]]
                model.step([WorldTick(ids[0], 0, None, action), *joined])
        finally:
            for sid in ids:
                model.release(sid)
    return seconds


def world_declaration(
    cfg: WorldModelConfig, dtype: torch.dtype, max_batch: int, graphs: bool = False
) -> MemoryDeclaration:
    """One session's bytes over the world stages, computed from the geometry before any pool
    exists (what ``WorldBlockStage.state_bytes() + WorldDecodeStage.state_bytes()`` will say);
    the fixed share (weights; one batched tick's transient memory; the DiT's CUDA graphs with
    ``graphs``) is ``models.world.memory``."""
    geometry = KVGeometry.of(cfg, dtype)
    return MemoryDeclaration(
        resident_bytes_per_session=geometry.bytes_per_session + decoder_state_bytes(cfg, dtype),
        scratch_bytes=fixed_bytes(cfg, dtype, max_batch, graphs),
        max_sessions=256,
    )


@dataclass(frozen=True)
class _TickDone:
    generation: int
    result: Any
    error: BaseException | None
    started: float  # time.monotonic() when the tick was spawned
    ahead_ms: float  # media the client held then (pacer's model)
    lead_ms: float | None  # the lead the pacer aimed for then


@dataclass
class _ChunkMedia:
    """A chunk's encoded media as :func:`_media` found it (written once there, on the loop), for
    the runner's stage timing once the chunk is sent; ``media`` stays ``None`` if it never was."""

    first: bool  # the session's chunk 0
    media: EncodedMedia | None = None
    ready_at: float = 0.0  # time.monotonic() when the media was encoded


@dataclass(frozen=True)
class _Sent:
    """A chunk left the writer (or was dropped): the generate-ahead credit comes back."""

    generation: int
    frames: int
    started: float
    at: float  # time.monotonic() when the writer was done with it
    event_at: float | None  # when the oldest event it applied was accepted (event to chunk)
    chunk: _ChunkMedia


class _Wake:
    """Pacing time reached (the timer that posted it) or a retry: maybe start the next tick."""


class _WorldHandler:
    """One world connection (``KindHandler``); every attribute is the runner's alone."""

    inline = False

    def __init__(self, service: WorldService, protocol_version: str | None) -> None:
        self.service = service
        self.protocol_version = protocol_version
        wc, cfg = service.config, service.model.cfg  # type: ignore[union-attr]
        self.codec = proto.ServerConnection(
            proto.Limits(
                cfg.frame_width,
                cfg.frame_height,
                wc.min_fps,
                wc.max_fps,
                wc.max_prompt_chars,
                wc.max_message_bytes,
            ),
            default_fps=wc.fps,
            default_pacing=wc.default_pacing,
            validate_control=validate_control,
        )
        self.start: proto.Start | None = None
        self.payload: WorldTickPayload | None = None
        self.pacer: PlaybackPacer | None = None
        self.ticking = False
        self.paused = False  # the session FAILED: no ticks until session.reset
        self.unsent = 0  # chunks generated but not yet sent, any epoch (the generate-ahead credit)
        self.frames_out = 0
        self.timer: asyncio.TimerHandle | None = None
        self.wake: _Wake | None = None  # what the pending timer will post
        self.client_ts: dict[int, float] = {}  # event id -> client timestamp, until applied
        self.accepted_at: dict[int, float] = {}  # event id -> time.monotonic() accepted, until applied
        self.queue_sends: list[asyncio.Task] = []  # session.queued frames on their way (_queued)
        self.held: dict[int, HeldBlock] = {}  # block -> the blocks its KV holds, as sent (checkpoints)

    async def opened(self, conn: Connection) -> None:
        bad = proto.check_version(self.protocol_version)
        if bad is not None:
            await conn.send(self._error(bad.code, bad.message))
            conn.end("protocol", "unsupported protocol_version")

    async def decode(self, message: str | bytes) -> proto.Command:
        if isinstance(message, bytes):
            return self.codec.receive_bytes(message)
        return self.codec.receive_text(message)

    async def session_ended(self, conn: Connection, reason: str) -> Close:
        self._stop_timer()
        session = conn.session
        await conn.send(proto.render_closed(session.session_id if session else None, reason))
        return runtime_close(reason)

    async def handle(self, conn: Connection, item: Any) -> None:
        if isinstance(item, _TickDone):
            await self._tick_done(conn, item)
        elif isinstance(item, _Sent):
            self._sent(conn, item)
        elif isinstance(item, _Wake):
            if item is self.wake:
                self.timer = self.wake = None
        elif isinstance(item, proto.Rejected):
            await conn.send(self._error(item.code, item.message, item.event_id))
        elif isinstance(item, proto.Ping):
            await conn.send(proto.render_pong(item.data))
        elif isinstance(item, proto.Start):
            await self._start(conn, item)
        elif isinstance(item, proto.Event):
            await conn.send(self._event(conn, item))
        elif isinstance(item, proto.Reset):
            await self._reset(conn)
        elif isinstance(item, proto.Close):
            await self._close(conn)
            return
        self._maybe_tick(conn)

    # -- commands -------------------------------------------------------------------------
    def _queued(self, conn: Connection, position: int) -> None:
        """The admission queue's position callback: it runs while the runner waits in
        ``create_session``, so the frame reaches the writer from a task of its own."""
        self.queue_sends.append(asyncio.create_task(conn.send(proto.render_queued(position))))

    async def _start(self, conn: Connection, cmd: proto.Start) -> None:
        unknown = self.service.unknown_prompt(cmd.prompt)
        if unknown:
            await conn.send(self._error(proto.ErrorCode.INVALID_MESSAGE, unknown))
            conn.end("protocol", unknown)  # the codec counts the start as made: no second one on this socket
            return
        restored = await self._restored(conn)
        if restored is not None:
            cmd = restored[1].start
        try:
            session = await conn.create_session(
                on_queue_position=functools.partial(self._queued, conn),
                session_id=restored[0] if restored else None,
            )
        except SessionError as exc:
            await conn.send(self._error(exc.code, exc.message))
            conn.end("capacity", exc.message)
            return
        finally:
            await asyncio.gather(*self.queue_sends, return_exceptions=True)  # positions before created
            self.queue_sends.clear()
        wc = self.service.config
        self.start = cmd
        held = restored[1].held if restored is not None else ()
        if held and not restorable(self.service.model.cfg, held):  # type: ignore[union-attr]
            log.warning("world checkpoint of another model shape: the session restarts from its seed")
            held = ()
        self.held = {h.block: h for h in held}
        self.payload = WorldTickPayload(
            cmd.seed, cmd.prompt, MediaSettings(cmd.format, cmd.fps, wc.jpeg_quality), held
        )
        block_s = self.service.model.cfg.frames_for_block(False) / cmd.fps  # type: ignore[union-attr]
        self.pacer = PlaybackPacer(
            cmd.fps, wc.pacing_margin_s, wc.pacing_window, wc.max_ahead_blocks * block_s
        )
        caps = {**self.service.capabilities(), "fps": cmd.fps, "format": cmd.format, "pacing": cmd.pacing}
        if restored is not None:
            state = restored[1]
            session.continue_from(state.epoch, state.prompt, state.controls, state.chunks if held else 0)
        await conn.send(proto.render_created(session.session_id, caps))

    async def _restored(self, conn: Connection) -> tuple[str, WorldState] | None:
        """The session of a gone replica this socket names, from the checkpoint the session check
        found (``realtime.scale.resume``): it goes on with its start command, prompt and controls
        after the last chunk it sent, its first tick rebuilding the model's state from the blocks
        held (``WorldModel.restore``); without them it restarts from its seed at chunk 0."""
        checkpointer, checkpoint = self.service.ctx.checkpointer, restoring(conn.ws.scope)
        if checkpointer is None or checkpoint is None or checkpoint.kind != "world":
            return None
        state = await asyncio.to_thread(decode, checkpoint)
        if not isinstance(state, WorldState):
            return None
        checkpointer.adopt(checkpoint)
        return checkpoint.session_id, state

    def _checkpoint(self, conn: Connection, sent: HeldBlock) -> None:
        """After a chunk was sent: the blocks its session's KV holds now, and the session's state
        with them to the replica's checkpointer (coalesced: ``state`` reads the newest when it
        runs). Held latents over the store's bound are left out (the world would restart from its
        seed)."""
        checkpointer, session, start = self.service.ctx.checkpointer, conn.session, self.start
        if checkpointer is None or session is None or start is None:
            return
        cfg = self.service.model.cfg  # type: ignore[union-attr]
        kept = resident_blocks(cfg, sent.block + 1)
        self.held = {b: h for b, h in {**self.held, sent.block: sent}.items() if b in kept}
        room = self.service.ctx.config.replicas.checkpoint_max_bytes - _STATE_OVERHEAD_BYTES

        def state() -> WorldState:
            held = tuple(self.held[b] for b in sorted(self.held))
            chunks = held[-1].block + 1 if held else 0
            if not restorable(cfg, held) or sum(h.latent.nbytes for h in held) > room:
                held = ()
            controls = tuple(session.controls.values())
            return WorldState(start, session.prompt, controls, session.epoch, chunks, held)

        checkpointer.save(session.session_id, "world", state)

    def _event(self, conn: Connection, cmd: proto.Event) -> str:
        """Accept or refuse one event at once; the ack or typed error to send."""
        event = cmd.event
        unknown = self.service.unknown_prompt(event.prompt) if event.prompt is not None else None
        if unknown:
            return self._error(proto.ErrorCode.INVALID_MESSAGE, unknown, event.event_id)
        try:
            status = conn.session.accept_event(event)  # type: ignore[union-attr]
        except SessionError as exc:
            return self._error(exc.code, exc.message, event.event_id)
        if status == "accepted":
            self.accepted_at[event.event_id] = time.monotonic()
        if event.client_ts_ms is not None and status == "accepted":
            self.client_ts[event.event_id] = event.client_ts_ms
        return proto.render_event_ack(event.event_id, str(status))

    async def _reset(self, conn: Connection) -> None:
        session, manager = conn.session, self.service.manager
        assert session is not None and manager is not None
        self._stop_timer()
        try:  # the reset moves the session's epoch on: queued chunks of the old world are never shown
            await manager.reset(session.session_id)
        except SessionError as exc:
            await conn.send(self._error(exc.code, exc.message))
            return
        self.paused, self.frames_out, self.held = False, 0, {}
        self.payload = dataclasses.replace(self.payload, restore=())  # type: ignore[arg-type]
        self.pacer.restart()  # type: ignore[union-attr]
        self.client_ts.clear()
        self.accepted_at.clear()
        await conn.send(proto.render_reset_done(session.session_id))

    async def _close(self, conn: Connection) -> None:
        session, manager = conn.session, self.service.manager
        assert session is not None and manager is not None
        self._stop_timer()
        try:
            await manager.close(session.session_id)
        except SessionError as exc:  # cleanup failed: the tombstone is the runtime's to retry
            await conn.send(self._error(exc.code, exc.message))
        await conn.send(proto.render_closed(session.session_id, "client_close"))
        conn.end("client_close")

    # -- ticks ----------------------------------------------------------------------------
    def _maybe_tick(self, conn: Connection) -> None:
        """Start the next tick if none runs and pacing and the generate-ahead credit allow it."""
        session, start, pacer = conn.session, self.start, self.pacer
        if self.ticking or self.paused or start is None or session is None or session.status != "active":
            return
        assert pacer is not None
        if self.unsent >= self.service.config.max_ahead_blocks:
            return  # a sent chunk posts _Sent
        now = time.monotonic()
        if start.pacing == "realtime":
            wait = pacer.wait_s(now)
            if wait is None:
                return  # the first chunk's send measures the pipeline (_Sent)
            if wait > 0:
                self._wake_in(conn, wait)
                return
        self._stop_timer()
        self.ticking = True
        generation, ahead_ms, lead = session.epoch, pacer.ahead_s(now) * 1000, pacer.lead_s()
        lead_ms = None if lead is None else lead * 1000
        conn.spawn(  # requested now: a reset before the child starts it drops it unstarted
            session.next_tick(self.payload),
            lambda result, error: _TickDone(generation, result, error, now, ahead_ms, lead_ms),
        )

    def _wake_in(self, conn: Connection, delay_s: float) -> None:
        """(Re)arm the one pacing timer: it posts a fresh ``_Wake`` to the runner."""
        self._stop_timer()
        wake = self.wake = _Wake()
        self.timer = asyncio.get_running_loop().call_later(delay_s, conn.post, wake)

    def _stop_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.timer = self.wake = None

    async def _tick_done(self, conn: Connection, done: _TickDone) -> None:
        self.ticking = False
        session = conn.session
        assert session is not None
        if done.generation != session.epoch and session.status is not SessionStatus.FAILED:
            return  # superseded by a reset or close (a failure moves the epoch on too: reported)
        if done.error is not None:
            error = done.error
            if not isinstance(error, SessionError):
                raise error  # a bug: the skeleton logs it and closes 1011
            if isinstance(error, TickSupersededError):
                return
            if isinstance(error, TransientError):  # a full engine queue: nothing changed; try again
                self._wake_in(conn, 0.05)
                return
            self.paused = True
            await conn.send(self._error(error.code, f"{error.message}; send session.reset"))
            return
        result: TickOutput[PipelineResult] = done.result
        if self.payload.restore:  # type: ignore[union-attr]  # the model state is rebuilt
            self.payload = dataclasses.replace(self.payload, restore=())  # type: ignore[arg-type]
        meta = self._chunk_metadata(result, done)
        frames = meta["frame_count"]
        self.unsent += 1
        self.pacer.generated(frames)  # type: ignore[union-attr]
        applied = [
            self.accepted_at.pop(i) for i in result.metadata.applied_event_ids if i in self.accepted_at
        ]
        oldest = min(applied, default=None)
        chunk = _ChunkMedia(first=result.metadata.chunk_index == 0)
        sent = functools.partial(self._post_sent, conn, done.generation, frames, done.started, oldest, chunk)
        await conn.send_later(_media(result.value.tail, meta, chunk), epoch=done.generation, on_done=sent)

    @staticmethod
    def _post_sent(
        conn: Connection,
        generation: int,
        frames: int,
        started: float,
        event_at: float | None,
        chunk: _ChunkMedia,
    ) -> None:
        """The writer's ``on_done``: only a message to the runner (it owns every counter)."""
        conn.post(_Sent(generation, frames, started, time.monotonic(), event_at, chunk))

    def _sent(self, conn: Connection, item: _Sent) -> None:
        self.unsent -= 1
        session = conn.session
        assert session is not None
        if item.generation == session.epoch:  # an old world's chunk was dropped, not played
            self.pacer.sent(item.frames, item.at, item.at - item.started)  # type: ignore[union-attr]
            if item.event_at is not None:
                self.service.event_to_chunk.observe(item.at - item.event_at)
            chunk = item.chunk
            if chunk.media is not None:
                self.service.stages.observe(chunk.media, chunk.first, item.started, chunk.ready_at, item.at)
                if chunk.media.held is not None:
                    self._checkpoint(conn, chunk.media.held)

    def _chunk_metadata(self, result: TickOutput[PipelineResult], done: _TickDone) -> dict[str, Any]:
        start, cfg = self.start, self.service.model.cfg  # type: ignore[union-attr]
        assert start is not None
        identity = result.metadata
        frames = cfg.frames_for_block(identity.chunk_index == 0)
        first, self.frames_out = self.frames_out, self.frames_out + frames
        stamps = [self.client_ts.pop(i) for i in identity.applied_event_ids if i in self.client_ts]
        head = result.value.head
        return {
            **identity.to_dict(),
            "frame_count": frames,
            "first_frame_index": first,
            "format": start.format,
            "width": cfg.frame_width,
            "height": cfg.frame_height,
            "fps": start.fps,
            "client_ts_ms": stamps[-1] if stamps else None,
            "timing": {
                "queue_ms": max(0.0, (time.monotonic() - done.started) * 1000.0 - head.forward_ms),
                "generate_ms": head.forward_ms,
                "batch_size": head.batch_size,
                "ahead_ms": done.ahead_ms,
                "lead_ms": done.lead_ms,
            },
        }

    def _error(self, code: str, message: str, event_id: int | None = None) -> str:
        self.service.errors.labels(str(code)).inc()
        return proto.render_error(code, message, event_id)


async def _media(tail: asyncio.Future, meta: dict[str, Any], chunk: _ChunkMedia) -> tuple[str | bytes, ...]:
    """The chunk's frames once the pipeline encoded them: metadata text, then the media bytes."""
    try:
        media: EncodedMedia = await tail
    except SessionError:
        return ()  # superseded (reset, close, release): never shown
    chunk.media, chunk.ready_at = media, time.monotonic()
    meta = {**meta, "byte_length": len(media.data), "init_segment_bytes": media.init_bytes}
    meta["timing"] = {**meta["timing"], "decode_ms": media.decode_ms, "encode_ms": media.encode_ms}
    return proto.render_chunk_metadata(meta), media.data


def build_world_service(ctx: ServerContext) -> WorldService:
    return WorldService(ctx)
