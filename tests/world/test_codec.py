"""The sans-I/O world codec and the media payload formats, as pure functions."""

from __future__ import annotations

import io
import json
import struct

import av
import numpy as np
import pytest

from models.world.controls import validate_control
from realtime.media.video import (
    TICKS_PER_FRAME,
    Fmp4Decoder,
    Fmp4Encoder,
    decode_jpeg_batch,
    encode_jpeg_batch,
    split_jpeg_batch,
)
from realtime.protocols import world as proto

LIMITS = proto.Limits(width=64, height=64, min_fps=1, max_fps=60, max_prompt_chars=20, max_message_bytes=512)


def _conn(started: bool = True) -> proto.ServerConnection:
    conn = proto.ServerConnection(
        LIMITS, default_fps=16, validate_control=validate_control
    )  # as the kind does
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
        ('{"type":"session.event","event_id":9007199254740992}', "invalid_message"),
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
    largest = _conn().receive_text(json.dumps({"type": "session.event", "event_id": 2**53 - 1}))
    assert isinstance(largest, proto.Event)
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


def _moving(n: int, start: int) -> np.ndarray:
    """Smooth frames whose content slides right one pixel per frame (x264 codes them well)."""
    shift = np.arange(start, start + n)[:, None, None, None]
    columns = np.arange(64)[None, None, :, None]
    return np.broadcast_to(np.sin((columns - shift) / 6.0) * 100 + 128, (n, 64, 64, 3)).astype(np.uint8)


def _tfdt_and_sequence(fragment: bytes) -> tuple[int, int]:
    """(baseMediaDecodeTime, mfhd sequence number) of a fragment's first moof."""
    assert fragment[4:8] == b"moof"
    sequence = struct.unpack_from(">I", fragment, 20)  # moof header 8 + mfhd header 12
    at = fragment.index(b"tfdt") - 4
    fmt = ">Q" if fragment[at + 8] == 1 else ">I"
    return struct.unpack_from(fmt, fragment, at + 12)[0], sequence[0]


def _avcc_nal_types(fragment: bytes) -> list[int]:
    """NAL unit types of a fragment's ``mdat``, read as 4-byte length-prefixed (AVCC) samples, as
    ``avc1`` requires (browsers reject Annex B start codes there; FFmpeg tolerates them)."""
    at = fragment.index(b"mdat") - 4
    end = at + struct.unpack_from(">I", fragment, at)[0]
    types, at = [], at + 8
    while at < end:
        (length,) = struct.unpack_from(">I", fragment, at)
        assert 0 < length <= end - at - 4, "not length-prefixed"
        header = fragment[at + 4]
        assert header & 0x80 == 0 and 1 <= header & 0x1F <= 12, f"bad NAL header {header:#x}"
        types.append(header & 0x1F)
        at += 4 + length
    assert at == end
    return types


def test_fmp4_init_segment_once_then_bare_fragments_of_one_h264_stream():
    encoder, decoder = Fmp4Encoder(64, 64, fps=16), Fmp4Decoder()
    payloads, first = [], 0
    for i, n in enumerate((5, 8, 8)):
        frames = _moving(n, first)
        init, fragment = encoder.encode(frames)
        assert (init[4:8] == b"ftyp" and b"moov" in init) if i == 0 else init == b""
        assert fragment[4:8] == b"moof" and b"moov" not in fragment and b"ftyp" not in fragment
        assert _tfdt_and_sequence(fragment) == (first * TICKS_PER_FRAME, i + 1)
        nal_types = _avcc_nal_types(fragment)
        assert (5 in nal_types) == (i == 0) and nal_types.count(1) == (n if i else n - 1)  # IDR, then P
        decoded = decoder.decode(init + fragment)  # in order, reference frames kept across chunks
        assert len(decoded) == n
        assert np.abs(np.stack(decoded).astype(int) - frames).mean() < 3
        payloads.append(init + fragment)
        first += n
    # what an MSE SourceBuffer sees: one file, one stream, a keyframe only at its start
    with av.open(io.BytesIO(b"".join(payloads)), mode="r", format="mp4") as container:
        frames = list(container.decode(video=0))
    assert len(frames) == 21 and [f.pts for f in frames] == [i * TICKS_PER_FRAME for i in range(21)]
    assert [f.key_frame for f in frames] == [True] + [False] * 20


def test_fmp4_fragment_before_init_segment_is_rejected():
    _, fragment = Fmp4Encoder(64, 64, fps=16).encode(_moving(5, 0))
    with pytest.raises(ValueError, match="init segment"):
        Fmp4Decoder().decode(fragment)


@pytest.mark.parametrize(
    "value",
    ["NaN", "Infinity", "-Infinity", "1e999", "-1e999", "9" * 400, "-" + "9" * 21, "[" * 40 + "]" * 40],
    ids=["nan", "inf", "-inf", "1e999", "-1e999", "400-digits", "21-digits", "deep"],
)
def test_hostile_json_numbers_are_invalid_message(value):
    """Regression (issue 11 defect 6): these closed the socket with 1011 and a traceback."""
    cmd = _conn().receive_text('{"type":"session.ping","data":' + value + "}")
    assert isinstance(cmd, proto.Rejected) and cmd.code == "invalid_message"


@pytest.mark.parametrize("ts", ["1" + "0" * 400, "1e400", "NaN"], ids=["10**400", "1e400", "nan"])
def test_client_ts_ms_that_cannot_be_a_float_is_invalid_message(ts):
    cmd = _conn().receive_text('{"type":"session.event","event_id":4,"client_ts_ms":' + ts + "}")
    assert isinstance(cmd, proto.Rejected) and cmd.code == "invalid_message"


@pytest.mark.parametrize(
    "message",
    [
        {"type": "session.event", "event_id": 3, "turbo": True},
        {"type": "session.reset", "hard": True},
        {"type": "session.close", "why": "x"},
        {"type": "session.ping", "data": 1, "more": 2},
    ],
)
def test_unknown_fields_are_invalid_message(message):
    cmd = _conn().receive_text(json.dumps(message))
    assert isinstance(cmd, proto.Rejected) and cmd.code == "invalid_message"
    assert cmd.event_id == message.get("event_id")


def test_lone_surrogate_prompts_are_invalid_message():
    conn = _conn(started=False)
    assert conn.receive_text('{"type":"session.start","prompt":"\\ud800"}').code == "invalid_message"
    assert (
        _conn().receive_text('{"type":"session.event","event_id":1,"prompt":"a\\udfff"}').code
        == "invalid_message"
    )


def test_every_accepted_value_renders():
    conn = _conn()
    big = 2**63 - 1  # the largest integer the strict parser accepts
    ping = conn.receive_text(
        json.dumps({"type": "session.ping", "data": [big, -big, 1e308, "\u00e9", {"a": None}]})
    )
    assert json.loads(proto.render_pong(ping.data))["data"][0] == big
    event = conn.receive_text(
        json.dumps({"type": "session.event", "event_id": 2**53 - 1, "client_ts_ms": big})
    )
    meta = {"session_id": "s", "client_ts_ms": event.event.client_ts_ms, "timing": {"queue_ms": 0.1234}}
    assert json.loads(proto.render_chunk_metadata(meta))["client_ts_ms"] == big
    assert json.loads(proto.render_event_ack(event.event.event_id, "accepted"))["event_id"] == 2**53 - 1
    rejected = conn.receive_text(json.dumps({"type": "session.event", "event_id": big, "prompt": 5}))
    assert (
        json.loads(proto.render_error(rejected.code, rejected.message, rejected.event_id))["error"][
            "event_id"
        ]
        == big
    )


def test_control_bounds_and_quoted_values_are_bounded():
    conn = _conn()
    keys = {"track": "keys", "schema": "world.keys.v1", "data": {"pressed": ["w"] * 17}}
    mouse = {"track": "mouse", "schema": "world.mouse.v1", "data": {"dx": 1e6 + 1, "dy": 0}}
    for control in (keys, mouse):
        cmd = conn.receive_text(json.dumps({"type": "session.event", "event_id": 1, "controls": [control]}))
        assert isinstance(cmd, proto.Rejected) and cmd.code == "invalid_message"
    cmd = _conn(False).receive_text(json.dumps({"type": "session.start", "format": "x" * 300}))
    assert cmd.code == "invalid_message" and len(cmd.message) < 120
