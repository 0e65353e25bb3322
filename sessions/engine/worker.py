"""A dedicated worker thread per device: where model forwards run, never on the event loop.

Jobs run one at a time in submission order, so slot initialisation and release are serialized
with forwards. On a CUDA device the thread owns its own CUDA stream; every job runs under that
stream and synchronises it before its result is handed back, so consumers on other streams or
the CPU see finished tensors. Several engines may share one worker to serialize their stages on
one stream (pass the same ``DeviceWorker``).
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from typing import Any

from sessions.engine.errors import EngineClosedError


def _resolve(fut: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if fut.done():  # the awaiting caller was cancelled
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(result)


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
        torch.cuda.set_device(device)  # per thread: default allocations land on this device
        stream = torch.cuda.Stream(device=device)
        return torch.cuda.stream(stream), stream

    def _loop(self) -> None:
        context, stream = self._stream_context()
        with context:
            while True:
                job = self._jobs.get()
                if job is None:
                    return
                loop, fut, fn, args = job
                result, error = None, None
                try:
                    result = fn(*args)
                    if stream is not None:
                        stream.synchronize()
                except BaseException as exc:  # handed to the awaiting coroutine, never lost
                    error = exc
                with contextlib.suppress(RuntimeError):  # loop already closed at interpreter exit
                    loop.call_soon_threadsafe(_resolve, fut, result, error)

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` on the worker thread and await its result (or exception)."""
        if self._closed:
            raise EngineClosedError(f"worker for {self.device} is closed")
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._jobs.put((loop, fut, fn, args))
        return await fut

    async def close(self, timeout_s: float = 30.0) -> None:
        """Finish queued jobs, then stop the thread (waits off the event loop)."""
        if self._closed:
            return
        self._closed = True
        self._jobs.put(None)
        await asyncio.to_thread(self._thread.join, timeout_s)
