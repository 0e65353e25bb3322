"""Property tests of every codec (issue 26's suite): what a client can send round-trips to the
typed command it means, and arbitrary input only ever gives the codec's own typed error.

Codecs: OpenPI (msgpack-numpy, with its header walk), world, OpenAI Realtime (GA and beta client
events), duplex, echo, and the strict JSON parser under the JSON ones. ``test_codec_fuzz.py`` holds
the older hostile-structure cases of the OpenPI and world codecs.
"""

from __future__ import annotations

import base64
import json

import msgpack
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from models.world.controls import validate_control
from realtime.protocols import echo, openpi
from realtime.protocols import world as proto
from realtime.protocols.duplex import commands as dc
from realtime.protocols.duplex.codec import DuplexCodec
from realtime.protocols.oai_realtime import CodecOptions, Dialect, RealtimeCodec, Rejected, SessionConfig
from realtime.protocols.oai_realtime import client_events as ce
from realtime.protocols.strict_json import MAX_DEPTH, StrictJSONError, dumps, loads_strict

PROPS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ANY_TEXT = st.one_of(st.text(max_size=300), st.binary(max_size=300).map(lambda b: b.decode("latin-1")))

# --------------------------------------------------------------------------- strict JSON

JSON = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**63) + 1, max_value=2**63 - 1),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=20),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=8), inner, max_size=5)
    ),
    max_leaves=30,
)


@PROPS
@given(JSON)
def test_strict_json_round_trips_what_it_renders(value):
    assert loads_strict(dumps({"v": value})) == {"v": value}


@PROPS
@given(ANY_TEXT)
def test_strict_json_on_any_text_raises_only_its_own_error(text):
    try:
        loads_strict(text)
    except StrictJSONError:
        pass


def test_strict_json_refuses_depth_and_breadth_before_parsing():
    for text in ("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), "[" + "0," * 20_000 + "0]"):
        try:
            loads_strict(text)
        except StrictJSONError:
            continue
        raise AssertionError(text[:40])
    assert loads_strict("[" * MAX_DEPTH + "]" * MAX_DEPTH) is not None
    assert loads_strict('["' + "[" * 500 + '"]') == ["[" * 500]  # brackets inside strings do not nest


# --------------------------------------------------------------------------- OpenPI

DTYPES = st.sampled_from(["|u1", "<f4", "<f8", "<i4", "<i8", "|b1", "<u2", ">f4", "<f2"]).map(np.dtype)
ARRAYS = DTYPES.flatmap(lambda d: hnp.arrays(d, hnp.array_shapes(min_dims=0, max_dims=4, max_side=6)))
PLAIN = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**63), 2**64 - 1),
        st.text(max_size=10),
        st.binary(max_size=10),
    ),
    # keys that cannot spell a numpy marker (nd, type, data): plain maps stay plain
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text("xyz", max_size=6), inner, max_size=4)
    ),
    max_leaves=20,
)


def _objects(value) -> int:
    """msgpack objects in ``value``: one per scalar or container, keys included."""
    if isinstance(value, list):
        return 1 + sum(map(_objects, value))
    if isinstance(value, dict):
        return 1 + sum(_objects(k) + _objects(v) for k, v in value.items())
    return 1


@PROPS
@given(st.dictionaries(st.text(max_size=12), ARRAYS, max_size=4), st.text(max_size=40))
def test_openpi_observations_round_trip_byte_exact(arrays, prompt):
    conn = openpi.ServerConnection()
    conn.start({})
    command = conn.receive(openpi.packb({**arrays, "prompt": prompt}))
    assert isinstance(command, openpi.Infer)
    for key, array in arrays.items():
        got = command.observation[key]
        assert got.dtype == array.dtype and got.shape == array.shape
        assert got.tobytes() == array.tobytes()
    assert command.observation["prompt"] == prompt


@PROPS
@given(PLAIN)
def test_openpi_header_walk_counts_every_object_and_decode_round_trips(value):
    frame = msgpack.packb(value, use_bin_type=True)
    assert openpi.scan(frame, 1 << 20, 1 << 10) == _objects(value)
    decoded = openpi.decode(frame, 1 << 20)
    assert decoded == msgpack.unpackb(frame, raw=False, strict_map_key=False)


@PROPS
@given(st.binary(max_size=400))
def test_openpi_on_arbitrary_bytes_gives_only_codec_errors(data):
    decoded = openpi.decode(data, 1 << 16)
    assert not isinstance(decoded, BaseException) or isinstance(decoded, openpi.CodecError)
    try:
        openpi.scan(data)
    except openpi.CodecError:
        pass


@PROPS
@given(st.integers(min_value=openpi.MAX_DEPTH + 1, max_value=3000), st.sampled_from([b"\x91", b"\x81\xa1k"]))
def test_openpi_refuses_deep_nesting_before_building(depth, level):
    decoded = openpi.decode(level * depth + b"\xc0", 1 << 20)
    assert isinstance(decoded, openpi.CodecError) and "nested deeper" in decoded.message


# --------------------------------------------------------------------------- world

LIMITS = proto.Limits(width=64, height=64, min_fps=1, max_fps=60, max_prompt_chars=40, max_message_bytes=4096)
KEYS = st.lists(st.sampled_from(list("wasd") + ["space", "shift"]), max_size=4, unique=True)


def _world() -> proto.ServerConnection:
    conn = proto.ServerConnection(LIMITS, default_fps=16, validate_control=validate_control)
    assert isinstance(conn.receive_text('{"type": "session.start"}'), proto.Start)
    return conn


@PROPS
@given(
    st.integers(min_value=0, max_value=2**53 - 1),
    st.none() | st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=40),
    KEYS,
)
def test_world_events_round_trip(event_id, prompt, pressed):
    message = {
        "type": "session.event",
        "event_id": event_id,
        "controls": [{"track": "keys", "schema": "world.keys.v1", "data": {"pressed": pressed}}],
    }
    if prompt is not None:
        message["prompt"] = prompt
    command = _world().receive_text(json.dumps(message))
    assert isinstance(command, proto.Event), command
    assert command.event.event_id == event_id and command.event.prompt == prompt
    assert list(command.event.controls[0].data["pressed"]) == pressed


@PROPS
@given(ANY_TEXT, st.binary(max_size=200))
def test_world_on_arbitrary_input_gives_only_typed_commands(text, data):
    conn = _world()
    assert isinstance(conn.receive_bytes(data), proto.Rejected)
    command = conn.receive_text(text)
    assert isinstance(
        command, proto.Start | proto.Event | proto.Reset | proto.Close | proto.Ping | proto.Rejected
    )


# --------------------------------------------------------------------------- OpenAI Realtime

CONFIG = SessionConfig(model="gpt-4o-realtime-preview")
DIALECTS = st.sampled_from([Dialect.GA, Dialect.BETA])
REALTIME_TYPES = st.sampled_from(
    [
        "session.update",
        "input_audio_buffer.append",
        "input_audio_buffer.commit",
        "conversation.item.create",
        "conversation.item.truncate",
        "response.create",
        "response.cancel",
        "playback.ack",
        "session.resume",
        "bogus",
    ]
)
EVENTS = st.builds(
    lambda kind, fields: {"type": kind, **fields},
    REALTIME_TYPES,
    st.dictionaries(
        st.sampled_from(
            ["event_id", "audio", "item", "session", "response", "item_id", "played_ms", "response_id"]
        ),
        JSON,
        max_size=4,
    ),
)
REALTIME_INPUT = st.one_of(ANY_TEXT, EVENTS.map(json.dumps))


@PROPS
@given(
    DIALECTS,
    st.binary(max_size=3000),
    st.none() | st.text(alphabet="abc_0123456789", min_size=1, max_size=20),
)
def test_realtime_audio_appends_round_trip_in_both_dialects(dialect, pcm, event_id):
    codec = RealtimeCodec(dialect, CONFIG)
    message = {"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode()}
    if event_id is not None:
        message["event_id"] = event_id
    command = codec.receive_text(json.dumps(message))
    assert isinstance(command, ce.AudioAppend), command
    assert command.audio == pcm and command.event_id == event_id


@PROPS
@given(DIALECTS, REALTIME_INPUT, st.binary(max_size=100))
def test_realtime_on_arbitrary_input_gives_only_typed_commands(dialect, text, data):
    codec = RealtimeCodec(dialect, CONFIG)
    assert isinstance(codec.receive_bytes(data), Rejected)
    command = codec.receive_text(text)
    assert isinstance(command, ce.Command.__args__), command  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- duplex

DUPLEX_COMMANDS = (
    *ce.Command.__args__,
    dc.PlaybackAck,
    dc.SessionResume,
    dc.EventAck,
    dc.Heartbeat,
    dc.SessionClose,
)  # type: ignore[attr-defined]


@PROPS
@given(
    DIALECTS, st.text(alphabet="abcdef0123456789_", min_size=1, max_size=30), st.integers(0, dc.MAX_PLAYED_MS)
)
def test_duplex_playback_acks_round_trip(dialect, response_id, played_ms):
    codec = DuplexCodec(dialect, CONFIG, CodecOptions())
    command = codec.receive_text(
        json.dumps({"type": "playback.ack", "response_id": response_id, "played_ms": played_ms})
    )
    assert command == dc.PlaybackAck(None, response_id, played_ms)


@PROPS
@given(DIALECTS, REALTIME_INPUT, st.binary(max_size=100), st.booleans())
def test_duplex_on_arbitrary_input_gives_only_typed_commands(dialect, text, data, opus):
    codec = DuplexCodec(dialect, CONFIG, CodecOptions(), opus_input=opus)
    assert isinstance(codec.receive_bytes(data), dc.OpusAppend if opus else Rejected)
    assert isinstance(codec.receive_text(text), DUPLEX_COMMANDS)


# --------------------------------------------------------------------------- echo


@PROPS
@given(st.text(max_size=64))
def test_echo_round_trips_its_text(text):
    assert echo.parse(json.dumps({"type": "echo", "text": text}), 64) == echo.Echo(text)


@PROPS
@given(ANY_TEXT, st.binary(max_size=64))
def test_echo_on_arbitrary_input_gives_only_typed_commands(text, data):
    assert isinstance(echo.parse(data, 64), echo.Rejected)
    assert isinstance(echo.parse(text, 64), echo.Echo | echo.Cancel | echo.Rejected)
