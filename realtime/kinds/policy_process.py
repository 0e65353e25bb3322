"""A robot policy built, warmed up and run in a child process of its own (``robot.process``).

Why: a policy's forward on the CPU is hundreds of small torch ops, each releasing and retaking the
GIL. On a thread of the server's process it waits in ``take_gil`` whenever the event loop holds
the interpreter for a burst of connections (docs/reliability.md, "The robot policy in a process
of its own"). In a child process the loop cannot hold its interpreter.

The boundary is ``Policy.infer``, pure by contract: the stage (``models.policy.stage.PolicyStage``)
and its per-slot state stay in the server. :class:`ProcessPolicy` is the server's side: it holds
the policy's front (``Policy.front()``: ``spec``, ``prepare``, ``new_state``, sent back by the
child once it built the policy, so ``prepare`` has one implementation and no weights live in the
server) and sends ``infer`` / ``warmup`` calls to the child over one ``multiprocessing`` pipe.
Messages are pickled (protocol 5) with every array over :data:`INBAND_MAX_BYTES` sent out of band
as its own frame, straight from its memory: no copy into the pickle, none out of it (the
receiver's arrays are read-only views of the received bytes, as decoded wire arrays are). An
array that is a permuted view of contiguous memory (ALOHA's cameras: channel-first on the wire,
served as a transposed view) travels as that memory and the permutation: pickling such a view
copied it element by element, 2 ms a camera on the dev CPU. Its ``device`` is ``"cpu"``: the
stage's worker thread only waits on the pipe and never touches the accelerator the child owns
(``served_device``).

The child (:func:`serve_policy`, ``spawn`` context) ignores SIGINT and SIGTERM (the server's
shutdown owns it), answers one call at a time, and exits on a close message or on the pipe's EOF
(the server is gone). An exception the child's call raises comes back as itself when it pickles,
else as :class:`PolicyCallError` with its type and message. A child that dies (killed, crashed)
fails the call in hand and every later one with
:class:`~sessions.engine.errors.StageWorkerDiedError`, which ends the stage's worker thread: its
sessions get typed errors and ``/readyz`` answers 503 (``sessions.engine.worker.dead_workers``).
A child that dies while no call runs is found by a watcher (:meth:`ProcessPolicy.watch`), which
hands the worker the same error through a job.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import threading
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from multiprocessing.util import Finalize
from typing import Any

import numpy as np

from models.policy.interface import Policy, PolicyFront, PolicySpec, PolicyState
from sessions.engine.errors import EngineClosedError, StageWorkerDiedError
from sessions.engine.worker import DeviceWorker

CLOSE = None  # the message that ends the child
CLOSE_TIMEOUT_S = 5.0  # a child that has not exited this long after the close message is killed
INBAND_MAX_BYTES = 64 << 10  # larger arrays (camera images) go out of band, as frames of their own


def _permuted(base: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    return base.transpose(axes)


class _Pickler(pickle.Pickler):
    """Protocol 5; an array that is a permuted view of C-contiguous memory pickles as that memory
    (out of band when large) plus the axes that restore its view."""

    def reducer_override(self, obj: Any) -> Any:
        if (
            type(obj) is np.ndarray
            and obj.ndim > 1
            and not (obj.flags.c_contiguous or obj.flags.f_contiguous)
        ):
            order = tuple(int(i) for i in np.argsort([-stride for stride in obj.strides], kind="stable"))
            contiguous = obj.transpose(order)
            if contiguous.flags.c_contiguous:
                return _permuted, (contiguous, tuple(int(i) for i in np.argsort(order)))
        return NotImplemented


def _send(conn: Connection, message: Any) -> None:
    """One message: its pickle (the count of out-of-band frames first), then those frames."""
    frames: list[pickle.PickleBuffer] = []

    def out_of_band(buffer: pickle.PickleBuffer) -> bool:  # False: this one goes out of band
        if buffer.raw().nbytes <= INBAND_MAX_BYTES:
            return True
        frames.append(buffer)
        return False

    head = io.BytesIO()
    head.write(b"\0\0\0\0")
    _Pickler(head, protocol=5, buffer_callback=out_of_band).dump(message)
    view = head.getbuffer()
    view[:4] = len(frames).to_bytes(4, "little")
    conn.send_bytes(view)
    del view
    for frame in frames:
        conn.send_bytes(frame.raw())


def _recv(conn: Connection) -> Any:
    """The message :func:`_send` sent (raises EOFError once the other end is gone)."""
    head = conn.recv_bytes()
    frames = [conn.recv_bytes() for _ in range(int.from_bytes(head[:4], "little"))]
    return pickle.loads(memoryview(head)[4:], buffers=frames)


class PolicyCallError(RuntimeError):
    """The child's call raised an exception that does not pickle: its type name and message."""


def _portable(exc: Exception) -> Exception:
    """``exc`` itself when it survives pickling, else a :class:`PolicyCallError` naming it."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:  # noqa: BLE001 - any failure to pickle or rebuild means: send its account
        return PolicyCallError(f"{type(exc).__name__}: {exc}")
    return exc


def serve_policy(conn: Connection, build: Callable[[Any], Policy], config: Any) -> None:
    """The child's main: ``build(config)``, send ``("ok", (front, device))`` (or ``("raised",
    exc)``), then answer ``(op, args)`` calls (``infer``, ``warmup``) until :data:`CLOSE` or EOF."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        policy = build(config)
    except Exception as exc:  # noqa: BLE001 - the server's load reports it
        _send(conn, ("raised", _portable(exc)))
        return
    _send(conn, ("ok", (policy.front(), policy.device)))
    calls = {"infer": policy.infer, "warmup": policy.warmup}
    while True:
        try:
            job = _recv(conn)
        except EOFError:  # the server is gone
            return
        if job is CLOSE:
            return
        op, args = job
        try:
            reply = ("ok", calls[op](*args))
        except Exception as exc:  # noqa: BLE001 - the caller's (the stage engine bisects)
            reply = ("raised", _portable(exc))
        _send(conn, reply)


def _stop_child(conn: Connection, process: multiprocessing.process.BaseProcess, timeout_s: float) -> None:
    """Send :data:`CLOSE`, close the pipe, wait ``timeout_s`` for the child, then kill it."""
    with contextlib.suppress(OSError):
        _send(conn, CLOSE)
    conn.close()
    process.join(timeout_s)
    if process.is_alive():
        process.kill()
        process.join(1.0)


class ProcessPolicy:
    """A :class:`~models.policy.interface.Policy` whose forwards run in a child process (see the
    module docstring). Built on the server's load thread; blocks until the child built the policy
    (its exception re-raised here) or exited."""

    device = "cpu"  # the stage's worker thread waits on the pipe; the child owns the model's device

    def __init__(self, build: Callable[[Any], Policy], config: Any, *, name: str = "policy") -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conn, child_end = ctx.Pipe()
        self.process = ctx.Process(
            target=serve_policy, args=(child_end, build, config), name=name, daemon=True
        )
        self.process.start()
        child_end.close()  # the child's end lives in the child alone: its death is our EOF
        self._lock = threading.Lock()  # one call on the pipe at a time
        self._died: str | None = None
        self._closing = False
        # Runs at close() or, before multiprocessing joins its children, at interpreter exit
        # (the child ignores SIGTERM, so the join would otherwise wait for an EOF never sent).
        self._stop = Finalize(self, _stop_child, (self._conn, self.process, CLOSE_TIMEOUT_S), exitpriority=10)
        try:
            front, self.served_device = self._call(None)
        except StageWorkerDiedError as exc:
            raise RuntimeError(f"the policy's process exited while loading ({exc})") from None
        self._front: PolicyFront = front
        self.spec: PolicySpec = front.spec

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def front(self) -> PolicyFront:
        return self._front

    def prepare(self, observation: Any) -> Any:
        return self._front.prepare(observation)

    def new_state(self) -> PolicyState:
        return self._front.new_state()

    def infer(self, batch: Sequence[Any], snapshots: Sequence[Any]) -> list[np.ndarray]:
        return self._call("infer", list(batch), list(snapshots))

    def warmup(self, max_batch: int) -> None:
        self._call("warmup", max_batch)

    def watch(self, worker: DeviceWorker) -> None:
        """On the event loop, once serving: a child that exits before :meth:`close`, even while
        no forward runs, ends ``worker`` as a forward would (its next job is :meth:`check`), so
        ``/readyz`` answers 503 at once. A watcher thread waits for the exit."""
        loop = asyncio.get_running_loop()

        def post() -> None:
            with contextlib.suppress(EngineClosedError):  # stopped, or already dead of a forward
                worker.post(self.check, (), lambda _result, _error: None)

        def wait() -> None:
            multiprocessing.connection.wait([self.process.sentinel])
            if self._closing:
                return
            # The sentinel fires as the dying child closes its files, a moment before it exits;
            # until then is_alive() still says True and check() would find it alive. Wait for the
            # exit without reaping it (WNOWAIT): the threads that read its exit code reap it.
            with contextlib.suppress(ChildProcessError):  # already reaped
                os.waitid(os.P_PID, self.process.pid, os.WEXITED | os.WNOWAIT)
            with contextlib.suppress(RuntimeError):  # the loop is closed: the server is gone
                loop.call_soon_threadsafe(post)

        threading.Thread(target=wait, name=f"{self.process.name}-watch", daemon=True).start()

    def check(self) -> None:
        """Raise :class:`StageWorkerDiedError` once the child is gone (a job for the stage's worker)."""
        if self.process.is_alive():
            return
        with self._lock:
            self._died = self._died or self._death()
        raise StageWorkerDiedError(self._died)

    def close(self) -> None:
        """End the child (close message, then a kill after :data:`CLOSE_TIMEOUT_S`); idempotent.
        Blocking: call it off the event loop, after the stage's worker stopped."""
        self._closing = True
        self._stop()

    def _call(self, op: str | None, *args: Any) -> Any:
        """One call's reply (``op`` None: the child's first message); raises what the child's call
        raised, or :class:`StageWorkerDiedError` once the child is gone."""
        with self._lock:
            if self._died is None:
                try:
                    if op is not None:
                        _send(self._conn, (op, args))
                    status, value = _recv(self._conn)
                except (EOFError, OSError):
                    self._died = self._death()
            if self._died is not None:
                raise StageWorkerDiedError(self._died)
        if status == "raised":
            raise value
        return value

    def _death(self) -> str:
        """How the child ended (it is gone: the pipe broke)."""
        self.process.join(1.0)
        code = self.process.exitcode
        how = (
            "still running"
            if code is None
            else f"killed by signal {-code}"
            if code < 0
            else f"exit code {code}"
        )
        return f"policy process {self.process.name} (pid {self.process.pid}) died: {how}"
