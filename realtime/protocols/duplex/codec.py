"""The sans-I/O codec of one duplex connection: the OpenAI codec plus the duplex events.

:class:`DuplexCodec` is a :class:`~realtime.protocols.oai_realtime.RealtimeCodec` (same dialect
handling, size limit, strict JSON, typed ``Rejected`` for every malformed event, never raises):
``type`` values of :data:`~.commands.PARSERS` parse as duplex commands, the rest as OpenAI
events. With Ogg/Opus negotiated, a binary frame is an :class:`~.commands.OpusAppend`; otherwise
it is refused (``unexpected_binary``). What a duplex session does not take is refused here too
(``unsupported_feature``): the OpenAI events of :data:`UNSUPPORTED` (the model decides when to
speak; history follows ``playback.ack``), and a ``session.update`` to an audio format other than
pcm16 (the session's config is then left as it was).

:meth:`DuplexCodec.frame` writes any server event (OpenAI's or duplex's) with ``epoch`` and
``server_event_seq`` added at the top level.
"""

from __future__ import annotations

from typing import Any

from realtime.protocols.oai_realtime import CodecOptions, Dialect, RealtimeCodec, SessionConfig
from realtime.protocols.oai_realtime.client_events import SessionUpdate
from realtime.protocols.oai_realtime.errors import ErrorCode, ParamError
from realtime.protocols.oai_realtime.fields import Obj
from realtime.protocols.oai_realtime.server_events import ServerEvent, type_name
from realtime.protocols.oai_realtime.session_config import AudioFormat
from realtime.protocols.oai_realtime.wire import dumps, new_id

from .commands import PARSERS, OpusAppend

#: OpenAI client events a duplex session refuses, and how the error names them.
UNSUPPORTED = {
    "response.create": "response.create (the duplex model decides when to speak)",
    "conversation.item.create": "conversation.item.create",
    "conversation.item.delete": "conversation.item.delete",
    "conversation.item.truncate": "conversation.item.truncate (send playback.ack)",
}
PCM16_ONLY = "Duplex sessions take pcm16 at 24 kHz (or Ogg/Opus negotiated at connect)."


class DuplexCodec(RealtimeCodec):
    def __init__(
        self, dialect: Dialect, config: SessionConfig, options: CodecOptions, *, opus_input: bool = False
    ) -> None:
        super().__init__(dialect, config, options)
        self.opus_input = opus_input

    def receive_bytes(self, data: bytes) -> Any:
        return OpusAppend(data) if self.opus_input else super().receive_bytes(data)

    def _dispatch(self, raw: dict, event_id: str | None) -> Any:
        kind = raw.get("type") if isinstance(raw.get("type"), str) else None
        if kind in UNSUPPORTED:
            message = f"{UNSUPPORTED[kind]} is not supported in a duplex session."
            raise ParamError(ErrorCode.UNSUPPORTED, message, "type")
        parser = PARSERS.get(kind) if kind is not None else None
        if parser is None:
            return super()._dispatch(raw, event_id)
        o = Obj(raw, "")
        o.ignore("type", "event_id")
        command = parser(o, event_id, self.options.limits)
        o.done()
        return command

    def _session_update(self, o: Obj, event_id: str | None) -> SessionUpdate:
        update = super()._session_update(o, event_id)
        pcm16 = AudioFormat.PCM16
        if update.config.input_format is not pcm16 or update.config.output_format is not pcm16:
            self.config = update.previous
            raise ParamError(ErrorCode.UNSUPPORTED, PCM16_ONLY, "session")
        return update

    def frame(self, event: ServerEvent, *, epoch: int, seq: int) -> str | None:
        """``event`` as a text frame in this connection's dialect (``None``: the dialect lacks it)."""
        name = type_name(event.TYPE, self.dialect)
        if name is None:
            return None
        body = event.body(self.dialect)
        return dumps(
            {"type": name, "event_id": new_id("event"), **body, "epoch": epoch, "server_event_seq": seq}
        )
