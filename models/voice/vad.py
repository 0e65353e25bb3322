"""Voice activity: Silero VAD with per-stream state, and OpenAI ``server_vad`` turn detection.

:class:`SileroVad` loads the ONNX Silero VAD v6 (the file inside the ``silero-vad`` wheel) once
per process; every session gets its own :class:`VadStream` (the model's recurrent state and the
64-sample context), so one model serves any number of sessions, and ``SileroVad.forward`` can
score one frame of many streams in one batched call. Frames are 512 samples at 16 kHz (32 ms).

:class:`TurnDetector` is a pure state machine (no model) that turns frame probabilities into the
Realtime API's ``input_audio_buffer.speech_started`` / ``speech_stopped`` decisions and hands back
the utterance audio to commit, prefix padding included.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import onnxruntime

from models.voice.weights import PackagedFile, verified_path

SAMPLE_RATE = 16_000
FRAME_SAMPLES = 512
FRAME_MS = FRAME_SAMPLES * 1000 // SAMPLE_RATE  # 32
CONTEXT_SAMPLES = 64  # Silero v5+ prepends the previous frame's last 64 samples
STATE_SHAPE = (2, 128)  # per stream; the model takes (2, batch, 128)

SILERO_ONNX = PackagedFile(
    "silero-vad",
    "6.2.3",
    "silero_vad/data/silero_vad.onnx",
    "1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3",
)


class VadStream:
    """One audio stream's VAD state: recurrent state, context samples, and a partial frame.

    Owned by one session (not thread-safe). ``feed`` accepts 16 kHz float32 chunks of any length
    and scores every complete 512-sample frame; leftover samples wait for the next chunk.
    """

    def __init__(self, model: SileroVad) -> None:
        self._model = model
        self.state = np.zeros(STATE_SHAPE, np.float32)
        self.context = np.zeros(CONTEXT_SAMPLES, np.float32)
        self._pending = np.zeros(0, np.float32)

    def feed(self, samples: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Return ``(frames [n, 512], probabilities [n])`` for the complete frames now available."""
        frames = self.take_frames(samples)
        n = len(frames)
        probs = np.empty(n, np.float32)
        for i in range(n):
            probs[i] = self._model.forward([self], frames[i : i + 1])[0]
        return frames, probs

    def take_frames(self, samples: np.ndarray) -> np.ndarray:
        """Split ``samples`` (after the partial frame kept from before) into complete frames,
        unscored (``[n, 512]``); the leftover samples wait. For a caller that scores the frames of
        many streams in one batched :meth:`SileroVad.forward` per frame index."""
        audio = np.concatenate([self._pending, np.asarray(samples, np.float32).reshape(-1)])
        n = len(audio) // FRAME_SAMPLES
        self._pending = audio[n * FRAME_SAMPLES :].copy()
        return audio[: n * FRAME_SAMPLES].reshape(n, FRAME_SAMPLES)

    def checkpoint(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A copy of the stream's state, for :meth:`restore` after a failed batched forward."""
        return self.state.copy(), self.context.copy(), self._pending.copy()

    def restore(self, checkpoint: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
        self.state, self.context, self._pending = (a.copy() for a in checkpoint)

    def reset(self) -> None:
        """Forget all audio (state, context, partial frame), as on a new input buffer."""
        self.state[:] = 0.0
        self.context[:] = 0.0
        self._pending = np.zeros(0, np.float32)


class SileroVad:
    """The Silero VAD ONNX model, loaded once and shared by every session.

    ``forward`` may run on several threads at once as long as no stream is in two calls at once.

    ``threads`` is onnxruntime's intra-op thread count (1 is plenty: a frame costs well under a
    millisecond). The weight file's SHA-256 is checked at load.
    """

    def __init__(self, threads: int = 1) -> None:
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        path = verified_path(SILERO_ONNX)
        self._session = onnxruntime.InferenceSession(
            str(path), sess_options=options, providers=["CPUExecutionProvider"]
        )
        self._sr = np.array(SAMPLE_RATE, dtype=np.int64)

    def stream(self) -> VadStream:
        return VadStream(self)

    def forward(self, streams: Sequence[VadStream], frames: np.ndarray) -> np.ndarray:
        """Speech probability of one frame per stream, as one batched call; advances each stream.

        ``frames`` is float32 ``[len(streams), 512]``; a stream may appear at most once.
        """
        frames = np.asarray(frames, np.float32)
        if frames.shape != (len(streams), FRAME_SAMPLES):
            raise ValueError(f"frames must be [{len(streams)}, {FRAME_SAMPLES}], got {list(frames.shape)}")
        inputs = np.concatenate([np.stack([s.context for s in streams]), frames], axis=1)
        state = np.stack([s.state for s in streams], axis=1)
        prob, new_state = self._session.run(None, {"input": inputs, "state": state, "sr": self._sr})
        for i, s in enumerate(streams):
            s.state = new_state[:, i, :].copy()
            s.context = frames[i, -CONTEXT_SAMPLES:].copy()
        return prob[:, 0]


@dataclass(frozen=True, slots=True)
class ServerVadConfig:
    """OpenAI ``turn_detection: {"type": "server_vad", ...}`` parameters (same defaults).

    ``threshold``: speech starts on a frame whose probability is at least this; it continues
    while frames stay at or above ``threshold - HYSTERESIS`` (Silero's own convention).
    ``prefix_padding_ms``: audio kept before the first speech frame (rounded up to whole frames).
    ``silence_duration_ms``: silence that ends the utterance (rounded up to whole frames).
    ``max_utterance_ms``: the utterance buffer's bound; speech that reaches it is stopped and
    committed there (a new utterance starts if speech goes on).
    """

    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500
    max_utterance_ms: int = 60_000

    HYSTERESIS = 0.15

    def __post_init__(self) -> None:
        if not 0.0 <= self.threshold <= 1.0:
            raise ValueError(f"threshold must be in [0, 1], got {self.threshold}")
        for name in ("prefix_padding_ms", "silence_duration_ms", "max_utterance_ms"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")


@dataclass(frozen=True, slots=True)
class SpeechStarted:
    """``input_audio_buffer.speech_started``: ``audio_start_ms`` includes the prefix padding."""

    audio_start_ms: int


@dataclass(frozen=True, slots=True)
class SpeechPaused:
    """A candidate end of speech (no event on the wire): the utterance's first ``speculate_ms``
    of silence. ``audio`` is the utterance so far (16 kHz float32, ``audio_start_ms`` to
    ``audio_end_ms``); work started on it may be reused if the :class:`SpeechStopped` that
    follows carries this ``pause_id``."""

    pause_id: int
    audio_start_ms: int
    audio_end_ms: int
    audio: np.ndarray = field(repr=False)


@dataclass(frozen=True, slots=True)
class SpeechStopped:
    """``input_audio_buffer.speech_stopped`` plus the utterance to commit.

    ``audio_end_ms`` is where the silence (or the length bound) ended the utterance; ``audio`` is
    the 16 kHz float32 audio from ``audio_start_ms`` to ``audio_end_ms``. ``pause_id``: the
    :class:`SpeechPaused` after which no speech came (so ``audio`` is that pause's audio plus
    silence), or None.
    """

    audio_start_ms: int
    audio_end_ms: int
    audio: np.ndarray = field(repr=False)
    pause_id: int | None = None


class TurnDetector:
    """Frames and their speech probabilities in, turn decisions out (pure; one per session).

    Times are milliseconds of audio pushed since construction; ``reset`` (the input buffer
    cleared, or a manual commit) drops the current utterance but keeps the clock. Memory is
    bounded by ``prefix_padding_ms`` while idle and ``max_utterance_ms`` while in speech.
    """

    def __init__(self, config: ServerVadConfig | None = None, speculate_ms: int = 0) -> None:
        self.config = config or ServerVadConfig()
        # a SpeechPaused after this much silence in speech (0: never; rounded up to whole frames)
        self._speculate_frames = math.ceil(speculate_ms / FRAME_MS) if speculate_ms > 0 else 0
        self._pauses = 0
        self._paused: int | None = None  # the pause whose silence still runs
        self._prefix_frames = math.ceil(self.config.prefix_padding_ms / FRAME_MS)
        self._silence_frames = max(1, math.ceil(self.config.silence_duration_ms / FRAME_MS))
        self._max_frames = max(1, self.config.max_utterance_ms // FRAME_MS)
        self._frames_seen = 0
        self._prefix: collections.deque[np.ndarray] = collections.deque(maxlen=self._prefix_frames or 1)
        self._utterance: list[np.ndarray] = []
        self._start_frame = 0
        self._silent_run = 0

    @property
    def in_speech(self) -> bool:
        return bool(self._utterance)

    @property
    def position_ms(self) -> int:
        return self._frames_seen * FRAME_MS

    @property
    def silence_ms(self) -> int:
        """The silence since the utterance's last speech frame (0 while speaking or idle)."""
        return self._silent_run * FRAME_MS if self._utterance else 0

    def audio(self) -> np.ndarray:
        """The utterance so far (16 kHz float32, prefix padding included; empty while idle)."""
        return np.concatenate(self._utterance) if self._utterance else np.zeros(0, np.float32)

    def push(
        self, frame: np.ndarray, probability: float
    ) -> SpeechStarted | SpeechPaused | SpeechStopped | None:
        """Consume one 512-sample frame and its probability; return the decision it causes."""
        index = self._frames_seen
        self._frames_seen += 1
        if not self._utterance:
            if probability < self.config.threshold:
                if self._prefix_frames:
                    self._prefix.append(frame)
                return None
            self._utterance = [*self._prefix, frame] if self._prefix_frames else [frame]
            self._prefix.clear()
            self._start_frame = index + 1 - len(self._utterance)
            self._silent_run = 0
            return SpeechStarted(self._start_frame * FRAME_MS)
        self._utterance.append(frame)
        speaking = probability >= self.config.threshold - ServerVadConfig.HYSTERESIS
        self._silent_run = 0 if speaking else self._silent_run + 1
        if speaking:
            self._paused = None
        if self._silent_run >= self._silence_frames or len(self._utterance) >= self._max_frames:
            return self._stop()
        if self._speculate_frames and self._silent_run == self._speculate_frames:
            self._pauses += 1
            self._paused = self._pauses
            audio = np.concatenate(self._utterance)
            return SpeechPaused(
                self._pauses, self._start_frame * FRAME_MS, self._frames_seen * FRAME_MS, audio
            )
        return None

    def push_frames(
        self, frames: np.ndarray, probabilities: np.ndarray
    ) -> list[SpeechStarted | SpeechPaused | SpeechStopped]:
        """:meth:`push` over ``VadStream.feed``'s output; the decisions in order."""
        decisions = (self.push(f, float(p)) for f, p in zip(frames, probabilities, strict=True))
        return [d for d in decisions if d is not None]

    def reset(self) -> None:
        self._utterance = []
        self._prefix.clear()
        self._silent_run = 0
        self._paused = None

    def _stop(self) -> SpeechStopped:
        audio = np.concatenate(self._utterance)
        stopped = SpeechStopped(
            self._start_frame * FRAME_MS, self._frames_seen * FRAME_MS, audio, self._paused
        )
        self.reset()
        return stopped
