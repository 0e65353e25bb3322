"""A websocket client that does only what a test says: ``websockets``' sans-I/O client protocol
over a plain blocking socket, so a test can play a client that never reads, or one that streams a
frame the server refuses, which the regular clients (reading in a background thread) cannot."""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.http11 import Response
from websockets.uri import parse_uri


class RawClient:
    """One websocket connection; ``send_*`` write frames, nothing is read unless asked."""

    def __init__(
        self,
        url: str,
        headers: dict[str, str] | None = None,
        timeout_s: float = 10.0,
        rcvbuf: int | None = None,
    ) -> None:
        parts = urlsplit(url)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:  # small: a client that does not read fills it (and the server's) fast
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(timeout_s)
        self.sock.connect((parts.hostname, parts.port))
        self.protocol = ClientProtocol(parse_uri(url), max_size=None)
        request = self.protocol.connect()
        for name, value in (headers or {}).items():  # replaces a header the protocol set (Host)
            if name in request.headers:
                del request.headers[name]
            request.headers[name] = value
        self.protocol.send_request(request)
        self._flush()
        while True:
            self.protocol.receive_data(self.sock.recv(65536))
            events = self.protocol.events_received()
            if events:
                self.response: Response = events[0]
                self.pending = events[1:]
                return

    @property
    def status(self) -> int:
        return self.response.status_code

    def _flush(self) -> None:
        for data in self.protocol.data_to_send():
            if data:
                self.sock.sendall(data)

    def send_text(self, text: str) -> None:
        self.protocol.send_text(text.encode())
        self._flush()

    def send_frame_header(self, opcode: Opcode, length: int) -> None:
        """Only the header of a masked frame announcing ``length`` payload bytes (no payload)."""
        header = bytearray([0x80 | opcode.value])
        if length < 126:
            header.append(0x80 | length)
        elif length < 1 << 16:
            header += bytes([0x80 | 126]) + length.to_bytes(2, "big")
        else:
            header += bytes([0x80 | 127]) + length.to_bytes(8, "big")
        self.sock.sendall(bytes(header) + b"\0\0\0\0")  # zero mask: the payload goes as is

    def close_code(self) -> int | None:
        """Read until the server's close frame and return its code (None: no close frame came)."""
        events = self.pending
        self.pending = []
        try:
            while True:
                for event in events:
                    if isinstance(event, Frame) and event.opcode is Opcode.CLOSE:
                        return self.protocol.close_rcvd.code if self.protocol.close_rcvd else None
                data = self.sock.recv(65536)
                if not data:
                    return None
                self.protocol.receive_data(data)
                events = self.protocol.events_received()
        except OSError:
            return None

    def close(self) -> None:
        self.sock.close()
