"""``StageExecutor``: the one tick executor, submitting a tick snapshot to a stage or pipeline.

A session kind never writes an executor: it hands the session manager a ``StageExecutor`` over its
:class:`~sessions.engine.protocol.StageRunner` (an engine or a pipeline) and a pure function
``to_input(snapshot) -> stage payload`` that lives with the model (the model's input adapter).

- ``execute(snapshot)``: open the session's resident state on first use (the first tick, and the
  first after a reset released it), submit ``to_input(snapshot)`` tagged with the snapshot's
  ``epoch`` and ``request_id``, and return ``TickOutput(snapshot.metadata, result)``. The session
  commits it (transactional tick).
- ``stream(snapshot)``: the same, for a streaming tick: the stage's chunks, in order, which
  ``Session.stream_tick`` tags with the tick's identity and commits on the last one.
- ``fence(session_id, epoch)``: ``Session.interrupt`` moved the session on; the runner drops and
  aborts the session's work of older epochs (``StageRunner.bump_epoch``).

Both run in the session's tick, so reset and close cut them short (the session cancels the
awaiting task and bumps its epoch).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from sessions.engine.protocol import StageRunner
from sessions.tick import TickOutput, TickSnapshot

InputAdapter = Callable[[TickSnapshot], Any]


class StageExecutor:
    def __init__(self, runner: StageRunner, to_input: InputAdapter) -> None:
        self.runner = runner
        self.to_input = to_input

    async def execute(self, snapshot: TickSnapshot) -> TickOutput[Any]:
        runner, session_id = self.runner, snapshot.session_id
        if not runner.is_open(session_id):  # most ticks skip the open() coroutine entirely
            await runner.open(session_id)
        value = await runner.submit(
            session_id, snapshot.epoch, self.to_input(snapshot), request_id=snapshot.request_id
        )
        return TickOutput(snapshot.metadata, value)

    async def stream(self, snapshot: TickSnapshot) -> AsyncIterator[Any]:
        if not self.runner.is_open(snapshot.session_id):
            await self.runner.open(snapshot.session_id)
        chunks = self.runner.stream(
            snapshot.session_id, snapshot.epoch, self.to_input(snapshot), request_id=snapshot.request_id
        )
        try:
            async for chunk in chunks:
                yield chunk.payload
        finally:  # a tick that ends early (its consumer left) aborts the stage's work now, not at GC
            await chunks.aclose()

    def fence(self, session_id: str, epoch: int) -> None:
        self.runner.bump_epoch(session_id, epoch)
