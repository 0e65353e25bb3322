"""The echo kind's two stages: one of each flavour, so its pipeline exercises both.

- :class:`WordStream` is a self-scheduling streaming stage (``models.stage.StreamingStage``), the
  shape of an LLM on vLLM's ``AsyncLLM``: ``stream(item)`` yields the payload's words one at a
  time, ``word_delay_s`` apart, and ``abort(request_id)`` stops a request between words. It
  computes nothing, so it needs no thread.
- :class:`Shout` is a batched stage (``models.stage.BatchedStage``): it upper-cases every chunk
  of a batch in one ``forward`` on the engine's worker thread, the shape of a TTS batching clauses.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

from models.stage import StageItem


class WordStream:
    name = "echo-words"
    device = "cpu"

    def __init__(self, word_delay_s: float = 0.0) -> None:
        self.word_delay_s = word_delay_s
        self._aborted: set[str] = set()
        self.aborted = 0  # requests aborted so far

    async def stream(self, item: StageItem) -> AsyncIterator[str]:
        try:
            for word in str(item.payload).split():
                if item.request_id in self._aborted:
                    return
                await asyncio.sleep(self.word_delay_s)
                yield word
        finally:
            self._aborted.discard(item.request_id)

    def abort(self, request_id: str) -> None:
        self.aborted += 1
        self._aborted.add(request_id)


class Shout:
    name = "echo-shout"
    device = "cpu"

    def forward(self, items: Sequence[StageItem]) -> list[str]:
        return [str(item.payload).upper() for item in items]
