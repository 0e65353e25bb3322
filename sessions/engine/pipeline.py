"""``Pipeline``: stage runners chained by bounded channels, handing chunks downstream at once.

A pipeline is itself a :class:`~sessions.engine.protocol.StageRunner`, so kinds and executors do
not care whether they drive one stage or several. Stages of either flavour compose: each hop
calls its runner's ``stream(...)`` for every incoming chunk and forwards every chunk it yields,
so a downstream stage starts on the first chunk, not the last (vllm-omni's "async chunk",
``vllm-omni-realtime-surfaces.md`` §8), and each engine still batches its chunks with other
sessions' work.

Per open session there is one *lane*: a bounded :class:`~sessions.engine.channels.Channel` in front
of every stage and one relay task per channel, so a session's chunks pass each stage one at a time
and in order while stage k works on chunk n + 1 and stage k + 1 on chunk n. Chunks carry
``(session_id, epoch, seq)``; a relay drops chunks of an epoch older than the lane's. A full
channel makes its producer wait (``block``: backpressure propagates up to the caller of
``submit``), or sheds the oldest chunk (``drop_oldest``, counted). Each hop's chunk stream
enforces its stage's stall deadline between chunks.

Two ways in:

- ``await submit(...)`` runs the first stage directly and returns a :class:`PipelineResult` as soon
  as it finishes: its output (``head``) and a future of the last stage's output (``tail``) for the
  rest of the lane. A session tick can therefore commit on the first stage (the world's DiT block,
  which owns the resident KV) while decode and encode of block k overlap the denoising of k + 1.
- ``stream(...)`` sends the input down the whole lane and returns the last stage's chunks.

A failure at any hop (stage error, stall, stale epoch, release) fails that request's ``tail`` or
stream with the typed error; the lane goes on with the next chunk. A failed request, or a stream
its consumer closed early, is abandoned at every hop: stage work running for it is cancelled (a
streaming stage gets ``abort``) and its queued chunks are skipped. Chunks are numbered per request
and hop, so each stage's items carry ``seq`` 0, 1, ... in order. ``release`` cancels the lane
and releases the session on every stage (the one release path); ``close`` fails what is still
queued with :class:`EngineClosedError`. A full first hop refuses ``stream`` with
:class:`QueueFullError` (transient).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry

from sessions.engine.channels import BackpressurePolicy, Channel, Chunk, check_capacity, check_policy
from sessions.engine.errors import (
    EngineClosedError,
    EngineConfigError,
    EngineError,
    QueueFullError,
    SessionReleasedError,
    StaleEpochError,
)
from sessions.engine.metrics import engine_metrics
from sessions.engine.protocol import StageRunner
from sessions.engine.runner import BaseRunner
from sessions.engine.streams import ChunkStream
from sessions.lifecycle import ReleaseReason

log = logging.getLogger("sessions.engine")


@dataclass(frozen=True)
class PipelineResult:
    """What ``submit`` returns once the first stage finished."""

    head: Any
    tail: asyncio.Future  # the last stage's output for this input


@dataclass(eq=False)
class _Request:
    """Where a request's last-stage output goes: a future (``submit``) or a channel (``stream``)."""

    request_id: str
    future: asyncio.Future | None = None
    channel: Channel | None = None
    next_seq: dict[int, int] = field(default_factory=dict)  # hop -> seq of its next output chunk
    running: set[ChunkStream] = field(default_factory=set)  # hop streams working on it now
    dead: bool = False  # failed or abandoned: no hop works on it any more

    def fail(self, error: BaseException) -> None:
        self.dead = True
        for stream in list(self.running):
            stream.cancel()  # aborts the stage's work for this request (an endless upstream too)
        if self.future is not None and not self.future.done():
            self.future.set_exception(error)
            self.future.exception()  # a consumer that moved on must not log it as lost
        if self.channel is not None:
            self.channel.close(error)


@dataclass(eq=False)
class _Lane:
    epoch: int
    hops: list[Channel]
    relays: list[asyncio.Task] = field(default_factory=list)


class Pipeline(BaseRunner[_Lane]):
    """Runners in order (see the module docstring)."""

    def __init__(
        self,
        runners: Sequence[StageRunner],
        *,
        registry: CollectorRegistry,
        channel_size: int = 4,
        backpressure: BackpressurePolicy = "block",
        name: str | None = None,
    ) -> None:
        if not runners:
            raise EngineConfigError("a pipeline needs at least one stage")
        check_capacity("channel_size", channel_size)
        check_policy(backpressure)
        super().__init__(name or "+".join(r.name for r in runners))
        self.runners = tuple(runners)
        self.channel_size = channel_size
        self.backpressure: BackpressurePolicy = backpressure
        self._metrics = engine_metrics(registry)

    @property
    def per_session_bytes(self) -> int:
        return sum(runner.per_session_bytes for runner in self.runners)

    def is_open(self, session_id: str) -> bool:
        return session_id in self._sessions and all(r.is_open(session_id) for r in self.runners)

    async def submit(
        self,
        session_id: str,
        epoch: int,
        payload: Any,
        *,
        request_id: str = "",
        seq: int = 0,
        last: bool = True,
    ) -> PipelineResult:
        """Run the first stage; hand its output to the rest of the lane (see the module docstring)."""
        lane = self._admit(session_id, epoch)
        head = await self.runners[0].submit(
            session_id, epoch, payload, request_id=request_id, seq=seq, last=last
        )
        future = asyncio.get_running_loop().create_future()
        request = _Request(request_id, future=future)
        if len(self.runners) == 1:
            future.set_result(head)
        else:
            hop = lane.hops[1]
            await hop.put(Chunk(session_id, epoch, seq, (head, request), last))
            if hop.closed:  # released while this waited for room: the chunk was discarded
                request.fail(SessionReleasedError(session_id, "pipeline lane closed"))
        return PipelineResult(head, future)

    def stream(
        self,
        session_id: str,
        epoch: int,
        payload: Any,
        *,
        request_id: str = "",
        seq: int = 0,
        last: bool = True,
    ) -> ChunkStream:
        """Send ``payload`` down the whole lane; the last stage's chunks stream back."""
        lane = self._admit(session_id, epoch)
        out = self._channel(self.runners[-1].name)
        request = _Request(request_id, channel=out)
        first = lane.hops[0]
        if not first.has_room():
            raise QueueFullError(self.name, self.channel_size)
        first.put_nowait(Chunk(session_id, epoch, seq, (payload, request), last))
        return ChunkStream(
            out,
            stage=self.name,
            session_id=session_id,
            stall_timeout_s=0,  # every hop enforces its own stage's deadline
            on_cancel=lambda error: request.fail(error or EngineError("stream cancelled by its consumer")),
        )

    async def close(self) -> None:
        """Cancel every lane (failing what is queued with ``EngineClosedError``), close every runner."""
        if self._closed:
            return
        self._closed = True
        for session_id in list(self._sessions):
            await self._stop_lane(
                self._sessions.pop(session_id), EngineClosedError(f"pipeline {self.name!r} is shutting down")
            )
        for runner in self.runners:
            await runner.close()

    # ----------------------------------------------------------------- sessions (BaseRunner hooks)

    async def _open_state(self, session_id: str) -> None:
        """Open the session on every stage, all or nothing (its lane starts in ``_register``)."""
        opened: list[StageRunner] = []
        try:
            for runner in self.runners:
                await runner.open(session_id)
                opened.append(runner)
        except BaseException:
            for runner in opened:
                await runner.release(session_id, "failed")
            raise

    def _register(self, session_id: str, state: None) -> _Lane:
        lane = _Lane(0, [self._channel(runner.name) for runner in self.runners])
        loop = asyncio.get_running_loop()
        for k in range(len(self.runners)):
            lane.relays.append(
                loop.create_task(self._relay(session_id, lane, k), name=f"relay-{self.name}-{k}")
            )
        return lane

    async def _release(self, session_id: str, lane: _Lane | None, reason: ReleaseReason) -> None:
        """Cancel the lane, then release on every stage concurrently; raises the first failure."""
        if lane is not None:
            await self._stop_lane(lane, SessionReleasedError(session_id, reason))
        results = await asyncio.gather(
            *(runner.release(session_id, reason) for runner in self.runners), return_exceptions=True
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result

    def _drop_stale(self, session_id: str, lane: _Lane, epoch: int) -> int:
        """Make ``epoch`` current on every stage and drop older chunks from every hop."""
        dropped = sum(runner.bump_epoch(session_id, epoch) for runner in self.runners)
        for runner, hop in zip(self.runners, lane.hops, strict=True):
            stale = hop.purge(lambda c: c.epoch < epoch)
            for chunk in stale:
                chunk.payload[1].fail(StaleEpochError(session_id, chunk.epoch, epoch))
            self._metrics.stale_dropped.labels(stage=runner.name).inc(len(stale))
            dropped += len(stale)
        return dropped

    async def _stop_lane(self, lane: _Lane, error: BaseException) -> None:
        for relay in lane.relays:
            relay.cancel()
        await asyncio.gather(*lane.relays, return_exceptions=True)
        for hop in lane.hops:
            _fail_buffered(hop, error)

    # ----------------------------------------------------------------- internals

    def _channel(self, stage: str) -> Channel:
        """A lane hop; every chunk in it is ``(value, request)``."""
        return Channel(
            self.channel_size,
            self.backpressure,
            on_drop=lambda chunk: self._on_drop(stage, chunk),
            depth=self._metrics.channel_depth.labels(stage=stage),
        )

    def _on_drop(self, stage: str, chunk: Chunk) -> None:
        self._metrics.backpressure_dropped.labels(stage=stage).inc()
        chunk.payload[1].fail(EngineError(f"stage {stage!r}: chunk dropped under backpressure"))

    async def _relay(self, session_id: str, lane: _Lane, k: int) -> None:
        """Feed each chunk of hop ``k`` to stage ``k``; forward what it yields to hop k + 1 or the request.

        Forwarded chunks are never ``final``: after the input marked ``final`` has passed a stage,
        an end marker follows it down the lane and ends the request at the last hop.
        """
        runner, inbox = self.runners[k], lane.hops[k]
        while True:
            chunk = await inbox.get()
            if chunk is None:
                return
            value, request = chunk.payload
            if request.dead:  # its consumer left or it failed at another hop: skip its work
                continue
            try:
                if value is not _END:
                    if chunk.epoch < lane.epoch:
                        raise StaleEpochError(session_id, chunk.epoch, lane.epoch)
                    outputs = runner.stream(
                        session_id,
                        chunk.epoch,
                        value,
                        request_id=request.request_id,
                        seq=chunk.seq,
                        last=chunk.final,
                    )
                    request.running.add(outputs)
                    try:
                        async for produced in outputs:
                            await self._forward(lane, k, request, chunk, produced.payload)
                    finally:
                        request.running.discard(outputs)
                        outputs.cancel()  # no-op once it ended; otherwise the relay left mid-stream
                if chunk.final or value is _END:
                    await self._forward(lane, k, request, chunk, _END)
            except asyncio.CancelledError:
                request.fail(SessionReleasedError(session_id, "pipeline lane closed"))
                raise
            except Exception as exc:
                if isinstance(exc, StaleEpochError):
                    self._metrics.stale_dropped.labels(stage=runner.name).inc()
                request.fail(
                    exc if isinstance(exc, EngineError) else EngineError(f"stage {runner.name!r}: {exc!r}")
                )

    async def _forward(self, lane: _Lane, k: int, request: _Request, chunk: Chunk, payload: Any) -> None:
        """Hand ``payload`` (or the end marker) to hop k + 1, or to the request after the last stage."""
        seq = request.next_seq.get(k, 0)
        if payload is not _END:
            request.next_seq[k] = seq + 1
        if k + 1 < len(self.runners):
            await lane.hops[k + 1].put(Chunk(chunk.session_id, chunk.epoch, seq, (payload, request), False))
        elif payload is _END:
            if request.future is not None and not request.future.done():
                request.fail(EngineError(f"pipeline {self.name!r} produced no output"))
            if request.channel is not None:
                request.channel.close()
        elif request.future is not None:
            if not request.future.done():
                request.future.set_result(payload)
        else:
            assert request.channel is not None
            await request.channel.put(Chunk(chunk.session_id, chunk.epoch, seq, payload, False))


_END = object()  # end-of-request marker that follows a request's last chunk down the lane


def _fail_buffered(channel: Channel, error: BaseException) -> None:
    for chunk in channel.purge(lambda _chunk: True):
        chunk.payload[1].fail(error)
    channel.close(error)
