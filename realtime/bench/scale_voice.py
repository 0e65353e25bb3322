"""``realtime bench scale`` (c), voice: OpenAI Realtime sessions, each through the official
``openai`` SDK, that outlive their replica by the SDK's own reconnection.

The SDK reconnects by itself when a socket closes with a recoverable code (1012, which the proxy
sends when a replica is lost, is one), with its own back-off; its ``on_reconnecting`` hook may
change the query of the next attempt. :class:`VoiceEpisode` names its session there
(``session_id``), which is all a client needs to have the session restored on another replica
with its id and conversation (``docs/scaling.md``). The episode measures, from the kill, the
first audio of a reply on the restored session: the voice half of ``resume_after_loss_ms``.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

RECONNECTS = 8  # the SDK's attempts; its back-off starts at RECONNECT_DELAY_S and doubles
RECONNECT_DELAY_S = 0.05
RECONNECT_MAX_DELAY_S = 0.5


def why_voice_cannot_serve() -> str | None:
    """``None`` when this machine can serve the voice kind (its libraries import, the packages
    carrying its weights are installed); else why not. The replicas run here: without this check a
    missing library would fail their start (only missing weights make a kind unavailable)."""
    try:
        from models.voice import asr, llm, tts, vad
        from models.voice.weights import locate

        for item in (*asr.WHISPER_BASE_FILES, llm.SMOLLM2_GGUF, tts.HIBARI_ONNX, vad.SILERO_ONNX):
            locate(item)
    except Exception as exc:  # noqa: BLE001 - the reason is the figure's caveat
        return f"{type(exc).__name__}: {exc}"
    return None


class SessionNotRestored(Exception):
    """The reconnected session is not the one the client had (another id, its conversation gone)."""


@dataclass(frozen=True)
class Resumed:
    """Seconds from a replica's loss to a voice session restored (its id and conversation back on
    the new socket) and to the first audio of the reply asked for then."""

    restored_s: float
    first_audio_s: float


def _until(events: Iterator[Any], kind: str) -> Any:
    """The next server event of type ``kind``; an ``error`` event raises."""
    for event in events:
        if event.type == "error":
            raise SessionNotRestored(f"{event.error.code}: {event.error.message}")
        if event.type == kind:
            return event
    raise SessionNotRestored("the connection closed")


def _text(item: Any) -> str:
    return "".join(getattr(part, "text", None) or "" for part in item.content or [])


@dataclass
class VoiceEpisode:
    """One voice session holding a user item, open through the SDK with reconnection on."""

    manager: Any
    connection: Any
    events: Iterator[Any]  # the SDK reconnects while it is iterated (``recv`` alone does not)
    session_id: str
    remembered: str
    reply_before_s: float | None = None  # a reply's first audio before the loss (:meth:`reply`)

    @classmethod
    def open(cls, url: str, index: int) -> VoiceEpisode:
        from openai import OpenAI

        named: dict[str, str] = {}

        def name_the_session(event: Any) -> dict:
            return {"extra_query": {**(event.extra_query or {}), "session_id": named["id"]}}

        manager = OpenAI(websocket_base_url=f"{url}/v1", api_key="unused").realtime.connect(
            model="gpt-realtime",
            on_reconnecting=name_the_session,
            max_retries=RECONNECTS,
            initial_delay=RECONNECT_DELAY_S,
            max_delay=RECONNECT_MAX_DELAY_S,
        )
        connection = manager.__enter__()
        events = iter(connection)
        named["id"] = _until(events, "session.created").session.id
        remembered = f"remember the number {index}"
        content = [{"type": "input_text", "text": remembered}]
        connection.conversation.item.create(item={"type": "message", "role": "user", "content": content})
        _until(events, "conversation.item.done")
        return cls(manager, connection, events, named["id"], remembered)

    def reply(self) -> None:
        """Ask for a reply and keep the time to its first audio (``reply_before_s``): what a reply
        costs on this machine without a loss; wait for the reply's end."""
        asked = time.monotonic()
        self.connection.response.create()
        _until(self.events, "response.output_audio.delta")
        self.reply_before_s = time.monotonic() - asked
        _until(self.events, "response.done")

    def reply_after_loss(self, killed_at: float, deadline_s: float) -> Resumed | str:
        """The times from ``killed_at`` to the session restored and to the first audio of a reply
        asked for on it; else why the session did not come back whole within ``deadline_s`` of
        the kill (another id, its item gone, an error, closed at the deadline)."""
        timer = threading.Timer(max(0.0, deadline_s - (time.monotonic() - killed_at)), self.close)
        timer.start()
        try:
            if _until(self.events, "session.created").session.id != self.session_id:
                raise SessionNotRestored("another session id")
            if _text(_until(self.events, "conversation.item.done").item) != self.remembered:
                raise SessionNotRestored("the conversation's item is not the client's")
            restored_s = time.monotonic() - killed_at
            self.connection.response.create()
            _until(self.events, "response.output_audio.delta")
            return Resumed(restored_s, time.monotonic() - killed_at)
        except Exception as exc:  # noqa: BLE001 - closed at the deadline, or not restored: lost
            return f"{type(exc).__name__}: {exc}"
        finally:
            timer.cancel()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.manager.__exit__(None, None, None)
