"""The duplex session kind: full-duplex voice on ``/v1/duplex`` and ``/v1/realtime?mode=duplex``.

One speech model (``models/duplex``) listens and speaks at once and decides turn-taking itself.
The server clock drives it, not input arrival: one :class:`~sessions.engine.StageEngine` with a
:class:`~sessions.engine.dispatch.FrameClock` steps **every** open session together in one
batched forward each 80 ms; a session that sent no audio steps on silence. A new session steps from
its client's first valid event, or ``duplex.probation_ms`` after it was created (``start_clock``),
so sockets that send only garbage and leave cost no model step. Admission: the memory
plan over the stage's ``state_bytes()``, capped by compute (the step time measured at each batch
size must fit ``compute_utilisation`` of the period). The parts, one job each:

- this module, the service: the model, the clock and its metrics (``duplex_steps_total``,
  ``duplex_late_steps_total``, ``duplex_missed_steps_total``, ``duplex_input_frames_total``), the
  routes, and the clock's hand-offs (each step's input taken from, and output handed to, the
  session's state; a detached session whose step fails or whose outputs overflow is closed);
- ``duplex_session.py``, one session's state that outlives its socket (``Session.kind_state``:
  the manager is the one registry and holds its resume grace), its epoch the session's;
- ``duplex_connection.py``, one connection's command handler (create or resume, barge-in,
  ``playback.ack``, ``session.close``);
- the sans-I/O protocol ``realtime/protocols/duplex`` (docs/protocols/duplex.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import parse_qs

from prometheus_client import Counter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from starlette.routing import BaseRoute, Match, WebSocketRoute
from starlette.types import Scope
from starlette.websockets import WebSocket

from models.duplex.stage import FRAME_MS, ContextExhausted, measure_step_seconds
from realtime.connection import Connection
from realtime.kinds.base import KindServiceBase, ProgressFn, ServedModel, ServerContext
from realtime.kinds.duplex_connection import OPUS, PCM16, DuplexHandler, codec_options
from realtime.kinds.duplex_model import FrameStage, build_stage, per_session_bytes
from realtime.kinds.duplex_session import DuplexSession, End, StepFailed
from realtime.kinds.runtime import build_session_manager, capacity_plan
from realtime.protocols.duplex.codec import DuplexCodec
from realtime.protocols.duplex.journal import Journal
from realtime.protocols.duplex.turns import TurnPolicy, Turns
from realtime.protocols.oai_realtime import (
    Handshake,
    Rejected,
    SessionConfig,
    errors,
    negotiate,
)
from realtime.protocols.oai_realtime import server_events as ev
from realtime.protocols.oai_realtime.responses import ResponseSettings
from realtime.protocols.oai_realtime.wire import new_id
from sessions.capacity import MemoryDeclaration, paced_capacity, with_compute_limit
from sessions.engine import StageEngine
from sessions.engine.dispatch import FrameClock
from sessions.engine.errors import EngineClosedError, SessionReleasedError
from sessions.executor import StageExecutor
from sessions.session import SessionStatus

log = logging.getLogger("realtime.kinds.duplex")

PATH = "/v1/duplex"
REALTIME_PATH = "/v1/realtime"
INBOX_MARGIN_STEPS = 16  # steps a session's inbox holds beyond the longest unapplied wait (1.28 s)
PERIOD_S = FRAME_MS / 1000


def wants_duplex(query: bytes | str) -> bool:
    """``mode=duplex`` in the query string (the ``/v1/realtime`` dispatch)."""
    text = query.decode("latin-1") if isinstance(query, bytes) else query
    return parse_qs(text).get("mode") == ["duplex"]


class _RealtimeDuplexRoute(WebSocketRoute):
    """``/v1/realtime`` for ``mode=duplex`` only: other queries fall through to the next route
    (the voice kind's), so the two kinds share the path without knowing of each other."""

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        match, child = super().matches(scope)
        if match is not Match.NONE and not wants_duplex(scope.get("query_string", b"")):
            return Match.NONE, {}
        return match, child


class _ClockMetrics:
    """The frame clock's counters, read at scrape time (the clock is the one writer)."""

    def __init__(self, service: DuplexService) -> None:
        self.service = service

    def describe(self) -> list:
        return []

    def collect(self) -> Iterator:
        clock = self.service.clock
        if clock is None:
            return
        for name, doc, value in (
            ("duplex_steps", "lockstep frame-clock steps", clock.steps),
            ("duplex_late_steps", "steps that started over 10% of a period late", clock.late_steps),
            (
                "duplex_missed_steps",
                "frame slots skipped entirely (never run back to back)",
                clock.missed_steps,
            ),
        ):
            family = CounterMetricFamily(name, doc)
            family.add_metric([], value)
            yield family
        lateness = sorted(clock.lateness_s)
        gauge = GaugeMetricFamily("duplex_step_lateness_p99_seconds", "p99 start lateness, last 1024 steps")
        gauge.add_metric([], lateness[int(0.99 * (len(lateness) - 1))] if lateness else 0.0)
        yield gauge


class _States(Mapping[str, DuplexSession]):
    """The live sessions' duplex state by session id: a view over the manager (the one registry)."""

    def __init__(self, service: DuplexService) -> None:
        self.service = service

    def __getitem__(self, session_id: str) -> DuplexSession:
        manager = self.service.manager
        session = manager.find(session_id) if manager is not None else None
        if session is None or session.kind_state is None:
            raise KeyError(session_id)
        return session.kind_state

    def __iter__(self) -> Iterator[str]:
        manager = self.service.manager
        sessions = manager.list_sessions() if manager is not None else []
        return (s.session_id for s in sessions if s.kind_state is not None)

    def __len__(self) -> int:
        return sum(1 for _ in self)


class DuplexService(KindServiceBase):
    """The ``duplex`` session kind (``realtime.kinds.base.SessionKindService``)."""

    name = "duplex"

    def __init__(self, ctx: ServerContext) -> None:
        super().__init__(ctx)
        self.config = ctx.config.duplex
        self.stage: Any = None
        self.engine: StageEngine | None = None
        self.clock: FrameClock | None = None
        self.plan: Any = None
        self.step_seconds: dict[int, float] = {}
        self.sessions = _States(self)
        self.media = ThreadPoolExecutor(max_workers=1, thread_name_prefix="duplex-opus")
        self._clock_starts: set[asyncio.Task] = set()  # probation timers' clock starts in flight
        frames = Counter(
            "duplex_input_frames", "input frames stepped, by source", ["source"], registry=ctx.registry
        )
        self._client_frames = frames.labels(source="client")
        self._silent_frames = frames.labels(source="silence")
        ctx.registry.register(_ClockMetrics(self))

    # -- SessionKindService ---------------------------------------------------------------
    def routes(self) -> list[BaseRoute]:
        return [WebSocketRoute(PATH, self._endpoint), _RealtimeDuplexRoute(REALTIME_PATH, self._endpoint)]

    def models(self) -> list[ServedModel]:
        details: dict[str, object] = {"chunk_period_ms": FRAME_MS, "audio_formats": self.audio_formats()}
        if self.plan is not None:
            details["capacity"] = self.plan.capacity
            details["limited_by"] = self.plan.limited_by
        return [ServedModel(self.config.model, self.name, (PATH, f"{REALTIME_PATH}?mode=duplex"), details)]

    def audio_formats(self) -> list[str]:
        return [PCM16, OPUS] if self.config.opus else [PCM16]

    def load(self, progress: ProgressFn) -> None:
        """Plan memory with a one-slot probe (before the pools exist), build the pools, then
        cap admission by the step time measured at each batch size."""
        import torch

        c = self.config
        if c.torch_threads:
            torch.set_num_threads(c.torch_threads)
        progress("plan capacity", 0, 3)
        per_session = per_session_bytes(c)
        plan = capacity_plan(
            self.ctx.config.runtime, MemoryDeclaration(per_session, max_sessions=c.max_sessions), c.device
        )
        progress("load model", 1, 3)
        self.stage = build_stage(c, plan.capacity)
        progress("time steps", 2, 3)
        self.step_seconds = measure_step_seconds(self.stage, plan.capacity)
        if c.compute_admission:
            paced = paced_capacity(self.step_seconds, PERIOD_S, plan.capacity, c.compute_utilisation)
            plan = with_compute_limit(plan, paced)
        self.plan = plan
        extra = {"capacity": plan.capacity, "limited_by": plan.limited_by, "step_seconds": self.step_seconds}
        log.info("duplex capacity planned", extra=extra)
        progress("ready", 3, 3)

    async def start(self) -> None:
        plan = self.plan
        assert plan is not None, "load() runs before start()"
        self.clock = FrameClock(PERIOD_S, silence=self._next_input, on_output=self._on_output)
        self.runner = self.engine = StageEngine(
            FrameStage(self.stage),
            registry=self.ctx.registry,
            max_batch=plan.capacity,
            dispatch=self.clock,
            max_sessions=plan.capacity,
        )
        self.manager = build_session_manager(
            self.name,
            ctx=self.ctx,
            kind_config=self.config,
            plan=plan,
            executor=StageExecutor(
                self.engine, lambda snapshot: snapshot.payload
            ),  # no ticks: the clock steps
            lifecycle=self.engine,
            resume_grace_s=self.config.resume_grace_s,
        )
        await self.manager.start()

    async def stop(self) -> None:
        await super().stop()
        self.media.shutdown(wait=True, cancel_futures=True)

    async def _endpoint(self, websocket: WebSocket) -> None:
        query = websocket.scope.get("query_string", b"")
        handshake = negotiate(query, websocket.headers, websocket.scope.get("subprotocols", ()))
        params = parse_qs(query.decode("latin-1"))
        audio = (params.get("audio_format") or [PCM16])[0]
        autostart = (params.get("autostart") or ["1"])[0] != "0"
        handler = DuplexHandler(self, handshake, audio, autostart)
        headers = handshake.accept_headers(self.config.model)
        await self.serve(websocket, handler, subprotocol=handshake.subprotocol, headers=headers)

    # -- the frame clock's callbacks (on the loop, between forwards): hand-offs only ------
    def _next_input(self, session_id: str) -> Any:
        ds = self.sessions.get(session_id)
        return self.stage.silence() if ds is None else ds.next_input()  # None: opened, not set up yet

    def _on_output(self, session_id: str, output: Any) -> None:
        """Hand the step's output to the session's owner. Nobody applies a detached session's
        outputs before a resume, so a failed step ends it at once; an inbox over its bound (nobody
        applied a grace period's worth) ends it too."""
        ds = self.sessions.get(session_id)
        if ds is None:
            return
        detached_failure = ds.attachment is None and isinstance(output, StepFailed)
        if detached_failure or not ds.deliver(output):
            if ds.attachment is not None:
                ds.attachment.conn.end("closed", f"over {ds.inbox.max_steps} model steps not applied")
            else:
                assert self.manager is not None
                self.manager.close_soon(session_id, "step_failed" if detached_failure else "step_inbox_full")
            log.info("duplex session ended by the clock", extra={"failed_step": detached_failure})

    def _count_frame(self, silent: bool) -> None:
        (self._silent_frames if silent else self._client_frames).inc()

    # -- sessions -------------------------------------------------------------------------
    def start_clock_later(self, session_id: str) -> None:
        """A new session's clock starts at its client's first valid event (the handler calls
        :meth:`start_clock`), at the latest ``duplex.probation_ms`` after now, attached or not."""
        loop = asyncio.get_running_loop()
        loop.call_later(self.config.probation_ms / 1000, self._probation_over, session_id)

    def _probation_over(self, session_id: str) -> None:
        task = asyncio.create_task(self.start_clock(session_id), name="duplex-clock-start")
        self._clock_starts.add(task)
        task.add_done_callback(self._clock_starts.discard)

    async def start_clock(self, session_id: str) -> None:
        """Give a live session its slot in the stage: the frame clock steps it from the next
        period on (idempotent; a session released meanwhile, or a stopped engine, is left alone)."""
        engine, manager = self.engine, self.manager
        session = manager.find(session_id) if manager is not None else None
        if engine is None or session is None or session.status is not SessionStatus.ACTIVE:
            return
        if not engine.is_open(session_id):
            with contextlib.suppress(SessionReleasedError, EngineClosedError):
                await engine.open(session_id)

    def new_session(self, conn: Connection, handshake: Handshake, config: SessionConfig) -> DuplexSession:
        c, session = self.config, conn.session
        assert session is not None
        policy = TurnPolicy(
            frame_ms=FRAME_MS,
            barge_in_rms=c.barge_in_rms,
            barge_in_frames=max(1, c.barge_in_ms // FRAME_MS),
            commit_policy=c.playback_commit_policy,
            max_history=c.max_history_items,
        )
        session.kind_state = DuplexSession(
            session,
            codec=DuplexCodec(handshake.dialect, config, codec_options(c)),
            turns=Turns(policy, ResponseSettings.of_session(config), new_id("conv")),
            journal=Journal(c.journal_max_events, c.journal_max_bytes),
            max_input_frames=max(1, c.max_input_queue_ms // FRAME_MS),
            max_unapplied_steps=self.max_unapplied_steps(),
            silence=self.stage.silence,
            context=self.stage.context_log(),
            media=self.media,
            opus_bitrate=c.opus_bitrate,
            on_failed=self._step_failed,
            on_frame=self._count_frame,
        )
        return session.kind_state

    def max_unapplied_steps(self) -> int:
        """The bound of a session's step inbox: the longest time nobody applies its outputs
        without the session ending anyway (a detached grace, or a send the watchdog ends), in
        steps, plus :data:`INBOX_MARGIN_STEPS`."""
        longest = max(self.config.resume_grace_s, self.ctx.config.server.max_send_wait_s)
        return math.ceil(longest / PERIOD_S) + INBOX_MARGIN_STEPS

    def _step_failed(self, ds: DuplexSession, error: Exception) -> None:
        """A step's typed error (``context_exhausted`` under policy ``end``): say so, end the session."""
        code = getattr(error, "code", "duplex_error")
        ds.emit([ev.ErrorEvent(Rejected(code, str(error), type=errors.SERVER_ERROR))])
        if ds.attachment is not None:
            ds.attachment.conn.post(End("closed", str(error)))
        elif self.manager is not None:
            self.manager.close_soon(ds.session_id, "step_failed")
        if isinstance(error, ContextExhausted):
            log.info("duplex session used its whole context", extra={"frames": error.context})


def build_duplex_service(ctx: ServerContext) -> DuplexService:
    return DuplexService(ctx)
