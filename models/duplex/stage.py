"""The duplex model as one batched, stateful stage of the stage engine (``models/stage.py``).

One engine step = one 80 ms frame of every item's session: the user's input frame in, the model's
output frame, text piece and listen/speak decision out. The engine's frame clock (not input
arrival) drives the steps; a session with no input steps on :meth:`DuplexStage.silence`.

Contract of :meth:`DuplexStage.forward`:

- ``items[i].payload`` is a :class:`DuplexInput`, ``items[i].slot`` the session's slot (the
  engine's slot table owns the indices); sessions may sit at any positions in their streams.
- It returns one entry per item: a :class:`DuplexOutput`, or a :class:`DuplexError` instance that
  fails only that item (:class:`DuplexInputError` for a bad frame, :class:`ContextExhausted` when
  a session under policy ``"end"`` has used its whole context).
- It is transactional per call: if it raises, no session's state changed; per-session state
  (positions, previous tokens, codec buffers) is committed only at the end.
- ``DuplexOutput.step`` is the 0-based index of the frame in the session's stream: output
  ``step`` covers ``[step * 80, (step + 1) * 80)`` ms of the session.

Context policy (``context_policy``): ``"roll"`` keeps stepping past the context length with a
sink + window KV (``rolled`` is True on every step that evicted a frame, so the first True marks
the crossing); ``"end"`` answers every step at or beyond the context length with
:class:`ContextExhausted`, leaving the session's state untouched.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from models.duplex.configs import FRAME_MS, FRAME_SAMPLES, SAMPLE_RATE, ContextPolicy, DuplexModelConfig
from models.stage import StageItem

__all__ = [
    "FRAME_MS",
    "FRAME_SAMPLES",
    "SAMPLE_RATE",
    "ContextExhausted",
    "DuplexError",
    "DuplexInput",
    "DuplexInputError",
    "DuplexOutput",
    "DuplexStage",
    "build_duplex_stage",
]


class DuplexError(Exception):
    """A duplex step failed for one session (returned in its output slot, never raised)."""

    code = "duplex_error"


class DuplexInputError(DuplexError):
    """The input frame is not ``float32 (FRAME_SAMPLES,)`` of finite samples."""

    code = "invalid_audio_frame"


class ContextExhausted(DuplexError):
    """The session reached the context length under policy ``"end"``; it cannot step further."""

    code = "context_exhausted"

    def __init__(self, context: int) -> None:
        super().__init__(f"the session used its whole context of {context} frames ({context * FRAME_MS} ms)")
        self.context = context


@dataclass(frozen=True, slots=True)
class DuplexInput:
    pcm: np.ndarray  # float32 (FRAME_SAMPLES,): the user's audio for this frame
    silent: bool = False  # True when the server filled the frame with silence (client gap)


@dataclass(frozen=True, slots=True)
class DuplexOutput:
    pcm: np.ndarray  # float32 (FRAME_SAMPLES,): the model's audio for this frame
    text: str  # text piece produced this step ("" if none)
    speaking: bool  # the model's listen/speak decision for this frame
    step: int  # 0-based index of this frame in the session's stream
    rolled: bool = False  # the KV rolled (sink + window) at this step


_SILENCE = np.zeros(FRAME_SAMPLES, dtype=np.float32)
_SILENCE.flags.writeable = False


def check_frame(pcm: Any) -> DuplexInputError | None:
    """None if ``pcm`` is a usable input frame, else the typed error."""
    if not isinstance(pcm, np.ndarray) or pcm.dtype != np.float32 or pcm.shape != (FRAME_SAMPLES,):
        shape = getattr(pcm, "shape", None)
        dtype = getattr(pcm, "dtype", type(pcm).__name__)
        return DuplexInputError(f"audio frame must be float32 ({FRAME_SAMPLES},), got {dtype} {shape}")
    if not np.isfinite(pcm).all():
        return DuplexInputError("audio frame holds non-finite samples")
    return None


class DuplexStage:
    """PROVISIONAL (interface only): steps positions and policies, outputs silence.

    The embedded model (codec + LM) replaces the compute; the interface stays.
    """

    name = "duplex"
    sample_rate = SAMPLE_RATE
    frame_samples = FRAME_SAMPLES

    def __init__(self, config: DuplexModelConfig, device: str, slot_capacity: int) -> None:
        config.validate()
        self.config = config
        self.device = device
        self.slot_capacity = slot_capacity
        self._steps = np.zeros(slot_capacity, dtype=np.int64)

    @property
    def context_policy(self) -> ContextPolicy:
        return self.config.context_policy

    def state_bytes(self) -> int:
        return 0

    def silence(self) -> DuplexInput:
        return DuplexInput(_SILENCE, silent=True)

    def open_state(self, session_id: str, slot: int) -> str:
        self._steps[slot] = 0
        return session_id

    def release_state(self, session_id: str, slot: int, state: Any) -> None:
        self._steps[slot] = 0

    def forward(self, items: Sequence[StageItem]) -> list[DuplexOutput | Exception]:
        cfg = self.config
        out: list[DuplexOutput | Exception] = []
        for item in items:
            bad = check_frame(getattr(item.payload, "pcm", None))
            step = int(self._steps[item.slot])
            if bad is not None:
                out.append(bad)
            elif step >= cfg.context and cfg.context_policy == "end":
                out.append(ContextExhausted(cfg.context))
            else:
                out.append(DuplexOutput(_SILENCE, "", False, step, step >= cfg.context))
        for item, res in zip(items, out, strict=True):
            if isinstance(res, DuplexOutput):
                self._steps[item.slot] = res.step + 1
        return out


def build_duplex_stage(
    config: DuplexModelConfig, device: str, slot_capacity: int, seed: int = 0
) -> DuplexStage:
    """The embedded duplex model (random weights from ``seed``) as a stage of ``slot_capacity`` slots."""
    return DuplexStage(config, device, slot_capacity)
