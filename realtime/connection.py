"""The connection skeleton every session kind runs on (architecture §2, §3).

One :class:`Connection` per accepted websocket. A kind supplies a :class:`KindHandler` (its
sans-I/O codec calls, its command handler and its tick loop); the skeleton owns everything else:

- **Tasks.** A *reader* (websocket -> ``handler.decode`` -> command), a *runner* and a *writer*.
  The runner is the session's single owner (architecture invariant 2): every session call and
  every piece of per-connection kind state is touched only from ``handler.handle(conn, item)``,
  one mailbox item at a time. Slow work (a tick) runs as a child task the runner spawns with
  :meth:`Connection.spawn`; its outcome comes back to the runner as a mailbox item. A
  request/response kind (``handler.inline``, the robot) has no separate runner: the reader task
  handles each command before it reads the next frame (the websocket is the mailbox), so a client
  cannot queue work and replies leave in request order.
- **Outbound.** One bounded queue (:class:`Outbound`, ``max_items`` and ``max_bytes``) drained by
  the writer. An item may carry an epoch of the connection's session (``Session.epoch``: an
  interrupt, reset, failure or close bumps it); an item of a superseded epoch is dropped before it
  is sent, so a barge-in is one call (``session.interrupt()``) and nothing of the old epoch
  follows it. Items without an epoch (acks, errors, goodbyes) are always sent. Media that is
  still being produced travels as a *deferred* item whose frames the writer awaits in order. A client that does not read: once the
  queued bytes exceed the bound, or a send (or a wait for room in the queue) has waited
  ``send_wait_s`` for the client, the connection ends with ``slow_consumer`` (1008).
- **Ends.** Every way a connection ends is one :class:`Close` reason, mapped through one table
  (:data:`CLOSES`) to a close code and reason text. The socket is closed with a deadline, then its
  transport aborted if the close frame cannot be flushed. The session is released through the
  runtime's one release path (``manager.disconnect``) whatever happened, unless the connection
  no longer owns it (a resume moved it to another connection) or the socket dropped and the
  kind's manager keeps dropped sessions for a resume (``resume_grace_s``: it detaches them),
  unless every frame the socket sent was invalid (below).
- **Invalid frames.** :attr:`Connection.frames` (``realtime.frame_budget``) counts the frames a
  kind's reader judged (the kind calls ``conn.frames.note`` as it decodes: only the kinds with a
  ``max_invalid_frames`` setting do), and a frame the transport refused (the socket ended 1007 or
  1009) as one more invalid frame. A socket that sent frames but never a valid one is no client of
  the kind's protocol: its drop releases the session instead of keeping it for a resume. The
  kind ends the connection when ``note`` says the budget is used up.
- **Start deadline.** A socket that has not started a session within ``start_timeout_s`` ends with
  ``start_timeout`` (1008).
- **Errors.** An unexpected exception in a kind is one rate-limited ERROR line with the traceback
  in the log and close 1011 ``internal server error`` on the wire; routine ends are INFO lines
  with the close code and reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketDisconnected, WebSocketState

from realtime.connections import TRANSPORT_EXTENSION
from realtime.frame_budget import InvalidFrameBudget
from realtime.logs import log_internal_error
from realtime.ws import CloseCode, close_quietly
from sessions.log_context import current_session_id
from sessions.manager import QueuePositionFn, SessionManager
from sessions.runner import SessionRunner
from sessions.session import Session

log = logging.getLogger("realtime.connection")


@dataclass(frozen=True)
class MediaIn:
    """Media that a transport other than a websocket (a WebRTC call, ``realtime.webrtc``) hands
    the reader in order with its events: ``samples``, 16 kHz mono float32 microphone audio."""

    samples: Any  # numpy.ndarray


Frame = str | bytes
#: Close reasons -> (close code, reason text). Texts may use ``{message}`` and the limits passed
#: to :meth:`Connection.end`. ``disconnect`` (the client went away) sends no close frame.
CLOSES: dict[str, tuple[CloseCode, str]] = {
    "client_close": (CloseCode.NORMAL, "session closed"),
    "shutdown": (CloseCode.GOING_AWAY, "server shutting down"),
    "idle": (CloseCode.POLICY_VIOLATION, "idle timeout: no request for {idle_timeout_s:g} s"),
    "lifetime": (CloseCode.POLICY_VIOLATION, "maximum session lifetime reached"),
    "evicted": (CloseCode.POLICY_VIOLATION, "session evicted to make room"),
    "closed": (CloseCode.POLICY_VIOLATION, "session closed: {message}"),
    "capacity": (CloseCode.TRY_AGAIN_LATER, "{message}"),
    "protocol": (CloseCode.POLICY_VIOLATION, "{message}"),
    "protocol_fatal": (CloseCode.INTERNAL_ERROR, "{message}"),
    "internal": (CloseCode.INTERNAL_ERROR, "internal server error"),
    "slow_consumer": (CloseCode.POLICY_VIOLATION, "client is not reading: over {max_bytes} bytes queued"),
    "send_timeout": (CloseCode.POLICY_VIOLATION, "client is not reading: a send waited {send_wait_s:g} s"),
    "start_timeout": (CloseCode.POLICY_VIOLATION, "no session started within {start_timeout_s:g} s"),
}
CLOSE_FLUSH_S = 2.0  # how long a close frame may wait for a client's write buffer before abort
#: Close codes of a socket that ended on a frame refused by the transport (invalid UTF-8, too big).
REFUSED_FRAME_CLOSES = (CloseCode.INVALID_DATA, CloseCode.MESSAGE_TOO_BIG)


class _Fields(dict):
    """Close-text fields; one a text names but nobody passed renders as ``?``, never raises."""

    def __missing__(self, key: str) -> str:
        return "?"


@dataclass(frozen=True)
class Close:
    """Why a connection ends: a :data:`CLOSES` key (or ``disconnect``) and its text's fields."""

    reason: str
    message: str = ""


class KindHandler(Protocol):
    """What a session kind supplies per connection (see the module docstring)."""

    #: Request/response: commands are handled in the reader task, the next frame read after.
    inline: bool

    async def opened(self, conn: Connection) -> None:
        """After accept, before the first frame is read (send a greeting, check the query)."""
        ...

    async def decode(self, message: Frame | MediaIn) -> Any:
        """One websocket message -> one command (the codec's typed result, never raises). On a
        WebRTC call (``realtime.webrtc.call``) the message may also be the call's microphone audio."""
        ...

    async def handle(self, conn: Connection, item: Any) -> None:
        """One command, or an item the handler posted itself (tick outcomes, timers)."""
        ...

    async def session_ended(self, conn: Connection, reason: str) -> Close:
        """The runtime closed the session (idle, lifetime, eviction, shutdown); say goodbye. It is
        the last word: from its start, nothing the client sends or the kind posts is handled."""
        ...


class SlowConsumerError(Exception):
    """The client does not read: queued outbound bytes exceed the bound (``slow_consumer``), or a
    send waited ``send_wait_s`` for it (``send_timeout``); ``reason`` is the :data:`CLOSES` key."""

    def __init__(self, message: str, reason: str = "slow_consumer") -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(eq=False, slots=True)
class _Out:
    frames: tuple[Frame, ...]
    size: int
    epoch: int | None
    deferred: Awaitable[tuple[Frame, ...]] | None
    on_done: Callable[[], None] | None


class Outbound:
    """The connection's bounded outbound queue and its single writer (see the module docstring)."""

    def __init__(
        self,
        websocket: WebSocket,
        *,
        max_items: int,
        max_bytes: int,
        current_epoch: Callable[[], int],
        direct: bool = False,
        send_wait_s: float = 30.0,
    ) -> None:
        self.ws = websocket
        self.direct = direct
        self.send_wait_s = send_wait_s
        #: When the send (or wait for room) in progress began; None while nothing waits on the client.
        self.blocked_since: float | None = None
        self.max_items = max_items
        self.max_bytes = max_bytes
        self._current_epoch = current_epoch
        self._items: deque[_Out] = deque()
        self._bytes = 0
        self._wake = asyncio.Event()
        self._room = asyncio.Event()
        self._writing = False
        self._empty = asyncio.Event()
        self._empty.set()

    @property
    def queued_bytes(self) -> int:
        return self._bytes

    async def send(self, *frames: Frame, epoch: int | None = None) -> None:
        """Queue frames (waits while ``max_items`` are queued); raises :class:`SlowConsumerError`.

        With ``direct`` (request/response kinds, whose caller may wait on the client) and nothing
        queued or being written, the caller writes them itself: no hand-off to the writer task.
        """
        if self.direct and not self._items and not self._writing:
            # Nothing is queued or written, so nothing else is held up on the client: this send is
            # the outermost (see _bounded), stamped inline (every robot reply passes here).
            self._writing = True
            self._empty.clear()
            self.blocked_since = time.monotonic()
            try:
                for frame in frames:
                    await self._write(frame)
            finally:
                self.blocked_since = None
                self._writing = False
                self._settle()
            return
        await self._put(_Out(frames, sum(map(len, frames)), epoch, None, None))

    async def send_later(
        self,
        deferred: Awaitable[tuple[Frame, ...]],
        *,
        epoch: int | None = None,
        on_done: Callable[[], None] | None = None,
    ) -> None:
        """Queue frames still being produced (media); the writer awaits them in order.

        ``on_done`` runs once the item was sent or dropped (a kind's generate-ahead credit).
        """
        await self._put(_Out((), 0, epoch, deferred, on_done))

    async def drained(self) -> None:
        """Wait until everything queued so far was written or dropped."""
        await self._empty.wait()

    async def run(self) -> None:
        """The writer task: send items in order until cancelled or the client goes away."""
        while True:
            while not self._items:
                self._wake.clear()
                await self._wake.wait()
            item = self._items.popleft()
            self._writing = True
            self._room.set()
            try:
                await self._send_item(item)
            finally:
                self._bytes -= item.size
                self._writing = False
                if item.on_done is not None:
                    item.on_done()
                self._settle()

    async def _send_item(self, item: _Out) -> None:
        frames = item.frames
        if item.epoch is not None and item.epoch != self._current_epoch():
            frames = ()
            _discard(item.deferred)
        elif item.deferred is not None:
            frames = await item.deferred
            if item.epoch is not None and item.epoch != self._current_epoch():
                frames = ()  # superseded while it was produced: never shown
        with self._bounded():  # the media's own production time does not count
            for frame in frames:
                await self._write(frame)

    async def _write(self, frame: Frame) -> None:
        if isinstance(frame, str):
            await self.ws.send_text(frame)
        else:
            await self.ws.send_bytes(frame)

    def _bounded(self) -> _HeldUp:
        """Marks a send (or a wait for room) as held up by the client while it lasts; the
        connection's watchdog ends a connection whose send is held up over ``send_wait_s``
        (a timestamp per send, not a timer: this is on the robot's hot path)."""
        return _HeldUp(self)

    async def _put(self, item: _Out) -> None:
        if len(self._items) >= self.max_items:
            with self._bounded():
                while len(self._items) >= self.max_items:
                    self._room.clear()
                    await self._room.wait()
        if self._bytes + item.size > self.max_bytes:
            raise SlowConsumerError(f"{self._bytes + item.size} bytes queued")
        self._items.append(item)
        self._bytes += item.size
        self._empty.clear()
        self._wake.set()

    def discard(self) -> None:
        """Drop everything still queued (the connection is gone): deferred work is closed."""
        while self._items:
            item = self._items.popleft()
            _discard(item.deferred)
            if item.on_done is not None:
                item.on_done()
        self._bytes = 0
        self._settle()

    def _settle(self) -> None:
        if not self._items and not self._writing:
            self._empty.set()


class _HeldUp:
    """``Outbound._bounded``'s context manager: the outermost one (a write inside a wait for room
    is nested) stamps ``blocked_since`` and clears it. A plain class: a ``contextlib`` generator
    costs a few µs per send, and every robot reply is a send."""

    __slots__ = ("outbound", "outer")

    def __init__(self, outbound: Outbound) -> None:
        self.outbound = outbound
        self.outer = False

    def __enter__(self) -> None:
        if self.outbound.blocked_since is None:
            self.outer = True
            self.outbound.blocked_since = time.monotonic()

    def __exit__(self, *exc_info: object) -> None:
        if self.outer:
            self.outbound.blocked_since = None


def _discard(deferred: Awaitable[Any] | None) -> None:
    """Drop a deferred item unsent: a coroutine is closed, a future's outcome marked retrieved."""
    if asyncio.iscoroutine(deferred):
        deferred.close()
    elif isinstance(deferred, asyncio.Future):
        deferred.cancel()


class Connection:
    """One accepted websocket running one kind's handler (see the module docstring)."""

    def __init__(
        self,
        websocket: WebSocket,
        handler: KindHandler,
        manager: SessionManager,
        *,
        kind: str,
        mailbox_items: int,
        max_outbound_items: int,
        max_outbound_bytes: int,
        start_timeout_s: float,
        send_wait_s: float = 30.0,
        close_fields: dict[str, Any] | None = None,
        max_invalid_frames: int = 0,
    ) -> None:
        self.ws = websocket
        self.kind = kind
        self.handler = handler
        self.manager = manager
        self.session: Session | None = None
        self._admitting = False  # waiting in the admission queue: the start deadline does not apply
        self.frames = InvalidFrameBudget(max_invalid_frames)
        self.outbound = Outbound(
            websocket,
            max_items=max_outbound_items,
            max_bytes=max_outbound_bytes,
            current_epoch=self._session_epoch,
            direct=handler.inline,
            send_wait_s=send_wait_s,
        )
        #: ``await conn.send_later(deferred, epoch=, on_done=)``: frames still being produced
        #: (media), awaited in order by the writer (:meth:`Outbound.send_later`).
        self.send_later = self.outbound.send_later
        self.start_timeout_s = start_timeout_s
        self._close_fields = {
            "max_bytes": max_outbound_bytes,
            "send_wait_s": send_wait_s,
            "start_timeout_s": start_timeout_s,
            **(close_fields or {}),
        }
        self._close: Close | None = None
        self._ended = asyncio.Event()
        #: The runtime ended the session and the kind says goodbye: its goodbye is the last word,
        #: so nothing read or posted after is handled. ``end()`` alone comes too late: the goodbye
        #: runs as wait_for's own task, and the runner could answer in between (an append refused
        #: by the closing session, after the voice kind's ``session_expired``).
        self._saying_goodbye = False
        self._children: set[asyncio.Task] = set()
        self._runner: SessionRunner | None = None
        if not handler.inline:
            self._runner = SessionRunner(self._handle, mailbox_size=mailbox_items, session_id=kind)

    def _session_epoch(self) -> int:
        """What the outbound queue fences with: the session's one epoch (0 before it exists)."""
        session = self.session
        return session.epoch if session is not None else 0

    # -- what handlers call ---------------------------------------------------------------
    async def create_session(
        self, on_queue_position: QueuePositionFn | None = None, session_id: str | None = None
    ) -> Session:
        """Admit the connection's session (raises ``SessionError``: capacity, shutdown). While it
        waits in the admission queue (``runtime.over_capacity: queue``) ``on_queue_position(n)``
        hears its 1-based position and the start deadline does not apply (the queue has its own).
        ``session_id``: a session restored from a checkpoint keeps its id (else a new one)."""
        self._admitting = True
        try:
            created = await self.manager.create(session_id, on_queue_position=on_queue_position)
            return self.adopt(created)
        finally:
            self._admitting = False

    def adopt(self, session: Session) -> Session:
        """Make ``session`` this connection's (its owner: ``SessionManager.attach``): a new one,
        or one that outlived its socket (a resume; a connection still attached to it must stop
        touching it: the kind tells it)."""
        self.session = self.manager.attach(session, self)
        watcher = asyncio.create_task(self._watch(session), name=f"{self.kind}-session-end")
        self._children.add(watcher)
        watcher.add_done_callback(self._children.discard)
        return session

    async def send(self, *frames: Frame, epoch: int | None = None) -> None:
        """Queue frames for the client (see :class:`Outbound`); with ``epoch`` (a tick's, or
        ``session.epoch``) they are dropped unsent once the session's epoch moved past it."""
        await self.outbound.send(*frames, epoch=epoch)

    def post(self, item: Any) -> None:
        """Hand an item to the runner (from a child task, a timer or the writer's ``on_done``)."""
        if self._runner is not None and not self._ended.is_set():
            self._runner.post(item)

    def spawn(self, work: Coroutine[Any, Any, Any], done: Callable[[Any, BaseException | None], Any]) -> None:
        """Run ``work`` as a child task; ``done(result, error)`` is then posted to the runner.

        ``work`` is the task's own coroutine, so a child cancelled before its first step (the
        connection ended first) closes it: no coroutine is left never awaited."""
        task = asyncio.create_task(work, name=f"{self.kind}-child")
        self._children.add(task)
        task.add_done_callback(functools.partial(self._child_done, done))

    def _child_done(self, done: Callable[[Any, BaseException | None], Any], task: asyncio.Task) -> None:
        self._children.discard(task)
        if task.cancelled():
            return
        error = task.exception()
        if error is None:
            self.post(done(task.result(), None))
        elif isinstance(error, Exception):
            self.post(done(None, error))

    def end(self, reason: str, message: str = "") -> None:
        """End the connection with ``reason`` (a :data:`CLOSES` key); the first reason wins."""
        if self._close is None:
            self._close = Close(reason, message)
        self._ended.set()

    # -- the skeleton ---------------------------------------------------------------------
    async def run(self) -> None:
        tasks: list[asyncio.Task] = [
            asyncio.create_task(self._read(), name=f"{self.kind}-reader"),
            asyncio.create_task(self._write(), name=f"{self.kind}-writer"),
            asyncio.create_task(self._ended.wait(), name=f"{self.kind}-ended"),
        ]
        if self._runner is not None:
            self._runner.start()
        try:
            try:
                await self.handler.opened(self)
                if self._close is None and self.start_timeout_s > 0:
                    tasks.append(asyncio.create_task(self._start_deadline(), name=f"{self.kind}-start"))
                tasks.append(asyncio.create_task(self._send_watchdog(), name=f"{self.kind}-send-watchdog"))
                if self._close is None:
                    done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                    for task in done:
                        if not task.cancelled() and task.exception() is not None:
                            raise task.exception()
            except Exception as exc:
                self._internal_error(exc)
            finally:
                for task in (*tasks, *self._children):
                    task.cancel()
                if self._runner is not None:
                    await self._runner.cancel()
        finally:
            # Release at once (the session cuts a tick still unwinding), then let the tasks end.
            if self.session is not None:
                ended = (self._close or Close("disconnect")).reason
                dropped = ended == "disconnect" and not self.frames.refused_only
                await self.manager.disconnect(self.session.session_id, owner=self, dropped=dropped)
            await asyncio.gather(*tasks, *self._children, return_exceptions=True)
        await self._finish()

    async def _read(self) -> None:
        handler = self.handler
        while True:
            try:
                message = await self.ws.receive()
            except (WebSocketDisconnect, RuntimeError, OSError):
                break
            if message["type"] == "websocket.disconnect":
                if message.get("code") in REFUSED_FRAME_CLOSES:
                    self.frames.note(invalid=True)
                break
            frame: Frame | MediaIn | None
            if "media" in message:  # a WebRTC call's microphone audio, in order with its events
                frame = message["media"]
            elif (frame := message.get("bytes")) is None:
                frame = message.get("text") or ""
            command = await handler.decode(frame)
            if self._runner is None:
                await self._handle(command)
            else:
                await self._runner.put(command)
            if self._ended.is_set():
                return
        self.end("disconnect")

    async def _handle(self, item: Any) -> None:
        """The runner's step (or the reader's, for inline kinds): one item through the handler."""
        if self._ended.is_set() or self._saying_goodbye:
            return
        try:
            session = self.session
            if session is not None and current_session_id.get() != session.session_id:
                # Log lines carry the session id. Set once in the handling task's own context (it
                # lives as long as the connection), not entered and left on every item.
                current_session_id.set(session.session_id)
            await self.handler.handle(self, item)
        except SlowConsumerError as exc:
            self.end(exc.reason)
        except (WebSocketDisconnect, OSError):  # a direct send to a client that went away
            self.end("disconnect")
        except WebSocketDisconnected:  # a send after the server's shutdown drain closed it (1001)
            self.end("shutdown")
        except Exception as exc:
            self._internal_error(exc)

    async def _write(self) -> None:
        try:
            await self.outbound.run()
        except SlowConsumerError as exc:
            self.end(exc.reason)
        except (WebSocketDisconnect, RuntimeError, OSError):  # OSError: uvicorn's ClientDisconnected
            self.end("disconnect")  # the client went away mid-send

    async def _watch(self, session: Session) -> None:
        reason = await session.wait_closed()
        if reason in ("close", "disconnect") or self._ended.is_set():
            return  # the connection itself asked for it
        self._saying_goodbye = True
        try:  # the goodbye is bounded: a client that does not read cannot keep the connection
            close = await asyncio.wait_for(self.handler.session_ended(self, reason), CLOSE_FLUSH_S)
        except TimeoutError:
            close = runtime_close(reason)
        except SlowConsumerError as exc:
            close = Close(exc.reason)
        self.end(close.reason, close.message)

    async def _send_watchdog(self) -> None:
        """End the connection once a send has waited ``send_wait_s`` for the client."""
        outbound, limit = self.outbound, self.outbound.send_wait_s
        while not self._ended.is_set():
            await asyncio.sleep(limit / 4)
            since = outbound.blocked_since
            if since is not None and time.monotonic() - since >= limit:
                log.info("client is not reading", extra={"kind": self.kind, "waited_s": limit})
                self.end("send_timeout")

    async def _start_deadline(self) -> None:
        await asyncio.sleep(self.start_timeout_s)
        while self._admitting:
            await asyncio.sleep(self.start_timeout_s)
        if self.session is None:
            self.end("start_timeout")
        await self._ended.wait()  # finishing early would end the connection

    def _internal_error(self, exc: BaseException) -> None:
        session_id = self.session.session_id if self.session is not None else None
        log_internal_error(log, session_id, f"{self.kind} connection failed", exc)
        self.end("internal")

    async def _finish(self) -> None:
        """Flush what is queued (bounded), send the close frame (bounded), else abort."""
        close = self._close or Close("disconnect")
        try:
            await self._close_socket(close)
        finally:
            self.outbound.discard()

    async def _close_socket(self, close: Close) -> None:
        if close.reason == "disconnect":
            log.info("client disconnected", extra={"kind": self.kind})
            return
        code, text = CLOSES[close.reason]
        reason = text.format_map(_Fields(message=close.message, **self._close_fields))
        if close.reason not in ("slow_consumer", "send_timeout", "internal"):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._flush(), CLOSE_FLUSH_S)
        log.info("closing websocket", extra={"kind": self.kind, "code": int(code), "reason": reason})
        try:
            await asyncio.wait_for(close_quietly(self.ws, code, reason), CLOSE_FLUSH_S)
        except (TimeoutError, Exception):
            self._abort()

    async def _flush(self) -> None:
        writer = asyncio.create_task(self.outbound.run())
        try:
            await self.outbound.drained()
        finally:
            writer.cancel()
            await asyncio.gather(writer, return_exceptions=True)

    def _abort(self) -> None:
        transport = self.ws.scope.get("extensions", {}).get(TRANSPORT_EXTENSION)
        if transport is not None:
            transport.abort()
        elif self.ws.application_state == WebSocketState.CONNECTED:
            log.warning("cannot abort a websocket without a transport extension", extra={"kind": self.kind})


async def run_connection(
    websocket: WebSocket, ctx: Any, kind: str, handler: KindHandler, manager: SessionManager, **fields: Any
) -> None:
    """A kind's endpoint body: the skeleton with the server's connection limits."""
    server, runtime = ctx.config.server, ctx.config.runtime
    section = getattr(ctx.config, kind, None)
    fields = {"idle_timeout_s": getattr(section, "idle_timeout_s", 0), **fields}
    await Connection(
        websocket,
        handler,
        manager,
        kind=kind,
        mailbox_items=runtime.max_mailbox_items,
        max_outbound_items=server.max_outbound_messages,
        max_outbound_bytes=server.max_outbound_bytes,
        start_timeout_s=server.start_timeout_s,
        send_wait_s=server.max_send_wait_s,
        close_fields=fields,
        max_invalid_frames=getattr(section, "max_invalid_frames", 0),
    ).run()


def runtime_close(reason: str) -> Close:
    """The close for a session the runtime ended (idle, lifetime, eviction, shutdown, other)."""
    return Close(reason) if reason in ("idle", "lifetime", "evicted", "shutdown") else Close("closed", reason)
