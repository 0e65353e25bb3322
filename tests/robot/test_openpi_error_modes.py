"""The codec's three error modes: which frames a bad request gets, and whether the session goes on."""

from __future__ import annotations

import numpy as np
import pytest
from openpi_client import msgpack_numpy as reference

from realtime.protocols import openpi
from realtime.protocols.openpi import ErrorCode, Infer, Rejected, ServerConnection, State


def _rejected(conn: ServerConnection) -> Rejected:
    conn.start({})
    cmd = conn.receive(openpi.packb({"endpoint": "fly"}))
    assert isinstance(cmd, Rejected) and cmd.code == ErrorCode.UNKNOWN_ENDPOINT
    return cmd


def test_text_mode_is_the_default_a_code_prefixed_text_frame_and_the_session_goes_on():
    conn = ServerConnection()
    assert conn.error_mode == "text"
    cmd = _rejected(conn)
    out = conn.reply(openpi.Error(cmd.seq, cmd.code, cmd.message))
    assert out.frames == (f"unknown_endpoint: {cmd.message}",) and out.close is None
    assert conn.state is State.OPEN
    assert isinstance(conn.receive(openpi.packb({"state": np.zeros(2)})), Infer)


@pytest.mark.parametrize(
    ("mode", "text"), [("text", True), ("openpi", True), ("recoverable", False)], ids=lambda v: str(v)
)
def test_fatal_sends_the_modes_error_frame_then_closes(mode, text):
    conn = ServerConnection(error_mode=mode)
    conn.start({})
    out = conn.fatal("session_limit_reached", "no room", 1013)
    assert out.close == (1013, "no room") and conn.state is State.CLOSED
    (frame,) = out.frames
    if text:
        assert frame == "session_limit_reached: no room"
    else:
        assert reference.unpackb(frame) == {
            "type": "error",
            "code": "session_limit_reached",
            "message": "no room",
        }
