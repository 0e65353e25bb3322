"""The stage engine: cross-session batching, chunked pipelines, resident per-session state.

Public API (see docs/engine.md):

- :class:`StageEngine` — one model stage (``models.stage.ModelStage``) batched across sessions;
  ``open`` / ``release`` / ``evict`` slots, ``submit`` (one result) / ``stream`` (chunks),
  ``bump_epoch``, ``close``. It is a ``sessions.lifecycle.LifecycleBackend``.
- :class:`Pipeline` — engines chained by bounded channels; chunks flow downstream as they exist.
- :class:`Chunk`, :class:`Channel`, :class:`ChunkStream`, :data:`BackpressurePolicy`.
- :class:`DeviceWorker` — the worker thread (own CUDA stream on a GPU) forwards run on.
- Typed errors in :mod:`sessions.engine.errors`.
"""

from sessions.engine.channels import BackpressurePolicy, Channel, Chunk
from sessions.engine.engine import StageEngine, check_stall_timeout
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
from sessions.engine.pipeline import Pipeline
from sessions.engine.slots import Slot, SlotTable
from sessions.engine.streams import ChunkStream
from sessions.engine.worker import DeviceWorker

__all__ = [
    "BackpressurePolicy",
    "Channel",
    "Chunk",
    "ChunkStream",
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
