"""A Python WebRTC client of this server's OpenAI Realtime calls (aiortc): what a browser does.

    call = RealtimeCall("http://127.0.0.1:8000", api_key="ek_... or a key")
    await call.connect()                       # offer -> POST /v1/realtime/calls -> answer
    call.speak(samples_24k)                     # plays into the microphone track at real time
    event = await call.next_event("response.done")
    heard = call.heard()                        # the assistant's audio, 24 kHz mono float32
    await call.close()

The microphone track (the server's own playout track, ``realtime.webrtc.media``) sends speech
at real time and silence between utterances, as a real microphone does. Events come
from the ``oai-events`` data channel as dicts (``received_at``: the monotonic time each arrived);
:meth:`RealtimeCall.send` sends one. The received track is decoded (Opus) and kept, with the
monotonic time its first audible frame arrived (``first_audible_at``; :meth:`RealtimeCall.mark`
starts timing the next one, :meth:`RealtimeCall.audible` waits for it). Timing a turn, as
``realtime bench voice --transport webrtc`` does: ``after = call.mark()`` before speaking,
``stopped = await call.next_event("input_audio_buffer.speech_stopped", after=after)``, then
``call.mark()`` and ``await call.audible() - call.received_at[call.events.index(stopped)]``.
Needs the ``webrtc`` extra (``pip install -e '.[webrtc]'``).
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
import uuid
from typing import Any

import numpy as np
import soxr
from aiortc import RTCPeerConnection, RTCSessionDescription
from aiortc.jitterbuffer import JitterBuffer
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from realtime.webrtc.media import PlayoutTrack, frame_to_mono
from realtime.webrtc.playout import Playout

RATE = 48_000
MAX_SPEECH_S = 600.0  # what speak() may queue
AUDIBLE_RMS = 0.005  # a received frame louder than this is speech, not Opus's silence


class RealtimeCall:
    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        path: str = "/v1/realtime/calls",
        session: dict | None = None,
        receive_buffer_frames: int | None = None,
    ) -> None:
        """``receive_buffer_frames``: 20 ms frames the received track's jitter buffer holds
        before it plays one (``None``: aiortc's fixed 4; ``0`` on loopback, where packets
        neither jitter nor reorder, so first audio is timed as it arrives)."""
        self.url = base_url.rstrip("/") + path
        self.api_key = api_key
        self.session = session
        self.receive_buffer_frames = receive_buffer_frames
        self.pc = RTCPeerConnection()
        self.mic = PlayoutTrack(Playout(MAX_SPEECH_S), lambda events: None)  # real time, silence between
        self.channel = self.pc.createDataChannel("oai-events")
        self.call_id = ""
        self.events: list[dict[str, Any]] = []
        self.received_at: list[float] = []  # time.monotonic() of each event's arrival
        self._event_added = asyncio.Condition()
        self._received: list[np.ndarray] = []  # 48 kHz mono float32 frames
        self.first_audible_at: float | None = None
        self._audible = asyncio.Event()
        self._reader: asyncio.Task | None = None
        self.channel.on("message", self._on_message)
        self.pc.on("track", self._on_track)

    async def connect(self, timeout_s: float = 15.0) -> None:
        self.pc.addTrack(self.mic)
        await self.pc.setLocalDescription(await self.pc.createOffer())
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        sdp = self.pc.localDescription.sdp
        if self.session is None:
            body, content_type = sdp.encode(), "application/sdp"
        else:
            body, content_type = _form({"sdp": sdp, "session": json.dumps(self.session)})
        request = urllib.request.Request(
            self.url, body, {**headers, "Content-Type": content_type}, method="POST"
        )
        try:
            answer = await asyncio.to_thread(urllib.request.urlopen, request, timeout=timeout_s)
        except urllib.error.HTTPError as refused:
            raise RuntimeError(
                f"call refused: {refused.code} {refused.read()[:300].decode(errors='replace')}"
            ) from None
        with answer:
            status, location, text = answer.status, answer.headers.get("location", ""), answer.read().decode()
        if status != 201:
            raise RuntimeError(f"call refused: {status} {text[:300]}")
        self.call_id = location.rsplit("/", 1)[-1]
        await self.pc.setRemoteDescription(RTCSessionDescription(text, "answer"))
        opened = asyncio.Event()
        if self.channel.readyState == "open":
            opened.set()
        self.channel.on("open", opened.set)
        await asyncio.wait_for(opened.wait(), timeout_s)

    def send(self, event: dict[str, Any]) -> None:
        self.channel.send(json.dumps(event))

    def speak(self, samples: np.ndarray, rate: int = 24_000) -> float:
        """Queue mono float32 ``samples`` on the microphone; returns the seconds they take to play."""
        pcm = soxr.resample(samples.astype(np.float32), rate, RATE)
        self.mic.playout.push("mic", "mic", (np.clip(pcm, -1, 1) * 32767).astype(np.int16))
        self.mic.audio_queued()
        return self.mic.playout.queued_samples / RATE

    async def next_event(self, kind: str, timeout_s: float = 60.0, after: int = 0) -> dict[str, Any]:
        """The first event of type ``kind`` at index >= ``after`` in :attr:`events`."""

        def found() -> dict[str, Any] | None:
            return next((e for e in self.events[after:] if e.get("type") == kind), None)

        async with self._event_added:
            await asyncio.wait_for(self._event_added.wait_for(found), timeout_s)
        event = found()
        assert event is not None
        return event

    def mark(self) -> int:
        """A new turn: forget the audible onset seen so far (:attr:`first_audible_at` becomes the
        next one's); the index the next event will have, for ``next_event(after=...)``."""
        self.first_audible_at = None
        self._audible.clear()
        return len(self.events)

    async def audible(self, timeout_s: float = 60.0) -> float:
        """:attr:`first_audible_at`, once a frame louder than silence has arrived since :meth:`mark`."""
        await asyncio.wait_for(self._audible.wait(), timeout_s)
        assert self.first_audible_at is not None
        return self.first_audible_at

    def heard(self, rate: int = 24_000) -> np.ndarray:
        """Everything the assistant's track played so far, mono float32 at ``rate``."""
        audio = np.concatenate(self._received) if self._received else np.zeros(0, np.float32)
        return soxr.resample(audio, RATE, rate).astype(np.float32) if len(audio) else audio

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
        await self.pc.close()

    def _on_message(self, message: str | bytes) -> None:
        self.received_at.append(time.monotonic())
        self.events.append(json.loads(message))
        asyncio.ensure_future(self._notify())

    async def _notify(self) -> None:
        async with self._event_added:
            self._event_added.notify_all()

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind != "audio":
            return
        if self.receive_buffer_frames is not None:
            receiver = next(t.receiver for t in self.pc.getTransceivers() if t.receiver.track is track)
            # aiortc fixes its audio jitter buffer at 4 frames and offers no setting for it
            receiver._RTCRtpReceiver__jitter_buffer = JitterBuffer(
                capacity=16, prefetch=self.receive_buffer_frames
            )
        self._reader = asyncio.ensure_future(self._read(track))

    async def _read(self, track: MediaStreamTrack) -> None:
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            pcm = frame_to_mono(frame)
            if frame.sample_rate != RATE:
                pcm = soxr.resample(pcm, frame.sample_rate, RATE)
            self._received.append(pcm)
            if self.first_audible_at is None and float(np.sqrt(np.mean(pcm**2))) > AUDIBLE_RMS:
                self.first_audible_at = time.monotonic()
                self._audible.set()


def _form(fields: dict[str, str]) -> tuple[bytes, str]:
    """A ``multipart/form-data`` body of text fields, and its content type."""
    boundary = uuid.uuid4().hex
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'
        for name, value in fields.items()
    ]
    return ("".join(parts) + f"--{boundary}--\r\n").encode(), f"multipart/form-data; boundary={boundary}"
