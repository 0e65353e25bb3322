"""A dedicated worker thread per device: where model forwards run, never on the event loop.

Hand-off cost matters (it sits on every tick's round trip): a job is one ``SimpleQueue.put``
(the thread blocks in the C-level ``get``, no polling), and its outcome comes back with one
``loop.call_soon_threadsafe``. ``post(fn, args, on_done)`` calls ``on_done(result, error)`` on
the loop with nothing in between; ``await run(fn, *args)`` wraps it in a future.

Jobs run one at a time in submission order, so slot initialisation and release are serialized
with forwards. A batched engine's forward job is :func:`isolated_forward`: batch isolation by
bisecting a forward that raised, on this thread. On a CUDA device the thread owns its own CUDA stream; every job runs under that
stream and synchronises it before its result is handed back, so consumers on other streams or
the CPU see finished tensors. Several engines may share one worker to serialize their stages on
one stream (pass the same ``DeviceWorker``).
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from models.stage import BatchedStage, StageItem
from sessions.engine.errors import EngineClosedError, EngineError

Done = Callable[[Any, BaseException | None], None]


def _resolver(fut: asyncio.Future) -> Done:
    def resolve(result: Any, error: BaseException | None) -> None:
        if fut.done():  # the awaiting caller was cancelled
            return
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(result)

    return resolve


class DeviceWorker:
    """One thread that runs jobs for one device; ``await run(fn, *args)`` from the event loop."""

    def __init__(self, device: str = "cpu", name: str | None = None) -> None:
        self.device = device
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=name or f"stage-worker-{device}", daemon=True)
        self._thread.start()

    @property
    def thread(self) -> threading.Thread:
        return self._thread

    def _stream_context(self):
        if not self.device.startswith("cuda"):
            return contextlib.nullcontext(), None
        import torch

        device = torch.device(self.device)
        if device.index is None:  # "cuda" means the current device, as in torch
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)  # per thread: default allocations land on this device
        stream = torch.cuda.Stream(device=device)
        return torch.cuda.stream(stream), stream

    def _loop(self) -> None:
        try:
            context, stream = self._stream_context()
        except BaseException as exc:  # e.g. no such device: every job fails with it, none hangs
            self._fail_jobs(exc)
            return
        with context:
            while True:
                job = self._jobs.get()
                if job is None:
                    return
                loop, on_done, fn, args = job
                result, error = None, None
                try:
                    result = fn(*args)
                    if stream is not None:
                        stream.synchronize()
                except BaseException as exc:  # handed to the awaiting coroutine, never lost
                    error = exc
                fn = args = job = None  # hold no batch inputs while idle
                # Signal last, then block in get() at once: the loop thread, woken by this
                # call, should not have to wait for this thread to drop the GIL.
                try:
                    loop.call_soon_threadsafe(on_done, result, error)
                except RuntimeError:  # loop already closed at interpreter exit
                    pass
                on_done = result = error = None

    def _fail_jobs(self, error: BaseException) -> None:
        while (job := self._jobs.get()) is not None:
            loop, on_done = job[0], job[1]
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(on_done, None, error)

    def post(self, fn: Callable[..., Any], args: tuple, on_done: Done) -> None:
        """Queue ``fn(*args)``; ``on_done(result, error)`` then runs on the calling event loop.

        Must be called on the event loop thread; raises :class:`EngineClosedError` once closed.
        """
        if self._closed:
            raise EngineClosedError(f"worker for {self.device} is closed")
        self._jobs.put((asyncio.get_running_loop(), on_done, fn, args))

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` on the worker thread and await its result (or exception)."""
        fut = asyncio.get_running_loop().create_future()
        self.post(fn, args, _resolver(fut))
        return await fut

    async def close(self, timeout_s: float = 30.0) -> None:
        """Finish queued jobs, then stop the thread (waits off the event loop)."""
        if self._closed:
            return
        self._closed = True
        self._jobs.put(None)
        await asyncio.to_thread(self._thread.join, timeout_s)


@dataclass(frozen=True, slots=True)
class BatchFailure:
    """The forward raised for this item alone (after bisecting): its output in the batch's list."""

    error: BaseException


def isolated_forward(
    stage: BatchedStage, items: Sequence[StageItem]
) -> tuple[list[Any] | None, BaseException | None, float]:
    """One batch's forward on the worker thread: ``(outputs, error, seconds)``.

    A forward that raises is re-run in halves, recursively (bisect), so only the items whose
    forward raises alone fail: their output is a :class:`BatchFailure`, the others get theirs.
    A forward that returns the wrong number of outputs fails the whole batch (``error``).
    """
    start = time.perf_counter()
    try:
        return _bisect(stage, items), None, time.perf_counter() - start
    except Exception as exc:  # only a wrong output count gets here
        return None, exc, time.perf_counter() - start


def _bisect(stage: BatchedStage, items: Sequence[StageItem]) -> list[Any]:
    try:
        outputs = list(stage.forward(items))
    except Exception as exc:
        if len(items) == 1:
            return [BatchFailure(exc)]
        half = len(items) // 2
        return _bisect(stage, items[:half]) + _bisect(stage, items[half:])
    if len(outputs) != len(items):
        raise EngineError(f"forward returned {len(outputs)} outputs for {len(items)} items")
    return outputs
