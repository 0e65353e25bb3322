"""One duplex connection: the duplex kind's command handler on the shared skeleton.

A socket either creates its session (``autostart``, the default) or, opened with ``autostart=0``,
takes over a live one with ``session.resume`` (``SessionManager.attach``: the manager ends its
grace; a socket still attached hears ``session.replaced`` and closes). From then on this
connection's runner owns the session's :class:`~realtime.kinds.duplex_session.DuplexSession`:
it applies the frame clock's outputs when woken (``Flush``), answers every client command with
journaled events, and ends with ``session.close`` (the session is released at once) or with the
socket (a drop: the manager keeps the session detached for a resume). Barge-in or
``response.cancel`` is one call, ``DuplexSession.interrupt``. Ogg/Opus appends are decoded on the
kind's media thread, in the reader.

Invalid frames: the reader notes every decoded frame in the connection's budget
(``Connection.frames``), invalid when the codec refused it. The ``duplex.max_invalid_frames``-th
invalid frame in a row gets its typed error, then ``too_many_invalid_frames``, then close 1008; the
session is released at once. A socket whose every frame was invalid is no client of the protocol:
the skeleton releases its session when it drops rather than keeping it for a resume, so garbage
costs no model steps beyond the socket's own life.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from models.duplex.stage import FRAME_MS, SAMPLE_RATE
from realtime.connection import Close, Connection, runtime_close
from realtime.kinds.duplex_session import DuplexSession, End, Flush
from realtime.protocols.duplex import commands as dc
from realtime.protocols.duplex import events as de
from realtime.protocols.duplex.audio import pcm16_samples
from realtime.protocols.duplex.codec import DuplexCodec
from realtime.protocols.duplex.opus import OggOpusDecoder, OpusError
from realtime.protocols.oai_realtime import CodecOptions, Handshake, Limits, Rejected, SessionConfig, errors
from realtime.protocols.oai_realtime import client_events as ce
from realtime.protocols.oai_realtime import server_events as ev
from realtime.protocols.oai_realtime.wire import new_id
from realtime.scale.resume import DuplexState, decode, restoring
from sessions.errors import SessionError
from sessions.identities import allocated_elsewhere
from sessions.session import SessionStatus

if TYPE_CHECKING:
    from realtime.kinds.duplex import DuplexService

OPUS = "ogg_opus"
PCM16 = "pcm16"
#: The manager's close reasons as ``session.expired`` names them (others go as they are).
EXPIRED_REASONS = {"grace_expired": "disconnect_grace_expired"}


def codec_options(c: Any) -> CodecOptions:
    """A duplex codec's limits: appends up to the whole input queue, events up to the route's size."""
    max_append = c.max_input_queue_ms * SAMPLE_RATE // 1000 * 2  # pcm16 bytes of the whole input queue
    return CodecOptions(Limits(max_append_bytes=max_append, max_event_bytes=c.max_message_bytes))


@dataclass(frozen=True)
class _Samples:
    """Decoded Opus audio of one binary frame (24 kHz float32)."""

    samples: np.ndarray


@dataclass(frozen=True)
class _OverBudget:
    """The invalid frame that used up the connection's budget: the codec's error for it."""

    rejected: Rejected


@dataclass(frozen=True)
class _Replaced:
    """This socket's session was resumed on another socket."""

    frame: str | None


class DuplexHandler:
    """One duplex connection (``KindHandler``): every attribute is the runner's alone."""

    inline = False

    def __init__(self, service: DuplexService, handshake: Handshake, audio: str, autostart: bool) -> None:
        self.service = service
        self.handshake = handshake
        self.audio = audio
        self.autostart = autostart
        c = service.config
        self.config = SessionConfig(model=handshake.display_model(c.model), turn_detection=None)
        self.codec = DuplexCodec(handshake.dialect, self.config, codec_options(c), opus_input=audio == OPUS)
        self.decoder = OggOpusDecoder() if audio == OPUS else None
        self.ds: DuplexSession | None = None
        self.conn: Connection | None = None  # set first thing in ``opened``, before any frame is read

    # -- KindHandler ----------------------------------------------------------------------
    async def opened(self, conn: Connection) -> None:
        self.conn = conn
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
        ds = self.ds = self.service.new_session(conn, self.handshake, self.config)
        ds.attach(conn, opus=self.audio == OPUS)
        created = de.DuplexSessionCreated(
            ds.session_id, self._expires_at(), self.config, self._capabilities(), ds.resume_token
        )
        ds.emit([created, ev.ConversationCreated(ds.turns.conversation_id)])
        self.service.start_clock_later(ds.session_id)  # or at the first valid event (``handle``)

    async def decode(self, message: str | bytes) -> Any:
        command = await self._decode(message)
        assert self.conn is not None
        return _OverBudget(command) if self.conn.frames.note(isinstance(command, Rejected)) else command

    async def _decode(self, message: str | bytes) -> Any:
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
        elif isinstance(item, End):
            await self._flush(conn)
            conn.end(item.reason, item.message)
        elif isinstance(item, _OverBudget):
            await self._over_budget(conn, item.rejected)
        elif self.ds is None:
            await self._before_session(conn, item)
        elif self.ds.owned_by(conn):  # else resumed on another socket: this one ends (_Replaced)
            self.ds.session.touch()
            if not isinstance(item, Rejected):  # a client of the protocol: its session steps now
                await self.service.start_clock(self.ds.session_id)
            await self._command(conn, self.ds, item)
        self._checkpoint(conn)

    def _checkpoint(self, conn: Connection) -> None:
        """After the runner's step: the session's state to the replica's checkpointer (coalesced)."""
        checkpointer, ds = self.service.ctx.checkpointer, self.ds
        if checkpointer is not None and ds is not None and ds.owned_by(conn):
            # within the store's bound per session: 3/4 journal, 1/8 model context, 1/8 the rest
            limit = self.service.ctx.config.replicas.checkpoint_max_bytes
            checkpointer.save(ds.session_id, "duplex", lambda: ds.state(limit * 3 // 4, limit // 8))

    async def _over_budget(self, conn: Connection, rejected: Rejected) -> None:
        """The last invalid frame's error, ``too_many_invalid_frames``, then close 1008."""
        limit = conn.frames.limit
        message = f"{limit} invalid frames in a row: closing the connection."
        refusals = [rejected, _error("too_many_invalid_frames", message)]
        if self.ds is not None and self.ds.owned_by(conn):
            self.ds.emit([ev.ErrorEvent(e) for e in refusals])
            await self._flush(conn)
        else:
            for error in refusals:
                await self._direct(conn, error)
        conn.end("protocol", f"{limit} invalid frames in a row")

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
        if session is None and await self._restore(conn, item):
            return
        if session is None or session.status is not SessionStatus.ACTIVE or session.kind_state is None:
            reason = manager.close_reason(item.session_id) or (session.close_reason if session else None)
            if reason is not None:
                await self._direct(
                    conn, de.SessionExpired(item.session_id, EXPIRED_REASONS.get(reason, reason))
                )
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
        await self.service.start_clock(ds.session_id)  # dropped in its probation: never stepped yet
        ds.resume(conn, item.last_received_server_event_seq, opus=self.audio == OPUS)

    async def _restore(self, conn: Connection, item: dc.SessionResume) -> bool:
        """Resume a session of a gone replica from the checkpoint the session check found for it
        (``realtime.scale.resume``): same id, epoch, token, journal and model context (the session
        state exists before its engine slot opens, so the slot's first step rebuilds the context;
        a rebuild that fails ends the session with ``context_restore_failed``). False when there
        is none to restore (the caller answers as for any unknown id)."""
        checkpointer, checkpoint = self.service.ctx.checkpointer, restoring(conn.ws.scope)
        if checkpointer is None or checkpoint is None or checkpoint.session_id != item.session_id:
            return False
        state = await asyncio.to_thread(decode, checkpoint)
        if not isinstance(state, DuplexState):
            return False
        if not hmac.compare_digest(state.resume_token.encode(), item.resume_token.encode()):
            await self._direct(
                conn, _error("invalid_resume_token", "The resume token does not match the session.")
            )
            return True
        try:
            session = await conn.create_session(session_id=item.session_id)
        except SessionError as exc:
            await self._direct(conn, Rejected(exc.code, exc.message, type=errors.SERVER_ERROR))
            conn.end("capacity", exc.message)
            return True
        checkpointer.adopt(checkpoint)
        session.continue_from(state.epoch)
        ds = self.ds = self.service.new_session(conn, self.handshake, self.config)
        ds.restore(state, item.last_received_server_event_seq)
        assert self.service.engine is not None
        await self.service.engine.open(session.session_id)
        ds.resume(conn, item.last_received_server_event_seq, opus=self.audio == OPUS)
        return True

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
