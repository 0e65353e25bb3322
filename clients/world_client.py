"""Async Python client of the world protocol (docs/protocols/world.md).

    async with WorldClient.connect("ws://127.0.0.1:8000", prompt="stone", seed=1) as world:
        await world.send_keys(["w"])
        async for chunk in world.frames(limit=8):
            print(chunk.metadata["chunk_index"], len(chunk.frames))

``frames()`` yields :class:`WorldChunk` (the ``chunk.metadata`` plus decoded ``uint8 [H, W, 3]``
frames, JPEG or fMP4 decoded off the event loop, in order: fMP4 chunks continue one H.264
stream) until the server ends the session, or ``limit`` chunks; other server messages (acks, errors, pongs) go to ``messages`` (a bounded queue,
oldest dropped). ``send_keys`` / ``send_mouse`` /
``set_prompt`` send ``session.event`` with increasing ``event_id`` and the client timestamp.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import websockets

from realtime.media.video import Fmp4Decoder, decode_jpeg_batch


@dataclass
class WorldChunk:
    metadata: dict[str, Any]
    frames: list[np.ndarray]


class WorldClient:
    def __init__(self, ws: Any, created: dict[str, Any]) -> None:
        self.ws = ws
        self.created = created
        self.session_id: str = created["session_id"]
        self.capabilities: dict[str, Any] = created["capabilities"]
        self.messages: asyncio.Queue[dict[str, Any]] = asyncio.Queue(256)
        self._event_id = 0
        self._fmp4 = Fmp4Decoder()  # one H.264 stream; a chunk with an init segment restarts it

    @classmethod
    @contextlib.asynccontextmanager
    async def connect(cls, base_url: str, **start: Any) -> AsyncIterator[WorldClient]:
        """Open ``/v1/realtime/world?protocol_version=1`` and start a session with ``start`` fields."""
        url = base_url.rstrip("/") + "/v1/realtime/world?protocol_version=1"
        async with websockets.connect(url, max_size=2**26) as ws:
            await ws.send(json.dumps({"type": "session.start", **start}))
            while True:
                msg = json.loads(await ws.recv())
                if msg["type"] == "session.created":
                    break
                if msg["type"] == "error":
                    raise RuntimeError(f"{msg['error']['code']}: {msg['error']['message']}")
            yield cls(ws, msg)

    async def send_event(self, prompt: str | None = None, controls: list[dict] | None = None) -> int:
        self._event_id += 1
        event: dict[str, Any] = {
            "type": "session.event",
            "event_id": self._event_id,
            "client_ts_ms": time.time() * 1000,
        }
        if prompt is not None:
            event["prompt"] = prompt
        if controls:
            event["controls"] = controls
        await self.ws.send(json.dumps(event))
        return self._event_id

    async def send_keys(self, pressed: list[str]) -> int:
        return await self.send_event(
            controls=[{"track": "keys", "schema": "world.keys.v1", "data": {"pressed": pressed}}]
        )

    async def send_mouse(self, dx: float, dy: float) -> int:
        return await self.send_event(
            controls=[{"track": "mouse", "schema": "world.mouse.v1", "data": {"dx": dx, "dy": dy}}]
        )

    async def set_prompt(self, prompt: str) -> int:
        return await self.send_event(prompt=prompt)

    async def reset(self) -> None:
        await self.ws.send(json.dumps({"type": "session.reset"}))

    async def close(self) -> None:
        await self.ws.send(json.dumps({"type": "session.close"}))

    async def frames(self, limit: int | None = None) -> AsyncIterator[WorldChunk]:
        """Decoded chunks until the server closes the session, or ``limit`` chunks (the world
        plays on, so a script that wants to end passes one)."""
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        count = 0
        try:
            while limit is None or count < limit:
                msg = await self.ws.recv()
                if isinstance(msg, bytes):
                    continue  # media without metadata: cannot happen with a conforming server
                data = json.loads(msg)
                if data["type"] != "chunk.metadata":
                    if self.messages.full():
                        self.messages.get_nowait()
                    self.messages.put_nowait(data)
                    if data["type"] == "session.closed":
                        return
                    continue
                media = await self.ws.recv()
                decode = self._fmp4.decode if data["format"] == "fmp4" else decode_jpeg_batch
                count += 1
                yield WorldChunk(data, await asyncio.to_thread(decode, media))
        except websockets.ConnectionClosed:
            return
