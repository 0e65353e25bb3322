"""The stage engine: cross-session batching, chunked pipelines, resident per-session state.

Public API (see docs/engine.md):

- :class:`StageRunner` — the interface kinds, executors and pipelines use; implemented (on the
  shared base of :mod:`sessions.engine.runner`) by:
- :class:`StageEngine` — a batched stage (``models.stage.BatchedStage``) batched across sessions
  under a dispatch policy (:class:`Coalescing` or :class:`FrameClock`): a composition of its
  scheduler (:mod:`sessions.engine.scheduler`), slot table, worker and metrics;
- :class:`StreamingStageEngine` — a self-scheduling streaming stage (``models.stage.StreamingStage``);
- :class:`Pipeline` — runners chained by bounded channels; chunks flow downstream as they exist.
  Each is a ``sessions.lifecycle.LifecycleBackend``.
- :class:`Chunk`, :class:`Channel`, :class:`ChunkStream`, :data:`BackpressurePolicy`.
- :class:`DeviceWorker` — the worker thread (own CUDA stream on a GPU) forwards run on.
- Typed errors in :mod:`sessions.engine.errors`.
"""

from sessions.engine.channels import BackpressurePolicy, Channel, Chunk
from sessions.engine.dispatch import Coalescing, DispatchPolicy, FrameClock
from sessions.engine.engine import StageEngine
from sessions.engine.errors import (
    EngineClosedError,
    EngineConfigError,
    EngineError,
    QueueFullError,
    SessionNotOpenError,
    SessionReleasedError,
    SlotsExhaustedError,
    StageBatchError,
    StageItemError,
    StaleEpochError,
    StallError,
)
from sessions.engine.pipeline import Pipeline, PipelineResult
from sessions.engine.protocol import StageRunner
from sessions.engine.runner import check_stall_timeout
from sessions.engine.slots import Slot, SlotTable
from sessions.engine.streaming import StreamingStageEngine
from sessions.engine.streams import ChunkStream
from sessions.engine.worker import DeviceWorker

__all__ = [
    "BackpressurePolicy",
    "Channel",
    "Chunk",
    "ChunkStream",
    "Coalescing",
    "DispatchPolicy",
    "FrameClock",
    "PipelineResult",
    "StageRunner",
    "StreamingStageEngine",
    "DeviceWorker",
    "EngineClosedError",
    "EngineConfigError",
    "EngineError",
    "Pipeline",
    "QueueFullError",
    "SessionNotOpenError",
    "SessionReleasedError",
    "Slot",
    "SlotTable",
    "SlotsExhaustedError",
    "StageBatchError",
    "StageEngine",
    "StageItemError",
    "StaleEpochError",
    "StallError",
    "check_stall_timeout",
]
