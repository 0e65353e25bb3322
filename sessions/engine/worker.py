"""A dedicated worker thread per device: where model forwards run, never on the event loop.

Hand-off cost matters (it sits on every tick's round trip): a job is one ``SimpleQueue.put``
(the thread blocks in the C-level ``get``, no polling), and its outcome comes back with one
``loop.call_soon_threadsafe``. ``post(fn, args, on_done)`` calls ``on_done(result, error)`` on
the loop with nothing in between; ``await run(fn, *args)`` wraps it in a future.

A job's exception goes back to its caller; the thread itself never stops for one. Should the
thread die anyway (an exception outside any job: an asynchronous exception, an interpreter
fault), the job in hand and every queued and later one fail with
:class:`~sessions.engine.errors.StageWorkerDiedError` (nothing waits forever) and
:func:`dead_workers` names it, so readiness can report it (``/readyz`` answers 503). A job that
raises :class:`~sessions.engine.errors.StageWorkerDiedError` itself (what it drives is gone for
good: a policy's child process that died) ends the thread the same way, logged once without a
traceback: the cause is in its message.

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
import functools
import itertools
import logging
import queue
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from models.stage import BatchedStage, StageItem
from sessions.engine.errors import EngineClosedError, EngineError, StageWorkerDiedError

Done = Callable[[Any, BaseException | None], None]
log = logging.getLogger("sessions.engine.worker")
_WORKERS: weakref.WeakSet[DeviceWorker] = weakref.WeakSet()


def dead_workers() -> list[str]:
    """The thread names of this process's workers whose thread died (closed ones are not dead)."""
    return sorted(worker.thread.name for worker in list(_WORKERS) if worker.died is not None)


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
        self.died: BaseException | None = None  # what ended the thread, if it died
        # Jobs posted and not yet answered, by ticket; touched on the event loop only. A thread
        # that dies fails them all from there: none is lost, whatever it was doing at the time.
        self._outstanding: dict[int, Done] = {}
        self._tickets = itertools.count()
        self._loop_of_jobs: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._loop, name=name or f"stage-worker-{device}", daemon=True)
        _WORKERS.add(self)
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
            self._serve()
        except BaseException as exc:  # the thread itself dies: fail what it holds and will get
            self.died = exc
            self._closed = True
            if isinstance(exc, StageWorkerDiedError):  # a job's own account of what is gone
                log.error("stage worker thread died: %s", exc, extra={"worker": self._thread.name})
            else:
                log.error("stage worker thread died", exc_info=exc, extra={"worker": self._thread.name})
            error = self._death()
            if self._loop_of_jobs is not None:
                with contextlib.suppress(RuntimeError):  # the loop is gone at interpreter exit
                    self._loop_of_jobs.call_soon_threadsafe(self._fail_outstanding, error)

    def _death(self) -> StageWorkerDiedError:
        """The error this dead worker's jobs fail with (its cause named)."""
        died, name = self.died, self._thread.name
        if isinstance(died, StageWorkerDiedError):
            return StageWorkerDiedError(f"stage worker {name} died: {died}")
        return StageWorkerDiedError(f"stage worker {name} died ({type(died).__name__})")

    def _fail_outstanding(self, error: BaseException) -> None:
        """On the loop: every job posted and not answered (in hand, queued) fails with ``error``."""
        outstanding, self._outstanding = self._outstanding, {}
        for on_done in outstanding.values():
            on_done(None, error)

    def _serve(self) -> None:
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
                except StageWorkerDiedError:  # what the job drives is gone: so is this worker
                    raise
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
        if self.died is not None:
            raise self._death()
        if self._closed:
            raise EngineClosedError(f"worker for {self.device} is closed")
        loop = self._loop_of_jobs = asyncio.get_running_loop()
        ticket = next(self._tickets)
        self._outstanding[ticket] = on_done
        self._jobs.put((loop, functools.partial(self._answer, ticket), fn, args))

    def _answer(self, ticket: int, result: Any, error: BaseException | None) -> None:
        on_done = self._outstanding.pop(ticket, None)
        if on_done is not None:  # not already failed by the thread's death
            on_done(result, error)

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` on the worker thread and await its result (or exception)."""
        fut = asyncio.get_running_loop().create_future()
        self.post(fn, args, _resolver(fut))
        return await fut

    async def close(self, timeout_s: float = 30.0) -> None:
        """Finish queued jobs, then stop the thread (waits off the event loop)."""
        _WORKERS.discard(self)  # closed: no longer a live worker, dead or not
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
    A forward that returns the wrong number of outputs fails the whole batch (``error``). A
    :class:`~sessions.engine.errors.StageWorkerDiedError` is not bisected: it ends the worker.
    """
    start = time.perf_counter()
    try:
        return _bisect(stage, items), None, time.perf_counter() - start
    except StageWorkerDiedError:
        raise
    except Exception as exc:  # only a wrong output count gets here
        return None, exc, time.perf_counter() - start


def _bisect(stage: BatchedStage, items: Sequence[StageItem]) -> list[Any]:
    try:
        outputs = list(stage.forward(items))
    except StageWorkerDiedError:
        raise
    except Exception as exc:
        if len(items) == 1:
            return [BatchFailure(exc)]
        half = len(items) // 2
        return _bisect(stage, items[:half]) + _bisect(stage, items[half:])
    if len(outputs) != len(items):
        raise EngineError(f"forward returned {len(outputs)} outputs for {len(items)} items")
    return outputs
