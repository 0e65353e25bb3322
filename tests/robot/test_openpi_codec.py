"""The OpenPI codec against openpi-client's own msgpack_numpy (the reference implementation)."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from openpi_client import msgpack_numpy as reference

from models.policy.presets import check_prompt
from realtime.protocols import openpi
from realtime.protocols.openpi import (
    Actions,
    CodecError,
    ErrorCode,
    Infer,
    Rejected,
    Reset,
    ResetDone,
    ServerConnection,
)

CASES = [
    np.int64(7),
    np.float32(2.5),
    np.bool_(True),
    np.array(3.0),
    np.arange(5, dtype=np.int16),
    np.zeros((224, 224, 3), dtype=np.uint8),
    np.ones((3, 224, 224), dtype=np.float64),
    np.array(["ab", "c"]),
    np.array([np.nan, np.inf, -np.inf], dtype=np.float32),
    np.zeros((0, 7), dtype=np.float32),
    {"observation/image": np.full((4, 4, 3), 9, np.uint8), "prompt": "pick", "n": [1, 2.5, None]},
    {"images": {"cam_high": np.zeros((3, 2, 2), np.uint8)}, "state": np.arange(14, dtype=np.float32)},
]


def _equal(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, np.ndarray | np.generic):
        return (
            type(a) is type(b) and a.dtype == b.dtype and np.array_equal(a, b, equal_nan=a.dtype.kind == "f")
        )
    return a == b


@pytest.mark.parametrize("obj", CASES, ids=lambda o: type(o).__name__)
def test_bytes_identical_to_openpi_and_decodes_both_ways(obj):
    ours = openpi.packb(obj)
    assert ours == reference.packb(obj)
    assert _equal(openpi.unpackb(ours), reference.unpackb(ours))


@settings(max_examples=60, deadline=None)
@given(
    hnp.arrays(
        dtype=st.one_of(
            hnp.integer_dtypes(), hnp.floating_dtypes(), hnp.boolean_dtypes(), hnp.unsigned_integer_dtypes()
        ),
        shape=hnp.array_shapes(min_dims=0, max_dims=4, max_side=5),
    )
)
def test_random_arrays_round_trip(arr):
    data = reference.packb({"x": arr})
    assert openpi.packb({"x": arr}) == data
    out = openpi.unpackb(data)["x"]
    assert out.dtype == arr.dtype and out.shape == arr.shape
    assert np.array_equal(out, arr, equal_nan=arr.dtype.kind == "f")


def test_marker_keys_are_bin_on_the_wire():
    raw = msgpack.unpackb(openpi.packb(np.zeros(2, np.float32)), raw=True)
    assert set(raw) == {b"__ndarray__", b"data", b"dtype", b"shape"}
    # str keys are what a naive JS client writes: the reference leaves such maps alone, so do we
    str_keyed = msgpack.packb({"__ndarray__": True, "data": b"\0" * 4, "dtype": "<f4", "shape": [1]})
    assert isinstance(openpi.unpackb(str_keyed), dict)


def test_decoded_arrays_are_zero_copy_read_only_views():
    payload = openpi.packb({"img": np.arange(12, dtype=np.uint8).reshape(2, 2, 3)})
    img = openpi.unpackb(payload)["img"]
    assert not img.flags.writeable
    assert img.base is not None and isinstance(img.base, bytes)
    with pytest.raises(ValueError):
        img[0, 0, 0] = 1


@pytest.mark.parametrize(
    "arr", [np.array([1 + 2j]), np.array([object()], dtype=object), np.zeros(2, "i4,f4")]
)
def test_refused_dtypes_on_encode(arr):
    with pytest.raises(ValueError, match="Unsupported dtype"):
        openpi.packb(arr)


def _marker(dtype: str, shape, data: bytes) -> bytes:
    return msgpack.packb({b"__ndarray__": True, b"data": data, b"dtype": dtype, b"shape": shape})


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        (_marker("|O", [1], b"\0" * 8), ErrorCode.UNSUPPORTED_DTYPE),
        (_marker("<c16", [1], b"\0" * 16), ErrorCode.UNSUPPORTED_DTYPE),
        (_marker("|V8", [1], b"\0" * 8), ErrorCode.UNSUPPORTED_DTYPE),
        (_marker("not-a-dtype", [1], b"\0"), ErrorCode.UNSUPPORTED_DTYPE),
        (_marker("<f4", [3], b"\0" * 4), ErrorCode.INVALID_ARRAY),  # too few bytes
        (_marker("<f4", [1], b"\0" * 8), ErrorCode.INVALID_ARRAY),  # trailing bytes
        (_marker("<f4", [-1], b""), ErrorCode.INVALID_ARRAY),
        (_marker("<f4", "1", b"\0" * 4), ErrorCode.INVALID_ARRAY),
        (msgpack.packb({b"__ndarray__": True, b"dtype": "<f4"}), ErrorCode.INVALID_ARRAY),
        (msgpack.packb({b"__npgeneric__": True, b"data": "x", b"dtype": "<f4"}), ErrorCode.INVALID_ARRAY),
        (
            msgpack.packb({b"nd": True, b"type": "|O", b"kind": b"O", b"shape": [1], b"data": b"\x80"}),
            ErrorCode.UNSUPPORTED_DTYPE,
        ),
        (b"\xc1garbage", ErrorCode.INVALID_PAYLOAD),
        (openpi.packb({"a": 1}) + b"\x00", ErrorCode.INVALID_PAYLOAD),
        (b"", ErrorCode.INVALID_PAYLOAD),
    ],
)
def test_bad_input_raises_typed_codec_error(frame, code):
    with pytest.raises(CodecError) as info:
        openpi.unpackb(frame)
    assert info.value.code == code


def test_max_size_is_enforced_before_parsing():
    frame = openpi.packb({"x": np.zeros(1000, np.uint8)})
    assert openpi.unpackb(frame, max_bytes=len(frame))["x"].shape == (1000,)
    with pytest.raises(CodecError) as info:
        openpi.unpackb(frame, max_bytes=len(frame) - 1)
    assert info.value.code == ErrorCode.MESSAGE_TOO_LARGE


@pytest.mark.parametrize("bin_keys", [True, False])
def test_legacy_vllm_omni_markers_decode(bin_keys):
    arr = np.arange(6, dtype=np.float32).reshape(2, 3)

    def key(k: str):
        return k.encode() if bin_keys else k

    legacy = {
        "state": {
            key("nd"): True,
            key("type"): "<f4",
            key("kind"): b"",
            key("shape"): [2, 3],
            key("data"): arr.tobytes(),
        },
        "gain": {key("nd"): False, key("type"): "<f8", key("data"): np.float64(0.5).tobytes()},
    }
    out = openpi.unpackb(msgpack.packb(legacy))
    assert np.array_equal(out["state"], arr) and not out["state"].flags.writeable
    assert out["gain"] == np.float64(0.5) and isinstance(out["gain"], np.float64)


def test_user_key_named_nd_is_not_a_marker():
    assert openpi.unpackb(openpi.packb({"nd": 1, "x": 2})) == {"nd": 1, "x": 2}


# --------------------------------------------------------------------------- state machine


def test_metadata_first_then_strict_request_reply_order():
    conn = ServerConnection()
    with pytest.raises(RuntimeError):
        conn.receive(b"")
    meta = conn.start({"action_horizon": 50, "reset_pose": [0, -1.5]})
    assert reference.unpackb(meta) == {"action_horizon": 50, "reset_pose": [0, -1.5]}
    obs = conn.receive(openpi.packb({"state": np.zeros(3), "session_id": "ep-1"}))
    reset = conn.receive(openpi.packb({"endpoint": "reset"}))
    assert isinstance(obs, Infer) and obs.session_id == "ep-1" and isinstance(reset, Reset)
    with pytest.raises(RuntimeError, match="out of order"):
        conn.reply(ResetDone(reset.seq))
    out = conn.reply(Actions(obs.seq, np.ones((50, 7), np.float32), {"infer_ms": 1.0}, {"infer_ms": 0.5}))
    body = reference.unpackb(out.frames[0])
    assert body["actions"].shape == (50, 7) and body["server_timing"] == {"infer_ms": 1.0}
    assert body["policy_timing"] == {"infer_ms": 0.5} and out.close is None
    assert reference.unpackb(conn.reply(ResetDone(reset.seq)).frames[0]) == {"status": "reset successful"}
    assert conn.pending == 0


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        ("hello", ErrorCode.TEXT_FRAME),
        (b"\xc1\xc1", ErrorCode.INVALID_PAYLOAD),
        (openpi.packb([1, 2]), ErrorCode.INVALID_PAYLOAD),
        (openpi.packb({"endpoint": "explode"}), ErrorCode.UNKNOWN_ENDPOINT),
        (openpi.packb({"session_id": [1]}), ErrorCode.INVALID_PAYLOAD),
    ],
)
def test_bad_requests_get_recoverable_error_replies(frame, code):
    conn = ServerConnection(error_mode="recoverable")
    conn.start({})
    cmd = conn.receive(frame)
    assert isinstance(cmd, Rejected) and cmd.code == code
    out = conn.reply(openpi.Error(cmd.seq, cmd.code, cmd.message))
    assert out.close is None
    assert reference.unpackb(out.frames[0]) == {"type": "error", "code": str(code), "message": cmd.message}
    assert isinstance(conn.receive(openpi.packb({"state": np.zeros(2)})), Infer)


def test_openpi_error_mode_sends_text_then_closes_1011_without_traceback():
    conn = ServerConnection(error_mode="openpi")
    conn.start({})
    cmd = conn.receive("not msgpack")
    out = conn.reply(openpi.Error(cmd.seq, cmd.code, cmd.message))
    assert isinstance(out.frames[0], str) and "Traceback" not in out.frames[0]
    assert out.close == (1011, cmd.message)
    assert conn.state is openpi.State.CLOSED


def _frame(value) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


def _infer(conn: ServerConnection, observation) -> Infer | Rejected:
    return conn.accept(openpi.decode(_frame(observation), conn.max_message_bytes))


def _open() -> ServerConnection:
    conn = ServerConnection(
        max_prompt_chars=8, check_prompt=check_prompt
    )  # the kind passes the policy's rule
    conn.start({})
    return conn


def test_dtype_strings_do_not_pin_memory():
    """Regression (issue 11 defect 4): numpy parses "<i" + many zeros + "8" as int64, and the
    codec cached the raw string: every such request pinned its dtype string for good."""
    import gc
    import tracemalloc

    conn = _open()
    tracemalloc.start()
    try:
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        for i in range(64):
            dtype = "<i" + "0" * (1_000_000 + i) + "8"  # unique strings, 1 MB each
            frame = _frame(
                {
                    "observation/state": {
                        b"__ndarray__": True,
                        b"data": b"\0" * 8,
                        b"dtype": dtype,
                        b"shape": [1],
                    }
                }
            )
            del dtype
            reply = conn.accept(openpi.decode(frame, 1 << 24))
            assert isinstance(reply, Rejected) and reply.code == ErrorCode.UNSUPPORTED_DTYPE
            conn.reply(openpi.Error(reply.seq, reply.code, reply.message))
            del frame, reply
        gc.collect()
        retained = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert retained < 1_000_000, f"{retained} bytes retained after 64 MB of dtype strings"


@pytest.mark.parametrize(
    "dtype", ["<f4", ">f8", "|u1", "|b1", "<i2", "<U4", "|S3", "float32", "uint8", "<u8"]
)
def test_allowed_dtypes_decode(dtype):
    arr = np.zeros(2, dtype=np.dtype(dtype))
    marker = {b"__ndarray__": True, b"data": arr.tobytes(), b"dtype": dtype, b"shape": [2]}
    assert openpi.unpackb(_frame(marker)).dtype == np.dtype(dtype)


@pytest.mark.parametrize(
    "dtype", ["<M8", "<m8", "<c8", "|O", "V4", "<U99999999", "i" * 17, "int", "<f16", "<q"]
)
def test_dtypes_off_the_allow_list_are_refused(dtype):
    marker = {b"__ndarray__": True, b"data": b"", b"dtype": dtype, b"shape": [0]}
    with pytest.raises(CodecError) as info:
        openpi.unpackb(_frame(marker))
    assert info.value.code == ErrorCode.UNSUPPORTED_DTYPE


@pytest.mark.parametrize("raw", [b"\xff\xff\xff\xff", "\ud800".encode("utf-32-le", "surrogatepass")])
def test_text_arrays_with_invalid_code_points_are_refused(raw):
    """A 0-d ``<U1`` above U+10FFFF made ``.item()`` raise SystemError; a lone surrogate broke
    ``prompt.encode("utf-8")`` in the batch's collate (issue 11 defect 1)."""
    marker = {b"__ndarray__": True, b"data": raw, b"dtype": "<U1", b"shape": []}
    reply = _infer(_open(), {"prompt": marker})
    assert isinstance(reply, Rejected) and reply.code == ErrorCode.INVALID_ARRAY


@pytest.mark.parametrize(
    "prompt",
    [
        "p" * 9,
        b"p" * 33,
        {b"__ndarray__": True, b"data": "p".encode("utf-32-le") * 9, b"dtype": "<U9", b"shape": []},
        {b"__npgeneric__": True, b"data": "p" * 9, b"dtype": "<U9"},
        "\ud800",
    ],
)
def test_prompts_are_bounded_and_valid_text(prompt):
    conn = _open()
    frame = msgpack.packb({"prompt": prompt}, use_bin_type=True, unicode_errors="surrogatepass")
    reply = conn.accept(openpi.decode(frame, conn.max_message_bytes))
    if isinstance(prompt, str) and prompt == "\ud800":  # msgpack itself refuses the bytes on decode
        assert isinstance(reply, Rejected) and reply.code == ErrorCode.INVALID_PAYLOAD
        return
    assert isinstance(reply, Rejected) and reply.code == ErrorCode.INVALID_OBSERVATION
    assert "prompt" in reply.message
    assert isinstance(_infer(conn, {"prompt": "p" * 8}), Infer)


def test_rank_and_session_id_are_bounded():
    conn = _open()
    deep = {b"__ndarray__": True, b"data": b"\0", b"dtype": "|u1", b"shape": [1] * 33}
    reply = _infer(conn, {"observation/state": deep})
    assert isinstance(reply, Rejected) and reply.code == ErrorCode.INVALID_ARRAY
    reply = _infer(conn, {"session_id": "s" * (openpi.MAX_SESSION_ID_CHARS + 1)})
    assert isinstance(reply, Rejected) and reply.code == ErrorCode.INVALID_PAYLOAD
    assert isinstance(_infer(conn, {"session_id": "s" * openpi.MAX_SESSION_ID_CHARS}), Infer)
