"""Bounded property-based fuzz of both codecs: whatever arrives, only typed results come out.

OpenPI: ``decode`` returns a message or a ``CodecError`` (never raises), ``accept`` turns either
into ``Infer`` / ``Reset`` / ``Rejected``. World: ``receive_text`` / ``receive_bytes`` return a typed
command, and every command's values render back (``render_pong``, ``render_error``, ...).
"""

from __future__ import annotations

import json

import msgpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from realtime.protocols import openpi
from realtime.protocols import world as proto

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# --------------------------------------------------------------------------- OpenPI

_DTYPE_STRINGS = st.one_of(
    st.sampled_from(["<f4", "|u1", "<U4", "|S3", "<i8", "|b1", "|O", "<c8", "V4", "<M8", "float32"]),
    st.text(max_size=24),
    st.binary(max_size=24),
    st.integers(),
    st.none(),
)
_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
    st.binary(max_size=64),
)


def _marker(draw_data, dtype, shape):
    return {b"__ndarray__": True, b"data": draw_data, b"dtype": dtype, b"shape": shape}


_MARKERS = st.one_of(
    st.builds(
        _marker,
        st.binary(max_size=64),
        _DTYPE_STRINGS,
        st.one_of(st.lists(st.integers(min_value=-2, max_value=16), max_size=4), st.integers(), st.text()),
    ),
    st.builds(lambda d, t: {b"__npgeneric__": True, b"data": d, b"dtype": t}, _SCALARS, _DTYPE_STRINGS),
    st.builds(
        lambda nd, t, d, k: {"nd": nd, "type": t, "data": d, "kind": k, "shape": [1]},
        st.booleans(),
        _DTYPE_STRINGS,
        st.binary(max_size=16),
        st.sampled_from(["", "O", "V", b""]),
    ),
)
_VALUES = st.recursive(
    st.one_of(_SCALARS, _MARKERS),
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.one_of(st.text(max_size=12), st.binary(max_size=4)), children, max_size=4),
    ),
    max_leaves=12,
)
_OBSERVATIONS = st.dictionaries(
    st.sampled_from(["prompt", "session_id", "endpoint", "observation/state", "rtc", "x"]),
    _VALUES,
    max_size=5,
)


def _openpi_connection() -> openpi.ServerConnection:
    conn = openpi.ServerConnection(max_message_bytes=1 << 16, max_prompt_chars=16)
    conn.start({"protocol": "openpi"})
    return conn


def _assert_typed(command: openpi.Command) -> None:
    assert isinstance(command, openpi.Infer | openpi.Reset | openpi.Rejected)
    if isinstance(command, openpi.Rejected):
        assert command.code in set(openpi.ErrorCode) and isinstance(command.message, str)


@FUZZ
@given(st.one_of(_VALUES, _OBSERVATIONS))
def test_openpi_decode_and_accept_only_give_typed_results(value):
    try:
        frame = msgpack.packb(value, use_bin_type=True)
    except (TypeError, ValueError, OverflowError):
        return  # not representable in msgpack: nothing a client could send
    conn = _openpi_connection()
    decoded = openpi.decode(frame, conn.max_message_bytes)
    assert not isinstance(decoded, Exception) or isinstance(decoded, openpi.CodecError)
    _assert_typed(conn.accept(decoded))


@FUZZ
@given(st.binary(max_size=256) | st.text(max_size=64))
def test_openpi_receive_of_arbitrary_frames_gives_typed_results(frame):
    _assert_typed(_openpi_connection().receive(frame))


# --------------------------------------------------------------------------- world

LIMITS = proto.Limits(width=64, height=64, min_fps=1, max_fps=60, max_prompt_chars=20, max_message_bytes=4096)
_JSON_ATOMS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=24),
)
_JSON = st.recursive(
    _JSON_ATOMS,
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=16,
)
_FIELD_VALUES = st.one_of(_JSON, st.sampled_from(["jpeg", "fmp4", "realtime", "fast", 64, 16, 1, 2**53]))
_MESSAGES = st.builds(
    lambda kind, fields: {"type": kind, **fields},
    st.sampled_from(
        ["session.start", "session.event", "session.reset", "session.close", "session.ping", "x"]
    ),
    st.dictionaries(
        st.sampled_from(
            ["prompt", "seed", "width", "height", "fps", "format", "pacing", "event_id", "controls"]
            + ["client_ts_ms", "data", "extra"]
        ),
        _FIELD_VALUES,
        max_size=5,
    ),
)
_HOSTILE_TEXT = st.one_of(
    st.text(max_size=200),
    st.builds(json.dumps, _MESSAGES),
    st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999", "9" * 5000, "[" * 2000, '"\\ud800"']).map(
        lambda v: '{"type": "session.ping", "data": ' + v + "}"
    ),
)


def _render(command: proto.Command) -> None:
    """Every value a command carries renders back without raising."""
    if isinstance(command, proto.Ping):
        json.loads(proto.render_pong(command.data))
    elif isinstance(command, proto.Rejected):
        json.loads(proto.render_error(command.code, command.message, command.event_id))
    elif isinstance(command, proto.Event):
        event = command.event
        json.loads(proto.render_event_ack(event.event_id, "accepted"))
        meta = {"session_id": "s", "client_ts_ms": event.client_ts_ms, "timing": {"queue_ms": 1.0}}
        json.loads(proto.render_chunk_metadata(meta))


@FUZZ
@given(st.lists(_HOSTILE_TEXT, min_size=1, max_size=4), st.binary(max_size=32))
def test_world_receive_only_gives_typed_commands_that_render(texts, data):
    conn = proto.ServerConnection(LIMITS, default_fps=16)
    assert isinstance(conn.receive_bytes(data), proto.Rejected)
    for text in [json.dumps({"type": "session.start"}), *texts]:
        command = conn.receive_text(text)
        assert isinstance(
            command, proto.Start | proto.Event | proto.Reset | proto.Close | proto.Ping | proto.Rejected
        )
        _render(command)
