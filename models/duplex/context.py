"""A duplex model's context as host-side data: what a checkpoint keeps of it and how a session
logs it (``realtime/scale/resume.py``, ``DuplexState.model_context``).

The stage owns the model's state (KV, positions) on its worker thread and never hands it out; the
session (the loop thread) builds checkpoints and never reads a device tensor. So each step's
output carries the step's share of the context as small host values (``DuplexOutput.context``),
the session appends it to a bounded :class:`ContextLog` the stage made for it
(``stage.context_log()``), and a checkpoint takes the log's :meth:`ContextLog.snapshot`. A
resumed session hands that snapshot to the stage with its first input (``DuplexInput.restore``),
and the stage rebuilds its context from it before that step (``models/duplex/stage.py``,
``step_ready``). A stage whose ``context_log()`` is None restores nothing: its context starts
empty on another replica.

Moshi-architecture models (:class:`TokenLog`): the temporal transformer's KV is a function of the
token streams it was fed, one row per 80 ms step: the text token and the ``n_q`` model codebooks
chosen at the step before, and the user's ``n_q`` codes of the step (``1 + 2 n_q`` ints: 17 at
Moshi's shape, 68 bytes as int32, 850 B per second of conversation). The log keeps the rows the
KV can still see: the first ``sink`` steps and the newest ``window``. The cascade's context is
its chat messages (``models/duplex/cascade.py``, ``ChatLog``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

TOKEN_DTYPE = np.int32


class ContextLog(Protocol):
    """A session's bounded record of its model's context, fed by the step outputs it applies."""

    def add(self, update: Any) -> None:
        """One step's ``DuplexOutput.context`` (never None)."""
        ...

    def snapshot(self, max_bytes: int) -> Any | None:
        """A frozen, picklable copy of at most about ``max_bytes`` (the newest part first), or
        None while there is nothing to restore."""
        ...

    def restore(self, context: Any) -> None:
        """Start from ``context`` (a snapshot of a log of the same model): a session restored
        from a checkpoint goes on logging after what it held."""
        ...


@dataclass(frozen=True, slots=True)
class FrameTokens:
    """One step's tokens, host-side: its temporal ``inputs`` ``[1 + 2 n_q]`` (the previous
    step's text token and model codebooks, then the user's codes of this frame) and its
    ``outputs`` ``[1 + n_q]`` (the text token and model codebooks it chose)."""

    inputs: np.ndarray
    outputs: np.ndarray


@dataclass(frozen=True)
class TokenContext:
    """A token model's context: ``inputs [n, 1 + 2 n_q]`` (int32) of the kept steps in step
    order: ``inputs[:head]`` are steps ``0 .. head - 1`` (the sink), ``inputs[head:]`` the newest
    steps, ending at step ``steps - 1``; ``outputs [1 + n_q]``, what step ``steps - 1`` chose
    (the next step's input)."""

    inputs: np.ndarray
    outputs: np.ndarray
    steps: int
    head: int

    @property
    def frames(self) -> np.ndarray:
        """The step index of each kept row ``[n]`` (int64)."""
        tail = len(self.inputs) - self.head
        return np.concatenate([np.arange(self.head), np.arange(self.steps - tail, self.steps)])


class TokenLog:
    """The token rows a temporal KV of ``sink + window`` frames can see (module docstring):
    the first ``sink`` steps, then a ring of the newest ``window``. ``add`` copies a row into
    preallocated arrays and ``snapshot`` gathers them in one copy."""

    def __init__(self, sink: int, window: int, width: int) -> None:
        self.sink, self.window = sink, window
        self.head = np.zeros((sink, width), TOKEN_DTYPE)
        self.ring = np.zeros((window, width), TOKEN_DTYPE)
        self.outputs: np.ndarray | None = None
        self.steps = 0

    def _row(self, step: int) -> np.ndarray:
        return self.head[step] if step < self.sink else self.ring[(step - self.sink) % self.window]

    def add(self, update: FrameTokens) -> None:
        self._row(self.steps)[:] = update.inputs
        self.outputs = update.outputs
        self.steps += 1

    def snapshot(self, max_bytes: int) -> TokenContext | None:
        """The sink rows and as many of the newest rows as fit ``max_bytes``."""
        if self.outputs is None:
            return None
        head = min(self.sink, self.steps)
        room = max(0, max_bytes // self.ring[0].nbytes - head)
        tail = min(self.steps - head, self.window, room)
        frames = np.arange(self.steps - tail, self.steps)
        inputs = np.concatenate([self.head[:head], self.ring[(frames - self.sink) % self.window]])
        return TokenContext(inputs, self.outputs.copy(), self.steps, head)

    def restore(self, context: TokenContext) -> None:
        for frame, row in zip(context.frames.tolist(), context.inputs, strict=True):
            self._row(frame)[:] = row
        self.outputs = context.outputs.copy()
        self.steps = context.steps
