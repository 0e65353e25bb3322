"""The device worker: forwards run on its own thread, in order, with errors handed back."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch

from sessions.engine import DeviceWorker, EngineClosedError
from tests.sessions.engine.stages import RecordingStage


async def test_forwards_run_on_the_stage_worker_thread(make_engine):
    seen = []

    class Where(RecordingStage):
        def forward(self, items):
            seen.append(threading.current_thread())
            return super().forward(items)

    async with make_engine(Where(), coalesce_window_s=0.0) as engine:
        await engine.open("a")
        await engine.submit("a", 0, 1)
        assert seen == [engine.worker.thread]
        assert seen[0] is not threading.current_thread()


async def test_jobs_run_in_order_and_errors_propagate():
    worker = DeviceWorker("cpu")
    order = []
    assert await worker.run(order.append, 1) is None
    assert await worker.run(lambda: order.append(2) or 42) == 42
    with pytest.raises(ZeroDivisionError):
        await worker.run(lambda: 1 / 0)
    assert order == [1, 2]
    await worker.close()
    assert not worker.thread.is_alive()
    with pytest.raises(EngineClosedError):
        await worker.run(order.append, 3)


@pytest.mark.gpu
async def test_a_cuda_worker_runs_on_its_own_stream():
    import torch

    worker = DeviceWorker("cuda:0")
    stream = await worker.run(torch.cuda.current_stream)
    assert stream != torch.cuda.default_stream(torch.device("cuda:0"))
    await worker.close()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
async def test_a_worker_whose_device_cannot_start_fails_jobs_instead_of_hanging():
    worker = DeviceWorker("cuda")
    with pytest.raises(BaseException) as caught:
        await asyncio.wait_for(worker.run(lambda: 1), timeout=10)
    assert not isinstance(caught.value, TimeoutError)
    await worker.close()
