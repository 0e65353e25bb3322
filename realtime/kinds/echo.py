"""The echo session kind: the smallest complete kind, and the worked example of
docs/adding-a-session-kind.md.

``/v1/realtime/echo``: the client sends text; each word streams back upper-cased, through a
two-stage pipeline — a self-scheduling streaming stage (``WordStream``) feeding a batched stage
(``Shout``, batched across sessions) — as one **streaming tick** per message
(``Session.stream_tick``: every chunk carries the tick's identity, the tick commits on its last
chunk). ``cancel`` interrupts the tick with one call (``Session.interrupt``: the session's epoch
moves on, the streaming stage's request is aborted, nothing is committed, and no delta of it
queued or made afterwards is sent). Disabled by default (``echo.enabled``).

The kind is only this file, its codec (``realtime/protocols/echo.py``) and its model
(``models/echo/stages.py``): connection plumbing, limits, close codes and release are the
skeleton's (``realtime.connection``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from starlette.routing import BaseRoute, WebSocketRoute
from starlette.websockets import WebSocket

from models.echo.stages import Shout, WordStream
from realtime.connection import Close, Connection, runtime_close
from realtime.kinds.base import KindServiceBase, ProgressFn, ServedModel, ServerContext
from realtime.kinds.runtime import build_session_manager, capacity_plan, stage_declaration
from realtime.protocols import echo as proto
from sessions.engine import Pipeline, StageEngine, StreamingStageEngine
from sessions.errors import SessionError, TickSupersededError
from sessions.executor import StageExecutor
from sessions.tick import TickChunk

PATH = "/v1/realtime/echo"


def echo_input(snapshot: Any) -> str:
    """The tick's input: the message text (the tick payload)."""
    return snapshot.payload


class EchoService(KindServiceBase):
    """The ``echo`` session kind (``realtime.kinds.base.SessionKindService``)."""

    name = "echo"

    def __init__(self, ctx: ServerContext) -> None:
        super().__init__(ctx)
        self.config = ctx.config.echo
        self.words = WordStream(self.config.word_delay_s)

    def routes(self) -> list[BaseRoute]:
        return [WebSocketRoute(PATH, self._endpoint)]

    def models(self) -> list[ServedModel]:
        return [ServedModel("echo", self.name, (PATH,), {"max_text_chars": self.config.max_text_chars})]

    def load(self, progress: ProgressFn) -> None:
        progress("ready", 1, 1)  # nothing to load

    async def start(self) -> None:
        registry = self.ctx.registry
        shout = Shout()
        self.runner = Pipeline(
            [StreamingStageEngine(self.words, registry=registry), StageEngine(shout, registry=registry)],
            registry=registry,
        )
        self.manager = build_session_manager(
            self.name,
            ctx=self.ctx,
            kind_config=self.config,
            plan=capacity_plan(
                self.ctx.config.runtime,
                stage_declaration(self.words, shout, max_sessions=self.config.max_sessions),
            ),
            executor=StageExecutor(self.runner, echo_input),
            lifecycle=self.runner,
        )
        await self.manager.start()

    async def _endpoint(self, websocket: WebSocket) -> None:
        await self.serve(websocket, _EchoHandler(self.config.max_text_chars))


@dataclass(frozen=True)
class _Done:
    chunk_index: int
    words: int
    error: BaseException | None


class _EchoHandler:
    """One echo connection (``KindHandler``): every attribute is the runner's alone."""

    inline = False

    def __init__(self, max_text_chars: int) -> None:
        self.max_text_chars = max_text_chars
        self.active = False  # a streaming tick is running

    async def opened(self, conn: Connection) -> None:
        try:
            session = await conn.create_session()
        except SessionError as exc:
            await conn.send(proto.render("error", code=exc.code, message=exc.message))
            conn.end("capacity", exc.message)
            return
        await conn.send(proto.render("session.created", session_id=session.session_id))

    async def decode(self, message: str | bytes) -> proto.Command:
        return proto.parse(message, self.max_text_chars)

    async def handle(self, conn: Connection, item: Any) -> None:
        session = conn.session
        assert session is not None
        if isinstance(item, proto.Rejected):
            await conn.send(proto.render("error", code=item.code, message=item.message))
        elif isinstance(item, proto.Echo):
            if self.active:
                await conn.send(proto.render("error", code="busy", message="an echo is already streaming"))
                return
            self.active = True
            ticks = session.stream_tick(item.text)  # requested now: a cancel from here on stops it
            conn.spawn(self._stream(conn, ticks), lambda result, error: result or _Done(-1, 0, error))
        elif isinstance(item, proto.Cancel):
            if not self.active:
                await conn.send(proto.render("error", code="not_active", message="no echo is streaming"))
                return
            session.interrupt()  # the one call: nothing of the echo is committed or sent after it
        elif isinstance(item, _Done):
            self.active = False
            if item.error is None:
                await conn.send(proto.render("echo.done", chunk_index=item.chunk_index, words=item.words))
            elif isinstance(item.error, TickSupersededError):
                await conn.send(proto.render("echo.cancelled", chunk_index=item.chunk_index))
            elif isinstance(item.error, SessionError):
                await conn.send(proto.render("error", code=item.error.code, message=item.error.message))
            else:
                raise item.error  # a bug: the skeleton logs it and closes 1011

    async def session_ended(self, conn: Connection, reason: str) -> Close:
        return runtime_close(reason)

    async def _stream(self, conn: Connection, ticks: AsyncIterator[TickChunk]) -> _Done:
        """The streaming tick, as the runner's child task: each word goes out as it arrives,
        fenced by the tick's epoch."""
        session = conn.session
        assert session is not None
        chunk_index, words = session.chunk_index, 0
        try:
            async for chunk in ticks:
                words += 1
                meta = chunk.metadata
                await conn.send(
                    proto.render("echo.delta", chunk_index=meta.chunk_index, seq=chunk.seq, text=chunk.value),
                    epoch=chunk.epoch,
                )
        except SessionError as exc:
            return _Done(chunk_index, words, exc)
        return _Done(chunk_index, words, None)


def build_echo_service(ctx: ServerContext) -> EchoService:
    return EchoService(ctx)
