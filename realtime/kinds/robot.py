"""Robot policy sessions over the OpenPI websocket protocol (docs/protocols/openpi.md).

Serves unmodified ``openpi-client`` robots at ``/`` and ``/v1/realtime/robot/openpi``. Each
connection is one session of the session runtime (admission, idle timeout, reset, close through
``SessionManager``); observations of all connected robots batch into one forward through the
policy's ``StageEngine``, on the engine's worker thread.

Per connection: one request loop, the session's single writer, strictly request/response as
openpi's own server (the next frame is read only after the reply went out, so replies are in
request order and a robot cannot queue work): decode (frames over 1 MiB off the loop), prepare the
observation, snapshot per-session state, run the tick through the engine, commit the chunk,
reply. A watcher ends the connection when the runtime closes the session (idle, lifetime,
eviction, shutdown). Keepalive pings are answered by the transport meanwhile.

Client ``session_id`` (an optional observation key) follows vllm-omni: the first call of a
connection starts fresh; a different id than the previous call resets the session first.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import time
from typing import Any

import torch
from prometheus_client import Counter
from starlette.routing import BaseRoute, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from models.policy.interface import ObservationError, Policy
from models.policy.pi0_tiny import Pi0TinyConfig, Pi0TinyPolicy
from models.policy.stage import PolicyChunk, PolicyStage, PolicyTick
from models.policy.trivial import ZerosPolicy
from realtime import __version__
from realtime.config import RobotConfig
from realtime.kinds.base import ProgressFn, ServedModel, ServerContext
from realtime.kinds.runtime import build_session_manager
from realtime.protocols import openpi
from realtime.ws import CloseCode, close_quietly, serve_websocket
from sessions.capacity import MemoryDeclaration
from sessions.engine import StageEngine
from sessions.engine.engine import DEFAULT_MAX_SESSIONS
from sessions.errors import SessionError
from sessions.log_context import session_context
from sessions.manager import SessionManager
from sessions.session import Session
from sessions.tick import TickOutput, TickSnapshot

log = logging.getLogger("realtime.robot")

PATHS = ("/", "/v1/realtime/robot/openpi")
# Frames above this are decoded on a thread; smaller ones on the loop, where decoding (~85 us per
# MiB on the dev CPU) costs less than a thread hand-off (60-100 us) and holds the loop <= ~0.1 ms.
OFFLOAD_DECODE_BYTES = 1 << 20
# Observation frames are 0.3-2 MiB and each request allocates and frees several buffers of that
# size (the websocket frame, its unmasked copy, msgpack's bin payloads). glibc's defaults hand
# them back to the OS at once (mmap above its threshold, heap trimming above 2x it), so every
# request page-faults them in again: ~30% of the server's CPU per request at ALOHA size. The
# robot kind raises both thresholds (process-wide, at load): frames up to MMAP bytes reuse heap
# memory, and up to TRIM bytes of freed heap stay mapped.
MALLOC_MMAP_THRESHOLD_BYTES = 8 << 20
MALLOC_TRIM_THRESHOLD_BYTES = 64 << 20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc mallopt parameters
_CLOSE_REASONS = {
    "idle": "idle timeout: no request for {idle:g} s",
    "lifetime": "maximum session lifetime reached",
    "evicted": "session evicted to make room",
    "shutdown": "server shutting down",
}


def resolve_device(name: str) -> str:
    """``robot.device`` -> a torch device string: ``auto`` is ``cuda:<current>`` when CUDA is
    available, else ``cpu``; ``cuda`` without a usable device raises a one-line RuntimeError."""
    if name == "cpu" or (name == "auto" and not torch.cuda.is_available()):
        return "cpu"
    if not torch.cuda.is_available():
        raise RuntimeError(f"robot.device is {name!r} but torch finds no CUDA device")
    return f"cuda:{torch.cuda.current_device()}"


def keep_frame_buffers() -> bool:
    """Apply the malloc thresholds above (glibc only; elsewhere a no-op returning False)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    ok = mallopt(_M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD_BYTES) == 1
    return mallopt(_M_TRIM_THRESHOLD, MALLOC_TRIM_THRESHOLD_BYTES) == 1 and ok


def build_policy(config: RobotConfig) -> Policy:
    """The policy ``robot.policy`` names, with its observation preset, seed and device."""
    preset = None if config.observation_preset == "auto" else config.observation_preset
    if config.policy == "zeros":
        return ZerosPolicy(preset=preset, default_prompt=config.default_prompt)
    return Pi0TinyPolicy(
        Pi0TinyConfig(seed=config.seed),
        preset=preset,
        default_prompt=config.default_prompt,
        device=resolve_device(config.device),
    )


def handshake_metadata(policy: Policy, config: RobotConfig) -> dict[str, Any]:
    """The first frame of every connection: the policy's spec plus server and protocol facts."""
    return {
        **policy.spec.metadata(),
        "server": "realtime-sessions",
        "server_version": __version__,
        "protocol": openpi.PROTOCOL,
        "protocol_version": openpi.PROTOCOL_VERSION,
        "error_mode": config.error_mode,
        "max_message_bytes": config.max_message_bytes,
    }


class _EngineExecutor:
    """The sessions' tick executor: one tick = one item of the policy engine's next batch."""

    def __init__(self, engine: StageEngine) -> None:
        self.engine = engine

    async def execute(self, snapshot: TickSnapshot) -> TickOutput[PolicyChunk]:
        engine, session_id = self.engine, snapshot.session_id
        if not engine.is_open(session_id):  # the first tick, or the first after a reset
            await engine.open(session_id)
        chunk = await engine.submit(session_id, snapshot.epoch, snapshot.payload)
        return TickOutput(snapshot.metadata, chunk)


class RobotService:
    """The ``robot`` session kind (``realtime.kinds.base.SessionKindService``)."""

    name = "robot"

    def __init__(self, ctx: ServerContext) -> None:
        self.ctx = ctx
        self.config = ctx.config.robot
        self.policy: Policy | None = None
        self.metadata: dict[str, Any] = {}
        self.engine: StageEngine | None = None
        self.manager: SessionManager | None = None
        self.errors = Counter(
            "realtime_robot_errors",
            "OpenPI error replies and fatal closes by code",
            ["code"],
            registry=ctx.registry,
        )

    def routes(self) -> list[BaseRoute]:
        return [WebSocketRoute(path, self._endpoint) for path in PATHS]

    def models(self) -> list[ServedModel]:
        details = (
            {k: self.metadata[k] for k in ("action_horizon", "action_dim", "camera_keys")}
            if self.metadata
            else {}
        )
        return [ServedModel(self.config.policy, self.name, PATHS, details)]

    def load(self, progress: ProgressFn) -> None:
        cfg = self.config
        if cfg.torch_threads:
            torch.set_num_threads(cfg.torch_threads)
        if not keep_frame_buffers():
            log.info("malloc thresholds not tuned (not glibc): frame buffers go back to the OS")
        progress("build policy", 0, 2)
        self.policy = build_policy(cfg)
        progress("warm up", 1, 2)
        self.policy.warmup(cfg.max_batch)
        self.metadata = handshake_metadata(self.policy, cfg)
        log.info("robot policy loaded", extra={"policy": cfg.policy, "device": self.policy.device})
        progress("ready", 2, 2)

    async def start(self) -> None:
        cfg, runtime = self.config, self.ctx.config.runtime
        assert self.policy is not None, "load() runs before start()"
        self.engine = StageEngine(
            PolicyStage(self.policy, name="robot-policy"),
            registry=self.ctx.registry,
            max_batch=cfg.max_batch,
            coalesce_window_s=cfg.coalesce_window_s,
        )
        self.manager = build_session_manager(
            self.name,
            runtime=runtime,
            kind_config=cfg,
            executor=_EngineExecutor(self.engine),
            declaration=MemoryDeclaration(
                resident_bytes_per_session=self.policy.new_state().nbytes, max_sessions=DEFAULT_MAX_SESSIONS
            ),
            lifecycle=self.engine,
            registry=self.ctx.registry,
            state_factory=self.policy.new_state,
        )
        await self.manager.start()
        log.info(
            "robot sessions ready", extra={"capacity": self.manager.capacity, "max_batch": cfg.max_batch}
        )

    async def stop(self) -> None:
        if self.manager is not None:
            await self.manager.shutdown()
        if self.engine is not None:
            await self.engine.close()

    async def _endpoint(self, websocket: WebSocket) -> None:
        await serve_websocket(websocket, self.ctx, self.name, _Connection(self, websocket).run)


class _Connection:
    """One robot's websocket: a request loop around one session."""

    def __init__(self, service: RobotService, websocket: WebSocket) -> None:
        self.service = service
        self.ws = websocket
        cfg = service.config
        self.codec = openpi.ServerConnection(
            max_message_bytes=cfg.max_message_bytes, error_mode=cfg.error_mode
        )
        self.episode: str | None = None
        self.prev_total_ms: float | None = None

    async def run(self) -> None:
        manager = self.service.manager
        assert manager is not None
        try:
            session = await manager.create()
        except SessionError as exc:
            await self._send(self.codec.fatal(exc.code, exc.message, CloseCode.TRY_AGAIN_LATER))
            self.service.errors.labels(exc.code).inc()
            return
        try:
            with session_context(session.session_id):
                await self._serve(session)
        except Exception:
            log.exception("robot connection failed")
            await self._close(openpi.INTERNAL_ERROR, "internal server error")
        finally:
            await manager.disconnect(session.session_id)

    async def _serve(self, session: Session) -> None:
        await self.ws.send_bytes(self.codec.start(self.service.metadata))
        loop = asyncio.create_task(self._request_loop(session), name="openpi-requests")
        ended = asyncio.create_task(session.wait_closed(), name="openpi-session-end")
        try:
            done, _ = await asyncio.wait({loop, ended}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (loop, ended):
                task.cancel()
            await asyncio.gather(loop, ended, return_exceptions=True)
        if loop in done and not loop.cancelled() and loop.exception() is not None:
            raise loop.exception()
        if ended in done:
            reason = ended.result()
            text = _CLOSE_REASONS.get(reason, "session closed: {reason}").format(
                idle=self.service.config.idle_timeout_s, reason=reason
            )
            await self._close(
                CloseCode.GOING_AWAY if reason == "shutdown" else CloseCode.POLICY_VIOLATION, text
            )

    async def _request_loop(self, session: Session) -> None:
        """Strict request/response, as openpi's server: the next frame is read after the reply."""
        max_bytes = self.service.config.max_message_bytes
        while True:
            try:
                message = await self.ws.receive()
            except (WebSocketDisconnect, RuntimeError):
                return
            if message["type"] == "websocket.disconnect":
                return
            frame = message.get("bytes")
            if frame is None:
                frame = message.get("text", "")
            received_at = time.perf_counter()
            if len(frame) > OFFLOAD_DECODE_BYTES:
                decoded = await asyncio.to_thread(openpi.decode, frame, max_bytes)
            else:
                decoded = openpi.decode(frame, max_bytes)
            del frame
            if self.codec.state is not openpi.State.OPEN:  # openpi error mode closed the connection
                return
            reply = await self._handle(session, self.codec.accept(decoded), received_at)
            if isinstance(reply, openpi.Error):
                self.service.errors.labels(reply.code).inc()
            out = self.codec.reply(reply)
            await self._send(out)
            self.prev_total_ms = (time.perf_counter() - received_at) * 1000.0
            if out.close is not None:
                return

    async def _handle(self, session: Session, cmd: openpi.Command, received_at: float) -> openpi.Reply:
        manager = self.service.manager
        policy = self.service.policy
        assert manager is not None and policy is not None
        if isinstance(cmd, openpi.Rejected):
            return openpi.Error(cmd.seq, cmd.code, cmd.message)
        try:
            if isinstance(cmd, openpi.Reset):
                await manager.reset(session.session_id)
                return openpi.ResetDone(cmd.seq)
            if cmd.session_id is not None and cmd.session_id != self.episode:
                if self.episode is not None:
                    await manager.reset(session.session_id)
                self.episode = cmd.session_id
            try:
                prepared = policy.prepare(cmd.observation)  # validation only: cheap by contract
            except ObservationError as exc:
                return openpi.Error(cmd.seq, openpi.ErrorCode.INVALID_OBSERVATION, str(exc))
            except Exception:
                log.exception("preparing an observation failed")
                return openpi.Error(
                    cmd.seq, openpi.ErrorCode.INTERNAL, "internal error preparing the observation"
                )
            tick = PolicyTick(prepared, session.state.snapshot(prepared, time.monotonic()))
            result = await session.next_tick(tick)
        except SessionError as exc:
            return openpi.Error(cmd.seq, exc.code, exc.message)
        chunk: PolicyChunk = result.value
        latency = time.perf_counter() - received_at
        session.state.commit(chunk.actions, latency, time.monotonic())
        server_timing = {"infer_ms": latency * 1000.0}
        if self.prev_total_ms is not None:
            server_timing["prev_total_ms"] = self.prev_total_ms
        policy_timing = {"infer_ms": chunk.forward_ms, "batch_size": float(chunk.batch_size)}
        return openpi.Actions(cmd.seq, chunk.actions, server_timing, policy_timing)

    async def _send(self, out: openpi.Outbound) -> None:
        for frame in out.frames:
            if isinstance(frame, str):
                await self.ws.send_text(frame)
            else:
                await self.ws.send_bytes(frame)
        if out.close is not None:
            await self._close(*out.close)

    async def _close(self, code: int, reason: str) -> None:
        await close_quietly(self.ws, code, reason)


def build_robot_service(ctx: ServerContext) -> RobotService:
    return RobotService(ctx)
