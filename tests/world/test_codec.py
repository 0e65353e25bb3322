"""The sans-I/O world codec and the media payload formats, as pure functions."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from realtime.media.video import (
    decode_fmp4,
    decode_jpeg_batch,
    encode_fmp4,
    encode_jpeg_batch,
    split_jpeg_batch,
)
from realtime.protocols import world as proto

LIMITS = proto.Limits(width=64, height=64, min_fps=1, max_fps=60, max_prompt_chars=20, max_message_bytes=512)


def _conn(started: bool = True) -> proto.ServerConnection:
    conn = proto.ServerConnection(LIMITS, default_fps=16)
    if started:
        assert isinstance(conn.receive_text('{"type":"session.start"}'), proto.Start)
    return conn


def test_version_check():
    assert proto.check_version("1") is None
    for bad in (None, "2", "one"):
        assert proto.check_version(bad).code == "unsupported_protocol_version"


def test_start_defaults_and_limits():
    start = _conn(False).receive_text(json.dumps({"type": "session.start", "prompt": "ice", "seed": 4}))
    assert start == proto.Start("ice", 4, 16, "jpeg", "realtime")
    for field, value in [("fps", 0), ("fps", 61), ("width", 32), ("format", "gif"), ("pacing", "slow"), ("seed", -1),
                         ("prompt", "x" * 21), ("bogus", 1), ("seed", True)]:  # fmt: skip
        cmd = _conn(False).receive_text(json.dumps({"type": "session.start", field: value}))
        assert isinstance(cmd, proto.Rejected) and cmd.code == "invalid_message", (field, value)


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("[1,2", "invalid_json"),
        ("[1,2]", "invalid_message"),
        ('{"type":"session.fly"}', "unknown_type"),
        ('{"type":"session.start"}', "already_started"),
        ('{"type":"session.event"}', "invalid_message"),
        ('{"type":"session.event","event_id":1,"extra":1}', "invalid_message"),
        ('{"type":"session.event","event_id":1,"controls":[{"track":"keys","schema":"world.keys.v1","data":{}}]}', "invalid_message"),
        ('{"type":"session.event","event_id":1,"controls":[{"track":"mouse","schema":"world.mouse.v2","data":{"dx":1}}]}', "invalid_message"),
        (json.dumps({"type": "session.event", "event_id": 1, "prompt": "p" * 600}), "message_too_large"),
    ],
)  # fmt: skip
def test_bad_messages_are_typed_rejections(text, code):
    cmd = _conn().receive_text(text)
    assert isinstance(cmd, proto.Rejected) and cmd.code == code


def test_event_before_start_and_binary_from_client():
    assert _conn(False).receive_text('{"type":"session.event","event_id":1}').code == "not_started"
    assert _conn().receive_bytes(b"\x00").code == "unexpected_binary"


def test_event_parses_into_a_frozen_session_event():
    keys = {"track": "keys", "schema": "world.keys.v1", "data": {"pressed": ["w"]}}
    cmd = _conn().receive_text(
        json.dumps({"type": "session.event", "event_id": 3, "controls": [keys], "client_ts_ms": 9})
    )
    assert isinstance(cmd, proto.Event) and cmd.event.event_id == 3
    assert cmd.event.controls[0].data["pressed"] == ("w",)


def test_rendered_messages_are_json_with_types():
    assert json.loads(proto.render_event_ack(4, "duplicate")) == {
        "type": "session.event.ack",
        "event_id": 4,
        "status": "duplicate",
    }
    err = json.loads(proto.render_error("stale_event", "old", 2))
    assert err == {"type": "error", "error": {"code": "stale_event", "message": "old", "event_id": 2}}


def test_jpeg_batch_round_trip_and_malformed_batches():
    frames = np.zeros((3, 32, 48, 3), np.uint8)
    frames[:, :, :24] = (200, 40, 10)
    payload = encode_jpeg_batch(frames, 90)
    decoded = decode_jpeg_batch(payload)
    assert len(decoded) == 3 and decoded[0].shape == (32, 48, 3)
    assert np.abs(decoded[1].astype(int) - frames[1]).mean() < 8
    with pytest.raises(ValueError):
        split_jpeg_batch(payload[:-1])
    with pytest.raises(ValueError):
        split_jpeg_batch(struct.pack("<I", 10**6))


def test_fmp4_round_trip_frame_count():
    frames = np.random.default_rng(0).integers(0, 255, (8, 64, 64, 3), dtype=np.uint8)
    payload = encode_fmp4(frames, fps=16, first_frame=40)
    assert payload[4:8] == b"ftyp" and b"moof" in payload
    assert len(decode_fmp4(payload)) == 8
