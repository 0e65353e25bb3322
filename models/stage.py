"""The model-stage interface: what a model implements so the stage engine can batch it.

The session runtime's ``StageEngine`` (``sessions/engine``) owns one stage and its device. It
collects work from many sessions, calls ``forward`` with one batch on the stage's worker thread
(never on the event loop) and fans the outputs back to the sessions. This module declares that
interface without importing the runtime, so ``models/`` stays independent of ``sessions/``.

A stage implements :class:`ModelStage`; optional capabilities are separate protocols the engine
detects with ``isinstance``:

- :class:`StatefulStage`: per-session resident state (KV caches, codec caches, the previous
  action chunk). The engine's slot table gives every open session a slot index in
  ``[0, slot_capacity)``; the stage keeps the state in pools preallocated for that many slots and
  gathers a batch's rows with ``[item.slot for item in items]`` as one index tensor.
  ``open_state`` / ``release_state`` run on the worker thread, serialized with forwards, so a
  forward never sees a slot being reset under it.
- :class:`AbortableStage`: in-flight work can be cut short when a session's epoch is bumped,
  its request is cancelled or its slot is released (``abort`` is called from the event loop
  thread, must be non-blocking and thread-safe: typically it sets a flag the forward checks
  between inner steps; whatever the forward then returns for that item is discarded).

Contract of ``forward(items)``:

- ``items`` holds at most one item per session; its length is at most the engine's ``max_batch``.
- It returns one entry per item, in order. An entry is either a plain value (the item's final
  output), a :class:`StageOutput` (to stream: ``final=False`` asks the engine to call ``forward``
  again for this item with ``step + 1`` and ``payload = next_input`` if given), or an
  ``Exception`` instance, which fails only that item.
- Raising fails every item of the batch (the engine keeps serving other batches).
- It must not keep references to ``items`` after returning.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class StageItem:
    """One session's unit of work in a batch.

    ``seq`` numbers the input chunk within its stream (0 for a single request); ``last`` is True
    when this input is the final chunk of its stream (a decoder may flush its cache then);
    ``step`` counts the forwards already run for this item (0 first; streaming stages use it).
    ``slot`` / ``state`` are the session's resident-state slot index and the handle returned by
    ``open_state`` (``None`` for stateless stages).
    """

    session_id: str
    epoch: int
    payload: Any
    seq: int = 0
    step: int = 0
    last: bool = True
    slot: int | None = None
    state: Any = None


@dataclass(frozen=True, slots=True)
class StageOutput:
    """An explicit output: ``final=False`` means more chunks follow for this item."""

    payload: Any
    final: bool = True
    next_input: Any = None


@runtime_checkable
class ModelStage(Protocol):
    """A batched model stage. ``device`` is a torch device string such as ``"cpu"`` or ``"cuda:0"``."""

    name: str
    device: str

    def forward(self, items: Sequence[StageItem]) -> Sequence[Any]:
        """Run one batched forward; see the module docstring for the result contract."""
        ...


@runtime_checkable
class StatefulStage(ModelStage, Protocol):
    """A stage with per-session resident state held in ``slot_capacity`` preallocated slots."""

    slot_capacity: int

    def state_bytes(self) -> int:
        """Resident bytes one session's state holds (feeds the runtime's capacity planning)."""
        ...

    def open_state(self, session_id: str, slot: int) -> Any:
        """Initialise slot ``slot`` for a new session; return a handle passed back in items."""
        ...

    def release_state(self, session_id: str, slot: int, state: Any) -> None:
        """Free or reset the slot. Raising marks the release failed; the engine may retry it."""
        ...


@runtime_checkable
class AbortableStage(Protocol):
    """A stage whose in-flight work for a session can be cut short."""

    def abort(self, session_id: str) -> None:
        """Cut the running forward's work for ``session_id`` short; non-blocking, thread-safe.

        Only called while a forward holding that session's item runs (or has just returned), and
        the engine starts no other forward before that one's outputs were handed out, so a stage
        clears a session's abort flag at the start of each forward.
        """
        ...
