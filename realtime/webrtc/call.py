"""One WebRTC call as the connection skeleton sees it: an ASGI websocket over the call's parts.

The skeleton (``realtime.connection``) and the kind's handler run unchanged on a call: the call
hands them a Starlette ``WebSocket`` whose ASGI ``receive``/``send`` are the call's
(:meth:`Call.websocket`):

- **in**: each text message of the ``oai-events`` data channel is a ``websocket.receive`` text
  message; the microphone's audio (``realtime.webrtc.media.read_microphone``) arrives in the same
  ordered inbox as ``{"type": "websocket.receive", "media": MediaIn}``, which the skeleton's
  reader hands to ``handler.decode`` like a frame. The channel closing or the peer connection
  failing is ``websocket.disconnect``.
- **out**: text frames go on the data channel; bytes frames are the codec's *track frames*
  (``realtime.protocols.oai_realtime.track``): assistant audio, resampled to 48 kHz into the
  call's :class:`~realtime.webrtc.playout.Playout`, which the outgoing track plays.
  ``response.done`` marks the response's audio complete (``output_audio_buffer.stopped`` follows
  once it has played); ``websocket.close`` hangs up.

Bound: at most :data:`MAX_INBOX` items wait for the reader. Microphone audio that finds the inbox
full is dropped (a live stream cannot wait; counted in ``Call.dropped_audio``); an event that finds
it full ends the call, as an over-full websocket would.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import numpy as np
from starlette.websockets import WebSocket

from realtime.connection import MediaIn
from realtime.connections import TRANSPORT_EXTENSION, TransportControl
from realtime.protocols.oai_realtime import Dialect
from realtime.protocols.oai_realtime import server_events as ev
from realtime.protocols.oai_realtime.audio import decode_audio
from realtime.protocols.oai_realtime.track import frame_type, unpack
from realtime.webrtc.media import PlayoutTrack, Resampler
from realtime.webrtc.playout import RATE, Playout

log = logging.getLogger("realtime.webrtc")

CHANNEL_LABEL = "oai-events"
MAX_INBOX = 256
_DISCONNECT = {"type": "websocket.disconnect", "code": 1006}


class Call:
    """One call's transport state (owned by its task in ``realtime.webrtc.calls``)."""

    def __init__(self, call_id: str, dialect: Dialect, scope: dict[str, Any], max_playout_s: float) -> None:
        self.call_id = call_id
        self.dialect = dialect
        self.playout = Playout(max_playout_s)
        self.track = PlayoutTrack(self.playout, self._send_events)
        self.channel: Any = None  # aiortc RTCDataChannel, once the client's arrives
        self.channel_open = asyncio.Event()
        self.dropped_audio = 0
        self._inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._connected = False
        self._ended = False
        self._resampler: tuple[str, Resampler] | None = None  # (response id, its resampler)
        extensions = {TRANSPORT_EXTENSION: TransportControl(self.end, self._buffered_bytes)}
        self.scope = {**scope, "type": "websocket", "subprotocols": [], "extensions": extensions}

    # -- the call's side: aiortc callbacks ------------------------------------------------
    def attach_channel(self, channel: Any) -> None:
        """The client's ``oai-events`` channel (a second one is ignored)."""
        if self.channel is not None or channel.label != CHANNEL_LABEL:
            return
        self.channel = channel
        channel.on("message", self._channel_message)
        channel.on("close", self.end)
        if channel.readyState == "open":
            self.channel_open.set()
        channel.on("open", self.channel_open.set)

    def microphone(self, samples: np.ndarray) -> None:
        if self._inbox.qsize() >= MAX_INBOX:
            self.dropped_audio += len(samples)
            return
        self._inbox.put_nowait({"type": "websocket.receive", "media": MediaIn(samples)})

    def _channel_message(self, message: str | bytes) -> None:
        if self._ended:
            return
        if self._inbox.qsize() >= MAX_INBOX:
            log.info("call ended: too many events waiting", extra={"call_id": self.call_id})
            self.end()
            return
        key = "text" if isinstance(message, str) else "bytes"
        self._inbox.put_nowait({"type": "websocket.receive", key: message})

    def end(self) -> None:
        """The call is over (hang-up, channel closed, peer gone): the reader sees a disconnect."""
        if not self._ended:
            self._ended = True
            self.channel_open.set()  # a task waiting for the channel wakes
            self._inbox.put_nowait(_DISCONNECT)
            self.track.stop()

    @property
    def ended(self) -> bool:
        return self._ended

    # -- the skeleton's side: ASGI --------------------------------------------------------
    def websocket(self) -> WebSocket:
        return WebSocket(self.scope, self._receive, self._send)

    async def _receive(self) -> dict[str, Any]:
        if not self._connected:
            self._connected = True
            return {"type": "websocket.connect"}
        return await self._inbox.get()

    async def _send(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind == "websocket.send":
            text = message.get("text")
            if text is not None:
                self._send_text(text)
            else:
                self._play(message["bytes"])
        elif kind == "websocket.close":
            self.end()

    def _send_text(self, text: str) -> None:
        if self._ended or self.channel is None or self.channel.readyState != "open":
            raise OSError("the call's data channel is closed")  # the skeleton's "client went away"
        self.channel.send(text)
        if frame_type(text) == "response.done":
            response_id = json.loads(text)["response"]["id"]
            self._send_events(self.playout.finish(response_id))

    def _play(self, frame: bytes) -> None:
        audio = unpack(frame)
        rate = audio.format.sample_rate
        if (
            self._resampler is None
            or self._resampler[0] != audio.response_id
            or self._resampler[1].in_rate != rate
        ):
            self._resampler = (audio.response_id, Resampler(rate, RATE))
        samples = self._resampler[1](decode_audio(audio.audio, audio.format))
        pcm = (np.clip(samples, -1.0, 1.0) * 32767.0).astype(np.int16)
        self.playout.push(audio.response_id, audio.item_id, pcm)
        self.track.audio_queued()

    def _send_events(self, events: list[ev.ServerEvent]) -> None:
        if self.channel is None or self.channel.readyState != "open":
            return
        for event in events:
            frame = ev.render(event, self.dialect)
            if frame is not None:
                self.channel.send(frame)

    def _buffered_bytes(self) -> int:
        return 0 if self.channel is None else int(self.channel.bufferedAmount)
