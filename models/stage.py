"""The model-stage interface: what a model implements so the session runtime can drive it.

This module declares the interface without importing the runtime, so ``models/`` stays
independent of ``sessions/``. Stages come in two flavours:

- :class:`BatchedStage` (``forward(items)``): the runtime's ``StageEngine`` owns the stage and its
  device, collects work from many sessions, calls ``forward`` with one batch on the stage's worker
  thread (never on the event loop) and fans the outputs back. The engine's dispatch policy decides
  when a batch runs (coalescing, or a frame clock that steps every session each period).
- :class:`StreamingStage` (``stream(item)``, ``abort(request_id)``): a stage that schedules itself,
  such as an LLM on vLLM's ``AsyncLLM`` (continuous batching of its own). The runtime calls
  ``stream`` once per request on the event loop and reads its chunks; the stage must run its
  compute off the loop (its own engine, threads or processes). ``abort`` cuts a request short.

Either flavour may also be a :class:`StatefulStage`: per-session resident state (KV caches, codec
caches) in pools preallocated for ``slot_capacity`` sessions. The runtime's slot table is the one
owner of slot indices: it gives every open session a slot in ``[0, slot_capacity)`` and the stage
indexes its pools by it (``item.slot``); ``open_state`` / ``release_state`` run on the stage's
worker thread, serialized with forwards, so a forward never sees a slot being reset under it.
``state_bytes()`` is the one declaration of a session's resident bytes that capacity planning reads.

Contract of ``BatchedStage.forward(items)``:

- ``items`` holds at most one item per session; its length is at most the engine's ``max_batch``.
- It returns one entry per item, in order: the item's output, or an ``Exception`` instance, which
  fails only that item.
- Raising means "something in this batch failed"; the engine then re-runs the batch in halves
  (bisecting) so only the offending item fails. A forward must therefore be transactional per
  call: when it raises, no session's state changed (commit at the end, as the world model does).
- It must not keep references to ``items`` after returning.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class StageItem:
    """One session's unit of work.

    ``request_id`` is the tick's id (the session runtime's ``TickSnapshot.request_id``), which a
    streaming stage's ``abort`` names. ``seq`` numbers the input chunk within its request (0 for a
    single input); ``last`` is True when this input is the request's final chunk (a decoder may
    flush its cache then). ``slot`` / ``state`` are the session's resident-state slot index and
    the handle ``open_state`` returned (``None`` for stateless stages).
    """

    session_id: str
    epoch: int
    payload: Any
    request_id: str = ""
    seq: int = 0
    last: bool = True
    slot: int | None = None
    state: Any = None


@runtime_checkable
class BatchedStage(Protocol):
    """A batched model stage. ``device`` is a torch device string such as ``"cpu"`` or ``"cuda:0"``."""

    name: str
    device: str

    def forward(self, items: Sequence[StageItem]) -> Sequence[Any]:
        """Run one batched forward; see the module docstring for the result contract."""
        ...


@runtime_checkable
class StreamingStage(Protocol):
    """A self-scheduling stage: one request in, a stream of chunks out."""

    name: str
    device: str

    def stream(self, item: StageItem) -> AsyncIterator[Any]:
        """Start ``item`` and yield its output chunks in order; the iterator ends after the last.

        Called on the event loop; the compute must run elsewhere. Raising fails the request.
        """
        ...

    def abort(self, request_id: str) -> None:
        """Cut the request short (barge-in, reset, release); non-blocking, idempotent.

        After ``abort`` the stream may end early or raise; whatever it still yields is dropped.
        """
        ...


@runtime_checkable
class StatefulStage(Protocol):
    """A stage with per-session resident state held in ``slot_capacity`` preallocated slots."""

    slot_capacity: int

    def state_bytes(self) -> int:
        """Resident bytes one session's state holds (feeds the runtime's one capacity plan)."""
        ...

    def open_state(self, session_id: str, slot: int) -> Any:
        """Initialise slot ``slot`` for a new session; return a handle passed back in items."""
        ...

    def release_state(self, session_id: str, slot: int, state: Any) -> None:
        """Free or reset the slot. Raising marks the release failed; the engine may retry it."""
        ...


ModelStage = BatchedStage | StreamingStage
