"""The voice session kind: OpenAI Realtime-compatible voice sessions on ``/v1/realtime``.

Stock OpenAI Realtime clients (the ``openai`` SDK's GA ``client.realtime.connect`` and beta
``client.beta.realtime.connect``, browser pages on the ``realtime`` subprotocol) talk to open models
through it. The protocol is the sans-I/O codec ``realtime/protocols/oai_realtime/`` (the handshake
picks the dialect before accept; one socket speaks one dialect); the models are the stages of
``models/voice/stages.py``, each behind its own engine so every stage batches across sessions:

- input audio: ``input_audio_buffer.append`` -> the connection's audio pump (a child task, in
  order) -> the batched **VAD** engine (resampling to 16 kHz and Silero, per-session state in
  slots) -> the frames come back to the runner, where ``server_vad`` turn detection (a pure state
  machine) decides ``speech_started`` / ``speech_stopped``. A stop commits the utterance; with
  ``turn_detection: null`` the client commits. Commit/clear travel through the pump too, so they
  apply to exactly the audio appended before them.
- a committed utterance -> the batched **ASR** engine (a child task) -> the user item's transcript
  (``...input_audio_transcription.completed`` when transcription is on).
- a **response** is one streaming tick (``Session.stream_tick``) through the ``Pipeline``
  **LLM -> TTS**: the LLM stage streams text and the clauses it completes, the TTS stage speaks each
  clause as it arrives, so audio starts on the first clause. The runner sends the opening events,
  a child task sends the deltas (audio at most ``voice.audio_delta_ms`` each), the runner sends the
  closing events and exactly one ``response.done``. A response created before the transcripts it
  needs are ready waits for them.
- **cancel / barge-in**: ``response.cancel``, ``output_audio_buffer.clear`` or speech during a
  response (``interrupt_response``) -> ``Session.interrupt`` (the LLM request is aborted, its KV
  keeps what was computed) and ``conn.epoch += 1`` (queued deltas of the old response are never
  sent) -> ``response.done`` with status ``cancelled`` after the closing events.

Handler state (conversation, input buffer, the active response) is the runner's alone.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import soxr
from prometheus_client import Histogram
from starlette.routing import BaseRoute, WebSocketRoute
from starlette.websockets import WebSocket

from realtime.connection import Close, Connection, runtime_close
from realtime.kinds.base import KindServiceBase, ProgressFn, ServedModel, ServerContext
from realtime.kinds.runtime import build_session_manager, capacity_plan, stage_declaration
from realtime.kinds.voice_conversation import Conversation
from realtime.kinds.voice_llm import llm_stage, load_chat
from realtime.protocols.oai_realtime import (
    CodecOptions,
    Handshake,
    RealtimeCodec,
    Rejected,
    SessionConfig,
    errors,
    negotiate,
)
from realtime.protocols.oai_realtime import client_events as ce
from realtime.protocols.oai_realtime import server_events as ev
from realtime.protocols.oai_realtime.errors import ParamError
from realtime.protocols.oai_realtime.items import (
    FunctionCall,
    InputAudio,
    Item,
    Message,
    OutputAudio,
    OutputText,
)
from realtime.protocols.oai_realtime.responses import ItemReference, ResponseSettings
from realtime.protocols.oai_realtime.session_config import (
    AudioFormat,
    SemanticVad,
    ServerVad,
    ToolChoiceFunction,
    Transcription,
    check_tool_choice,
)
from realtime.protocols.oai_realtime.wire import new_id
from sessions.engine import Pipeline, StageEngine, StreamingStageEngine
from sessions.errors import SessionError, TickSupersededError
from sessions.executor import StageExecutor
from sessions.lifecycle import ReleaseReason
from sessions.session import SessionStatus
from sessions.tick import TickChunk

log = logging.getLogger("realtime.kinds.voice")

PATH = "/v1/realtime"
LARGE_FRAME_CHARS = 1 << 20  # frames above this are parsed on a worker thread (base64 of big appends)
AUDIO_QUEUE_ITEMS = 64  # appends waiting for the VAD; the reader waits beyond this (backpressure)
VAD_RATE = 16_000
FRAME_MS = 32
_TERMINAL = ("close", "disconnect", "idle", "lifetime", "evicted", "shutdown")
# semantic_vad is served as server VAD whose end-of-turn silence follows ``eagerness``: OpenAI's
# "`low` will wait longer for the user to continue speaking, `high` will respond more quickly.
# `auto` is the default and is equivalent to `medium`" (its max timeouts 8 s / 4 s / 2 s bound
# the wait of a semantic model; these silences sit well inside them).
SEMANTIC_VAD_SILENCE_MS = {"low": 800, "medium": 500, "auto": 500, "high": 250}
SEMANTIC_VAD = ServerVad()  # threshold and prefix padding of the semantic_vad mapping
TTFA_BUCKETS = (0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0)


def voice_input(snapshot: Any) -> Any:
    """The tick's input: the response's ``ChatRequest`` (the tick payload)."""
    return snapshot.payload


class _VoiceLifecycle:
    """The session's one release path over the response pipeline and the VAD and ASR engines.

    A reset or a failed tick releases only the pipeline (the LLM's KV); the audio engines keep
    the session until it ends, so input audio keeps flowing.
    """

    def __init__(self, pipeline: Pipeline, audio: Sequence[StageEngine]) -> None:
        self.pipeline = pipeline
        self.audio = audio

    async def release(self, session_id: str, reason: ReleaseReason) -> None:
        await self.pipeline.release(session_id, reason)
        if reason in _TERMINAL:
            for engine in self.audio:
                await engine.release(session_id, reason)


class VoiceService(KindServiceBase):
    """The ``voice`` session kind (``realtime.kinds.base.SessionKindService``)."""

    name = "voice"

    def __init__(self, ctx: ServerContext) -> None:
        super().__init__(ctx)
        self.config = ctx.config.voice
        self.models_loaded: dict[str, Any] = {}
        self.llm: Any = None  # the LlmStage (tests read its usage)
        self.vad_engine: StageEngine | None = None
        self.asr_engine: StageEngine | None = None
        self.pipeline: Pipeline | None = None
        self.default_instructions = ""
        self.asr_speculations = 0  # transcriptions started at a candidate end of speech (tests, bench)
        self.asr_speculations_used = 0  # ... and reused by the stop that followed
        self.ttfa = Histogram(
            "voice_time_to_first_audio_seconds",
            "committed user turn (speech_stopped or input_audio_buffer.commit) -> its answer's first audio delta",
            buckets=TTFA_BUCKETS,
            registry=ctx.registry,
        )

    def routes(self) -> list[BaseRoute]:
        return [WebSocketRoute(PATH, self._endpoint)]

    def models(self) -> list[ServedModel]:
        c = self.config
        details = {"asr": "whisper-base", "tts": "hibari", "vad": "silero-vad", "chunked_tts": c.chunked_tts}
        return [ServedModel(c.served_model, self.name, (PATH,), details)]

    def load(self, progress: ProgressFn) -> None:
        import torch

        from models.voice.asr import WhisperAsr
        from models.voice.llm import DEFAULT_SYSTEM_PROMPT
        from models.voice.tts import HibariTts
        from models.voice.vad import SileroVad

        c = self.config
        if c.torch_threads:
            torch.set_num_threads(c.torch_threads)
        steps = (
            ("vad", SileroVad),
            ("asr", WhisperAsr),
            ("llm", lambda: load_chat(c)),  # voice.llm_backend: transformers | vllm
            ("tts", HibariTts),
        )
        for i, (name, build) in enumerate(steps):
            progress(name, i, len(steps))
            self.models_loaded[name] = build()
        progress("ready", len(steps), len(steps))
        self.default_instructions = c.instructions or DEFAULT_SYSTEM_PROMPT

    async def start(self) -> None:
        from models.voice.stages import AsrStage, TtsStage, VadStage

        c, registry, m = self.config, self.ctx.registry, self.models_loaded
        self.llm = llm_stage(c, m["llm"])
        vad = VadStage(m["vad"], c.max_sessions)
        plan = capacity_plan(
            self.ctx.config.runtime, stage_declaration(self.llm, vad, max_sessions=c.max_sessions)
        )
        common = {"registry": registry, "max_sessions": plan.capacity, "stall_timeout_s": c.stall_timeout_s}
        self.vad_engine = StageEngine(
            vad, max_batch=c.max_batch, coalesce_window_s=c.vad_coalesce_window_s, **common
        )
        self.asr_engine = StageEngine(
            AsrStage(m["asr"]), max_batch=c.max_batch, coalesce_window_s=c.asr_coalesce_window_s, **common
        )
        self.runner = self.pipeline = Pipeline(
            [
                StreamingStageEngine(self.llm, **common),
                StageEngine(
                    TtsStage(m["tts"]),
                    max_batch=c.max_batch,
                    coalesce_window_s=c.tts_coalesce_window_s,
                    **common,
                ),
            ],
            registry=registry,
        )
        self.manager = build_session_manager(
            self.name,
            ctx=self.ctx,
            kind_config=c,
            plan=plan,
            executor=StageExecutor(self.pipeline, voice_input),
            lifecycle=_VoiceLifecycle(self.pipeline, (self.vad_engine, self.asr_engine)),
        )
        await self.manager.start()

    async def stop(self) -> None:
        await super().stop()  # the manager, then the response pipeline (``self.runner``)
        for engine in (self.vad_engine, self.asr_engine):
            if engine is not None:
                await engine.close()
        if self.llm is not None:
            self.llm.close()

    def session_defaults(self, handshake: Handshake) -> SessionConfig:
        """A new session's config (also what an explicit ``null`` restores)."""
        c = self.config
        return SessionConfig(
            model=handshake.display_model(c.served_model),
            instructions=self.default_instructions,
            voice=c.voice,
            transcription=Transcription(model="whisper-base") if c.transcription else None,
        )

    async def _endpoint(self, websocket: WebSocket) -> None:
        assert self.manager is not None
        handshake = negotiate(
            websocket.scope.get("query_string", b""),
            websocket.headers,
            websocket.scope.get("subprotocols", ()),
        )
        await self.serve(
            websocket,
            _VoiceHandler(self, handshake),
            subprotocol=handshake.subprotocol,
            headers=handshake.accept_headers(self.config.served_model),
        )


# ------------------------------------------------------------------------ runner mailbox items


@dataclass(frozen=True)
class _Audio:
    """What the pump hands the VAD: one append's samples at the wire rate."""

    samples: np.ndarray = field(repr=False)
    sample_rate: int


@dataclass(frozen=True)
class _Marker:
    """A command that must apply after the appends sent before it (commit, clear, response
    create/cancel): it passes through the pump, behind them."""

    command: ce.AudioCommit | ce.AudioClear | ce.ResponseCreate | ce.ResponseCancel


@dataclass(frozen=True)
class _Frames:
    frames: np.ndarray = field(repr=False)
    probabilities: np.ndarray = field(repr=False)


@dataclass(frozen=True)
class _Transcribed:
    item_id: str
    transcript: Any  # models.voice.asr.Transcript
    error: BaseException | None


@dataclass(frozen=True)
class _Expiring:
    seconds_left: float


@dataclass(frozen=True)
class _TaskFailed:
    error: BaseException


@dataclass(eq=False)
class _Response:
    """The active response; ``cancel_reason`` set once it was cancelled (a second cancel is refused).

    ``item_id`` is its assistant message ("" when a forced tool call makes the response only a
    function call); ``after_id`` the conversation item its output follows.
    """

    state: ev.ResponseState
    item_id: str = ""
    started: bool = False
    cancel_reason: str | None = None
    after_id: str | None = None
    turn_committed_at: float | None = None  # monotonic time of the commit it answers (time to first audio)

    @property
    def ref(self) -> ev.PartRef:
        return ev.PartRef(self.state.id, self.item_id)

    @property
    def in_conversation(self) -> bool:
        return self.state.settings.conversation != "none"


@dataclass(frozen=True)
class _Finished:
    response: _Response
    text: str
    audio: bytes  # kept for conversation.item.retrieved, up to MAX_RETRIEVED_AUDIO_BYTES
    audio_ms: int
    usage: Any  # models.voice.llm.ChatUsage | None
    error: BaseException | None
    calls: tuple[FunctionCall, ...] = ()  # in output order; "in_progress" ones were cut short


class _CallEvents:
    """One response's function calls as the model makes them: its call events
    (``models.voice.tool_calls``) in, the server events out. Owned by the response's child task;
    the runner puts the calls in the conversation when the response finishes (``items``)."""

    def __init__(self, r: _Response) -> None:
        self.r = r
        self.first_index = 1 if r.item_id else 0  # the assistant message, when there is one, is 0
        self._calls: dict[int, FunctionCall] = {}
        self._previous: dict[int, str | None] = {}
        self._last = r.after_id

    def events(self, calls: Sequence[Any]) -> list[ev.ServerEvent]:
        from models.voice.tool_calls import CallArguments, CallStarted

        out: list[ev.ServerEvent] = []
        rid, in_conversation = self.r.state.id, self.r.in_conversation
        for c in calls:
            index = self.first_index + c.index
            if isinstance(c, CallStarted):
                call = FunctionCall(new_id("item"), new_id("call"), c.name, "", "in_progress")
                self._calls[c.index], self._previous[c.index] = call, self._last
                out.append(ev.OutputItemAdded(rid, index, call))
                if in_conversation:
                    out.append(ev.ItemAdded(call, self._last))
                    self._last = call.id
            elif isinstance(c, CallArguments):
                call = self._calls[c.index]
                out.append(ev.FunctionArgumentsDelta(rid, call.id, index, call.call_id, c.delta))
            else:
                call = replace(self._calls[c.index], arguments=c.arguments, status="completed")
                self._calls[c.index] = call
                out += [
                    ev.FunctionArgumentsDone(rid, call.id, index, call.call_id, call.name, call.arguments),
                    ev.OutputItemDone(rid, index, call),
                ]
                if in_conversation:
                    out.append(ev.ItemDone(call, self._previous[c.index]))
        return out

    def items(self) -> tuple[FunctionCall, ...]:
        return tuple(self._calls[i] for i in sorted(self._calls))


_INTERNAL = (_Marker, _Frames, _Transcribed, _Finished, _Expiring, _TaskFailed)  # items the kind posts itself

# ----------------------------------------------------------------------------------- encoding


def _decode_audio(data: bytes, fmt: AudioFormat) -> np.ndarray:
    from models.voice.audio import alaw_to_float, pcm16_to_float, ulaw_to_float

    if fmt is AudioFormat.PCM16:
        return pcm16_to_float(data[: len(data) // 2 * 2])
    return (ulaw_to_float if fmt is AudioFormat.G711_ULAW else alaw_to_float)(data)


def _encode_audio(samples: np.ndarray, fmt: AudioFormat) -> bytes:
    from models.voice.audio import float_to_alaw, float_to_pcm16, float_to_ulaw

    if fmt is AudioFormat.PCM16:
        return float_to_pcm16(samples)
    return (float_to_ulaw if fmt is AudioFormat.G711_ULAW else float_to_alaw)(samples)


def _wire_to_16k(data: bytes, fmt: AudioFormat) -> np.ndarray:
    return soxr.resample(_decode_audio(data, fmt), fmt.sample_rate, VAD_RATE).astype(np.float32)


def _too_big(part: Any) -> bool:
    """Audio that ``conversation.item.retrieved`` would leave out anyway (see ``MAX_RETRIEVED_AUDIO_BYTES``)."""
    return isinstance(part, InputAudio) and len(part.audio or b"") > ev.MAX_RETRIEVED_AUDIO_BYTES


# ------------------------------------------------------------------------------------ handler


class _VoiceHandler:
    """One ``/v1/realtime`` connection (``KindHandler``): every attribute is the runner's alone."""

    inline = False

    def __init__(self, service: VoiceService, handshake: Handshake) -> None:
        self.service = service
        self.vc = service.config
        self.handshake = handshake
        defaults = service.session_defaults(handshake)
        self.codec = RealtimeCodec(handshake.dialect, defaults, CodecOptions(semantic_vad=True))
        self.config = defaults
        self.session_id = new_id("sess")
        self.conversation_id = new_id("conv")
        self.expires_at = int(time.time() + self.vc.max_lifetime_s) if self.vc.max_lifetime_s > 0 else 0
        self.items = Conversation(self.vc.max_conversation_items)
        self.audio_queue: asyncio.Queue = asyncio.Queue(AUDIO_QUEUE_ITEMS)
        max_frames = int(self.vc.max_input_buffer_s * 1000 / FRAME_MS)
        self.buffer: collections.deque[np.ndarray] = collections.deque(maxlen=max_frames)  # 16 kHz frames
        self.turn = self._turn_detector(self.config)
        self.speech_item_id: str | None = None
        self.pending_transcripts: set[str] = set()
        self.response: _Response | None = None
        self.queued_response: ResponseSettings | None = None  # server VAD's, after a barge-in
        self.last_response_id = ""
        self.committed_at: float | None = None  # the last commit not answered yet
        self.speculation: tuple[int, asyncio.Future] | None = None  # (pause id, its ASR) at a candidate stop

    # -- KindHandler ----------------------------------------------------------------------
    async def opened(self, conn: Connection) -> None:
        try:
            session = await conn.create_session()
            for engine in (self.service.vad_engine, self.service.asr_engine):
                assert engine is not None
                await engine.open(session.session_id)
        except SessionError as exc:
            await self._error(conn, Rejected(exc.code, exc.message, type=errors.SERVER_ERROR))
            conn.end("capacity", exc.message)
            return
        session.on_lifetime_warning = lambda left: conn.post(_Expiring(left))
        await self._send(
            conn,
            ev.SessionCreated(self.session_id, self.expires_at, self.config),
            ev.ConversationCreated(self.conversation_id),
        )
        conn.spawn(self._pump(conn), lambda result, error: _TaskFailed(error) if error else None)

    async def decode(self, message: str | bytes) -> ce.Command:
        if isinstance(message, bytes):
            return self.codec.receive_bytes(message)
        if len(message) > LARGE_FRAME_CHARS:
            return await asyncio.to_thread(self.codec.receive_text, message)
        return self.codec.receive_text(message)

    async def session_ended(self, conn: Connection, reason: str) -> Close:
        if reason == "lifetime":
            await self._error(conn, errors.session_expired(max(1, round(self.vc.max_lifetime_s / 60))))
        return runtime_close(reason)

    async def handle(self, conn: Connection, item: Any) -> None:
        session = conn.session
        assert session is not None
        if item is None:
            return
        handler = self._HANDLERS.get(type(item))
        if handler is None:
            raise TypeError(f"unexpected mailbox item {type(item).__name__}")
        if not isinstance(item, _INTERNAL):  # a client's command: the session is active
            session.touch()
        await handler(self, conn, item)

    # -- client events --------------------------------------------------------------------
    async def _on_rejected(self, conn: Connection, item: Rejected) -> None:
        await self._error(conn, item)

    async def _on_session_update(self, conn: Connection, item: ce.SessionUpdate) -> None:
        previous, self.config = self.config, item.config
        if previous.turn_detection != self.config.turn_detection:
            self.turn = self._turn_detector(self.config)
            self.speech_item_id = None
            self.speculation = None  # its pause ids were the old detector's
        await self._send(conn, ev.SessionUpdated(self.session_id, self.expires_at, self.config))

    async def _on_append(self, conn: Connection, item: ce.AudioAppend) -> None:
        fmt = self.config.input_format
        await self.audio_queue.put(_Audio(_decode_audio(item.audio, fmt), fmt.sample_rate))

    async def _on_ordered(self, conn: Connection, item: Any) -> None:
        await self.audio_queue.put(_Marker(item))

    async def _on_marker(self, conn: Connection, item: _Marker) -> None:
        """An ordered command, now that every append before it went through the VAD."""
        if isinstance(item.command, ce.ResponseCreate):
            await self._create_response(
                conn, item.command.options.resolve(self.config), item.command.event_id
            )
            return
        if isinstance(item.command, ce.ResponseCancel):
            await self._on_response_cancel(conn, item.command)
            return
        if isinstance(item.command, ce.AudioClear):
            self._reset_input()
            await self._send(conn, ev.AudioCleared())
            return
        buffered_ms = len(self.buffer) * FRAME_MS
        if buffered_ms < max(self.vc.min_commit_ms, 1):
            await self._error(
                conn, errors.commit_empty(buffered_ms, self.vc.min_commit_ms), item.command.event_id
            )
            return
        audio = np.concatenate(self.buffer)
        item_id = self.speech_item_id or new_id("item")
        self._reset_input()
        await self._commit(conn, item_id, audio)

    async def _on_frames(self, conn: Connection, item: _Frames) -> None:
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
                if (
                    td.interrupt_response
                    and self.response is not None
                    and self.response.cancel_reason is None
                ):
                    await self._cancel(conn, "turn_detected")
            elif isinstance(decision, SpeechStopped):
                item_id = self.speech_item_id or new_id("item")
                self.speech_item_id = None
                self.buffer.clear()
                speculation, self.speculation = self.speculation, None
                early = speculation[1] if speculation and speculation[0] == decision.pause_id else None
                await self._send(conn, ev.SpeechStopped(item_id, decision.audio_end_ms))
                await self._commit(conn, item_id, decision.audio, early)
                if not td.create_response:
                    continue
                settings = ResponseSettings.of_session(self.config)
                if self.response is not None and self.response.cancel_reason is not None:
                    self.queued_response = settings  # the barged-in response is still closing
                else:
                    await self._create_response(conn, settings, None)

    async def _on_item_create(self, conn: Connection, item: ce.ItemCreate) -> None:
        new = item.item
        if new.id in self.items:
            await self._error(conn, errors.item_id_in_use(new.id), item.event_id)
            return
        previous = item.previous_item_id
        if previous not in (None, "root") and previous not in self.items:
            await self._error(conn, errors.item_not_found(previous, "previous_item_id"), item.event_id)
            return
        content = new.content if isinstance(new, Message) else ()
        audio = [p.audio for p in content if isinstance(p, InputAudio) and p.audio and p.transcript is None]
        if isinstance(new, Message) and any(_too_big(p) for p in new.content):
            # kept only while it fits a retrieve frame: the conversation's memory stays bounded
            new = replace(
                new, content=tuple(replace(p, audio=None) if _too_big(p) else p for p in new.content)
            )
        previous = self.items.insert(new, previous)
        await self._send(conn, ev.ItemAdded(new, previous), ev.ItemDone(new, previous))
        if audio:  # a client's audio enters the prompt through its transcript, as committed audio does
            self._transcribe(conn, new.id, b"".join(audio), self.config.input_format)

    async def _on_item_delete(self, conn: Connection, item: ce.ItemDelete) -> None:
        if not self.items.delete(item.item_id):
            await self._error(conn, errors.item_not_found(item.item_id), item.event_id)
            return
        await self._send(conn, ev.ItemDeleted(item.item_id))

    async def _on_item_retrieve(self, conn: Connection, item: ce.ItemRetrieve) -> None:
        entry = self.items.get(item.item_id)
        if entry is None:
            await self._error(conn, errors.item_not_found(item.item_id), item.event_id)
            return
        await self._send(conn, ev.ItemRetrieved(entry.item))

    async def _on_item_truncate(self, conn: Connection, item: ce.ItemTruncate) -> None:
        entry = self.items.get(item.item_id)
        if entry is None:
            await self._error(conn, errors.item_not_found(item.item_id), item.event_id)
            return
        message = entry.item
        if (
            not isinstance(message, Message)
            or message.role != "assistant"
            or item.content_index >= len(message.content)
            or not isinstance(message.content[item.content_index], OutputAudio)
        ):
            await self._error(conn, errors.truncate_not_assistant_audio(), item.event_id)
            return
        if item.audio_end_ms > entry.audio_ms:
            await self._error(
                conn, errors.truncate_beyond_audio(entry.audio_ms, item.audio_end_ms), item.event_id
            )
            return
        part = message.content[item.content_index]
        assert isinstance(part, OutputAudio)
        kept = None
        if part.audio is not None:
            rate = self.config.output_format.sample_rate * self.config.output_format.bytes_per_sample
            kept = part.audio[: rate * item.audio_end_ms // 1000]
        # OpenAI drops the transcript too: the model must not "remember" words the user never heard
        content = list(message.content)
        content[item.content_index] = OutputAudio("", kept)
        entry.item = replace(message, content=tuple(content))
        entry.audio_ms = item.audio_end_ms
        await self._send(conn, ev.ItemTruncated(item.item_id, item.content_index, item.audio_end_ms))

    async def _on_response_cancel(self, conn: Connection, item: ce.ResponseCancel) -> None:
        r = self.response
        if r is None or r.cancel_reason is not None or item.response_id not in (None, r.state.id):
            await self._error(conn, errors.cancel_not_active(), item.event_id)
            return
        await self._cancel(conn, "client_cancelled")

    async def _on_output_audio_clear(self, conn: Connection, item: ce.OutputAudioClear) -> None:
        response_id = self.response.state.id if self.response is not None else self.last_response_id
        if self.response is not None and self.response.cancel_reason is None:
            await self._cancel(conn, "client_cancelled")
        await self._send(conn, ev.OutputAudioCleared(response_id))

    # -- internal items -------------------------------------------------------------------
    async def _on_transcribed(self, conn: Connection, item: _Transcribed) -> None:
        self.pending_transcripts.discard(item.item_id)
        entry = self.items.get(item.item_id)
        if entry is not None and isinstance(entry.item, Message):
            text = "" if item.error is not None else item.transcript.text
            parts = tuple(
                replace(p, transcript=text) if isinstance(p, InputAudio) else p for p in entry.item.content
            )
            entry.item = replace(entry.item, content=parts)
        if self.config.transcription is not None:
            if item.error is not None:
                log.warning("transcription failed: %r", item.error)
                failure = Rejected(
                    "transcription_failed", "Input audio transcription failed.", type=errors.SERVER_ERROR
                )
                await self._send(conn, ev.TranscriptionFailed(item.item_id, 0, failure))
            else:
                usage = ev.DurationUsage(round(item.transcript.audio_seconds, 3))
                await self._send(
                    conn, ev.TranscriptionCompleted(item.item_id, 0, item.transcript.text, usage)
                )
        if self.response is not None and not self.response.started and not self.pending_transcripts:
            await self._begin(conn, self.response)

    async def _on_finished(self, conn: Connection, item: _Finished) -> None:
        r = item.response
        settings = r.state.settings
        status, reason, error = "completed", None, None
        if r.cancel_reason is not None:
            status, reason = "cancelled", r.cancel_reason
        elif item.error is not None:
            status = "failed"
            code = getattr(item.error, "code", "server_error")
            error = Rejected(str(code), "The response failed in the model.", type=errors.SERVER_ERROR)
        elif item.usage is not None and item.usage.generated_tokens >= self._max_tokens(settings):
            status, reason = "incomplete", "max_output_tokens"
        output: list[Item] = []
        closing: list[ev.ServerEvent] = []
        if r.item_id:
            final = self._close_message(r, item, status, closing)
            output.append(final)
        output += self._close_calls(r, item.calls, closing)
        state = replace(
            r.state,
            status=status,
            reason=reason,
            error=error,
            output=tuple(output),
            usage=self._usage(item.usage),
        )
        closing += [ev.ResponseDone(state), self._rate_limits()]
        await self._send(conn, *closing)
        if item.audio_ms > 0:
            self.codec.lock_voice()
        self.response = None
        session = conn.session
        assert session is not None
        if status == "failed" and session.status is SessionStatus.FAILED:
            await session.reset()  # a failed tick released the KV; start the conversation's KV over
        if self.queued_response is not None:
            settings, self.queued_response = self.queued_response, None
            await self._create_response(conn, settings, None)

    def _close_message(
        self, r: _Response, item: _Finished, status: str, closing: list[ev.ServerEvent]
    ) -> Message:
        """The assistant message's closing events (appended to ``closing``); its final item."""
        settings = r.state.settings
        part: OutputAudio | OutputText = (
            OutputAudio(item.text, item.audio or None) if settings.audio_output else OutputText(item.text)
        )
        final = Message(
            r.item_id, "assistant", (part,), "completed" if status == "completed" else "incomplete"
        )
        previous = self.items.previous_of(r.item_id) if r.in_conversation else None
        entry = self.items.get(r.item_id)
        if entry is not None:
            entry.item, entry.audio_ms = final, item.audio_ms
        ref = r.ref
        if settings.audio_output:
            closing += [ev.AudioDone(ref), ev.TranscriptDone(ref, item.text)]
        else:
            closing.append(ev.TextDone(ref, item.text))
        closing += [
            ev.ContentPartDone(ref, OutputAudio(item.text) if settings.audio_output else part),
            ev.OutputItemDone(r.state.id, 0, final),
        ]
        if r.in_conversation:
            closing.append(ev.ItemDone(final, previous))
        return final

    def _close_calls(
        self, r: _Response, calls: tuple[FunctionCall, ...], closing: list[ev.ServerEvent]
    ) -> list[FunctionCall]:
        """The response's function calls enter the conversation after its message (or after the
        item the response followed); a call cut short (cancel, token cap) is closed incomplete."""
        first = 1 if r.item_id else 0
        previous = r.after_id if r.after_id in self.items else None
        out = []
        for index, call in enumerate(calls, start=first):
            if call.status == "in_progress":
                call = replace(call, status="incomplete")
                closing.append(ev.OutputItemDone(r.state.id, index, call))
                if r.in_conversation:
                    closing.append(ev.ItemDone(call, previous))
            if r.in_conversation:
                self.items.insert(call, previous)
                previous = call.id
            out.append(call)
        return out

    async def _on_expiring(self, conn: Connection, item: _Expiring) -> None:
        minutes = max(1, round(self.vc.max_lifetime_s / 60))
        warning = Rejected(
            "session_expiring",
            f"Your session will hit the maximum duration of {minutes} minutes in {item.seconds_left:.0f} seconds.",
        )
        await self._error(conn, warning)

    async def _on_task_failed(self, conn: Connection, item: _TaskFailed) -> None:
        raise item.error  # a bug or a closed engine: the skeleton logs it and closes 1011

    _HANDLERS: dict[type, Any] = {
        Rejected: _on_rejected,
        ce.SessionUpdate: _on_session_update,
        ce.AudioAppend: _on_append,
        ce.AudioCommit: _on_ordered,
        ce.AudioClear: _on_ordered,
        ce.ItemCreate: _on_item_create,
        ce.ItemDelete: _on_item_delete,
        ce.ItemRetrieve: _on_item_retrieve,
        ce.ItemTruncate: _on_item_truncate,
        ce.ResponseCreate: _on_ordered,
        ce.ResponseCancel: _on_ordered,
        ce.OutputAudioClear: _on_output_audio_clear,
        _Marker: _on_marker,
        _Frames: _on_frames,
        _Transcribed: _on_transcribed,
        _Finished: _on_finished,
        _Expiring: _on_expiring,
        _TaskFailed: _on_task_failed,
    }

    # -- input audio ----------------------------------------------------------------------
    async def _pump(self, conn: Connection) -> None:
        """Child task: appends through the VAD engine in order; markers pass through in order."""
        from models.voice.stages import VadInput

        engine = self.service.vad_engine
        assert engine is not None and conn.session is not None
        session_id = conn.session.session_id
        while True:
            entry = await self.audio_queue.get()
            if isinstance(entry, _Marker):
                conn.post(entry)
                continue
            out = await engine.submit(session_id, 0, VadInput(entry.samples, entry.sample_rate))
            if len(out.frames):
                conn.post(_Frames(out.frames, out.probabilities))

    def _turn_detector(self, config: SessionConfig) -> Any:
        from models.voice.vad import ServerVadConfig, TurnDetector

        td = config.turn_detection
        if td is None:
            return None
        if isinstance(td, SemanticVad):
            td = replace(SEMANTIC_VAD, silence_duration_ms=SEMANTIC_VAD_SILENCE_MS[td.eagerness])
        return TurnDetector(
            ServerVadConfig(
                td.threshold,
                td.prefix_padding_ms,
                td.silence_duration_ms,
                int(self.vc.max_input_buffer_s * 1000),
            ),
            speculate_ms=self.vc.asr_speculate_ms,
        )

    def _reset_input(self) -> None:
        self.buffer.clear()
        self.speech_item_id = None
        self.speculation = None
        if self.turn is not None:
            self.turn.reset()

    def _speculate(self, conn: Connection, pause: Any) -> None:
        """Transcribe the utterance at a candidate end of speech (``SpeechPaused``), so the ASR
        runs during the end-of-turn silence; the stop reuses it if no speech came since. At most
        one speculation per connection is in flight (a later pause waits for none: it is skipped)."""
        if self.speculation is not None and not self.speculation[1].done():
            return
        engine = self.service.asr_engine
        assert engine is not None and conn.session is not None
        try:
            future = engine.submit(conn.session.session_id, 0, pause.audio)
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
        user = Message(item_id, "user", (InputAudio(None, None),))
        previous = self.items.insert(user, None)
        await self._send(
            conn,
            ev.AudioCommitted(item_id, previous),
            ev.ItemAdded(user, previous),
            ev.ItemDone(user, previous),
        )
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
        engine = self.service.asr_engine
        assert engine is not None and conn.session is not None
        session_id = conn.session.session_id
        self.pending_transcripts.add(item_id)

        async def asr() -> Any:
            samples = audio if fmt is None else await asyncio.to_thread(_wire_to_16k, audio, fmt)
            if early is not None:
                with contextlib.suppress(Exception):  # it failed: transcribe the utterance itself
                    transcript = await early
                    self.service.asr_speculations_used += 1
                    return replace(transcript, audio_seconds=len(samples) / VAD_RATE)
            return await engine.submit(session_id, 0, samples)

        conn.spawn(asr(), lambda result, error: _Transcribed(item_id, result, error))

    # -- responses ------------------------------------------------------------------------
    async def _create_response(
        self, conn: Connection, settings: ResponseSettings, event_id: str | None
    ) -> None:
        if self.response is not None:
            await self._error(conn, errors.active_response(self.response.state.id), event_id)
            return
        missing = [
            i.id for i in settings.input or () if isinstance(i, ItemReference) and i.id not in self.items
        ]
        if missing:
            await self._error(conn, errors.item_not_found(missing[0], "response.input"), event_id)
            return
        try:
            check_tool_choice(settings.tools, settings.tool_choice, "response.tool_choice")
        except ParamError as exc:
            await self._error(conn, exc.rejected, event_id)
            return
        conversation = self.conversation_id if settings.conversation != "none" else None
        response = _Response(ev.ResponseState(new_id("resp"), settings, conversation_id=conversation))
        response.turn_committed_at, self.committed_at = self.committed_at, None
        self.response = response
        self.last_response_id = response.state.id
        await self._send(conn, ev.ResponseCreated(response.state))
        if not self.pending_transcripts:
            await self._begin(conn, response)

    async def _begin(self, conn: Connection, r: _Response) -> None:
        """Announce the assistant item and start the streaming tick (a child task). A forced
        tool call (``tool_choice`` ``"required"`` or a function) has no assistant message: its
        function call items are announced as the model makes them."""
        from models.voice.pacing import PlaybackClock
        from models.voice.stages import ChatRequest
        from models.voice.tool_calls import ToolSpec

        settings = r.state.settings
        r.started = True
        specs = tuple(ToolSpec(t.name, t.description, t.parameters) for t in settings.tools)
        choice = settings.tool_choice
        forced = tuple(
            t
            for t in specs
            if choice == "required" or (isinstance(choice, ToolChoiceFunction) and t.name == choice.name)
        )
        messages = self.items.prompt(
            settings.instructions or self.service.default_instructions, settings.input
        )
        r.after_id = self.items.last_id() if r.in_conversation else None
        if not forced:
            r.item_id = new_id("item")
            opening = Message(r.item_id, "assistant", (), "in_progress")
            part = OutputAudio("") if settings.audio_output else OutputText("")
            events: list[ev.ServerEvent] = [ev.OutputItemAdded(r.state.id, 0, opening)]
            if r.in_conversation:
                previous = self.items.insert(opening, None)
                events.append(ev.ItemAdded(opening, previous))
                r.after_id = r.item_id
            events.append(ev.ContentPartAdded(r.ref, part))
            await self._send(conn, *events)
        fmt = settings.output_format
        request = ChatRequest(
            messages,
            max_new_tokens=self._max_tokens(settings),
            temperature=0.0 if forced else self.vc.temperature,  # a forced call is greedy: deterministic
            speak=settings.audio_output and not forced,
            speed=self.config.speed,
            sample_rate=fmt.sample_rate,
            # answering a tool's output, the model gets no tools (unless forced): small models
            # echo the output or call the tool again when the listing is still in the prompt
            tools=() if choice == "none" or (not forced and messages[-1].role == "tool") else specs,
            forced_tools=forced,
            playback=PlaybackClock(),  # _generate records the audio it sends; the LLM paces on it
        )
        session = conn.session
        assert session is not None
        ticks = session.stream_tick(request)  # requested now: a cancel from here on supersedes it
        conn.spawn(
            self._generate(conn, r, request, ticks),
            lambda result, error: result or _Finished(r, "", b"", 0, None, error),
        )

    async def _generate(
        self, conn: Connection, r: _Response, request: Any, ticks: AsyncIterator[TickChunk]
    ) -> _Finished:
        """Child task: the response's streaming tick; every chunk's deltas go out as it arrives."""
        session = conn.session
        assert session is not None
        fmt = r.state.settings.output_format
        delta_bytes = fmt.sample_rate * self.vc.audio_delta_ms // 1000 * fmt.bytes_per_sample
        text: list[str] = []
        kept = bytearray()
        audio_bytes, usage = 0, None
        audio_output = r.state.settings.audio_output
        ref = r.ref
        calls = _CallEvents(r)

        def finished(error: BaseException | None) -> _Finished:
            ms = audio_bytes * 1000 // (fmt.sample_rate * fmt.bytes_per_sample)
            return _Finished(r, "".join(text), bytes(kept), ms, usage, error, calls.items())

        try:
            async for chunk in ticks:
                speech = chunk.value
                frames: list[ev.ServerEvent] = []
                if speech.text:
                    text.append(speech.text)
                    frames.append(
                        ev.TranscriptDelta(ref, speech.text)
                        if audio_output
                        else ev.TextDelta(ref, speech.text)
                    )
                if speech.audio.size:
                    if r.turn_committed_at is not None and audio_bytes == 0:
                        self.service.ttfa.observe(time.monotonic() - r.turn_committed_at)
                    data = _encode_audio(speech.audio, fmt)
                    audio_bytes += len(data)
                    room = ev.MAX_RETRIEVED_AUDIO_BYTES - len(kept)
                    kept += data[: max(room, 0)]
                    for start in range(0, len(data), delta_bytes):
                        frames.append(ev.AudioDelta(ref, data[start : start + delta_bytes]))
                frames += calls.events(speech.calls)
                if speech.usage is not None:
                    usage = speech.usage
                if frames:
                    await conn.send(*self._render(frames), epoch=chunk.epoch)
                if (speech.audio.size or speech.voiced_chars) and request.playback is not None:
                    request.playback.sent(speech.audio.size / fmt.sample_rate, speech.voiced_chars)
        except TickSupersededError:
            return finished(None)  # cancelled: the runner knows why
        except SessionError as exc:
            return finished(exc)
        return finished(None)

    async def _cancel(self, conn: Connection, reason: str) -> None:
        r = self.response
        assert r is not None
        r.cancel_reason = reason
        if not r.started:  # still waiting for a transcript: nothing was announced
            self.response = None
            state = replace(r.state, status="cancelled", reason=reason)
            await self._send(conn, ev.ResponseDone(state))
            return
        session = conn.session
        assert session is not None
        session.interrupt()  # the one call: the tick is superseded, its queued deltas never sent

    def _max_tokens(self, settings: ResponseSettings) -> int:
        cap = self.vc.max_output_tokens
        return cap if settings.max_output_tokens is None else min(cap, settings.max_output_tokens)

    @staticmethod
    def _usage(usage: Any) -> ev.Usage | None:
        if usage is None:
            return None
        return ev.Usage(
            input_text_tokens=usage.prompt_tokens,
            cached_tokens=usage.cached_tokens,
            output_text_tokens=usage.generated_tokens,
        )

    @staticmethod
    def _rate_limits() -> ev.RateLimitsUpdated:
        return ev.RateLimitsUpdated(
            (
                ev.RateLimit("requests", 1_000_000, 1_000_000, 0.0),
                ev.RateLimit("tokens", 1_000_000, 1_000_000, 0.0),
            )
        )

    # -- output ---------------------------------------------------------------------------
    def _render(self, events: Sequence[ev.ServerEvent]) -> list[str]:
        return [frame for e in events if (frame := self.codec.render(e)) is not None]

    async def _send(self, conn: Connection, *events: ev.ServerEvent) -> None:
        frames = self._render(events)
        if frames:
            await conn.send(*frames)

    async def _error(self, conn: Connection, rejected: Rejected, event_id: str | None = None) -> None:
        if event_id is not None and rejected.event_id is None:
            rejected = rejected.with_event_id(event_id)
        await self._send(conn, ev.ErrorEvent(rejected))


def build_voice_service(ctx: ServerContext) -> VoiceService:
    return VoiceService(ctx)
