"""AR-diffusion world sessions over the public world protocol (docs/protocols/world.md).

Route ``/v1/realtime/world?protocol_version=1``; ``GET /demo/world`` serves the minimal browser
page ``clients/web/world.html`` (package data). Each connection is one session of the session
runtime; every tick generates one latent block through the world ``StageEngine`` (ticks of all
sessions batch into one forward on the engine's worker thread), decodes it to frames, and the
frames are encoded (JPEG batch, or fMP4 continuing the session's H.264 stream) on a worker thread
while the next block denoises.

Per connection: a reader task (frames -> codec commands; events are accepted or rejected at once),
a runner task (the generation loop: pacing, ``session.next_tick``, encode hand-off) and a writer
task (ordered outbound queue; drops chunks of a superseded generation after a reset).

Pacing: ``realtime`` generates at most ``world.max_ahead_blocks`` blocks ahead of the media clock
(frames sent / fps since the first chunk) and then waits; ``fast`` generates as fast as possible,
bounded by the outbound queue (``max_ahead_blocks`` chunks). Controls apply at the next block
boundary: the reducer keeps the latest ``keys`` control (sticky) and sums ``mouse`` deltas of the
events applied in one block. Prompt changes reset the session's cross-attention KV
(``models.world.model``); a tick failure moves the session to FAILED until ``session.reset``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import torch
from prometheus_client import Counter
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import BaseRoute, Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from models.world.configs import CONFIGS, WEIGHTS_DIR, WorldModelConfig, read_config
from models.world.controls import CONTROL_SCHEMAS, KEYS_TRACK, MOUSE_SCHEMA, MOUSE_TRACK, action_vector
from models.world.kv_cache import KVGeometry
from models.world.model import WorldModel, WorldTick
from models.world.stage import WorldStage, WorldStageInput, WorldStageOutput
from models.world.vae import decoder_state_bytes
from realtime.kinds.base import ProgressFn, ServedModel, ServerContext
from realtime.kinds.runtime import build_session_manager, capacity_plan
from realtime.media.video import Fmp4Encoder, encode_jpeg_batch
from realtime.protocols import world as proto
from realtime.ws import CloseCode, close_quietly, serve_websocket
from sessions.capacity import MemoryDeclaration
from sessions.engine import StageEngine
from sessions.errors import SessionError, TickSupersededError
from sessions.events import ControlInput, SessionEvent
from sessions.log_context import session_context
from sessions.manager import SessionManager
from sessions.reducer import PreparedControls
from sessions.session import Session
from sessions.tick import TickOutput, TickSnapshot

log = logging.getLogger("realtime.world")

PATH = "/v1/realtime/world"
PAGE_PATH = "/demo/world"
OUTBOUND_MESSAGES = 64  # queued text messages + chunks per connection (then the reader waits)
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class WorldControlReducer:
    """Latest ``keys`` control wins (sticky); ``mouse`` deltas of one block's events are summed."""

    def prepare(
        self,
        *,
        current_controls: Mapping[str, ControlInput],
        events: tuple[SessionEvent, ...],
        chunk_index: int,
    ) -> PreparedControls:
        keys = current_controls.get(KEYS_TRACK)
        dx = dy = 0.0
        for event in events:
            for control in event.controls:
                if control.track == KEYS_TRACK:
                    keys = control
                elif control.track == MOUSE_TRACK:
                    dx += float(control.data.get("dx", 0))
                    dy += float(control.data.get("dy", 0))
        mouse = ControlInput(MOUSE_TRACK, MOUSE_SCHEMA, {"dx": dx, "dy": dy})
        return PreparedControls((keys, mouse) if keys is not None else (mouse,))

    def commit(self, prepared: PreparedControls) -> None:
        return None

    def reset(self) -> None:
        return None


@dataclass(frozen=True)
class WorldTickPayload:
    """What a world tick carries besides the snapshot: the session seed and start prompt."""

    seed: int
    prompt: str | None


@dataclass(frozen=True)
class WorldChunk:
    output: WorldStageOutput
    client_ts_ms: float | None
    queued_ms: float


class WorldExecutor:
    """One tick = one item of the world engine's next batch."""

    def __init__(self, engine: StageEngine) -> None:
        self.engine = engine

    async def execute(self, snapshot: TickSnapshot) -> TickOutput[WorldChunk]:
        payload: WorldTickPayload = snapshot.payload
        keys = snapshot.control(KEYS_TRACK)
        mouse = snapshot.control(MOUSE_TRACK)
        action = action_vector(
            keys.data["pressed"] if keys is not None else (),
            mouse.data["dx"] if mouse is not None else 0.0,
            mouse.data["dy"] if mouse is not None else 0.0,
        )
        prompt = snapshot.prompt if snapshot.prompt is not None else payload.prompt
        tick = WorldTick(snapshot.session_id, snapshot.chunk_index, prompt, action)
        t0 = time.perf_counter()
        await self.engine.open(snapshot.session_id)  # idempotent; a reset released the slot
        out: WorldStageOutput = await self.engine.submit(
            snapshot.session_id, snapshot.epoch, WorldStageInput(tick, payload.seed)
        )
        stamps = [e.client_ts_ms for e in snapshot.events if e.client_ts_ms is not None]
        queued = (time.perf_counter() - t0) * 1000.0 - out.forward_ms
        return TickOutput(
            snapshot.metadata, WorldChunk(out, stamps[-1] if stamps else None, max(0.0, queued))
        )


@functools.cache
def _page_html() -> str:
    return resources.files("clients").joinpath("web", "world.html").read_text(encoding="utf-8")


def resolve_model(name: str, weights: str | None) -> tuple[WorldModelConfig, Path | None]:
    """(config, weights path or None) for ``world.model`` / ``world.weights``."""
    if weights:
        return read_config(Path(weights)), Path(weights)
    if name not in CONFIGS:
        raise ValueError(f"unknown world model {name!r} (known: {', '.join(CONFIGS)})")
    trained = WEIGHTS_DIR / f"{name}.safetensors"
    return CONFIGS[name], trained if trained.is_file() else None


class WorldService:
    """The ``world`` session kind (``realtime.kinds.base.SessionKindService``)."""

    name = "world"

    def __init__(self, ctx: ServerContext) -> None:
        self.ctx = ctx
        self.config = ctx.config.world
        self.model: WorldModel | None = None
        self.declaration: MemoryDeclaration | None = None
        self.engine: StageEngine | None = None
        self.manager: SessionManager | None = None
        self.errors = Counter(
            "realtime_world_errors", "world protocol errors by code", ["code"], registry=ctx.registry
        )

    def routes(self) -> list[BaseRoute]:
        return [WebSocketRoute(PATH, self._endpoint), Route(PAGE_PATH, self._page, methods=["GET"])]

    async def _page(self, request: Request) -> Response:
        """The minimal browser page (``clients/web/world.html``, shipped as package data)."""
        return HTMLResponse(_page_html())

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
        wc = self.config
        if wc.torch_threads:
            torch.set_num_threads(wc.torch_threads)
        progress("plan capacity", 0, 3)
        cfg, weights = resolve_model(wc.model, wc.weights)
        dtype = _DTYPES[wc.dtype]
        geometry = KVGeometry.of(cfg, dtype)
        decoder_bytes = decoder_state_bytes(cfg, dtype)
        probe = MemoryDeclaration(
            resident_bytes_per_session=geometry.bytes_per_session,
            model_owned_bytes_per_session=decoder_bytes,
            scratch_bytes=geometry.scratch_bytes(wc.max_batch),
            max_sessions=256,
        )
        slots = capacity_plan(self.ctx.config.runtime, probe, wc.device).capacity
        progress("load model", 1, 3)
        self.model = WorldModel.build(cfg, slots=slots, weights=weights, device=wc.device, dtype=dtype)
        self.declaration = MemoryDeclaration(
            resident_bytes_per_session=geometry.bytes_per_session,
            model_owned_bytes_per_session=decoder_bytes,
            scratch_bytes=geometry.scratch_bytes(wc.max_batch),
            max_sessions=slots,
        )
        progress("warm up", 2, 3)
        self.model.open("warmup", seed=0)
        try:
            self.model.step([WorldTick("warmup", 0, None, torch.zeros(cfg.action_dim))])
        finally:
            self.model.release("warmup")
        progress("ready", 3, 3)

    async def start(self) -> None:
        wc = self.config
        assert self.model is not None and self.declaration is not None, "load() runs before start()"
        self.engine = StageEngine(
            WorldStage(self.model, device=wc.device),
            registry=self.ctx.registry,
            max_batch=wc.max_batch,
            coalesce_window_s=wc.coalesce_window_s,
        )
        self.manager = build_session_manager(
            self.name,
            runtime=self.ctx.config.runtime,
            kind_config=wc,
            executor=WorldExecutor(self.engine),
            declaration=self.declaration,
            lifecycle=self.engine,
            registry=self.ctx.registry,
            device=wc.device,
            reducer_factory=WorldControlReducer,
        )
        await self.manager.start()
        log.info("world sessions ready", extra={"capacity": self.manager.capacity, "max_batch": wc.max_batch})

    async def stop(self) -> None:
        if self.manager is not None:
            await self.manager.shutdown()
        if self.engine is not None:
            await self.engine.close()

    async def _endpoint(self, websocket: WebSocket) -> None:
        await serve_websocket(websocket, self.ctx, self.name, _Connection(self, websocket).run)


@dataclass
class _ChunkOut:
    generation: int
    metadata: dict[str, Any]
    media: asyncio.Future


class _Connection:
    def __init__(self, service: WorldService, websocket: WebSocket) -> None:
        self.service = service
        self.ws = websocket
        wc = service.config
        cfg = service.model.cfg  # type: ignore[union-attr]
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
        )
        self.outbound: asyncio.Queue[str | _ChunkOut] = asyncio.Queue(OUTBOUND_MESSAGES)
        self.session: Session | None = None
        self.start: proto.Start | None = None
        self.generation = 0
        self.resumed = asyncio.Event()
        self.started = asyncio.Event()
        self.clock_t0: float | None = None
        self.frames_out = 0
        self.closing: tuple[int, str] | None = None
        self.reader_done = asyncio.Event()
        self.chunk_slots = asyncio.Semaphore(wc.max_ahead_blocks)  # chunks generated but not yet sent
        self.fmp4: Fmp4Encoder | None = None  # this generation's H.264 stream (fmp4 format)
        self.fmp4_generation = -1
        self.last_encode: asyncio.Future | None = None  # encodes run one at a time, in chunk order

    async def run(self) -> None:
        bad = proto.check_version(self.ws.query_params.get("protocol_version"))
        if bad is not None:
            self.service.errors.labels(bad.code).inc()
            await self.ws.send_text(proto.render_error(bad.code, bad.message))
            await self._close(CloseCode.POLICY_VIOLATION, "unsupported protocol_version")
            return
        tasks = {
            asyncio.create_task(self._read(), name="world-reader"),
            asyncio.create_task(self._run(), name="world-runner"),
            asyncio.create_task(self._write(), name="world-writer"),
        }
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if not task.cancelled() and task.exception() is not None:
                    raise task.exception()
        except Exception:
            log.exception("world connection failed")
            self.closing = (CloseCode.INTERNAL_ERROR, "internal server error")
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if self.session is not None:
                await self.service.manager.disconnect(self.session.session_id)  # type: ignore[union-attr]
        if self.closing is not None:
            await self._close(*self.closing)

    def _error(self, code: str, message: str, event_id: int | None = None) -> str:
        self.service.errors.labels(str(code)).inc()
        return proto.render_error(code, message, event_id)

    async def _read(self) -> None:
        try:
            await self._read_loop()
        finally:
            self.reader_done.set()

    async def _read_loop(self) -> None:
        while True:
            try:
                message = await self.ws.receive()
            except (WebSocketDisconnect, RuntimeError):
                return
            if message["type"] == "websocket.disconnect":
                return
            if message.get("bytes") is not None:
                cmd: proto.Command = self.codec.receive_bytes(message["bytes"])
            else:
                cmd = self.codec.receive_text(message.get("text") or "")
            if await self._handle(cmd):
                return

    async def _handle(self, cmd: proto.Command) -> bool:
        """Apply one command; True ends the connection."""
        manager = self.service.manager
        assert manager is not None
        if isinstance(cmd, proto.Rejected):
            await self.outbound.put(self._error(cmd.code, cmd.message, cmd.event_id))
        elif isinstance(cmd, proto.Ping):
            await self.outbound.put(proto.render_pong(cmd.data))
        elif isinstance(cmd, proto.Start):
            try:
                self.session = await manager.create()
            except SessionError as exc:
                await self.outbound.put(self._error(exc.code, exc.message))
                self.closing = (CloseCode.TRY_AGAIN_LATER, exc.message)
                return True
            self.start = cmd
            caps = {**self.service.capabilities(), "fps": cmd.fps, "format": cmd.format, "pacing": cmd.pacing}
            await self.outbound.put(proto.render_created(self.session.session_id, caps))
            self.started.set()
            self.resumed.set()
        elif isinstance(cmd, proto.Event):
            assert self.session is not None
            try:
                status = self.session.accept_event(cmd.event)
            except SessionError as exc:
                await self.outbound.put(self._error(exc.code, exc.message, cmd.event.event_id))
            else:
                await self.outbound.put(proto.render_event_ack(cmd.event.event_id, str(status)))
        elif isinstance(cmd, proto.Reset):
            assert self.session is not None
            self.generation += 1
            self.resumed.clear()
            try:
                await manager.reset(self.session.session_id)
            except SessionError as exc:
                await self.outbound.put(self._error(exc.code, exc.message))
                return False
            self.clock_t0, self.frames_out = None, 0
            await self.outbound.put(proto.render_reset_done(self.session.session_id))
            self.resumed.set()
        elif isinstance(cmd, proto.Close):
            assert self.session is not None
            self.generation += 1
            try:
                await manager.close(self.session.session_id)
            except SessionError as exc:  # cleanup failed: the tombstone is the runtime's to retry
                await self.outbound.put(self._error(exc.code, exc.message))
            await self.outbound.put(proto.render_closed(self.session.session_id, "client_close"))
            self.closing = (CloseCode.NORMAL, "session closed")
            await self.outbound.join()
            return True
        return False

    async def _run(self) -> None:
        await self.started.wait()
        session = self.session
        assert session is not None
        closed = asyncio.create_task(session.wait_closed())
        try:
            with session_context(session.session_id):
                await self._generate(session, closed)
        finally:
            closed.cancel()
        if self.codec.closed:
            await self.reader_done.wait()  # the client closed: the reader answers and ends
            return
        reason = closed.result() if closed.done() and not closed.cancelled() else "closed"
        await self.outbound.put(proto.render_closed(session.session_id, reason))
        self.closing = (
            CloseCode.GOING_AWAY if reason == "shutdown" else CloseCode.POLICY_VIOLATION,
            f"session closed: {reason}",
        )
        await self.outbound.join()

    async def _generate(self, session: Session, closed: asyncio.Task) -> None:
        """The generation loop: pacing, ticks, hand-off to encoding; ends when the session closes."""
        start = self.start
        assert start is not None
        wc, cfg = self.service.config, self.service.model.cfg  # type: ignore[union-attr]
        payload = WorldTickPayload(start.seed, start.prompt)
        block_s = cfg.frames_for_block(False) / start.fps
        while not closed.done():
            if not await _until(self.resumed.wait(), closed):
                return
            if start.pacing == "realtime" and self.clock_t0 is not None:
                ahead = self.frames_out / start.fps - (time.monotonic() - self.clock_t0)
                if ahead > wc.max_ahead_blocks * block_s:
                    await _until(asyncio.sleep(ahead - wc.max_ahead_blocks * block_s), closed)
                    continue
            if not await _until(self.chunk_slots.acquire(), closed):
                return
            if not self.resumed.is_set():  # a reset began while waiting: tick its new world later
                self.chunk_slots.release()
                continue
            generation = self.generation
            try:
                result = await session.next_tick(payload)
            except SessionError as exc:
                self.chunk_slots.release()
                if closed.done() or isinstance(exc, TickSupersededError) or generation != self.generation:
                    continue
                self.resumed.clear()
                await self.outbound.put(self._error(exc.code, f"{exc.message}; send session.reset"))
                continue
            if generation != self.generation:
                self.chunk_slots.release()
                continue
            await self.outbound.put(self._chunk(result.metadata.to_dict(), result.value, generation))

    def _chunk(self, identity: dict[str, Any], chunk: WorldChunk, generation: int) -> _ChunkOut:
        start, wc = self.start, self.service.config
        assert start is not None
        frames = chunk.output.frames.numpy()
        first = self.frames_out
        self.frames_out += len(frames)
        if self.clock_t0 is None:
            self.clock_t0 = time.monotonic()
        if start.format == "fmp4" and self.fmp4_generation != generation:
            # a new stream (init segment, keyframe, decode time 0) per session start and reset
            self.fmp4 = Fmp4Encoder(frames.shape[2], frames.shape[1], start.fps)
            self.fmp4_generation = generation
        fmp4 = self.fmp4 if start.format == "fmp4" else None

        def encode() -> tuple[bytes, int, float]:
            t0 = time.perf_counter()
            if fmp4 is not None:
                init, fragment = fmp4.encode(frames)
                data = init + fragment
            else:
                init, data = b"", encode_jpeg_batch(frames, wc.jpeg_quality)
            return data, len(init), (time.perf_counter() - t0) * 1000.0

        async def encode_after(previous: asyncio.Future | None) -> tuple[bytes, int, float]:
            if previous is not None:
                await asyncio.wait({previous})  # its outcome is its own chunk's business
            return await asyncio.to_thread(encode)

        meta = {
            **identity,
            "frame_count": len(frames),
            "first_frame_index": first,
            "format": start.format,
            "width": frames.shape[2],
            "height": frames.shape[1],
            "fps": start.fps,
            "client_ts_ms": chunk.client_ts_ms,
            "timing": {
                "queue_ms": chunk.queued_ms,
                "generate_ms": chunk.output.forward_ms,
                "batch_size": chunk.output.batch_size,
            },
        }
        self.last_encode = asyncio.ensure_future(encode_after(self.last_encode))
        return _ChunkOut(generation, meta, self.last_encode)

    async def _write(self) -> None:
        while True:
            item = await self.outbound.get()
            try:
                await self._send(item)
            except (WebSocketDisconnect, RuntimeError):
                return  # the client went away; the reader ends the connection
            finally:
                if isinstance(item, _ChunkOut):
                    self.chunk_slots.release()
                self.outbound.task_done()

    async def _send(self, item: str | _ChunkOut) -> None:
        if isinstance(item, str):
            await self.ws.send_text(item)
            return
        data, init_bytes, encode_ms = await item.media
        if item.generation != self.generation:
            return  # superseded by a reset or close: never shown
        meta = {**item.metadata, "byte_length": len(data), "init_segment_bytes": init_bytes}
        meta["timing"] = {**meta["timing"], "encode_ms": encode_ms}
        await self.ws.send_text(proto.render_chunk_metadata(meta))
        await self.ws.send_bytes(data)

    async def _close(self, code: int, reason: str) -> None:
        await close_quietly(self.ws, code, reason)


async def _until(awaitable: Any, closed: asyncio.Task) -> bool:
    """Await ``awaitable`` unless ``closed`` finishes first (then cancel it and return False)."""
    task = asyncio.ensure_future(awaitable)
    await asyncio.wait({task, closed}, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        return True
    task.cancel()
    return False


def build_world_service(ctx: ServerContext) -> WorldService:
    return WorldService(ctx)
