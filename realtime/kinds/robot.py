"""Robot policy sessions over the OpenPI websocket protocol (docs/protocols/openpi.md).

Serves unmodified ``openpi-client`` robots at ``/`` and ``/v1/realtime/robot/openpi``. Each
connection is one session of the session runtime (admission, optional idle timeout, reset, close
through ``SessionManager``); observations of all connected robots batch into one forward through the
policy's ``StageEngine``, on the engine's worker thread.

Batching: ``robot.dispatch`` picks the engine's policy (``arrival`` by default: a robot that is
connected but not sending does not hold a batch for the window). Errors: ``robot.error_mode``
is passed to the codec, which decides the frames (``text`` by default).

Per connection: the shared connection skeleton (``realtime.connection``) with an inline handler:
strictly request/response as openpi's own server (the next frame is read only after the reply,
so replies are in request order and a robot cannot queue work): decode (frames over 1 MiB off the
loop), prepare the observation, run the tick through the engine's ``StageExecutor`` (the policy
stage keeps the per-session RTC state in its slot), reply. The skeleton ends the connection when
the runtime closes the session (idle, lifetime, eviction, shutdown) and releases it.

Client ``session_id`` (an optional observation key) follows vllm-omni: the first call of a
connection starts fresh; a different id than the previous call resets the session first.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import time
from dataclasses import replace
from typing import Any

import torch
from prometheus_client import Counter
from starlette.routing import BaseRoute, WebSocketRoute
from starlette.websockets import WebSocket

from models.policy.interface import ObservationError, Policy
from models.policy.pi0_policy import RANDOM_CONFIGS, Pi0Policy
from models.policy.presets import check_prompt
from models.policy.stage import PolicyChunk, PolicyInput, PolicyStage, policy_input
from models.policy.trivial import ZerosPolicy
from realtime import __version__
from realtime.config import RobotConfig
from realtime.connection import Close, Connection, runtime_close
from realtime.kinds.base import KindServiceBase, ProgressFn, ServedModel, ServerContext
from realtime.kinds.policy_process import ProcessPolicy
from realtime.kinds.runtime import build_session_manager, capacity_plan, stage_declaration
from realtime.logs import log_internal_error
from realtime.protocols import openpi
from realtime.scale.resume import RobotState, robot_key
from realtime.ws import CloseCode
from sessions.engine import StageEngine
from sessions.engine.dispatch import ArrivalAware, Coalescing, DispatchPolicy
from sessions.errors import SessionError
from sessions.executor import StageExecutor

log = logging.getLogger("realtime.robot")

PATHS = ("/", "/v1/realtime/robot/openpi")
# Frames over 1 MiB or 1024 msgpack objects are decoded on a thread (openpi.decodes_inline); smaller
# ones on the loop, where decoding (~85 us per MiB on the dev CPU) costs less than a thread
# hand-off (60-100 us) and holds the loop <= ~0.1 ms.
# Observation frames are 0.3-2 MiB and each request allocates and frees several buffers of that
# size (the websocket frame, its unmasked copy, msgpack's bin payloads). glibc's defaults hand
# them back to the OS at once (mmap above its threshold, heap trimming above 2x it), so every
# request page-faults them in again: ~30% of the server's CPU per request at ALOHA size. The
# robot kind raises both thresholds (process-wide, at load): frames up to MMAP bytes reuse heap
# memory, and up to TRIM bytes of freed heap stay mapped.
MALLOC_MMAP_THRESHOLD_BYTES = 8 << 20
MALLOC_TRIM_THRESHOLD_BYTES = 64 << 20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc mallopt parameters


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
    """The policy ``robot.policy`` names: random weights (pi0-tiny, pi0-shaped), a checkpoint
    folder (pi0, pi0.5; checked again here, as at config load), or the zeros policy."""
    preset = None if config.observation_preset == "auto" else config.observation_preset
    limits = {"default_prompt": config.default_prompt, "max_prompt_chars": config.max_prompt_chars}
    if config.policy == "zeros":
        return ZerosPolicy(preset=preset, **limits)
    device = resolve_device(config.device)
    checkpoint = config.inspect() if config.policy in ("pi0", "pi0.5") else None
    base = checkpoint.model if checkpoint else RANDOM_CONFIGS[config.policy]
    if config.dtype != "auto":
        dtype = config.dtype
    elif checkpoint is not None:
        dtype = "float32" if device == "cpu" else "bfloat16"
    else:
        dtype = base.dtype  # pi0-tiny float32, pi0-shaped bfloat16
    return Pi0Policy(
        replace(base, seed=config.seed, dtype=dtype),
        checkpoint=checkpoint,
        preset=preset,
        device=device,
        cuda_graphs=config.cuda_graphs,
        compile=config.compile is True or (config.compile == "auto" and device.startswith("cuda")),
        attention=config.attention,
        name=config.policy,
        **limits,
    )


def runs_in_process(config: RobotConfig) -> bool:
    """``robot.process``: ``auto`` is a child process for a model policy on the CPU, where the
    forward's many small ops would wait for the event loop's GIL; a thread on CUDA (the forward
    is CUDA-graph replays) and for ``zeros`` (nothing to compute)."""
    if config.process != "auto":
        return config.process
    if config.policy == "zeros":
        return False
    return config.device == "cpu" or not torch.cuda.is_available()


def tune_process(config: RobotConfig) -> None:
    """The process-wide settings of a process that runs the policy's forwards or decodes its
    frames: ``robot.torch_threads`` and the malloc thresholds (:func:`keep_frame_buffers`)."""
    if config.torch_threads:
        torch.set_num_threads(config.torch_threads)
    if not keep_frame_buffers():
        log.info("malloc thresholds not tuned (not glibc): frame buffers go back to the OS")


def build_tuned_policy(config: RobotConfig) -> Policy:
    """The policy's own process (``robot.process``): tuned as the server is, then the policy."""
    tune_process(config)
    return build_policy(config)


def dispatch_policy(config: RobotConfig) -> DispatchPolicy:
    """``robot.dispatch``: ``arrival`` waits the window only for robots whose arrival pattern
    predicts them (a paused robot costs the others nothing); ``window`` waits for every robot
    that has sent before and has nothing pending."""
    if config.dispatch == "window":
        return Coalescing(config.coalesce_window_s)
    return ArrivalAware(config.coalesce_window_s, idle_after=config.idle_after_intervals)


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


class RobotService(KindServiceBase):
    """The ``robot`` session kind (``realtime.kinds.base.SessionKindService``)."""

    name = "robot"

    def __init__(self, ctx: ServerContext) -> None:
        super().__init__(ctx)
        self.config = ctx.config.robot
        self.policy: Policy | None = None
        self.metadata: dict[str, Any] = {}
        self.engine: StageEngine | None = None
        self.stage: PolicyStage | None = None
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
        tune_process(cfg)
        progress("build policy", 0, 2)
        if runs_in_process(cfg):
            self.policy = proxy = ProcessPolicy(build_tuned_policy, cfg, name="robot-policy")
            where: dict[str, Any] = {"device": proxy.served_device, "policy_pid": proxy.pid}
        else:
            self.policy = build_policy(cfg)
            where = {"device": self.policy.device}
        progress("warm up", 1, 2)
        self.policy.warmup(cfg.max_batch)
        self.metadata = handshake_metadata(self.policy, cfg)
        log.info("robot policy loaded", extra={"policy": cfg.policy, **where})
        progress("ready", 2, 2)

    async def stop(self) -> None:
        await super().stop()
        if isinstance(self.policy, ProcessPolicy):  # after the stage's worker: no call in flight
            await asyncio.to_thread(self.policy.close)

    async def start(self) -> None:
        cfg = self.config
        assert self.policy is not None, "load() runs before start()"
        stage = self.stage = PolicyStage(self.policy, name="robot-policy")
        self.runner = self.engine = StageEngine(
            stage, registry=self.ctx.registry, max_batch=cfg.max_batch, dispatch=dispatch_policy(cfg)
        )
        self.manager = build_session_manager(
            self.name,
            ctx=self.ctx,
            kind_config=cfg,
            plan=capacity_plan(self.ctx.config.runtime, stage_declaration(stage)),
            executor=StageExecutor(self.engine, policy_input),
            lifecycle=self.engine,
        )
        await self.manager.start()
        if isinstance(self.policy, ProcessPolicy):  # its death, even while idle, ends the worker
            self.policy.watch(self.engine.worker)
        log.info(
            "robot sessions ready", extra={"capacity": self.manager.capacity, "max_batch": cfg.max_batch}
        )

    async def _endpoint(self, websocket: WebSocket) -> None:
        await self.serve(websocket, _RobotHandler(self))


class _RobotHandler:
    """One robot's connection: strict request/response, as openpi's server (``KindHandler``).

    Inline: the reader handles each request before it reads the next frame, so replies are in
    request order and a robot cannot queue work. State (codec, episode, timings) is this
    connection's own.
    """

    inline = True

    def __init__(self, service: RobotService) -> None:
        self.service = service
        cfg = service.config
        self.codec = openpi.ServerConnection(
            max_message_bytes=cfg.max_message_bytes,
            error_mode=cfg.error_mode,
            max_prompt_chars=cfg.max_prompt_chars,
            check_prompt=check_prompt,
        )
        self.episode: str | None = None
        self.last: RobotState | None = None  # the episode's last chunk (checkpointed)
        self.prev_total_ms: float | None = None
        self.received_at = 0.0

    async def opened(self, conn: Connection) -> None:
        try:
            await conn.create_session()
        except SessionError as exc:
            self.service.errors.labels(exc.code).inc()
            await self._send(conn, self.codec.fatal(exc.code, exc.message, CloseCode.TRY_AGAIN_LATER))
            return
        await conn.send(self.codec.start(self.service.metadata))

    async def decode(self, frame: bytes | str) -> Any:
        self.received_at = time.perf_counter()
        max_bytes = self.service.config.max_message_bytes
        if not openpi.decodes_inline(frame):  # big, or many objects: a worker thread decodes it
            return await asyncio.to_thread(openpi.decode, frame, max_bytes)
        return openpi.decode(frame, max_bytes)

    async def handle(self, conn: Connection, decoded: Any) -> None:
        received_at = self.received_at
        reply = await self._reply(conn, self.codec.accept(decoded), received_at)
        if isinstance(reply, openpi.Error):
            self.service.errors.labels(reply.code).inc()
        await self._send(conn, self.codec.reply(reply))
        self.prev_total_ms = (time.perf_counter() - received_at) * 1000.0

    async def session_ended(self, conn: Connection, reason: str) -> Close:
        return runtime_close(reason)

    async def _reply(self, conn: Connection, cmd: openpi.Command, received_at: float) -> openpi.Reply:
        manager, policy, session = self.service.manager, self.service.policy, conn.session
        assert manager is not None and policy is not None and session is not None
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
                await self._restore(session.session_id, cmd.session_id)
            try:
                prepared = policy.prepare(cmd.observation)  # validation only: cheap by contract
            except ObservationError as exc:
                return openpi.Error(cmd.seq, openpi.ErrorCode.INVALID_OBSERVATION, str(exc))
            except Exception as exc:
                log_internal_error(log, session.session_id, "preparing an observation failed", exc)
                return openpi.Error(
                    cmd.seq, openpi.ErrorCode.INTERNAL, "internal error preparing the observation"
                )
            result = await session.next_tick(PolicyInput(prepared, received_at))
        except SessionError as exc:
            return openpi.Error(cmd.seq, exc.code, exc.message)
        chunk: PolicyChunk = result.value
        server_timing = {"infer_ms": (time.perf_counter() - received_at) * 1000.0}
        if self.prev_total_ms is not None:
            server_timing["prev_total_ms"] = self.prev_total_ms
        policy_timing = {"infer_ms": chunk.forward_ms, "batch_size": float(chunk.batch_size)}
        self._checkpoint(session.session_id, chunk.actions, server_timing["infer_ms"] / 1000.0)
        return openpi.Actions(cmd.seq, chunk.actions, server_timing, policy_timing)

    def _checkpoint(self, session_id: str, actions: Any, latency_s: float) -> None:
        """A named episode's chunk to the replica's checkpointer (coalesced), keyed by the episode."""
        checkpointer = self.service.ctx.checkpointer
        if checkpointer is None or self.episode is None:
            return
        self.last = RobotState(actions, latency_s, time.time())
        checkpointer.save(session_id, "robot", lambda: self.last, key=robot_key(self.episode))

    async def _restore(self, session_id: str, episode: str) -> None:
        """An episode whose replica is gone goes on here: its last chunk guides the next (RTC)."""
        checkpointer, engine, stage = self.service.ctx.checkpointer, self.service.engine, self.service.stage
        if checkpointer is None or engine is None or stage is None:
            return
        loaded = await checkpointer.load(robot_key(episode))
        if loaded is None or not isinstance(loaded[1], RobotState):
            return
        slot = await engine.open(session_id)  # else it opens at the first tick; idempotent
        checkpoint, state = loaded
        checkpointer.adopt(checkpoint, session_id)
        age_s = max(0.0, time.time() - state.delivered_wall)
        stage.seed_state(slot.index, state.actions, state.latency_s, time.monotonic() - age_s)

    async def _send(self, conn: Connection, out: openpi.Outbound) -> None:
        await conn.send(*out.frames)
        if out.close is not None:
            code, text = out.close
            conn.end("capacity" if code == CloseCode.TRY_AGAIN_LATER else "protocol_fatal", text)


def build_robot_service(ctx: ServerContext) -> RobotService:
    return RobotService(ctx)
