"""One ``/v1/realtime`` voice connection: the voice kind's command handler on the shared skeleton.

- **Input.** The reader is the session's ordered, bounded input stream: each append is decoded and
  run through the batched VAD in :meth:`VoiceHandler.decode` (``Session.submit``), so its frames
  reach the runner as one command in order with every other: a commit or clear always finds the
  audio appended before it. Turn detection (a pure state machine) decides speech start and stop;
  a stop (or the client's commit) makes a user item, transcribed by the batched ASR in a child
  task (started early at a candidate end of speech).
- **Responses.** One streaming tick each (``Session.stream_tick``, requested in the runner)
  through the LLM -> TTS pipeline; a child task sends each chunk's events (``ResponseOutput``)
  fenced by the tick's epoch; the runner sends the opening and closing events and exactly one
  ``response.done``. A response waits for the transcripts it needs.
- **Cancel / barge-in**: one call, ``Session.interrupt`` (the LLM request is aborted, its KV
  keeps what was computed; no queued delta of it is sent), then ``response.done`` ``cancelled``.

Every attribute is the runner's alone, but for the reader's codec and its VAD submit.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import soxr

from models.voice.stages import VadFrames, VadInput
from realtime.connection import Close, Connection, MediaIn, runtime_close
from realtime.kinds.voice_llm import chat_prompt
from realtime.protocols.oai_realtime import (
    CodecOptions,
    Handshake,
    RealtimeCodec,
    Rejected,
    SessionConfig,
    errors,
)
from realtime.protocols.oai_realtime import client_events as ce
from realtime.protocols.oai_realtime import server_events as ev
from realtime.protocols.oai_realtime.audio import decode_audio
from realtime.protocols.oai_realtime.conversation import Conversation, untranscribed_audio
from realtime.protocols.oai_realtime.output import ResponseOutput, refusal
from realtime.protocols.oai_realtime.responses import ResponseSettings
from realtime.protocols.oai_realtime.session_config import AudioFormat, ToolChoiceFunction, as_server_vad
from realtime.protocols.oai_realtime.wire import new_id
from realtime.scale.resume import VoiceState, decode, restoring
from sessions.engine.errors import StaleEpochError
from sessions.errors import SessionError, TickSupersededError
from sessions.session import Session, SessionStatus
from sessions.tick import TickChunk

if TYPE_CHECKING:
    from realtime.kinds.voice import VoiceService
    from realtime.webrtc.playout import Cleared, Playout

log = logging.getLogger("realtime.kinds.voice")

LARGE_FRAME_CHARS = 1 << 20  # frames above this are parsed on a worker thread (base64 of big appends)
VAD_RATE = 16_000
FRAME_MS = 32


@dataclass(frozen=True)
class _Transcribed:
    item_id: str
    transcript: Any  # models.voice.asr.Transcript
    error: BaseException | None


@dataclass(frozen=True)
class _Expiring:
    seconds_left: float


@dataclass(frozen=True)
class _Finished:
    response: ResponseOutput
    usage: Any  # models.voice.llm.ChatUsage | None
    error: BaseException | None


class VoiceHandler:
    """One ``/v1/realtime`` connection (``KindHandler``; see the module docstring)."""

    inline = False

    def __init__(
        self,
        service: VoiceService,
        handshake: Handshake,
        bound: SessionConfig | None = None,
        playout: Playout | None = None,
    ) -> None:
        """``bound``: the config the connection starts with (its client secret's, a call's
        ``session``). ``playout``: a WebRTC call's output audio buffer (``realtime.webrtc``):
        assistant audio then leaves as track frames, and a barge-in clears what has not played."""
        self.service = service
        self.vc = service.config
        defaults = service.session_defaults(handshake)
        options = CodecOptions(semantic_vad=True, media_track=playout is not None)
        self.codec = RealtimeCodec(handshake.dialect, defaults, options)
        if bound is not None:
            self.codec.config = bound
        self.playout = playout
        self.truncate_after: Cleared | None = None  # a barge-in's cut of a response still closing
        self.config = self.codec.config
        self.session: Session | None = None
        self.ready = asyncio.Event()  # the session is open: the reader may decode
        self.session_id = ""  # the manager's id (routable), once opened
        self.conversation_id = new_id("conv")
        self.expires_at = int(time.time() + self.vc.max_lifetime_s) if self.vc.max_lifetime_s > 0 else 0
        self.items = Conversation(self.vc.max_conversation_items)
        max_frames = int(self.vc.max_input_buffer_s * 1000 / FRAME_MS)
        self.buffer: collections.deque[np.ndarray] = collections.deque(maxlen=max_frames)  # 16 kHz frames
        self.turn = self._turn_detector(self.config)
        self.speech_item_id: str | None = None
        self.speculation: tuple[int, asyncio.Future] | None = None  # (pause id, its ASR) at a candidate stop
        self.pending_transcripts: set[str] = set()
        self.committed_at: float | None = None  # the last commit not answered yet
        self.response: ResponseOutput | None = None
        self.response_committed_at: float | None = None  # the commit it answers (time to first audio)
        self.queued_response: ResponseSettings | None = None  # server VAD's, after a barge-in
        self.last_response_id = ""

    # -- KindHandler ----------------------------------------------------------------------
    async def opened(self, conn: Connection) -> None:
        checkpointer, checkpoint = self.service.ctx.checkpointer, restoring(conn.ws.scope)
        state = None
        if checkpointer is not None and checkpoint is not None and checkpoint.kind == "voice":
            state = await asyncio.to_thread(decode, checkpoint)
        try:
            session = await conn.create_session(session_id=checkpoint.session_id if state else None)
            for engine in (self.service.vad_engine, self.service.asr_engine):
                assert engine is not None
                await engine.open(session.session_id)
        except SessionError as exc:
            await self._error(conn, Rejected(exc.code, exc.message, type=errors.SERVER_ERROR))
            conn.end("capacity", exc.message)
            return
        session.on_lifetime_warning = lambda left: conn.post(_Expiring(left))
        self.session = session
        self.session_id = session.session_id  # routable: a reconnect naming it reaches this session
        restored: list[ev.ServerEvent] = []
        if isinstance(state, VoiceState) and checkpointer is not None and checkpoint is not None:
            checkpointer.adopt(checkpoint)
            restored = self._restore(state)
        self.ready.set()
        created = ev.SessionCreated(self.session_id, self.expires_at, self.config)
        await self._send(conn, created, ev.ConversationCreated(self.conversation_id), *restored)

    def _restore(self, state: VoiceState) -> list[ev.ServerEvent]:
        """Continue a session of a gone replica (``realtime.scale.resume``): its config and
        conversation; the events that show the client its items again. The LLM's KV is
        recomputed from the items at the next response (one prefill of the conversation)."""
        self.config = self.codec.config = state.config
        self.turn = self._turn_detector(self.config)
        self.items.restore(state.items)
        events: list[ev.ServerEvent] = []
        previous = None
        for item in self.items.items():
            events += [ev.ItemAdded(item, previous), ev.ItemDone(item, previous)]
            previous = item.id
        return events

    def _checkpoint(self) -> None:
        """After the runner's step: config and items to the replica's checkpointer (coalesced)."""
        checkpointer = self.service.ctx.checkpointer
        if checkpointer is not None and self.session is not None:
            checkpointer.save(self.session.session_id, "voice", self._state)

    def _state(self) -> VoiceState:
        return VoiceState(self.config, self.items.snapshot())

    async def decode(self, message: str | bytes | MediaIn) -> Any:
        """The reader's step, in order: parse; an append (or a call's microphone audio) goes
        through the VAD here (the reader waits for it: the session's bounded, ordered input stream)."""
        await self.ready.wait()
        if isinstance(message, MediaIn):
            return await self._vad(VadInput(message.samples, VAD_RATE), None)
        if isinstance(message, bytes):
            return self.codec.receive_bytes(message)
        if len(message) > LARGE_FRAME_CHARS:
            command = await asyncio.to_thread(self.codec.receive_text, message)
        else:
            command = self.codec.receive_text(message)
        if not isinstance(command, ce.AudioAppend):
            return command
        fmt = self.codec.config.input_format
        return await self._vad(VadInput(decode_audio(command.audio, fmt), fmt.sample_rate), command.event_id)

    async def _vad(self, audio: VadInput, event_id: str | None) -> Any:
        """VadFrames (the audio's 16 kHz frames and their speech probabilities), or the refusal."""
        session, vad = self.session, self.service.vad_engine
        assert session is not None and vad is not None
        try:
            return await session.submit(vad, audio)
        except SessionError as exc:  # a full VAD queue, a closing session: this audio is refused
            return Rejected(exc.code, exc.message, None, event_id, errors.SERVER_ERROR)

    async def session_ended(self, conn: Connection, reason: str) -> Close:
        if reason == "lifetime":
            await self._error(conn, errors.session_expired(max(1, round(self.vc.max_lifetime_s / 60))))
        return runtime_close(reason)

    async def handle(self, conn: Connection, item: Any) -> None:
        session = conn.session
        assert session is not None
        match item:
            case _Transcribed():
                await self._transcribed(conn, item)
            case _Finished():
                await self._finished(conn, session, item)
            case _Expiring():
                minutes = max(1, round(self.vc.max_lifetime_s / 60))
                await self._error(conn, errors.session_expiring(minutes, item.seconds_left))
            case _:
                session.touch()  # a client's command: the session is active
                await self._command(conn, item)
        self._checkpoint()

    async def _command(self, conn: Connection, item: Any) -> None:
        match item:
            case Rejected():
                await self._error(conn, item)
            case VadFrames():  # an append, through the VAD in the reader
                await self._heard(conn, item)
            case ce.SessionUpdate():
                previous, self.config = self.config, item.config
                if previous.turn_detection != self.config.turn_detection:
                    self.turn = self._turn_detector(self.config)
                    self.speech_item_id = self.speculation = None  # its pause ids were the old detector's
                await self._send(conn, ev.SessionUpdated(self.session_id, self.expires_at, self.config))
            case ce.AudioCommit():
                await self._commit_buffer(conn, item.event_id)
            case ce.AudioClear():
                self._reset_input()
                await self._send(conn, ev.AudioCleared())
            case ce.ItemCreate():
                audio = untranscribed_audio(item.item)  # its words enter the prompt as a transcript
                answer = self.items.create(item.item, item.previous_item_id)
                if await self._reply(conn, answer, item.event_id) and audio:
                    self._transcribe(conn, item.item.id, audio, self.config.input_format)
            case ce.ItemDelete():
                await self._reply(conn, self.items.remove(item.item_id), item.event_id)
            case ce.ItemRetrieve():
                await self._reply(conn, self.items.retrieve(item.item_id), item.event_id)
            case ce.ItemTruncate():
                fmt = self.config.output_format
                answer = self.items.truncate(item.item_id, item.content_index, item.audio_end_ms, fmt)
                await self._reply(conn, answer, item.event_id)
            case ce.ResponseCreate():
                await self._create_response(conn, item.options.resolve(self.config), item.event_id)
            case ce.ResponseCancel():
                r = self.response
                if r is None or not r.cancellable or item.response_id not in (None, r.state.id):
                    await self._error(conn, errors.cancel_not_active(), item.event_id)
                else:
                    await self._cancel(conn, "client_cancelled")
            case ce.OutputAudioClear():
                r = self.response
                if r is not None and r.cancellable:
                    await self._cancel(conn, "client_cancelled")
                if not await self._clear_playout(conn):
                    await self._send(conn, ev.OutputAudioCleared(r.state.id if r else self.last_response_id))
            case _:
                raise TypeError(f"unexpected mailbox item {type(item).__name__}")

    # -- the user's turns -----------------------------------------------------------------
    async def _heard(self, conn: Connection, item: VadFrames) -> None:
        """An append's frames: buffered, and through turn detection when the session has it."""
        self.buffer.extend(item.frames)
        if self.turn is None:
            return
        from models.voice.vad import SpeechPaused, SpeechStarted, SpeechStopped

        for decision in self.turn.push_frames(item.frames, item.probabilities):
            td = self.config.turn_detection
            assert td is not None
            if isinstance(decision, SpeechPaused):
                self._speculate(conn, decision)
            elif isinstance(decision, SpeechStarted):
                self.speech_item_id = new_id("item")
                await self._send(conn, ev.SpeechStarted(self.speech_item_id, decision.audio_start_ms))
                if td.interrupt_response and self.response is not None and self.response.cancellable:
                    await self._cancel(conn, "turn_detected")
                if td.interrupt_response:
                    await self._clear_playout(conn)
            elif isinstance(decision, SpeechStopped):
                item_id, self.speech_item_id = self.speech_item_id or new_id("item"), None
                self.buffer.clear()
                speculation, self.speculation = self.speculation, None
                early = speculation[1] if speculation and speculation[0] == decision.pause_id else None
                await self._send(conn, ev.SpeechStopped(item_id, decision.audio_end_ms))
                await self._commit(conn, item_id, decision.audio, early)
                if not td.create_response:
                    continue
                settings = ResponseSettings.of_session(self.config)
                if self.response is not None and not self.response.cancellable:
                    self.queued_response = settings  # the barged-in response is still closing
                else:
                    await self._create_response(conn, settings, None)

    async def _commit_buffer(self, conn: Connection, event_id: str | None) -> None:
        """``input_audio_buffer.commit``: the audio appended before it (its VAD ran in the reader)."""
        buffered_ms = len(self.buffer) * FRAME_MS
        if buffered_ms < max(self.vc.min_commit_ms, 1):
            await self._error(conn, errors.commit_empty(buffered_ms, self.vc.min_commit_ms), event_id)
            return
        audio, item_id = np.concatenate(self.buffer), self.speech_item_id or new_id("item")
        self._reset_input()
        await self._commit(conn, item_id, audio)

    def _turn_detector(self, config: SessionConfig) -> Any:
        from models.voice.vad import ServerVadConfig, TurnDetector

        if config.turn_detection is None:
            return None
        td, max_ms = as_server_vad(config.turn_detection), int(self.vc.max_input_buffer_s * 1000)
        vad = ServerVadConfig(td.threshold, td.prefix_padding_ms, td.silence_duration_ms, max_ms)
        return TurnDetector(vad, speculate_ms=self.vc.asr_speculate_ms)

    def _reset_input(self) -> None:
        self.buffer.clear()
        self.speech_item_id = self.speculation = None
        if self.turn is not None:
            self.turn.reset()

    def _speculate(self, conn: Connection, pause: Any) -> None:
        """Transcribe the utterance at a candidate end of speech (``SpeechPaused``), so the ASR
        runs during the end-of-turn silence; the stop reuses it if no speech came since. At most
        one speculation per connection is in flight (a later pause waits for none: it is skipped)."""
        if self.speculation is not None and not self.speculation[1].done():
            return
        assert conn.session is not None and self.service.asr_engine is not None
        try:
            future = conn.session.submit(self.service.asr_engine, pause.audio)
        except SessionError:  # a full queue: the stop transcribes as usual
            self.speculation = None
            return
        future.add_done_callback(lambda f: f.cancelled() or f.exception())  # an unused failure is fine
        self.speculation = (pause.pause_id, future)
        self.service.asr_speculations += 1

    async def _commit(
        self, conn: Connection, item_id: str, audio: np.ndarray, early: asyncio.Future | None = None
    ) -> None:
        """The utterance becomes a user item; its transcription starts (a child task), or reuses
        ``early``, the transcription of a candidate end of this utterance (``_speculate``)."""
        self.committed_at = time.monotonic()
        await self._send(conn, *self.items.commit_audio(item_id))
        self._transcribe(conn, item_id, audio, None, early)

    def _transcribe(
        self,
        conn: Connection,
        item_id: str,
        audio: np.ndarray | bytes,
        fmt: AudioFormat | None,
        early: asyncio.Future | None = None,
    ) -> None:
        """Transcribe ``audio`` (16 kHz samples, or wire bytes in ``fmt``) as a child task; a
        successful ``early`` transcription of the same speech is used instead (its duration made
        the committed audio's)."""
        session, engine = conn.session, self.service.asr_engine
        assert session is not None and engine is not None
        self.pending_transcripts.add(item_id)

        async def asr() -> Any:
            samples = audio if fmt is None else await asyncio.to_thread(_wire_to_16k, audio, fmt)
            if early is not None:
                with contextlib.suppress(Exception):  # it failed: transcribe the utterance itself
                    transcript = await early
                    self.service.asr_speculations_used += 1
                    return replace(transcript, audio_seconds=len(samples) / VAD_RATE)
            try:
                return await session.submit(engine, samples)
            except StaleEpochError:  # an interrupt moved the epoch on while it waited: it still counts
                return await session.submit(engine, samples)

        conn.spawn(asr(), lambda result, error: _Transcribed(item_id, result, error))

    async def _transcribed(self, conn: Connection, item: _Transcribed) -> None:
        self.pending_transcripts.discard(item.item_id)
        text, seconds = (None, 0.0)
        if item.error is not None:
            log.warning("transcription failed: %r", item.error)
        else:
            text, seconds = item.transcript.text, item.transcript.audio_seconds
        announce = self.config.transcription is not None
        await self._send(conn, *self.items.transcribed(item.item_id, text, seconds, announce=announce))
        if self.response is not None and not self.response.started and not self.pending_transcripts:
            await self._begin(conn, self.response)

    # -- responses ------------------------------------------------------------------------
    async def _create_response(
        self, conn: Connection, settings: ResponseSettings, event_id: str | None
    ) -> None:
        r = self.response
        refused = refusal(settings, self.items) if r is None else errors.active_response(r.state.id)
        if refused is not None:
            await self._error(conn, refused, event_id)
            return
        conversation = self.conversation_id if settings.conversation != "none" else None
        state = ev.ResponseState(new_id("resp"), settings, conversation_id=conversation)
        self.response = ResponseOutput(state, self.vc.audio_delta_ms)
        self.response_committed_at, self.committed_at, self.last_response_id = (
            self.committed_at,
            None,
            state.id,
        )
        await self._send(conn, ev.ResponseCreated(state))
        if not self.pending_transcripts:
            await self._begin(conn, self.response)

    async def _begin(self, conn: Connection, r: ResponseOutput) -> None:
        """Announce the assistant item and request the streaming tick (its child task streams
        it). A forced tool call (``tool_choice`` ``"required"`` or a function) has no assistant
        message: its function call items are announced as the model makes them."""
        from models.voice.pacing import PlaybackClock
        from models.voice.stages import ChatRequest
        from models.voice.tool_calls import ToolSpec

        settings, choice = r.settings, r.settings.tool_choice
        specs = tuple(ToolSpec(t.name, t.description, t.parameters) for t in settings.tools)
        forced = tuple(
            t
            for t in specs
            if choice == "required" or (isinstance(choice, ToolChoiceFunction) and t.name == choice.name)
        )
        messages = chat_prompt(
            self.items, settings.instructions or self.service.default_instructions, settings.input
        )
        await self._send(conn, *r.open(self.items, message=not forced))
        request = ChatRequest(
            messages,
            max_new_tokens=self._max_tokens(settings),
            temperature=0.0 if forced else self.vc.temperature,  # a forced call is greedy: deterministic
            speak=settings.audio_output and not forced,
            speed=self.config.speed,
            sample_rate=settings.output_format.sample_rate,
            # answering a tool's output, the model gets no tools (unless forced): small models
            # echo the output or call the tool again when the listing is still in the prompt
            tools=() if choice == "none" or (not forced and messages[-1].role == "tool") else specs,
            forced_tools=forced,
            playback=PlaybackClock(),  # _generate records the audio it sends; the LLM paces on it
        )
        assert conn.session is not None
        ticks = conn.session.stream_tick(request)  # requested now: a cancel from here on supersedes it
        work = self._generate(conn, r, request, ticks, self.response_committed_at)
        conn.spawn(work, lambda usage, error: _Finished(r, usage, error))

    async def _generate(
        self,
        conn: Connection,
        out: ResponseOutput,
        request: Any,
        ticks: AsyncIterator[TickChunk],
        committed_at: float | None,
    ) -> Any:
        """Child task: the response's streaming tick; each chunk's events go out as it arrives,
        fenced by the tick's epoch. Returns the LLM's usage (None if cut short)."""
        usage, rate = None, out.settings.output_format.sample_rate
        try:
            async for chunk in ticks:
                speech, events = chunk.value, []
                if speech.text:
                    events += out.text_delta(speech.text)
                if speech.audio.size:
                    if out.audio_bytes == 0 and committed_at is not None:
                        self.service.ttfa.observe(time.monotonic() - committed_at)
                    events += out.audio(speech.audio)
                events += _call_events(out, speech.calls)
                if speech.usage is not None:
                    usage = speech.usage
                if events:
                    await conn.send(*self._render(events), epoch=chunk.epoch)
                if (speech.audio.size or speech.voiced_chars) and request.playback is not None:
                    request.playback.sent(speech.audio.size / rate, speech.voiced_chars)
        except TickSupersededError:
            pass  # cancelled: the runner knows why
        return usage

    async def _finished(self, conn: Connection, session: Session, item: _Finished) -> None:
        r, u = item.response, item.usage
        failure = None if item.error is None else str(getattr(item.error, "code", "server_error"))
        usage = None if u is None else ev.Usage(u.prompt_tokens, 0, u.cached_tokens, u.generated_tokens)
        closing = r.finish(
            self.items, failure=failure, usage=usage, max_output_tokens=self._max_tokens(r.settings)
        )
        await self._send(conn, *closing)
        if r.audio_ms > 0:
            self.codec.lock_voice()
        self.response = None
        if self.truncate_after is not None:
            cut, self.truncate_after = self.truncate_after, None
            await self._truncate(conn, cut)
        if r.state.status == "failed" and session.status is SessionStatus.FAILED:
            await session.reset()  # a failed tick released the KV; start the conversation's KV over
        if self.queued_response is not None:
            settings, self.queued_response = self.queued_response, None
            await self._create_response(conn, settings, None)

    async def _cancel(self, conn: Connection, reason: str) -> None:
        assert self.response is not None and conn.session is not None
        done = self.response.cancel(reason)
        if done:  # it was still waiting for a transcript: nothing was announced
            self.response = None
            await self._send(conn, *done)
        else:
            conn.session.interrupt()  # the one call: the tick is superseded, its queued deltas never sent

    async def _clear_playout(self, conn: Connection) -> bool:
        """A WebRTC call: drop the assistant audio not played yet (``output_audio_buffer.cleared``)
        and cut its message to what was heard (``conversation.item.truncated``; once the response
        has closed, if it still is). True if there was audio to clear."""
        if self.playout is None:
            return False
        cut, events = self.playout.clear()
        if cut is None:
            return False
        await self._send(conn, *events)
        if self.response is not None and self.response.item_id == cut.item_id:
            self.truncate_after = cut  # its item enters the conversation when it closes
        else:
            await self._truncate(conn, cut)
        return True

    async def _truncate(self, conn: Connection, cut: Cleared) -> None:
        answer = self.items.truncate(cut.item_id, 0, cut.played_ms, self.config.output_format)
        if not isinstance(answer, Rejected):  # an item the client deleted meanwhile: nothing to cut
            await self._send(conn, *(answer if isinstance(answer, list) else [answer]))

    def _max_tokens(self, settings: ResponseSettings) -> int:
        cap = self.vc.max_output_tokens
        return cap if settings.max_output_tokens is None else min(cap, settings.max_output_tokens)

    # -- output ---------------------------------------------------------------------------
    def _render(self, events: Sequence[ev.ServerEvent]) -> list[str | bytes]:
        return [frame for e in events if (frame := self.codec.render(e)) is not None]

    async def _send(self, conn: Connection, *events: ev.ServerEvent) -> None:
        frames = self._render(events)
        if frames:
            await conn.send(*frames)

    async def _error(self, conn: Connection, rejected: Rejected, event_id: str | None = None) -> None:
        if event_id is not None and rejected.event_id is None:
            rejected = rejected.with_event_id(event_id)
        await self._send(conn, ev.ErrorEvent(rejected))

    async def _reply(self, conn: Connection, answer: Any, event_id: str | None) -> bool:
        """Send a state machine's answer: its events, or its refusal as an error; True if sent."""
        if isinstance(answer, Rejected):
            await self._error(conn, answer, event_id)
            return False
        await self._send(conn, *(answer if isinstance(answer, list) else [answer]))
        return True


def _call_events(out: ResponseOutput, calls: Sequence[Any]) -> list[ev.ServerEvent]:
    """The model's tool-call events (``models.voice.tool_calls``) as the response's output."""
    from models.voice.tool_calls import CallArguments, CallStarted

    events: list[ev.ServerEvent] = []
    for c in calls:
        if isinstance(c, CallStarted):
            events += out.call_started(c.index, c.name)
        elif isinstance(c, CallArguments):
            events += out.call_arguments(c.index, c.delta)
        else:
            events += out.call_done(c.index, c.arguments)
    return events


def _wire_to_16k(data: bytes, fmt: AudioFormat) -> np.ndarray:
    return soxr.resample(decode_audio(data, fmt), fmt.sample_rate, VAD_RATE).astype(np.float32)
