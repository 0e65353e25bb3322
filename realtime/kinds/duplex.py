"""The duplex session kind: full-duplex voice on ``/v1/duplex`` and ``/v1/realtime?mode=duplex``.

One speech model (``models/duplex``) listens and speaks at once and decides turn-taking itself.
The server clock drives it, not input arrival: one :class:`~sessions.engine.StageEngine` with a
:class:`~sessions.engine.dispatch.FrameClock` steps **every** open session together in one
batched forward each 80 ms (lockstep batching). Each session's next frame is the client's
audio (its appends cut into 80 ms frames, at most ``duplex.max_input_queue_ms`` queued) or
silence when it sent none (counted: ``duplex_input_frames_total{source="silence"}``). Late and
missed steps are the clock's, exported as ``duplex_steps_total``, ``duplex_late_steps_total``,
``duplex_missed_steps_total``.

Admission: the memory plan over the stage's ``state_bytes()`` (``capacity_plan``, measured before
the pools exist), capped by compute: the step time measured at each batch size must fit
``compute_utilisation`` of the period (``paced_capacity`` with the whole batch in one forward).

Per session (:class:`~realtime.kinds.duplex_session.DuplexSession`, which outlives its socket):
the protocol state machines of ``realtime/protocols/duplex`` and the socket it is attached to.
Its one owner is the attached connection's runner; the clock's callbacks only hand frames in and
outputs out through the session's two channels (the ``duplex_session`` module docstring). A
stalled client only fills its own queues: the clock steps it with the others, its runner waits
on its socket and the skeleton's bounded outbound and send watchdog end that connection alone.

- **Barge-in**: user speech (RMS >= ``barge_in_rms`` for ``barge_in_ms``) while the model speaks,
  or ``response.cancel``, bumps the epoch (the engine drops the in-flight step's output, the
  socket's writer drops queued deltas, the journal forgets them): nothing of the old epoch is
  sent after. The response ends ``cancelled``; the model stays muted until it chooses to listen.
- **Resume**: a dropped socket keeps the session, its slot and its clock for
  ``duplex.resume_grace_s``; its steps wait in its bounded step inbox. A socket opened with
  ``autostart=0`` sends ``session.resume``; the journal after the client's cursor is replayed
  exactly once, then the waiting steps' events (never sent before), then ``session.resumed``
  (token rotated). ``session.event_ack`` frees the journal up to a seq. A socket still attached
  gets ``session.replaced`` and closes. After the grace the session is released
  (``session.expired`` to a late resume).
- **Opus**: ``?audio_format=ogg_opus``: audio travels as Ogg/Opus in binary frames both ways
  (one Ogg stream per response); encoding and decoding run on one media thread, off the loop.
  Binary audio sent live is not journaled (no seq says what arrived); the audio of the steps
  taken while detached reaches the resumed socket once, as a new Ogg stream.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Iterator
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
from realtime.kinds.duplex_session import DuplexSession, Flush, Pending, StepFailed, new_token
from realtime.kinds.runtime import build_session_manager, capacity_plan
from realtime.protocols.duplex import commands as dc
from realtime.protocols.duplex import events as de
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
from realtime.protocols.oai_realtime.session_config import AudioFormat
from realtime.protocols.oai_realtime.wire import new_id
from sessions.capacity import MemoryDeclaration, paced_capacity, with_compute_limit
from sessions.engine import StageEngine
from sessions.engine.dispatch import FrameClock
from sessions.errors import SessionError
from sessions.executor import StageExecutor
from sessions.identities import allocated_elsewhere

log = logging.getLogger("realtime.kinds.duplex")

PATH = "/v1/duplex"
REALTIME_PATH = "/v1/realtime"
OPUS = "ogg_opus"
PCM16 = "pcm16"
MAX_EXPIRED_IDS = 1024  # expired session ids remembered so a late resume hears session.expired
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
        self.sessions: dict[str, DuplexSession] = {}
        self.expired: OrderedDict[str, str] = OrderedDict()  # session id -> reason
        self.media = ThreadPoolExecutor(max_workers=1, thread_name_prefix="duplex-opus")
        self._tasks: set[asyncio.Task] = set()
        self._frames = Counter(
            "duplex_input_frames", "input frames stepped, by source", ["source"], registry=ctx.registry
        )
        self._client_frames = self._frames.labels(source="client")
        self._silent_frames = self._frames.labels(source="silence")
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
        log.info(
            "duplex capacity planned",
            extra={
                "capacity": plan.capacity,
                "limited_by": plan.limited_by,
                "step_seconds": self.step_seconds,
            },
        )
        progress("ready", 3, 3)

    async def start(self) -> None:
        plan = self.plan
        assert plan is not None, "load() runs before start()"
        registry = self.ctx.registry
        self.clock = FrameClock(PERIOD_S, silence=self._next_input, on_output=self._on_output)
        self.runner = self.engine = StageEngine(
            FrameStage(self.stage),
            registry=registry,
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
        )
        await self.manager.start()

    async def stop(self) -> None:
        for ds in self.sessions.values():
            if ds.grace_timer is not None:
                ds.grace_timer.cancel()
        await super().stop()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.media.shutdown(wait=True, cancel_futures=True)

    async def _endpoint(self, websocket: WebSocket) -> None:
        query = websocket.scope.get("query_string", b"")
        handshake = negotiate(query, websocket.headers, websocket.scope.get("subprotocols", ()))
        params = parse_qs(query.decode("latin-1"))
        audio = (params.get("audio_format") or [PCM16])[0]
        autostart = (params.get("autostart") or ["1"])[0] != "0"
        handler = _DuplexHandler(self, handshake, audio, autostart)
        await self.serve(
            websocket,
            handler,
            subprotocol=handshake.subprotocol,
            headers=handshake.accept_headers(self.config.model),
        )

    # -- the frame clock's callbacks (on the loop, between forwards): hand-offs only ------
    def _next_input(self, session_id: str) -> Any:
        ds = self.sessions.get(session_id)
        if ds is None:  # opened, not registered yet
            return self.stage.silence()
        return ds.next_input()

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
                self._expire(session_id, "step_failed" if detached_failure else "step_inbox_full")
            log.info("duplex session ended by the clock", extra={"failed_step": detached_failure})

    def _count_frame(self, silent: bool) -> None:
        (self._silent_frames if silent else self._client_frames).inc()

    # -- sessions -------------------------------------------------------------------------
    def new_session(self, conn: Connection, handshake: Handshake, config: SessionConfig) -> DuplexSession:
        c = self.config
        session = conn.session
        assert session is not None
        policy = TurnPolicy(
            frame_ms=FRAME_MS,
            barge_in_rms=c.barge_in_rms,
            barge_in_frames=max(1, c.barge_in_ms // FRAME_MS),
            commit_policy=c.playback_commit_policy,
            max_history=c.max_history_items,
        )
        ds = DuplexSession(
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
        self.sessions[ds.session_id] = ds
        self._track(self._watch(ds))
        return ds

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
        else:
            self._track(self._close(ds.session_id))
        if isinstance(error, ContextExhausted):
            log.info("duplex session used its whole context", extra={"frames": error.context})

    def detach(self, ds: DuplexSession) -> None:
        """The socket dropped: keep the session for the grace period, then release it."""
        ds.detach()
        ds.detached_at = time.monotonic()
        loop = asyncio.get_running_loop()
        ds.grace_timer = loop.call_later(
            self.config.resume_grace_s, self._expire, ds.session_id, "disconnect_grace_expired"
        )

    def _expire(self, session_id: str, reason: str) -> None:
        """Release a detached session; a later resume hears ``session.expired {reason}``."""
        ds = self.sessions.get(session_id)
        if ds is None or ds.attachment is not None or session_id in self.expired:
            return  # gone, resumed, or its release is under way
        self.expired[session_id] = reason
        while len(self.expired) > MAX_EXPIRED_IDS:
            self.expired.popitem(last=False)
        self._track(self._close(session_id))

    async def _close(self, session_id: str) -> None:
        assert self.manager is not None
        await self.manager.disconnect(session_id)

    async def _watch(self, ds: DuplexSession) -> None:
        """Forget the session once the runtime closed it (any reason, attached or not)."""
        try:
            await ds.session.wait_closed()
        finally:
            if ds.grace_timer is not None:
                ds.grace_timer.cancel()
            if self.sessions.get(ds.session_id) is ds:
                del self.sessions[ds.session_id]

    def _track(self, work: Any) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


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


_INTERNAL = (Flush, _Replaced, _End)


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
            await conn.create_session()
        except SessionError as exc:
            await self._direct(conn, Rejected(exc.code, exc.message, type=errors.SERVER_ERROR))
            conn.end("capacity", exc.message)
            return
        service = self.service
        assert service.engine is not None and conn.session is not None
        await service.engine.open(conn.session.session_id)
        ds = self.ds = service.new_session(conn, self.handshake, self.config)
        ds.attach(conn, opus=self.audio == OPUS)
        ds.emit(
            [
                de.DuplexSessionCreated(
                    ds.session_id, self._expires_at(), self.config, self._capabilities(), ds.resume_token
                ),
                ev.ConversationCreated(ds.turns.conversation_id),
            ]
        )

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

    def keep_session(self, conn: Connection, close: Close) -> bool:
        """The skeleton asks at the end of the socket: keep the session for a resume?"""
        ds = self.ds
        if ds is None:
            return False
        if ds.attachment is None or ds.attachment.conn is not conn:
            return True  # replaced: the session is another socket's now
        if close.reason == "disconnect" and self.service.config.resume_grace_s > 0:
            self.service.detach(ds)
            return True
        ds.detach()
        return False

    async def handle(self, conn: Connection, item: Any) -> None:
        if isinstance(item, Flush):
            if self.ds is not None and self.ds.owned_by(conn):
                self.ds.apply_outputs()
            await self._flush(conn)
            return
        if isinstance(item, _Replaced):
            if item.frame is not None:
                await conn.send(item.frame)
            conn.end("closed", "resumed on another connection")
            return
        if isinstance(item, _End):
            await self._flush(conn)
            conn.end(item.reason, item.message)
            return
        ds = self.ds
        if ds is None:
            await self._before_session(conn, item)
            return
        if not ds.owned_by(conn):
            return  # resumed on another socket: this one ends with its _Replaced item
        ds.session.touch()
        handler = self._HANDLERS.get(type(item))
        if handler is None:
            raise TypeError(f"unexpected mailbox item {type(item).__name__}")
        await handler(self, conn, ds, item)

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
        service = self.service
        ds = service.sessions.get(item.session_id)
        if ds is None:
            reason = service.expired.get(item.session_id)
            if reason is not None:
                await self._direct(conn, de.SessionExpired(item.session_id, reason))
            elif allocated_elsewhere(item.session_id):  # scaled out: the session is another replica's
                message = (
                    f"Session {item.session_id!r} is on another replica: reconnect with "
                    "?session_id=<it>&autostart=0, then resume."
                )
                await self._direct(conn, _error("session_not_found", message))
            else:
                await self._direct(
                    conn, _error("unknown_session", f"No session {item.session_id!r} to resume.")
                )
            return
        if not hmac.compare_digest(ds.resume_token.encode(), item.resume_token.encode()):
            await self._direct(
                conn, _error("invalid_resume_token", "The resume token does not match the session.")
            )
            return
        if ds.grace_timer is not None:
            ds.grace_timer.cancel()
            ds.grace_timer = None
        old = ds.attachment
        if old is not None:  # the old socket hears it is replaced, then closes
            old.conn.post(
                _Replaced(
                    ds.codec.frame(de.SessionReplaced(ds.session_id), epoch=ds.epoch, seq=ds.journal.last_seq)
                )
            )
        conn.adopt(ds.session)
        self.ds = ds  # this runner owns the session now
        entries, gap = ds.journal.after(item.last_received_server_event_seq)
        att = ds.attach(conn, opus=self.audio == OPUS)
        att.pending.extend(Pending(e.frame, None, None) for e in entries)
        ds.resume_token = new_token()
        if gap:
            ds.emit([de.ResyncRequired(ds.session_id, "journal_gap", ds.journal.first_available())])
        # The steps of the time no socket was attached were never sent: applied now, they go to
        # this socket live, once, in its audio format (Ogg/Opus audio included), before resumed.
        before = ds.journal.last_seq
        ds.apply_outputs()
        replayed = len(entries) + ds.journal.last_seq - before
        ds.emit([de.SessionResumed(ds.session_id, ds.resume_token, replayed)])

    # -- client events --------------------------------------------------------------------
    async def _on_rejected(self, conn: Connection, ds: DuplexSession, item: Rejected) -> None:
        ds.emit([ev.ErrorEvent(item)])

    async def _on_session_update(self, conn: Connection, ds: DuplexSession, item: ce.SessionUpdate) -> None:
        cfg = item.config
        if cfg.input_format is not AudioFormat.PCM16 or cfg.output_format is not AudioFormat.PCM16:
            self.codec.config = item.previous
            message = "Duplex sessions take pcm16 at 24 kHz (or Ogg/Opus negotiated at connect)."
            ds.emit(
                [ev.ErrorEvent(Rejected(errors.ErrorCode.UNSUPPORTED, message, "session", item.event_id))]
            )
            return
        self.config = cfg
        ds.emit([ev.SessionUpdated(ds.session_id, self._expires_at(), cfg)])

    async def _on_append(self, conn: Connection, ds: DuplexSession, item: ce.AudioAppend) -> None:
        pcm = np.frombuffer(item.audio[: len(item.audio) // 2 * 2], dtype="<i2").astype(np.float32) / 32768.0
        self._take_audio(ds, pcm, item.event_id)

    async def _on_samples(self, conn: Connection, ds: DuplexSession, item: _Samples) -> None:
        self._take_audio(ds, item.samples, None)

    def _take_audio(self, ds: DuplexSession, samples: np.ndarray, event_id: str | None) -> None:
        frames, refused = ds.frames.push(samples)
        for frame in frames:
            if ds.turns.user_audio(float(np.sqrt(np.mean(np.square(frame))))):
                self._cancel(ds, "turn_detected")
        if refused:
            limit = self.service.config.max_input_queue_ms
            message = f"Input audio queue full ({limit} ms): {refused * 1000 // SAMPLE_RATE} ms dropped."
            ds.emit([ev.ErrorEvent(Rejected("input_audio_buffer_full", message, None, event_id))])

    async def _on_commit(self, conn: Connection, ds: DuplexSession, item: ce.AudioCommit) -> None:
        ds.emit([ev.AudioCommitted(new_id("item"))])  # the model hears the stream: a commit is a marker

    async def _on_clear(self, conn: Connection, ds: DuplexSession, item: ce.AudioClear) -> None:
        ds.frames.clear()
        ds.emit([ev.AudioCleared()])

    async def _on_cancel(self, conn: Connection, ds: DuplexSession, item: Any) -> None:
        if ds.turns.active is None:
            if isinstance(item, ce.ResponseCancel):
                ds.emit([ev.ErrorEvent(errors.cancel_not_active().with_event_id(item.event_id))])
            return
        self._cancel(ds, "client_cancelled")

    def _cancel(self, ds: DuplexSession, reason: str) -> None:
        """Barge-in or client cancel: the epoch moves on everywhere, then the response closes."""
        ds.interrupt()
        events: list[ev.ServerEvent] = []
        if reason == "turn_detected":
            events.append(
                ev.SpeechStarted(new_id("item"), max(0, ds.turns.input_ms - self.service.config.barge_in_ms))
            )
        ds.emit([*events, *ds.turns.cancel(reason, ds.step)])

    async def _on_retrieve(self, conn: Connection, ds: DuplexSession, item: ce.ItemRetrieve) -> None:
        found = ds.turns.retrieve(item.item_id)
        if isinstance(found, Rejected):
            ds.emit([ev.ErrorEvent(found.with_event_id(item.event_id))])
        else:
            ds.emit([ev.ItemRetrieved(found)])

    async def _on_unsupported(self, conn: Connection, ds: DuplexSession, item: Any) -> None:
        what = {
            ce.ResponseCreate: "response.create (the duplex model decides when to speak)",
            ce.ItemCreate: "conversation.item.create",
            ce.ItemDelete: "conversation.item.delete",
            ce.ItemTruncate: "conversation.item.truncate (send playback.ack)",
        }[type(item)]
        message = f"{what} is not supported in a duplex session."
        ds.emit([ev.ErrorEvent(Rejected(errors.ErrorCode.UNSUPPORTED, message, "type", item.event_id))])

    async def _on_ack(self, conn: Connection, ds: DuplexSession, item: dc.PlaybackAck) -> None:
        result = ds.turns.ack(item.response_id, item.played_ms)
        ds.emit(
            [ev.ErrorEvent(result.with_event_id(item.event_id)) if isinstance(result, Rejected) else result]
        )

    async def _on_event_ack(self, conn: Connection, ds: DuplexSession, item: dc.EventAck) -> None:
        """Free the journal up to what the client holds (no answer: acks are frequent)."""
        if item.server_event_seq > ds.journal.last_seq:
            message = (
                f"server_event_seq {item.server_event_seq} was not sent yet (last {ds.journal.last_seq})."
            )
            ds.emit(
                [
                    ev.ErrorEvent(
                        Rejected(errors.ErrorCode.INVALID_VALUE, message, "server_event_seq", item.event_id)
                    )
                ]
            )
            return
        ds.journal.release_through(item.server_event_seq)

    async def _on_heartbeat(self, conn: Connection, ds: DuplexSession, item: dc.Heartbeat) -> None:
        ds.emit([de.HeartbeatAck()])

    async def _on_close(self, conn: Connection, ds: DuplexSession, item: dc.SessionClose) -> None:
        await self._flush(conn)
        conn.end("client_close")

    async def _on_resume_again(self, conn: Connection, ds: DuplexSession, item: dc.SessionResume) -> None:
        ds.emit(
            [
                ev.ErrorEvent(
                    _error("session_already_attached", "This socket already has a session.", item.event_id)
                )
            ]
        )

    _HANDLERS: dict[type, Any] = {
        Rejected: _on_rejected,
        ce.SessionUpdate: _on_session_update,
        ce.AudioAppend: _on_append,
        _Samples: _on_samples,
        ce.AudioCommit: _on_commit,
        ce.AudioClear: _on_clear,
        ce.ResponseCancel: _on_cancel,
        ce.OutputAudioClear: _on_cancel,
        ce.ItemRetrieve: _on_retrieve,
        ce.ResponseCreate: _on_unsupported,
        ce.ItemCreate: _on_unsupported,
        ce.ItemDelete: _on_unsupported,
        ce.ItemTruncate: _on_unsupported,
        dc.PlaybackAck: _on_ack,
        dc.EventAck: _on_event_ack,
        dc.Heartbeat: _on_heartbeat,
        dc.SessionClose: _on_close,
        dc.SessionResume: _on_resume_again,
    }

    # -- output ---------------------------------------------------------------------------
    async def _flush(self, conn: Connection) -> None:
        ds = self.ds
        if ds is None:
            return
        for item in ds.take_pending(conn):
            if item.encoded is None:
                await conn.send(item.frame, epoch=item.epoch)
            else:
                await conn.send_later(_binary(item.encoded), epoch=item.epoch)

    async def _direct(self, conn: Connection, event: Any) -> None:
        """An event for a socket without a session (seq 0: nothing journaled)."""
        if isinstance(event, Rejected):
            event = ev.ErrorEvent(event)
        frame = self.codec.frame(event, epoch=0, seq=0)
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


def _error(code: str, message: str, event_id: str | None = None) -> Rejected:
    return Rejected(code, message, None, event_id)


def build_duplex_service(ctx: ServerContext) -> DuplexService:
    return DuplexService(ctx)
