"""Turn-taking of the duplex cascade (``cascade.py``): when the user's turn ends, when the model yields.

One :class:`TurnTaker` per session: a pure state machine (no model, no threads, no clock of its
own; time is the audio pushed, in 32 ms VAD frames). Fed the VAD's frames and probabilities
(:meth:`TurnTaker.hear`), the transcripts it asked for (:meth:`TurnTaker.transcribed`) and the end
of each reply (:meth:`TurnTaker.reply_done`), it answers with actions for the cascade to run:
:class:`Transcribe`, :class:`Draft`, :class:`Commit`, :class:`Cancel`, :class:`Backchannel`.

The rules, as Kyutai's Unmute and OpenAI's ``semantic_vad`` do it (VAD silence plus a semantic
end-of-turn signal from the transcript); thresholds in :class:`TurnRules`:

- **Speech** is segmented by the voice kind's ``TurnDetector`` (Silero probabilities, threshold
  with hysteresis, 300 ms of prefix padding): an utterance runs from the first speech frame to a
  long silence (``max_silence_ms``) or the length bound (``max_utterance_ms``).
- **Listening**: while the user speaks, the utterance so far is re-transcribed every
  ``partial_ms`` of it (:attr:`TurnTaker.partial`, the streaming transcript); at every pause of
  ``pause_ms`` it is transcribed for the end-of-turn decision.
- **End of turn**: the pause's transcript sounds complete (:func:`sounds_complete`: it ends a
  sentence or question and its last word does not ask for more) and the silence reached
  ``end_silence_ms``; or the silence reached ``max_silence_ms`` whatever the transcript; or the
  utterance reached ``max_utterance_ms``. A transcript that is empty (Whisper heard no speech)
  ends nothing: the utterance is dropped at ``end_silence_ms``.
- **Speculation**: a complete-sounding transcript starts the reply at once (:class:`Draft`, it is
  generated but not played); the end of the turn plays it (:class:`Commit`); speech before that
  cancels it (:class:`Cancel` ``speech_resumed``) and the turn goes on.
- **Barge-in**: ``barge_in_ms`` of continuous speech while the model answers (from its commit
  until :meth:`TurnTaker.reply_done`) cancels the reply (:class:`Cancel` ``barge_in``); that
  speech is the user's next turn. Shorter speech that starts while the model answers (a user's
  "mm-hmm", a cough) is an aside: not transcribed, no turn.
- **Backchannel** (``backchannel``, off by default): at a pause of a user turn already
  ``backchannel_after_ms`` long whose transcript does not sound complete (the user is mid-thought)
  and whose streaming transcript holds words, the model says a short acknowledgement
  (:class:`Backchannel`), at most once per ``backchannel_every_ms``; it does not end the turn.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np

from models.voice.vad import (
    FRAME_MS,
    ServerVadConfig,
    SpeechPaused,
    SpeechStarted,
    SpeechStopped,
    TurnDetector,
)

PREFIX_PADDING_MS = 300  # audio kept before the first speech frame (Whisper hears the onset)

# A last word that asks for more: a turn that ends on it is not over, whatever the punctuation.
CONTINUATION_WORDS = frozenset(
    "and but or so because then the a an to of in on at for with from that which who whose my your "
    "their our his her its um uh er erm like if when while than as".split()
)
_TRAILING = "\"'”’)] "


def sounds_complete(text: str) -> bool:
    """The semantic end-of-turn signal: ``text`` ends a sentence or a question (``.``, ``?``,
    ``!``; not an ellipsis) and its last word is not one of :data:`CONTINUATION_WORDS`."""
    t = text.strip().rstrip(_TRAILING)
    if not t or t.endswith(("...", "…")) or t[-1] not in ".?!":
        return False
    words = re.findall(r"[a-z']+", t.lower())
    return not words or words[-1] not in CONTINUATION_WORDS


@dataclass(frozen=True, slots=True)
class TurnRules:
    """The turn-taking thresholds (the module docstring says what each one decides)."""

    vad_threshold: float = 0.5
    pause_ms: int = 160
    end_silence_ms: int = 480
    max_silence_ms: int = 1200
    max_utterance_ms: int = 30_000
    barge_in_ms: int = 160
    partial_ms: int = 1000  # 0: no streaming transcript (transcripts at pauses only)
    backchannel: bool = False
    backchannel_after_ms: int = 4000
    backchannel_every_ms: int = 8000

    def __post_init__(self) -> None:
        if not 0.0 < self.vad_threshold <= 1.0:
            raise ValueError(f"vad_threshold must be in (0, 1], got {self.vad_threshold}")
        if not FRAME_MS <= self.pause_ms <= self.end_silence_ms <= self.max_silence_ms:
            raise ValueError(
                f"need {FRAME_MS} <= pause_ms <= end_silence_ms <= max_silence_ms, got "
                f"{self.pause_ms}, {self.end_silence_ms}, {self.max_silence_ms}"
            )
        for name in ("max_utterance_ms", "barge_in_ms", "partial_ms", "backchannel_after_ms"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")


@dataclass(frozen=True, slots=True)
class Transcribe:
    """Transcribe ``audio`` (16 kHz float32: the utterance so far) and hand the text back to
    :meth:`TurnTaker.transcribed` with ``request``. ``final``: a pause's (end-of-turn) transcript;
    else a streaming one (superseded by the next)."""

    request: int
    audio: np.ndarray = field(repr=False)
    final: bool


@dataclass(frozen=True, slots=True)
class Draft:
    """Start generating the reply to the user's ``text`` (not played until :class:`Commit`)."""

    text: str


@dataclass(frozen=True, slots=True)
class Commit:
    """The user's turn (``text``) ended: play the draft reply to it."""

    text: str


@dataclass(frozen=True, slots=True)
class Cancel:
    """Drop the reply: ``speech_resumed`` (a draft; the user's turn goes on) or ``barge_in``."""

    reason: str


@dataclass(frozen=True, slots=True)
class Backchannel:
    """Say a short acknowledgement now, without taking the turn."""


Action = Transcribe | Draft | Commit | Cancel | Backchannel


class TurnTaker:
    """One session's turn-taking (see the module docstring). Not thread-safe: one owner."""

    def __init__(self, rules: TurnRules | None = None) -> None:
        self.rules = rules = rules or TurnRules()
        vad = ServerVadConfig(
            rules.vad_threshold, PREFIX_PADDING_MS, rules.max_silence_ms, rules.max_utterance_ms
        )
        self.detector = TurnDetector(vad, speculate_ms=rules.pause_ms)
        self.answering = False  # a committed reply: playing, or about to (until reply_done)
        self.drafting = False  # a draft reply is being generated, not committed
        self.partial = ""  # the streaming transcript of the current utterance
        self._requests = 0
        self._pause: int | None = None  # the current pause's transcription request
        self._heard: str | None = None  # its text, once back
        self._ended: int | None = None  # a turn that ended before its transcript came back
        self._carry = ""  # an ended turn's words heard once the user was speaking again
        self._partial_request: int | None = None
        self._partial_at = 0  # utterance ms at the last streaming request
        self._aside = False  # the utterance began while the model answered (no turn unless it barges in)
        self._utterance_ms = 0
        self._voiced_ms = 0  # continuous speech so far
        self._now_ms = 0
        self._backchannel_at = -math.inf

    @property
    def in_speech(self) -> bool:
        return self.detector.in_speech

    # -- inputs ---------------------------------------------------------------------------
    def hear(self, frames: np.ndarray, probabilities: np.ndarray) -> list[Action]:
        """The VAD's next frames (``[n, 512]`` at 16 kHz) and their speech probabilities."""
        actions: list[Action] = []
        for frame, p in zip(frames, probabilities, strict=True):
            actions += self._frame(frame, float(p))
        return actions

    def transcribed(self, request: int, text: str) -> list[Action]:
        """The text of a :class:`Transcribe` this taker asked for (stale requests are ignored)."""
        text = text.strip()
        if request == self._ended:
            self._ended = None
            if self.in_speech:  # the user already goes on: these words open the next turn
                self._carry = text
                return []
            return self._end_turn(text) if text else []
        if request == self._pause:
            self._heard = text
            actions: list[Action] = []
            if self.answering:
                return actions
            if text and sounds_complete(text) and not self.drafting:
                self.drafting = True
                actions.append(Draft(self._with_carry(text)))
            actions += self._backchannel(text)
            return actions + self._maybe_end()
        if request == self._partial_request:
            self.partial = text
        return []

    def reply_done(self) -> None:
        """The committed reply played out (or failed): the model listens again."""
        self.answering = False

    # -- the rules ------------------------------------------------------------------------
    def _frame(self, frame: np.ndarray, p: float) -> list[Action]:
        self._now_ms += FRAME_MS
        decision = self.detector.push(frame, p)
        actions: list[Action] = []
        if isinstance(decision, SpeechStarted):
            self._utterance_ms = self._partial_at = 0
            self._aside, self.partial, self._partial_request = self.answering, "", None
        if self.in_speech:
            self._utterance_ms += FRAME_MS
        voiced = self.in_speech and self.detector.silence_ms == 0
        self._voiced_ms = self._voiced_ms + FRAME_MS if voiced else 0
        if voiced and self._pause is not None:
            actions += self._resumed()
        if isinstance(decision, SpeechPaused) and not self._aside:
            self._pause, self._heard = self._next(), None
            actions.append(Transcribe(self._pause, decision.audio, final=True))
        elif isinstance(decision, SpeechStopped):
            actions += self._stopped(decision)
        if self.answering and self._voiced_ms >= self.rules.barge_in_ms:
            self.answering, self._aside = False, False
            actions.append(Cancel("barge_in"))
        if voiced and not self._aside and self.rules.partial_ms:
            if self._utterance_ms - self._partial_at >= self.rules.partial_ms:
                self._partial_at = self._utterance_ms
                self._partial_request = self._next()
                actions.append(Transcribe(self._partial_request, self.detector.audio(), final=False))
        return actions + self._maybe_end()

    def _resumed(self) -> list[Action]:
        """Speech after a pause: the turn goes on; a draft for the pause is dropped."""
        self._pause = self._heard = None
        if self.drafting:
            self.drafting = False
            return [Cancel("speech_resumed")]
        return []

    def _stopped(self, stopped: SpeechStopped) -> list[Action]:
        """The detector ended the utterance (``max_silence_ms`` of silence, or its length bound)."""
        if self._aside:
            self._aside = False
            return []
        if stopped.pause_id is not None and self._pause is not None:
            if self._heard is not None:
                return self._end_turn(self._heard)
            self._ended, self._pause = self._pause, None  # wait for the pause's transcript
            return []
        self._ended = self._next()  # the length bound: transcribe what was said
        return [Transcribe(self._ended, stopped.audio, final=True)]

    def _maybe_end(self) -> list[Action]:
        """End the turn at ``end_silence_ms`` once the pause's transcript is complete or empty."""
        heard = self._heard
        if self._pause is None or heard is None or self.detector.silence_ms < self.rules.end_silence_ms:
            return []
        if heard and not sounds_complete(heard):
            return []
        return self._end_turn(heard)

    def _end_turn(self, text: str) -> list[Action]:
        self.detector.reset()
        self._pause = self._heard = None
        text = self._with_carry(text)
        self._carry = ""
        if not text:
            return []
        actions: list[Action] = [] if self.drafting else [Draft(text)]
        self.drafting, self.answering = False, True
        return [*actions, Commit(text)]

    def _backchannel(self, text: str) -> list[Action]:
        r = self.rules
        if not r.backchannel or not self.partial or (text and sounds_complete(text)):
            return []
        if (
            self._utterance_ms < r.backchannel_after_ms
            or self._now_ms - self._backchannel_at < r.backchannel_every_ms
        ):
            return []
        self._backchannel_at = self._now_ms
        return [Backchannel()]

    def _with_carry(self, text: str) -> str:
        return f"{self._carry} {text}".strip() if self._carry else text

    def _next(self) -> int:
        self._requests += 1
        return self._requests
