"""One robot of ``realtime bench robot``: an OpenPI websocket client that can hang up.

It makes the calls ``openpi_client.WebsocketClientPolicy`` (0.1.2) makes, through public APIs
only: ``websockets.sync.client.connect`` with the same options (no compression, no size limit),
the server's metadata frame read first, and ``openpi_client.msgpack_numpy`` for every frame both
ways. That client offers no way to close its connection, and the bench must disconnect robots
between blocks (paused robots leave after each block of (c)), so the bench owns this one; both
servers meet the same client, so the comparison stays like for like.
"""

from __future__ import annotations

from typing import Any

import websockets.sync.client
from openpi_client import msgpack_numpy


class OpenPIRobot:
    """A connected OpenPI client: ``infer(obs)`` is one request/reply, ``close()`` hangs up."""

    def __init__(self, url: str) -> None:
        self._packer = msgpack_numpy.Packer()
        self._connection = websockets.sync.client.connect(url, compression=None, max_size=None)
        self.metadata: dict[str, Any] = msgpack_numpy.unpackb(self._connection.recv())

    def infer(self, obs: dict[str, Any]) -> dict[str, Any]:
        """Send one observation and return the server's reply; a text frame is the server's error."""
        self._connection.send(self._packer.pack(obs))
        reply = self._connection.recv()
        if isinstance(reply, str):
            raise RuntimeError(f"server answered with an error: {reply}")
        return msgpack_numpy.unpackb(reply)

    def close(self) -> None:
        self._connection.close()
