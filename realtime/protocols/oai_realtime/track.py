"""Assistant audio for a WebRTC call's media track, sans-I/O.

Over a websocket the assistant's audio travels as ``response.output_audio.delta`` events. Over
WebRTC it plays on the call's audio track and the data channel carries no audio (as OpenAI does
it). A codec made with ``CodecOptions(media_track=True)`` renders each
:class:`~.server_events.AudioDelta` as a **track frame** (bytes) instead of its event: the
connection's outbound queue carries it like any other frame (in order with the events, and dropped
unsent when its response is interrupted), and the call's transport plays it
(``realtime.webrtc``). Layout: a 2-byte big-endian header length, the JSON header
``{"response_id", "item_id", "format"}``, then the audio bytes in that format.

:func:`frame_type` reads the event type of a text frame this codec rendered (every one starts
with ``{"type":"<name>"``), so a transport can follow a response's progress without parsing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from .session_config import AudioFormat

_TYPE_PREFIX = '{"type":"'


@dataclass(frozen=True)
class TrackAudio:
    """One track frame: audio of ``response_id``'s message ``item_id`` in ``format``."""

    response_id: str
    item_id: str
    format: AudioFormat
    audio: bytes


def pack(audio: TrackAudio) -> bytes:
    header = json.dumps(
        {"response_id": audio.response_id, "item_id": audio.item_id, "format": audio.format.value}
    ).encode()
    return len(header).to_bytes(2, "big") + header + audio.audio


def unpack(frame: bytes) -> TrackAudio:
    """The frame :func:`pack` made (``ValueError`` for anything else)."""
    size = int.from_bytes(frame[:2], "big")
    header = json.loads(frame[2 : 2 + size])
    return TrackAudio(
        header["response_id"], header["item_id"], AudioFormat(header["format"]), frame[2 + size :]
    )


def frame_type(frame: str) -> str | None:
    """The ``type`` of a text frame the codec rendered (``None`` if it does not start like one)."""
    if not frame.startswith(_TYPE_PREFIX):
        return None
    end = frame.find('"', len(_TYPE_PREFIX))
    return frame[len(_TYPE_PREFIX) : end] if end > 0 else None
