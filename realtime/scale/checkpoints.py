"""The checkpoint store on Ray: one detached actor per cluster holds a
:class:`~realtime.scale.resume.CheckpointTable` (the bounds and expiry of ``replicas.checkpoint_*``);
:class:`RayCheckpointStore` is the async :class:`~realtime.scale.resume.CheckpointStore` every
replica uses. The actor is named ``<Serve app name>-checkpoints`` in the ``realtime`` namespace, made by
whichever replica starts first (``get_if_exists``), needs no CPU, and outlives replicas: a replica's
loss does not lose what it checkpointed. ``realtime serve --replicas`` removes it at shutdown.
"""

from __future__ import annotations

from typing import Any

import ray

from realtime.config import ReplicasConfig
from realtime.scale.resume import Checkpoint, CheckpointTable, CheckpointTooLargeError

NAMESPACE = "realtime"


@ray.remote(num_cpus=0)
class _StoreActor:
    def __init__(self, max_bytes: int, max_total_bytes: int, ttl_s: float) -> None:
        self.table = CheckpointTable(max_bytes, max_total_bytes, ttl_s)

    def put(self, checkpoint: Checkpoint) -> bool:
        return self.table.put(checkpoint)

    def get(self, session_id: str) -> Checkpoint | None:
        return self.table.get(session_id)

    def delete(self, session_id: str) -> None:
        self.table.delete(session_id)

    def stats(self) -> dict[str, int]:
        return self.table.stats()


def actor_name(app_name: str) -> str:
    return f"{app_name}-checkpoints"


class RayCheckpointStore:
    """The cluster's checkpoint store (module docstring)."""

    def __init__(self, config: ReplicasConfig, app_name: str) -> None:
        self.max_bytes = config.checkpoint_max_bytes
        self._actor: Any = _StoreActor.options(
            name=actor_name(app_name), namespace=NAMESPACE, lifetime="detached", get_if_exists=True
        ).remote(config.checkpoint_max_bytes, config.checkpoint_max_total_bytes, config.checkpoint_ttl_s)

    async def put(self, checkpoint: Checkpoint) -> bool:
        if len(checkpoint.state) > self.max_bytes:  # refused here: nothing crosses the network
            raise CheckpointTooLargeError(
                f"the state of session {checkpoint.session_id} is {len(checkpoint.state)} bytes, "
                f"over {self.max_bytes}",
                session_id=checkpoint.session_id,
                limit=self.max_bytes,
            )
        return await self._actor.put.remote(checkpoint)

    async def get(self, session_id: str) -> Checkpoint | None:
        return await self._actor.get.remote(session_id)

    async def delete(self, session_id: str) -> None:
        await self._actor.delete.remote(session_id)

    async def stats(self) -> dict[str, int]:
        return await self._actor.stats.remote()


def remove_store(app_name: str) -> None:
    """End the store's actor (the app is gone; its checkpoints with it)."""
    try:
        ray.kill(ray.get_actor(actor_name(app_name), namespace=NAMESPACE))
    except ValueError:  # never made
        pass
