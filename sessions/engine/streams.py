"""``ChunkStream``: the consumer's async iterator over one request's chunks.

It ends after a chunk with ``final=True`` or when its channel closes cleanly. It enforces the stall deadline between chunks:
while the consumer waits, if no chunk arrives within ``stall_timeout_s`` of starting to wait,
the stream fails with :class:`StallError` and its remaining work is cancelled. The deadline
measures the producer only: time the consumer spends away from the stream (a slow reader under
backpressure) never counts. Closing the stream early (``aclose``, or leaving an ``async for``
through an exception) cancels the remaining work too, and so does dropping the last reference
to an unfinished stream (a finalizer schedules the cancel on the stream's event loop), so an
abandoned stream cannot pin its session's work; chunks it left unread are dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import Callable

from sessions.engine.channels import Channel, Chunk
from sessions.engine.errors import StallError


class ChunkStream:
    def __init__(
        self,
        channel: Channel,
        *,
        stage: str,
        session_id: str,
        stall_timeout_s: float,
        on_cancel: Callable[[BaseException | None], None],
        on_stall: Callable[[], None] | None = None,
    ) -> None:
        self.stage = stage
        self.session_id = session_id
        self._channel = channel
        self._stall_timeout_s = stall_timeout_s
        self._on_cancel = on_cancel
        self._on_stall = on_stall
        self._done = False
        self._finalizer = weakref.finalize(self, _cancel_soon, asyncio.get_running_loop(), on_cancel, channel)

    def __aiter__(self) -> ChunkStream:
        return self

    async def __anext__(self) -> Chunk:
        if self._done:
            raise StopAsyncIteration
        try:
            if self._stall_timeout_s > 0:
                # Not ``wait_for``: on Python 3.11 it swallows a cancel that lands as the chunk
                # arrives (the cancelled relay or tick would then run on and never end).
                async with asyncio.timeout(self._stall_timeout_s):
                    chunk = await self._channel.get()
            else:
                chunk = await self._channel.get()
        except TimeoutError:
            error = StallError(self.stage, self.session_id, self._stall_timeout_s)
            if self._on_stall is not None:
                self._on_stall()
            self._finish(error)
            raise error from None
        except BaseException as exc:
            self._finish(exc)
            raise
        if chunk is None or chunk.final:
            self._done = True
            self._finalizer.detach()
        if chunk is None:
            raise StopAsyncIteration
        return chunk

    async def collect(self) -> list[Chunk]:
        """Every chunk up to and including the final one."""
        return [chunk async for chunk in self]

    def cancel(self) -> None:
        """Stop the stream now; pending work is dropped and in-flight work aborted if possible."""
        self._finish(None)

    async def aclose(self) -> None:
        self.cancel()

    def _finish(self, error: BaseException | None) -> None:
        if self._done:
            return
        self._done = True
        self._finalizer.detach()
        _abandon(on_cancel=self._on_cancel, channel=self._channel, error=error)


def _abandon(
    on_cancel: Callable[[BaseException | None], None], channel: Channel, error: BaseException | None = None
) -> None:
    """Cancel the remaining work, then drop what is still buffered: nobody reads it now (a request
    that finished unread leaves a cleanly closed channel, which the depth gauge would count forever)."""
    on_cancel(error)
    channel.purge(lambda _chunk: True)


def _cancel_soon(
    loop: asyncio.AbstractEventLoop, on_cancel: Callable[[BaseException | None], None], channel: Channel
) -> None:
    # Garbage collection may run on any thread, so the cancel is handed to the loop.
    with contextlib.suppress(RuntimeError):  # the loop is already closed
        loop.call_soon_threadsafe(_abandon, on_cancel, channel)
