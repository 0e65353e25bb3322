"""The sans-I/O codec of one duplex connection: the OpenAI codec plus the duplex events.

:class:`DuplexCodec` is a :class:`~realtime.protocols.oai_realtime.RealtimeCodec` (same dialect
handling, size limit, strict JSON, typed ``Rejected`` for every malformed event, never raises):
``type`` values of :data:`~.commands.PARSERS` parse as duplex commands, the rest as OpenAI
events. With Ogg/Opus negotiated, a binary frame is an :class:`~.commands.OpusAppend`; otherwise
it is refused (``unexpected_binary``).

:meth:`DuplexCodec.frame` writes any server event (OpenAI's or duplex's) with ``epoch`` and
``server_event_seq`` added at the top level.
"""

from __future__ import annotations

from typing import Any

from realtime.protocols.oai_realtime import CodecOptions, Dialect, RealtimeCodec, SessionConfig
from realtime.protocols.oai_realtime.fields import Obj
from realtime.protocols.oai_realtime.server_events import ServerEvent, type_name
from realtime.protocols.oai_realtime.wire import dumps, new_id

from .commands import PARSERS, OpusAppend


class DuplexCodec(RealtimeCodec):
    def __init__(
        self, dialect: Dialect, config: SessionConfig, options: CodecOptions, *, opus_input: bool = False
    ) -> None:
        super().__init__(dialect, config, options)
        self.opus_input = opus_input

    def receive_bytes(self, data: bytes) -> Any:
        return OpusAppend(data) if self.opus_input else super().receive_bytes(data)

    def _dispatch(self, raw: dict, event_id: str | None) -> Any:
        parser = PARSERS.get(raw.get("type")) if isinstance(raw.get("type"), str) else None
        if parser is None:
            return super()._dispatch(raw, event_id)
        o = Obj(raw, "")
        o.ignore("type", "event_id")
        command = parser(o, event_id, self.options.limits)
        o.done()
        return command

    def frame(self, event: ServerEvent, *, epoch: int, seq: int) -> str | None:
        """``event`` as a text frame in this connection's dialect (``None``: the dialect lacks it)."""
        name = type_name(event.TYPE, self.dialect)
        if name is None:
            return None
        body = event.body(self.dialect)
        return dumps(
            {"type": name, "event_id": new_id("event"), **body, "epoch": epoch, "server_event_seq": seq}
        )
