"""The duplex session kind: full-duplex voice on ``/v1/duplex`` and ``/v1/realtime?mode=duplex``.

One speech model (``models/duplex``) listens and speaks at once and decides turn-taking itself.
The server clock drives it, not input arrival: one :class:`~sessions.engine.StageEngine` with a
:class:`~sessions.engine.dispatch.FrameClock` steps **every** open session together in one
batched forward each 80 ms. Each session's next frame is the client's audio (its appends cut
into 80 ms frames, at most ``duplex.max_input_queue_ms`` queued) or silence when it sent none
(counted: ``duplex_input_frames_total{source}``); the clock's late and missed steps are exported
as ``duplex_steps_total``, ``duplex_late_steps_total``, ``duplex_missed_steps_total``.

Admission: the memory plan over the stage's ``state_bytes()``, capped by compute (the step time
measured at each batch size must fit ``compute_utilisation`` of the period).

Per session: a :class:`~realtime.kinds.duplex_session.DuplexSession` (the protocol state machines
of ``realtime/protocols/duplex``), kept on the session itself (``Session.kind_state``); the
manager is the one registry. Its one owner is the attached connection's runner; the clock's
callbacks only hand frames in and outputs out through the session's two channels.

- **Barge-in**: user speech (RMS >= ``barge_in_rms`` for ``barge_in_ms``) while the model speaks,
  or ``response.cancel``: one call, ``DuplexSession.interrupt`` (the session's epoch moves on: the
  engine drops the in-flight step's output, the writer drops queued deltas, the journal forgets
  them). The response ends ``cancelled``; the model stays muted until it chooses to listen.
- **Resume**: a socket that drops (no ``session.close``) leaves its session detached for
  ``duplex.resume_grace_s`` (``SessionManager.detach``: the manager's grace timer, and a slot the
  manager reclaims first when a new session needs one); its steps wait in its bounded step inbox.
  A socket opened with ``autostart=0`` sends ``session.resume``: the journal after the client's
  cursor is replayed exactly once, then the waiting steps' events, then ``session.resumed``
  (token rotated). A socket still attached gets ``session.replaced`` and closes. A resume of a
  session that is gone hears ``session.expired {reason}`` (the manager remembers why).
  ``session.close`` ends the session at once.
- **Opus**: ``?audio_format=ogg_opus``: audio travels as Ogg/Opus in binary frames both ways
  (one Ogg stream per response), coded on one media thread, off the loop. Binary audio sent live
  is not journaled; the audio of the steps taken while detached reaches the resumed socket once.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import math
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

import numpy as np
from prometheus_client import Counter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from starlette.routing import BaseRoute, Match, WebSocketRoute
from starlette.types import Scope
from starlette.websockets import WebSocket

from models.duplex.stage import FRAME_MS, SAMPLE_RATE, ContextExhausted, measure_step_seconds
from realtime.connection import Close, Connection, runtime_close
from realtime.kinds.base import KindServiceBase, ProgressFn, ServedModel, ServerContext
from realtime.kinds.duplex_model import FrameStage, build_stage, per_session_bytes
from realtime.kinds.duplex_session import DuplexSession, Flush, StepFailed
from realtime.kinds.runtime import build_session_manager, capacity_plan
from realtime.protocols.duplex import commands as dc
from realtime.protocols.duplex import events as de
from realtime.protocols.duplex.audio import pcm16_samples
from realtime.protocols.duplex.codec import DuplexCodec
from realtime.protocols.duplex.journal import Journal
from realtime.protocols.duplex.opus import OggOpusDecoder, OpusError
from realtime.protocols.duplex.turns import TurnPolicy, Turns
from realtime.protocols.oai_realtime import (
    CodecOptions,
    Handshake,
    Limits,
    Rejected,
    SessionConfig,
    errors,
    negotiate,
)
from realtime.protocols.oai_realtime import client_events as ce
from realtime.protocols.oai_realtime import server_events as ev
from realtime.protocols.oai_realtime.responses import ResponseSettings
from realtime.protocols.oai_realtime.wire import new_id
from sessions.capacity import MemoryDeclaration, paced_capacity, with_compute_limit
from sessions.engine import StageEngine
from sessions.engine.dispatch import FrameClock
from sessions.errors import SessionError
from sessions.executor import StageExecutor
from sessions.session import SessionStatus

log = logging.getLogger("realtime.kinds.duplex")

PATH = "/v1/duplex"
REALTIME_PATH = "/v1/realtime"
OPUS = "ogg_opus"
PCM16 = "pcm16"
INBOX_MARGIN_STEPS = 16  # steps a session's inbox holds beyond the longest unapplied wait (1.28 s)
PERIOD_S = FRAME_MS / 1000
#: The manager's close reasons as ``session.expired`` names them (others go as they are).
EXPIRED_REASONS = {"grace_expired": "disconnect_grace_expired"}


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
        handler = _DuplexHandler(self, handshake, audio, autostart)
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
            codec=DuplexCodec(handshake.dialect, config, _codec_options(c)),
            turns=Turns(policy, ResponseSettings.of_session(config), new_id("conv")),
            journal=Journal(c.journal_max_events, c.journal_max_bytes),
            max_input_frames=max(1, c.max_input_queue_ms // FRAME_MS),
            max_unapplied_steps=self.max_unapplied_steps(),
            silence=self.stage.silence,
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
            ds.attachment.conn.post(_End("closed", str(error)))
        elif self.manager is not None:
            self.manager.close_soon(ds.session_id, "step_failed")
        if isinstance(error, ContextExhausted):
            log.info("duplex session used its whole context", extra={"frames": error.context})


def _codec_options(c: Any) -> CodecOptions:
    max_append = c.max_input_queue_ms * SAMPLE_RATE // 1000 * 2  # pcm16 bytes of the whole input queue
    return CodecOptions(Limits(max_append_bytes=max_append, max_event_bytes=c.max_message_bytes))


# ------------------------------------------------------------------------ runner mailbox items


@dataclass(frozen=True)
class _Samples:
    """Decoded Opus audio of one binary frame (24 kHz float32)."""

    samples: np.ndarray


@dataclass(frozen=True)
class _Replaced:
    """This socket's session was resumed on another socket."""

    frame: str | None


@dataclass(frozen=True)
class _End:
    reason: str
    message: str


class _DuplexHandler:
    """One duplex connection (``KindHandler``): every attribute is the runner's alone."""

    inline = False

    def __init__(self, service: DuplexService, handshake: Handshake, audio: str, autostart: bool) -> None:
        self.service = service
        self.handshake = handshake
        self.audio = audio
        self.autostart = autostart
        c = service.config
        self.config = SessionConfig(model=handshake.display_model(c.model), turn_detection=None)
        self.codec = DuplexCodec(handshake.dialect, self.config, _codec_options(c), opus_input=audio == OPUS)
        self.decoder = OggOpusDecoder() if audio == OPUS else None
        self.ds: DuplexSession | None = None

    # -- KindHandler ----------------------------------------------------------------------
    async def opened(self, conn: Connection) -> None:
        if self.audio not in self.service.audio_formats():
            formats = ", ".join(self.service.audio_formats())
            await self._direct(
                conn, _error("unsupported_audio_format", f"audio_format must be one of {formats}.")
            )
            conn.end("protocol", f"unsupported audio_format {self.audio[:32]!r}")
            return
        if not self.autostart:
            return  # the first event must be session.resume
        try:
            session = await conn.create_session()
        except SessionError as exc:
            await self._direct(conn, Rejected(exc.code, exc.message, type=errors.SERVER_ERROR))
            conn.end("capacity", exc.message)
            return
        assert self.service.engine is not None
        await self.service.engine.open(session.session_id)
        ds = self.ds = self.service.new_session(conn, self.handshake, self.config)
        ds.attach(conn, opus=self.audio == OPUS)
        created = de.DuplexSessionCreated(
            ds.session_id, self._expires_at(), self.config, self._capabilities(), ds.resume_token
        )
        ds.emit([created, ev.ConversationCreated(ds.turns.conversation_id)])

    async def decode(self, message: str | bytes) -> Any:
        if isinstance(message, str):
            return self.codec.receive_text(message)
        command = self.codec.receive_bytes(message)
        if not isinstance(command, dc.OpusAppend) or self.decoder is None:
            return command
        loop = asyncio.get_running_loop()
        try:
            return _Samples(await loop.run_in_executor(self.service.media, self.decoder.feed, command.data))
        except OpusError as exc:
            self.decoder = OggOpusDecoder()  # the client restarts its stream (a new OpusHead)
            return _error("invalid_opus", str(exc))

    async def session_ended(self, conn: Connection, reason: str) -> Close:
        return runtime_close(reason)

    async def handle(self, conn: Connection, item: Any) -> None:
        if isinstance(item, Flush):
            if self.ds is not None and self.ds.owned_by(conn):
                self.ds.apply_outputs()
            await self._flush(conn)
        elif isinstance(item, _Replaced):
            if item.frame is not None:
                await conn.send(item.frame)
            conn.end("closed", "resumed on another connection")
        elif isinstance(item, _End):
            await self._flush(conn)
            conn.end(item.reason, item.message)
        elif self.ds is None:
            await self._before_session(conn, item)
        elif self.ds.owned_by(conn):  # else resumed on another socket: this one ends (_Replaced)
            self.ds.session.touch()
            await self._command(conn, self.ds, item)

    # -- before a session (autostart=0) ---------------------------------------------------
    async def _before_session(self, conn: Connection, item: Any) -> None:
        if isinstance(item, Rejected):
            await self._direct(conn, item)
        elif isinstance(item, dc.SessionResume):
            await self._resume(conn, item)
        else:
            message = "This socket has no session yet: send session.resume (or connect without autostart=0)."
            await self._direct(conn, _error("session_not_started", message))

    async def _resume(self, conn: Connection, item: dc.SessionResume) -> None:
        manager = self.service.manager
        assert manager is not None
        session = manager.find(item.session_id)
        if session is None or session.status is not SessionStatus.ACTIVE or session.kind_state is None:
            reason = manager.close_reason(item.session_id) or (session.close_reason if session else None)
            if reason is not None:
                await self._direct(
                    conn, de.SessionExpired(item.session_id, EXPIRED_REASONS.get(reason, reason))
                )
            else:
                await self._direct(
                    conn, _error("unknown_session", f"No session {item.session_id!r} to resume.")
                )
            return
        ds: DuplexSession = session.kind_state
        if not hmac.compare_digest(ds.resume_token.encode(), item.resume_token.encode()):
            await self._direct(
                conn, _error("invalid_resume_token", "The resume token does not match the session.")
            )
            return
        if session.owner is not None:  # the socket still attached hears it is replaced, then closes
            session.owner.post(_Replaced(ds.replaced_frame()))
        conn.adopt(session)  # this runner owns the session now (the manager ends its grace)
        self.ds = ds
        ds.resume(conn, item.last_received_server_event_seq, opus=self.audio == OPUS)

    # -- client events --------------------------------------------------------------------
    async def _command(self, conn: Connection, ds: DuplexSession, item: Any) -> None:
        """One client command of the session this runner owns; every answer is journaled."""
        match item:
            case Rejected():
                ds.emit([ev.ErrorEvent(item)])
            case ce.SessionUpdate():
                self.config = item.config  # the codec refused anything but pcm16
                ds.emit([ev.SessionUpdated(ds.session_id, self._expires_at(), item.config)])
            case ce.AudioAppend():
                self._take_audio(ds, pcm16_samples(item.audio), item.event_id)
            case _Samples():
                self._take_audio(ds, item.samples, None)
            case ce.AudioCommit():
                ds.emit([ev.AudioCommitted(new_id("item"))])  # the model hears the stream: a marker
            case ce.AudioClear():
                ds.frames.clear()
                ds.emit([ev.AudioCleared()])
            case ce.ResponseCancel() | ce.OutputAudioClear():
                if ds.turns.active is not None:
                    self._cancel(ds, "client_cancelled")
                elif isinstance(item, ce.ResponseCancel):
                    ds.emit([ev.ErrorEvent(errors.cancel_not_active().with_event_id(item.event_id))])
            case ce.ItemRetrieve():
                found = ds.turns.retrieve(item.item_id)
                ds.emit(
                    [_answer(ev.ItemRetrieved(found) if not isinstance(found, Rejected) else found, item)]
                )
            case dc.PlaybackAck():
                ds.emit([_answer(ds.turns.ack(item.response_id, item.played_ms), item)])
            case dc.EventAck() if item.server_event_seq <= ds.journal.last_seq:
                ds.journal.release_through(item.server_event_seq)  # no answer: acks are frequent
            case dc.EventAck():
                last = ds.journal.last_seq
                message = f"server_event_seq {item.server_event_seq} was not sent yet (last {last})."
                rejected = Rejected(
                    errors.ErrorCode.INVALID_VALUE, message, "server_event_seq", item.event_id
                )
                ds.emit([ev.ErrorEvent(rejected)])
            case dc.Heartbeat():
                ds.emit([de.HeartbeatAck()])
            case dc.SessionClose():
                await self._flush(conn)
                conn.end("client_close")  # a clean close: the session ends at once, no grace
            case dc.SessionResume():
                error = _error(
                    "session_already_attached", "This socket already has a session.", item.event_id
                )
                ds.emit([ev.ErrorEvent(error)])
            case _:
                raise TypeError(f"unexpected mailbox item {type(item).__name__}")

    def _take_audio(self, ds: DuplexSession, samples: np.ndarray, event_id: str | None) -> None:
        frames, refused = ds.frames.push(samples)
        for frame in frames:
            if ds.turns.user_audio(float(np.sqrt(np.mean(np.square(frame))))):
                self._cancel(ds, "turn_detected")
        if refused:
            limit = self.service.config.max_input_queue_ms
            message = f"Input audio queue full ({limit} ms): {refused * 1000 // SAMPLE_RATE} ms dropped."
            ds.emit([ev.ErrorEvent(Rejected("input_audio_buffer_full", message, None, event_id))])

    def _cancel(self, ds: DuplexSession, reason: str) -> None:
        """Barge-in or client cancel: the epoch moves on everywhere, then the response closes."""
        ds.interrupt()
        events: list[ev.ServerEvent] = []
        if reason == "turn_detected":
            started_ms = max(0, ds.turns.input_ms - self.service.config.barge_in_ms)
            events.append(ev.SpeechStarted(new_id("item"), started_ms))
        ds.emit([*events, *ds.turns.cancel(reason, ds.step)])

    # -- output ---------------------------------------------------------------------------
    async def _flush(self, conn: Connection) -> None:
        if self.ds is None:
            return
        for item in self.ds.take_pending(conn):
            if item.encoded is None:
                await conn.send(item.frame, epoch=item.epoch)
            else:
                await conn.send_later(_binary(item.encoded), epoch=item.epoch)

    async def _direct(self, conn: Connection, event: Any) -> None:
        """An event for a socket without a session (seq 0: nothing journaled)."""
        frame = self.codec.frame(
            ev.ErrorEvent(event) if isinstance(event, Rejected) else event, epoch=0, seq=0
        )
        if frame is not None:
            await conn.send(frame)

    def _capabilities(self) -> de.Capabilities:
        c, stage = self.service.config, self.service.stage
        return de.Capabilities(
            chunk_period_ms=FRAME_MS,
            sample_rate_hz=SAMPLE_RATE,
            audio_formats=tuple(self.service.audio_formats()),
            audio_format=self.audio,
            supports_resume=c.resume_grace_s > 0,
            supports_barge_in=True,
            supports_playback_ack=True,
            context_policy=stage.context_policy,
            context_frames=getattr(getattr(stage, "config", None), "context", 0),
            resume_grace_s=c.resume_grace_s,
        )

    def _expires_at(self) -> int:
        lifetime = self.service.config.max_lifetime_s
        return int(time.time() + lifetime) if lifetime > 0 else 0


async def _binary(encoded: Any) -> tuple[bytes, ...]:
    """The Ogg bytes of one encode on the media thread, as the writer's deferred frames."""
    data = await asyncio.wrap_future(encoded)
    return (data,) if data else ()


def _answer(result: Any, command: Any) -> Any:
    """A state machine's answer to ``command``: its event, or its refusal as an error event."""
    return ev.ErrorEvent(result.with_event_id(command.event_id)) if isinstance(result, Rejected) else result


def _error(code: str, message: str, event_id: str | None = None) -> Rejected:
    return Rejected(code, message, None, event_id)


def build_duplex_service(ctx: ServerContext) -> DuplexService:
    return DuplexService(ctx)
