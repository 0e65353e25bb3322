"""The voice components as runtime stages (``models/stage.py``): VAD, ASR, LLM, TTS.

The voice kind drives them through the session runtime's engines; none of them ever runs on the
event loop:

- :class:`VadStage` (batched, stateful): each slot holds one session's input :class:`Resampler`
  (wire rate -> 16 kHz, ``soxr.ResampleStream``) and :class:`VadStream`. ``forward`` cuts every
  item's audio into 32 ms frames and scores frame ``i`` of every session in one Silero call, so
  one forward serves many sessions. Output: :class:`VadFrames` (the 16 kHz frames and their
  speech probabilities; the turn decisions are the kind's, a pure state machine).
- :class:`AsrStage` (batched, stateless): one utterance per item, ``transcribe_batch`` over the
  batch (either ASR backend, ``models/voice/asr.py``), on the ASR's device.
- :class:`TransformersLlmStage` (streaming, stateful): ``stream(item)`` runs
  ``TransformersChat.generate`` on a worker thread of its own pool and yields
  :class:`TextChunk` s through an asyncio queue; ``abort(request_id)`` sets the generation's
  ``should_stop`` flag. A slot is a conversation: its KV stays resident across turns, opened and
  released with the slot. Clause splitting happens here, so the TTS stage downstream starts on
  the first clause, not the full reply (``chunked=False`` holds every clause back until the
  reply is complete: the benchmark's baseline). Any other LLM backend (vLLM's ``AsyncLLM``) plugs
  in behind the :class:`LlmStage` interface.
- :class:`TtsStage` (batched, stateless): speaks the clauses a chunk carries, in the chunk's
  output rate; text passes through, so the kind receives :class:`SpeechChunk` s in order.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np
import soxr

from models.stage import StageItem
from models.voice.audio import Resampler
from models.voice.llm import ChatMessage, ChatUsage, TransformersChat
from models.voice.pacing import DEFAULT_PACING, PacingPolicy, PlaybackClock, ReplyPace, StepGate
from models.voice.tool_calls import (
    FORCED_PREFIX,
    CallArguments,
    CallDone,
    CallStarted,
    ToolCallExtractor,
    ToolEvent,
    ToolSpec,
    conform_arguments,
    forced_choices,
)
from models.voice.tts import SAMPLE_RATE as TTS_RATE
from models.voice.tts import ClauseSplitter, HibariTts, split_clauses
from models.voice.vad import SAMPLE_RATE as VAD_RATE
from models.voice.vad import SileroVad, VadStream

if TYPE_CHECKING:  # the ASR backends load only where one is built
    from models.voice.asr import ShortWindowAsr, Transcript

# ------------------------------------------------------------------------------------- VAD


@dataclass(frozen=True, slots=True)
class VadInput:
    """Mono float32 audio at ``sample_rate`` (the wire's: 24 kHz pcm16, 8 kHz G.711)."""

    samples: np.ndarray = field(repr=False)
    sample_rate: int


@dataclass(frozen=True, slots=True)
class VadFrames:
    """The complete 16 kHz frames the input completed (``[n, 512]``) and their probabilities."""

    frames: np.ndarray = field(repr=False)
    probabilities: np.ndarray = field(repr=False)


@dataclass(slots=True)
class _VadSlot:
    stream: VadStream
    resampler: Resampler


class VadStage:
    """Silero VAD over many sessions; ``slot_capacity`` sessions, each with its own stream state."""

    name = "voice-vad"
    device = "cpu"

    def __init__(self, model: SileroVad, slot_capacity: int) -> None:
        self.model = model
        self.slot_capacity = slot_capacity
        self._slots: list[_VadSlot | None] = [None] * slot_capacity

    def state_bytes(self) -> int:
        return 4 * (2 * 128 + 64 + 512)  # recurrent state, context and a partial frame (float32)

    def open_state(self, session_id: str, slot: int) -> _VadSlot:
        self._slots[slot] = _VadSlot(self.model.stream(), Resampler(TTS_RATE, VAD_RATE))
        return self._slots[slot]

    def release_state(self, session_id: str, slot: int, state: object) -> None:
        self._slots[slot] = None

    def forward(self, items: Sequence[StageItem]) -> list[VadFrames]:
        slots = [self._slot(item) for item in items]
        checkpoints = [s.stream.checkpoint() for s in slots]
        try:
            frames = [self._frames(s, item.payload) for s, item in zip(slots, items, strict=True)]
            probs = [np.empty(len(f), np.float32) for f in frames]
            for i in range(max((len(f) for f in frames), default=0)):
                batch = [k for k, f in enumerate(frames) if len(f) > i]
                scored = self.model.forward(
                    [slots[k].stream for k in batch], np.stack([frames[k][i] for k in batch])
                )
                for k, p in zip(batch, scored, strict=True):
                    probs[k][i] = p
        except BaseException:
            for s, cp in zip(slots, checkpoints, strict=True):  # the resampler's few samples are lost
                s.stream.restore(cp)
            raise
        return [VadFrames(f, p) for f, p in zip(frames, probs, strict=True)]

    def _slot(self, item: StageItem) -> _VadSlot:
        slot = self._slots[item.slot] if item.slot is not None else None
        if slot is None:
            raise RuntimeError(f"VAD slot {item.slot} of {item.session_id} is not open")
        return slot

    @staticmethod
    def _frames(slot: _VadSlot, payload: VadInput) -> np.ndarray:
        if slot.resampler.in_rate != payload.sample_rate:  # the session changed its input format
            slot.resampler = Resampler(payload.sample_rate, VAD_RATE)
        return slot.stream.take_frames(slot.resampler.push(payload.samples))


# ------------------------------------------------------------------------------------- ASR


class AsrStage:
    """Whisper over a batch of utterances (16 kHz float32 each) -> one :class:`Transcript` each."""

    name = "voice-asr"

    def __init__(self, asr: ShortWindowAsr) -> None:
        self.asr = asr
        self.device = asr.device

    def forward(self, items: Sequence[StageItem]) -> list[Transcript]:
        return self.asr.transcribe_batch([item.payload for item in items])


# ------------------------------------------------------------------------------------- LLM


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """One response's generation: the conversation so far and how to speak the reply.

    ``speak`` False: text only (no clauses for the TTS). ``speed`` and ``sample_rate`` travel
    with every chunk to the TTS stage (the output format's rate: 24000 pcm16, 8000 G.711).
    ``tools`` are offered in the prompt; ``forced_tools`` force one call of one of them: a
    backend ends the prompt with ``prefill`` and constrains the reply to start with one of
    ``choices`` (:class:`ReplyText` does the rest). ``playback`` is the response's playback
    position, kept by the kind as it sends the audio: a backend that paces replies reads it.
    """

    messages: tuple[ChatMessage, ...]
    max_new_tokens: int = 256
    temperature: float = 0.0
    speak: bool = True
    speed: float = 1.0
    sample_rate: int = TTS_RATE
    tools: tuple[ToolSpec, ...] = ()  # listed in the prompt
    forced_tools: tuple[ToolSpec, ...] = ()  # non-empty: the reply is one call of one of these
    playback: PlaybackClock | None = field(default=None, compare=False)  # the reply's audio as played

    @property
    def prefill(self) -> str:
        """What the prompt ends with (the reply continues it): the call opening when forced."""
        return FORCED_PREFIX if self.forced_tools else ""

    @property
    def choices(self) -> tuple[str, ...]:
        """What the reply must start with (constrained decoding): a forced tool's name and head."""
        return forced_choices(self.forced_tools)


@dataclass(frozen=True, slots=True)
class TextChunk:
    """A piece of the reply's speakable ``text``, the clauses it completed and the tool-call
    events it made (``calls``; markup never reaches ``text``); ``usage`` on the last chunk."""

    text: str
    clauses: tuple[str, ...] = ()
    speed: float = 1.0
    sample_rate: int = TTS_RATE
    usage: ChatUsage | None = None
    calls: tuple[ToolEvent, ...] = ()


class LlmStage(Protocol):
    """The LLM seam: a stateful streaming stage whose ``stream(item)`` takes a :class:`ChatRequest`
    and yields :class:`TextChunk` s (the last with ``usage``); one slot = one conversation whose
    KV stays resident across turns. :class:`TransformersLlmStage` is the offline default; a vLLM
    ``AsyncLLM`` stage implements the same members."""

    name: str
    device: str
    slot_capacity: int

    def state_bytes(self) -> int: ...

    def open_state(self, session_id: str, slot: int) -> object: ...

    def release_state(self, session_id: str, slot: int, state: object) -> None: ...

    def stream(self, item: StageItem) -> AsyncIterator[TextChunk]: ...

    def abort(self, request_id: str) -> None: ...

    def last_usage(self, session_id: str) -> ChatUsage:
        """The session's last generation's token counts (cached = reused from resident KV)."""
        ...


class ReplyText:
    """One reply's text path, shared by every :class:`LlmStage`: the backend's incremental
    detokenised pieces in, :class:`TextChunk` s out.

    ``push(piece)`` returns the chunk for one piece with the clauses it completed (none when the
    request does not ``speak`` or ``chunked`` is off); ``finish(usage)`` returns the last chunk
    with the remaining clauses (every clause of the reply when not chunked) and ``usage``. Not
    thread-safe: one reply, one caller.

    Tool calls (``models/voice/tool_calls.py``): the pieces first go through a
    :class:`ToolCallExtractor`, so only speakable text reaches the chunks' ``text`` and clauses,
    and the calls become the chunks' ``calls``. Calls naming a tool the request did not offer
    are dropped. A forced reply (``request.forced_tools``) starts inside the call (the backend
    prefilled :data:`FORCED_PREFIX`); its arguments are conformed to the tool's schema
    (:func:`conform_arguments`) and sent as one delta when the call is done, and ``complete``
    turns True then: the backend should stop generating.
    """

    def __init__(self, request: ChatRequest, *, chunked: bool, first_clause_words: int = 0) -> None:
        self.request = request
        self.chunked = chunked
        self.complete = False
        self._splitter = ClauseSplitter(first_clause_words=first_clause_words)
        self._spoken: list[str] = []
        self._tools = {t.name: t for t in (*request.tools, *request.forced_tools)}
        self._dropped: set[int] = set()
        self._extractor = ToolCallExtractor()
        if request.forced_tools:
            self._extractor.push(request.prefill)

    def push(self, piece: str) -> TextChunk:
        text, events = self._extractor.push(piece)
        return self._chunk(text, self._clauses(text), self._calls(events))

    def finish(self, usage: ChatUsage) -> TextChunk:
        text, events = self._extractor.finish()
        self._spoken.append(text)
        if not self.request.speak:
            rest: list[str] = []
        elif self.chunked:
            rest = self._splitter.push(text) + self._splitter.flush()
        else:
            rest = list(split_clauses(self._spoken))
        return self._chunk(text, rest, self._calls(events), usage)

    def _clauses(self, text: str) -> list[str]:
        self._spoken.append(text)
        return self._splitter.push(text) if self.request.speak and self.chunked and text else []

    def _calls(self, events: list[ToolEvent]) -> tuple[ToolEvent, ...]:
        out: list[ToolEvent] = []
        forced = bool(self.request.forced_tools)
        for event in events:
            if isinstance(event, CallStarted) and event.name not in self._tools:
                self._dropped.add(event.index)
            if event.index in self._dropped or (forced and isinstance(event, CallArguments)):
                continue
            if forced and isinstance(event, CallDone):
                parameters = self._tools[event.name].parameters
                arguments = conform_arguments(event.arguments, parameters)
                out += [CallArguments(event.index, arguments), CallDone(event.index, event.name, arguments)]
                self.complete = True
                continue
            out.append(event)
        return tuple(out)

    def _chunk(
        self,
        text: str,
        clauses: list[str],
        calls: tuple[ToolEvent, ...] = (),
        usage: ChatUsage | None = None,
    ) -> TextChunk:
        request = self.request
        return TextChunk(text, tuple(clauses), request.speed, request.sample_rate, usage, calls)


_END = object()


class TransformersLlmStage:
    """:class:`LlmStage` over :class:`TransformersChat` (see the module docstring).

    Every conversation may hold a generation thread (``slot_capacity`` threads at most); at most
    ``workers`` of them run a model step (one forward) at once, through a :class:`StepGate`:
    replies before their first clause go first, then replies whose playback lead
    (``ChatRequest.playback``) fell below ``pacing.urgent_lead_s``, then the rest; a reply whose
    lead reached ``pacing.max_lead_s`` sleeps (``models/voice/pacing.py``).
    torch's own thread count is the caller's. ``first_clause_words`` > 0 lets a reply's first
    clause end after that many words (``ClauseSplitter``), so speech starts sooner. A new request
    of a session waits until the session's previous generation (aborted, still finishing its
    forward) let go of the conversation.
    """

    name = "voice-llm"
    device = "cpu"

    def __init__(
        self,
        chat: TransformersChat,
        slot_capacity: int,
        *,
        workers: int = 4,
        chunked: bool = True,
        first_clause_words: int = 0,
        pacing: PacingPolicy = DEFAULT_PACING,
    ):
        self.chat = chat
        self.slot_capacity = slot_capacity
        self.chunked = chunked
        self.first_clause_words = first_clause_words
        self.pacing = pacing
        self.gate = StepGate(workers)
        # a paced reply sleeps on its thread: one thread per conversation, so a new turn never queues
        self._pool = ThreadPoolExecutor(
            max_workers=max(workers, slot_capacity), thread_name_prefix="voice-llm"
        )
        self._stops: dict[str, threading.Event] = {}
        self._running: dict[str, Future] = {}  # session -> its generation's thread work
        self.aborts = 0  # generations stopped by abort before they ended (metrics, tests)

    def state_bytes(self) -> int:
        return self.chat.kv_bytes_per_conversation

    def open_state(self, session_id: str, slot: int) -> str:
        self.chat.open(session_id)
        return session_id

    def release_state(self, session_id: str, slot: int, state: object) -> None:
        self.chat.release(session_id)

    def last_usage(self, session_id: str) -> ChatUsage:
        return self.chat.last_usage(session_id)

    def abort(self, request_id: str) -> None:
        stop = self._stops.get(request_id)
        if stop is not None and not stop.is_set():
            stop.set()
            self.aborts += 1

    def close(self) -> None:
        for stop in self._stops.values():
            stop.set()
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def stream(self, item: StageItem) -> AsyncIterator[TextChunk]:
        request: ChatRequest = item.payload
        previous = self._running.get(item.session_id)
        if previous is not None and not previous.done():
            await asyncio.wrap_future(previous)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        stop = threading.Event()
        self._stops[item.request_id] = stop

        def put(value: object) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, value)
            except RuntimeError:  # the loop is gone (shutdown): nobody reads any more
                stop.set()

        work = self._pool.submit(self._generate, item.session_id, request, stop, put)
        self._running[item.session_id] = work
        try:
            while (value := await queue.get()) is not _END:
                if isinstance(value, BaseException):
                    raise value
                yield value
        finally:
            stop.set()
            self._stops.pop(item.request_id, None)

    def _generate(self, session_id: str, request: ChatRequest, stop: threading.Event, put) -> None:
        """The worker thread: every chunk of :meth:`reply_chunks` handed to the loop, then the end."""
        try:
            for chunk in self.reply_chunks(session_id, request, stop):
                put(chunk)
        except BaseException as exc:
            put(exc)
        finally:
            put(_END)

    def reply_chunks(
        self, session_id: str, request: ChatRequest, stop: threading.Event
    ) -> Iterator[TextChunk]:
        """One reply's chunks, generated on the caller's thread: each model step through the gate,
        paced, clauses split. ``stream`` runs it on the stage's pool; a caller without an event
        loop (the duplex cascade's reply workers) iterates it directly. Setting ``stop`` ends it
        at the next step (no final chunk then); one conversation runs one reply at a time."""
        pace = ReplyPace(self.pacing, request.playback if request.speak else None, stop)
        try:
            pieces = self.chat.generate(
                session_id,
                request.messages,
                max_new_tokens=request.max_new_tokens,
                temperature=request.temperature,
                should_stop=stop.is_set,
                tools=request.tools,
                prefill=request.prefill,
                choices=request.choices,
            )
            reply = ReplyText(request, chunked=self.chunked, first_clause_words=self.first_clause_words)
            while True:
                pace.wait(stop)
                with self.gate.step(pace):  # one next() is one forward (the first: the prefill)
                    piece = next(pieces, None)
                if piece is None:
                    break
                chunk = reply.push(piece)
                pace.emitted(chunk.clauses)
                self.gate.update(pace)
                yield chunk
                if reply.complete:
                    pieces.close()  # a forced call is done: nothing after it is wanted
                    break
            if stop.is_set():
                return
            yield reply.finish(self.chat.last_usage(session_id))
        finally:
            self.gate.finish(pace)


# ------------------------------------------------------------------------------------- TTS


@dataclass(frozen=True, slots=True)
class SpeechChunk:
    """What reaches the kind: a piece of the reply's text and the audio of the clauses it
    completed (mono float32 at the request's rate; empty when it completed none)."""

    text: str
    audio: np.ndarray = field(repr=False)
    sample_rate: int = TTS_RATE
    usage: ChatUsage | None = None
    calls: tuple[ToolEvent, ...] = ()
    voiced_chars: int = 0  # characters of the clauses ``audio`` speaks (the playback clock's)


class TtsStage:
    """Speaks each chunk's clauses (hibari, 24 kHz, resampled to the chunk's rate)."""

    name = "voice-tts"
    device = "cpu"

    def __init__(self, tts: HibariTts) -> None:
        self.tts = tts

    def forward(self, items: Sequence[StageItem]) -> list[SpeechChunk]:
        return [self._speak(item.payload) for item in items]

    def _speak(self, chunk: TextChunk) -> SpeechChunk:
        audio = np.zeros(0, np.float32)
        if chunk.clauses:
            audio = np.concatenate([self.tts.synthesize(c, speed=chunk.speed) for c in chunk.clauses])
            if chunk.sample_rate != self.tts.sample_rate:
                audio = soxr.resample(audio, self.tts.sample_rate, chunk.sample_rate).astype(np.float32)
        voiced = sum(len(c) for c in chunk.clauses)
        return SpeechChunk(chunk.text, audio, chunk.sample_rate, chunk.usage, chunk.calls, voiced)
