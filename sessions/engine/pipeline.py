"""``Pipeline``: stage engines chained by bounded channels, handing chunks downstream at once.

``stream(session_id, epoch, payload)`` feeds ``payload`` to the first engine and returns a
:class:`ChunkStream` of the last stage's chunks. Between two stages one relay task per request
reads the upstream chunks and submits each one to the next engine as soon as it exists (the
downstream stage starts on the first chunk, not the last: vllm-omni's "async chunk", reference
``vllm-omni-realtime-surfaces.md`` §8), so stage k+1 of chunk n overlaps stage k of chunk n+1,
and the next engine batches those chunks with other sessions' work.

Chunks keep ``(session_id, epoch)``; each hop numbers its output ``seq`` from 0; the last
output of the upstream's final chunk is ``final``. Every hop channel is bounded with the
pipeline's policy (``block`` propagates backpressure from a slow reader to the first stage;
``drop_oldest`` sheds chunks with a counter). ``bump_epoch`` bumps every engine and purges
older-epoch chunks from every hop, so no stale chunk survives at any stage. A failure anywhere
(stage error, stall, stale epoch, release) closes every later hop with that error, so the
consumer gets one typed error.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from prometheus_client import CollectorRegistry

from sessions.engine.channels import BackpressurePolicy, Channel, Chunk, check_capacity, check_policy
from sessions.engine.engine import StageEngine
from sessions.engine.errors import EngineConfigError, EngineError
from sessions.engine.metrics import engine_metrics
from sessions.engine.streams import ChunkStream
from sessions.lifecycle import ReleaseReason


class Pipeline:
    """Engines in order; a ``LifecycleBackend`` whose release frees the session on every stage."""

    def __init__(
        self,
        engines: Sequence[StageEngine],
        *,
        registry: CollectorRegistry,
        channel_size: int = 8,
        backpressure: BackpressurePolicy = "block",
    ) -> None:
        if not engines:
            raise EngineConfigError("a pipeline needs at least one stage engine")
        check_capacity("channel_size", channel_size)
        check_policy(backpressure)
        self.engines = tuple(engines)
        self.channel_size = channel_size
        self.backpressure: BackpressurePolicy = backpressure
        self._metrics = engine_metrics(registry)
        self._hops: dict[str, list[tuple[StageEngine, Channel]]] = {}
        self._tasks: set[asyncio.Task] = set()

    @property
    def per_session_bytes(self) -> int:
        return sum(engine.per_session_bytes for engine in self.engines)

    @property
    def bytes_in_use(self) -> int:
        return sum(engine.slots.bytes_in_use for engine in self.engines)

    async def open(self, session_id: str) -> None:
        """Open the session on every stage (all or nothing)."""
        opened = []
        try:
            for engine in self.engines:
                await engine.open(session_id)
                opened.append(engine)
        except BaseException:
            for engine in opened:
                await engine.release(session_id, "failed")
            raise

    async def release(self, session_id: str, reason: ReleaseReason = "close") -> None:
        """Release on every stage concurrently; raises the first failure after all ran."""
        results = await asyncio.gather(
            *(engine.release(session_id, reason) for engine in self.engines), return_exceptions=True
        )
        self._hops.pop(session_id, None)
        for result in results:
            if isinstance(result, BaseException):
                raise result

    async def evict(self, session_id: str) -> None:
        await self.release(session_id, "evicted")

    def bump_epoch(self, session_id: str, epoch: int) -> int:
        """Make ``epoch`` current on every stage and drop older chunks from every hop."""
        dropped = sum(engine.bump_epoch(session_id, epoch) for engine in self.engines)
        for engine, hop in self._hops.get(session_id, ()):
            purged = hop.purge(lambda chunk: chunk.epoch < epoch)
            self._metrics.stale_dropped.labels(stage=engine.name).inc(purged)
            dropped += purged
        return dropped

    def stream(self, session_id: str, epoch: int, payload: Any) -> ChunkStream:
        """Run ``payload`` through every stage; chunks of the last stage stream back."""
        first = self.engines[0].stream(session_id, epoch, payload)
        if len(self.engines) == 1:
            return first
        source: Callable[[], Awaitable[Chunk | None]] = first.__anext__
        cancels: list[Callable[[], None]] = [first.cancel]
        hops = self._hops.setdefault(session_id, [])
        for engine in self.engines[1:]:
            hop = Channel(
                self.channel_size,
                self.backpressure,
                on_drop=lambda _c, n=engine.name: self._metrics.backpressure_dropped.labels(stage=n).inc(),
                depth=self._metrics.channel_depth.labels(stage=engine.name),
            )
            hops.append((engine, hop))
            relay = self._relay(engine, source, cancels[-1], hop, session_id)
            task = asyncio.get_running_loop().create_task(relay)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            task.add_done_callback(lambda _t, h=hop, s=session_id: self._forget(s, h))
            cancels.append(task.cancel)
            source = hop.get

        def cancel(_error: BaseException | None) -> None:
            for fn in cancels:
                fn()

        last = self.engines[-1]
        return ChunkStream(hop, stage=last.name, session_id=session_id, stall_timeout_s=0, on_cancel=cancel)

    async def close(self) -> None:
        """Cancel running relays and close every engine."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for engine in self.engines:
            await engine.close()

    def _forget(self, session_id: str, hop: Channel) -> None:
        hops = self._hops.get(session_id)
        if hops is None:
            return
        hops[:] = [(e, h) for e, h in hops if h is not hop]
        if not hops:
            del self._hops[session_id]

    async def _relay(
        self,
        engine: StageEngine,
        source: Callable[[], Awaitable[Chunk | None]],
        cancel_source: Callable[[], None],
        out: Channel,
        session_id: str,
    ) -> None:
        """Feed each upstream chunk to ``engine`` as it arrives; on failure stop upstream too."""
        seq = 0
        sub = None
        try:
            while True:
                try:
                    chunk = await source()
                except StopAsyncIteration:
                    chunk = None
                if chunk is None:
                    break
                current = engine.epoch(session_id)
                if current is not None and chunk.epoch < current:
                    self._metrics.stale_dropped.labels(stage=engine.name).inc()
                    continue
                sub = engine.stream(session_id, chunk.epoch, chunk.payload, seq=chunk.seq, last=chunk.final)
                async for produced in sub:
                    await out.put(
                        Chunk(
                            session_id, produced.epoch, seq, produced.payload, chunk.final and produced.final
                        )
                    )
                    seq += 1
                sub = None
                if chunk.final:
                    break
            out.close()
        except asyncio.CancelledError:
            out.close(EngineError("pipeline stream cancelled"))
            cancel_source()
            raise
        except Exception as exc:
            out.close(exc)
            cancel_source()
        finally:
            if sub is not None:
                sub.cancel()
