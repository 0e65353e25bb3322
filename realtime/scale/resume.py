"""Sessions that survive their replica: what a kind checkpoints, the per-replica
:class:`Checkpointer` that puts it to the cluster's store, and how a replica restores it.

The contract (docs/scaling.md, "Resume on another replica"):

- **Checkpoint at tick boundaries.** After a committed tick (a voice response, a duplex flush of
  model steps, a robot chunk; a world chunk once sent) the session's one owner calls
  :meth:`Checkpointer.save` with a function that builds the kind's frozen state
  (:class:`VoiceState`, :class:`DuplexState`, :class:`WorldState`, :class:`RobotState`). Saves are coalesced (at most one put per ``interval_s``, 0.2 s, per
  session: a save inside the interval arms one timer that builds the newest state when it ends),
  serialized on a worker thread and put fire-and-forget (a slow store never holds a tick). Each
  put carries the next ``seq`` of its session; the store keeps only the newest.
- **Small and self-contained.** A state holds what rebuilds the session elsewhere, not its device
  state (KV caches are recomputed on the new replica from host data: conversation items, token
  rows, a world's held latent blocks). At most ``replicas.checkpoint_max_bytes``.
- **Restore where the router places it.** A request naming a session whose replica is gone is
  placed by capacity on a live replica; that replica's session check
  (``realtime.scale.session_check``) finds the checkpoint and hands it to the kind in the
  request's scope (:func:`restoring`), which recreates the session under the same id. A robot has
  no routable id: its state is keyed by its episode name (:func:`robot_key`) and looked up when a
  connection's first observation names one.
- **Release deletes.** A session closed for good (its client left, it expired) has its checkpoint
  deleted (:meth:`Checkpointer.discard`, from the manager's release path), except while the replica
  is moving its sessions away (:meth:`Checkpointer.retain`: drain).

Encoding: ``pickle`` of the frozen dataclasses. The trust boundary is the cluster: only replicas
write to the store (a detached actor inside Ray, which itself pickles every actor call), and
nothing a client sends is unpickled, so pickle adds no exposure Ray does not already have.

:class:`CheckpointTable` is the store's state (bounds and expiry), :class:`CheckpointStore` the
async API the replicas use; ``realtime.scale.checkpoints`` keeps the table in a detached Ray
actor, one per cluster.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import pickle
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from sessions.errors import SessionError

log = logging.getLogger("realtime.scale.resume")

CHECKPOINT_SCOPE_KEY = "realtime.checkpoint"  # the ASGI scope key the session check fills


class CheckpointTooLargeError(SessionError):
    """A session's resumable state is over ``replicas.checkpoint_max_bytes``; the older
    checkpoint stays."""

    code = "checkpoint_too_large"


@dataclass(frozen=True)
class Checkpoint:
    """One session's resumable state at a tick boundary (``seq``: that boundary; newer wins)."""

    session_id: str
    kind: str
    seq: int
    state: bytes


class CheckpointStore(Protocol):
    async def put(self, checkpoint: Checkpoint) -> bool:
        """Keep ``checkpoint`` unless the store holds a newer one (then ``False``); raises
        :class:`CheckpointTooLargeError`."""
        ...

    async def get(self, session_id: str) -> Checkpoint | None: ...

    async def delete(self, session_id: str) -> None: ...

    async def stats(self) -> dict[str, int]:
        """``sessions`` and ``bytes`` held now."""
        ...


class CheckpointTable:
    """The store's state: one checkpoint per session, at most ``max_bytes`` each and
    ``max_total_bytes`` together (the ones written longest ago go first), each dropped
    ``ttl_s`` after its last put."""

    def __init__(
        self, max_bytes: int, max_total_bytes: int, ttl_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.max_bytes = max_bytes
        self.max_total_bytes = max_total_bytes
        self.ttl_s = ttl_s
        self._clock = clock
        self._entries: collections.OrderedDict[str, tuple[float, Checkpoint]] = collections.OrderedDict()
        self._bytes = 0

    def _drop(self, session_id: str) -> None:
        _, old = self._entries.pop(session_id)
        self._bytes -= len(old.state)

    def _expire(self) -> None:
        deadline = self._clock() - self.ttl_s
        while self._entries:
            session_id, (written, _) = next(iter(self._entries.items()))
            if written > deadline:
                break
            self._drop(session_id)

    def put(self, checkpoint: Checkpoint) -> bool:
        size = len(checkpoint.state)
        if size > self.max_bytes:
            raise CheckpointTooLargeError(
                f"the state of session {checkpoint.session_id} is {size} bytes, over {self.max_bytes}",
                session_id=checkpoint.session_id,
                limit=self.max_bytes,
            )
        self._expire()
        held = self._entries.get(checkpoint.session_id)
        if held is not None:
            if held[1].seq > checkpoint.seq:
                return False
            self._drop(checkpoint.session_id)
        while self._entries and self._bytes + size > self.max_total_bytes:
            self._drop(next(iter(self._entries)))
        self._entries[checkpoint.session_id] = (self._clock(), checkpoint)
        self._bytes += size
        return True

    def get(self, session_id: str) -> Checkpoint | None:
        self._expire()
        held = self._entries.get(session_id)
        return held[1] if held is not None else None

    def delete(self, session_id: str) -> None:
        if session_id in self._entries:
            self._drop(session_id)

    def stats(self) -> dict[str, int]:
        self._expire()
        return {"sessions": len(self._entries), "bytes": self._bytes}


# -- what each kind checkpoints ---------------------------------------------------------------
@dataclass(frozen=True)
class VoiceState:
    """A voice session: its session config (``session.update``'s) and its conversation items with
    the milliseconds of assistant audio generated for each (``conversation.item.truncate``'s clamp)."""

    config: Any  # realtime.protocols.oai_realtime.SessionConfig
    items: tuple[tuple[Any, int], ...]  # (Item, audio_ms), in conversation order


@dataclass(frozen=True)
class DuplexState:
    """A duplex session's protocol state: the resume token, the epoch its frames carry, the
    conversation id, and the journal (kept entries, last seq, the highest seq lost to its bounds);
    and its model's context as host data (``models/duplex/context.py``: the token rows its KV
    can see, or the cascade's chat messages; None: the model keeps none, its context restarts
    empty), which the new replica's stage recomputes its KV from."""

    resume_token: str
    epoch: int
    conversation_id: str
    last_seq: int
    trimmed_to: int
    entries: tuple[Any, ...]  # realtime.protocols.duplex.journal.Entry
    model_context: Any = None  # models.duplex.context.TokenContext | models.duplex.cascade.ChatContext


@dataclass(frozen=True)
class WorldState:
    """A world session: its start command (seed, fps, format, pacing, first prompt), the sticky
    prompt and controls its last committed chunk left, its epoch, the chunks it sent, and the
    blocks its KV held at the last of them (``held``: each block's clean latent with the action
    and prompt it was generated under, the control history the model's context depends on;
    empty when they did not fit ``replicas.checkpoint_max_bytes``: the world then restarts from
    its seed)."""

    start: Any  # realtime.protocols.world.Start
    prompt: str | None
    controls: tuple[Any, ...]  # sessions.events.ControlInput
    epoch: int
    chunks: int
    held: tuple[Any, ...] = ()  # models.world.model.HeldBlock, in block order


@dataclass(frozen=True)
class RobotState:
    """A robot episode's real-time-chunking state: the last action chunk it was sent, the time
    that took, and when (``time.time()``: the restoring replica counts the steps executed since)."""

    actions: Any  # numpy array, the chunk as replied
    latency_s: float
    delivered_wall: float


def robot_key(episode: str) -> str:
    """The store key of a robot episode (openpi's ``session_id`` observation key)."""
    return f"robot-episode:{episode}"


def encode(state: object) -> bytes:
    return pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)


def decode(checkpoint: Checkpoint) -> Any:
    """The state of a checkpoint this cluster's replicas wrote (module docstring: trust)."""
    return pickle.loads(checkpoint.state)  # noqa: S301 - written by replicas only


def restoring(scope: Mapping[str, Any]) -> Checkpoint | None:
    """The checkpoint the session check found for the session a request names, if any."""
    return scope.get(CHECKPOINT_SCOPE_KEY)


class Checkpointer:
    """One replica's writer to the checkpoint store (module docstring). Loop-thread only."""

    def __init__(
        self, store: CheckpointStore, interval_s: float = 0.2, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.store = store
        self.interval_s = interval_s
        self._clock = clock
        self._keys: dict[str, str] = {}  # session id -> its store key
        self._seqs: dict[str, int] = {}  # store key -> the last seq put
        self._last: dict[str, float] = {}  # store key -> when it was last put
        self._timers: dict[str, tuple[asyncio.TimerHandle, str, Callable[[], object]]] = {}
        self._writes: dict[str, asyncio.Task] = {}  # store key -> its newest write in flight
        self._tasks: set[asyncio.Task] = set()
        self._retain = False
        self._too_large: set[str] = set()  # keys warned about

    def save(self, session_id: str, kind: str, build: Callable[[], object], key: str | None = None) -> None:
        """Checkpoint the session's state ``build()`` makes, now or when its interval ends."""
        key = key or session_id
        self._keys[session_id] = key
        if key in self._timers:
            return  # the armed timer builds the newest state
        wait = self._last.get(key, float("-inf")) + self.interval_s - self._clock()
        if wait > 0:
            loop = asyncio.get_running_loop()
            self._timers[key] = (loop.call_later(wait, self._timed, key), kind, build)
            return
        self._put(key, kind, build())

    def _timed(self, key: str) -> None:
        _, kind, build = self._timers.pop(key)
        try:
            state = build()
        except Exception as exc:  # noqa: BLE001 - the session ended meanwhile: nothing to keep
            log.debug("checkpoint skipped", extra={"key": key, "error": type(exc).__name__})
            return
        self._put(key, kind, state)

    def _put(self, key: str, kind: str, state: object) -> None:
        self._last[key] = self._clock()
        seq = self._seqs[key] = self._seqs.get(key, 0) + 1
        self._spawn(key, self._write(key, kind, seq, state, self._writes.get(key)))

    def _spawn(self, key: str, work: Any) -> None:
        task = asyncio.create_task(work, name="checkpoint")
        self._writes[key] = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _write(self, key: str, kind: str, seq: int, state: object, before: asyncio.Task | None) -> None:
        try:
            data = await asyncio.to_thread(encode, state)
            if before is not None:
                await asyncio.wait([before])  # in order per key: a delete never precedes a put
            await self.store.put(Checkpoint(key, kind, seq, data))
        except CheckpointTooLargeError as exc:
            if key not in self._too_large:  # once per session: its next puts are as large
                self._too_large.add(key)
                log.warning("checkpoint too large", extra={"key": key, "limit": exc.details.get("limit")})
        except Exception as exc:  # noqa: BLE001 - the store is down or slow: the session goes on
            log.warning("checkpoint not stored", extra={"key": key, "error": type(exc).__name__})

    async def _delete(self, key: str, before: asyncio.Task | None) -> None:
        try:
            if before is not None:
                await asyncio.wait([before])
            await self.store.delete(key)
        except Exception as exc:  # noqa: BLE001 - it expires by TTL instead
            log.warning("checkpoint not deleted", extra={"key": key, "error": type(exc).__name__})

    def adopt(self, checkpoint: Checkpoint, session_id: str | None = None) -> None:
        """This replica continues ``checkpoint``'s session: its next put follows its ``seq``."""
        self._seqs[checkpoint.session_id] = max(self._seqs.get(checkpoint.session_id, 0), checkpoint.seq)
        self._keys[session_id or checkpoint.session_id] = checkpoint.session_id

    async def load(self, key: str) -> tuple[Checkpoint, Any] | None:
        """The checkpoint under ``key`` and its state (decoded on a worker thread), or ``None``."""
        try:
            checkpoint = await self.store.get(key)
        except Exception as exc:  # noqa: BLE001 - no store answer: start fresh
            log.warning("checkpoint not loaded", extra={"key": key, "error": type(exc).__name__})
            return None
        if checkpoint is None:
            return None
        return checkpoint, await asyncio.to_thread(decode, checkpoint)

    def discard(self, session_id: str) -> None:
        """The session is closed for good: its checkpoint goes (unless :meth:`retain`)."""
        key = self._keys.pop(session_id, None)
        if key is None:
            return
        armed = self._timers.pop(key, None)
        if armed is not None:
            armed[0].cancel()
        if self._retain:
            return
        self._seqs.pop(key, None)
        self._last.pop(key, None)
        self._too_large.discard(key)
        self._spawn(key, self._delete(key, self._writes.get(key)))
        self._writes.pop(key, None)

    def retain(self) -> None:
        """From now on a closed session keeps its checkpoint (the replica drains: its sessions
        resume elsewhere)."""
        self._retain = True

    async def flush(self) -> None:
        """Put every armed save now and wait for every write (drain, before the sockets close)."""
        for key, (timer, _, _) in list(self._timers.items()):
            timer.cancel()
            self._timed(key)
        while self._tasks:
            await asyncio.wait(set(self._tasks))
