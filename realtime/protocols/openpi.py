"""OpenPI websocket protocol, sans-I/O: frames in -> typed commands out, typed events in -> frames out.

Wire format (matches ``openpi_client.msgpack_numpy`` of openpi-client 0.1.2 byte for byte, see
reference ``openpi-and-robot-policy-servers.md`` §2.5):

- ndarray -> map ``{b"__ndarray__": True, b"data": <C-order bytes>, b"dtype": dtype.str,
  b"shape": [..]}`` with the four marker keys as msgpack **bin** (Python ``bytes`` literals);
- numpy scalar -> ``{b"__npgeneric__": True, b"data": <native value>, b"dtype": dtype.str}``;
- object (``O``), void/structured (``V``) and complex (``c``) dtypes are refused both ways;
  inbound, a dtype string must be on an allow-list before numpy parses it (bool, ints, uints,
  floats with any byte-order prefix or by name; ``U``/``S`` of at most
  :data:`MAX_STRING_DTYPE_CHARS`; at most :data:`MAX_DTYPE_CHARS` characters), so no client
  string can make numpy parse (or anything cache) an unbounded dtype; text arrays must hold valid
  code points (no surrogates, nothing above U+10FFFF);
- inbound only, vllm-omni's legacy markers ``{nd: True, type, kind, shape, data}`` (arrays) and
  ``{nd: False, type, data}`` (scalars), keys as bin or str; ``kind`` ``O``/``V`` is refused
  (the original msgpack-numpy would unpickle ``O``: there is no pickle here, ever).

Before msgpack builds anything, :func:`scan` walks the frame's headers (skipping str, bin and
ext payloads in O(1)) and refuses more than :data:`MAX_OBJECTS` objects or nesting deeper than
:data:`MAX_DEPTH` (``invalid_payload``); msgpack itself is given the same per-container bounds.
So a 5,000-deep or 100,000-key frame costs a header walk, not an object graph on the event loop.
:func:`decodes_inline` tells a caller whether a frame is cheap enough to decode where it is (at
most :data:`INLINE_OBJECTS` objects and :data:`INLINE_BYTES` bytes); other frames belong on a
worker thread.

Decoded arrays are zero-copy read-only views over the received bin payloads
(``np.frombuffer``), exactly like openpi's; consumers must copy before any in-place change. A
marker whose byte count does not equal ``prod(shape) * itemsize`` is refused (openpi silently
accepts trailing bytes).

An observation's ``prompt`` (str, bytes, or a 0-d ``U``/``S`` array) is checked here, before any
tokeniser sees it, by the ``check_prompt(prompt, max_chars)`` the kind passes in (the policy's
own rule: at most ``max_prompt_chars`` characters, ``robot.max_prompt_chars``, valid Unicode); a
``ValueError`` from it is ``invalid_observation``. The codec imports no model code: without a
``check_prompt`` prompts are passed on as they are. ``session_id`` at most
:data:`MAX_SESSION_ID_CHARS`.

Session sequence (reference §2.2): the server sends the msgpack metadata frame **first**, before
reading anything; then strictly one response per request, in request order. Requests are an
observation map (answered with ``{"actions", "server_timing", "policy_timing"}``) or
``{"endpoint": "reset"}`` (answered with ``{"status": "reset successful"}``, as vllm-omni).

Errors (``error_mode``; never a traceback, always ``<code>`` and a one-line message):

- ``"text"`` (default): a bad request is answered with the text frame ``"<code>: <message>"``
  and the session goes on. openpi-client raises ``RuntimeError("Error in inference server:\n"
  "<code>: <message>")`` from ``infer()``; the script can catch it and call ``infer`` again on the
  same client.
- ``"recoverable"``: the binary frame ``{"type": "error", "code", "message"}`` (vllm-omni's
  in-band form plus a machine-readable ``code``) and the session goes on; openpi-client returns
  it from ``infer()`` as a dict.
- ``"openpi"``: the reference server's behaviour: the text frame, then close 1011.

A fatal error (:meth:`ServerConnection.fatal`) sends the mode's error frame and then closes.
"""

from __future__ import annotations

import enum
import re
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, Literal

import msgpack
import numpy as np

PROTOCOL = "openpi"
PROTOCOL_VERSION = "0.1"
DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_PROMPT_CHARS = 2000  # robot.max_prompt_chars
MAX_SESSION_ID_CHARS = 256
INTERNAL_ERROR = 1011
RESET_OK = {"status": "reset successful"}
REPLY_BUFFER_BYTES = 16 * 1024  # a connection's packer starts this big and grows to its largest reply

MAX_OBJECTS = 1 << 16  # msgpack objects (scalars, strings, containers) in one frame
MAX_DEPTH = 32  # nesting of maps and arrays (an observation with images nests 3 deep)
INLINE_OBJECTS = 1024  # a frame this small in objects and ...
INLINE_BYTES = 1 << 20  # ... bytes decodes in well under a millisecond: no worker thread needed

ErrorMode = Literal["text", "recoverable", "openpi"]
#: ``check_prompt(prompt, max_chars)``: raises ``ValueError`` naming why a text prompt is refused
PromptCheck = Callable[[Any, int], object]
_REFUSED_KINDS = frozenset("VOc")
_MAX_NDIM = 32


class ErrorCode(enum.StrEnum):
    """Codes of error frames (``"<code>: ..."`` text or ``{"code": ...}``); docs/protocols/openpi.md."""

    TEXT_FRAME = "text_frame_unsupported"
    MESSAGE_TOO_LARGE = "message_too_large"
    INVALID_PAYLOAD = "invalid_payload"
    INVALID_ARRAY = "invalid_array"
    UNSUPPORTED_DTYPE = "unsupported_dtype"
    INVALID_OBSERVATION = "invalid_observation"
    UNKNOWN_ENDPOINT = "unknown_endpoint"
    INTERNAL = "internal_error"


class CodecError(ValueError):
    """A frame could not be decoded; ``code`` is an :class:`ErrorCode`."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


# --------------------------------------------------------------------------- msgpack-numpy


def _pack_numpy(obj: Any) -> Any:
    if isinstance(obj, np.ndarray | np.generic):
        if obj.dtype.kind in _REFUSED_KINDS:
            raise ValueError(f"Unsupported dtype: {obj.dtype}")
        if isinstance(obj, np.ndarray):
            return {
                b"__ndarray__": True,
                b"data": obj.tobytes(),
                b"dtype": obj.dtype.str,
                b"shape": obj.shape,
            }
        return {b"__npgeneric__": True, b"data": obj.item(), b"dtype": obj.dtype.str}
    raise TypeError(f"cannot serialize {type(obj).__name__}")


def packb(obj: Any) -> bytes:
    """Serialize like ``openpi_client.msgpack_numpy.packb`` (identical bytes)."""
    return msgpack.packb(obj, default=_pack_numpy)


# Dtype strings are checked against this allow-list before numpy sees them: numpy parses
# strings such as "<i" + 60 million zeros + "8", and anything keyed by raw client strings could
# pin memory. Numeric dtypes resolve through a fixed table; strings and bytes by regex.
MAX_DTYPE_CHARS = 16
MAX_STRING_DTYPE_CHARS = 65536  # longest "<U{n}" / "|S{n}" element
_NUMERIC = ("b1", "i1", "u1", "i2", "i4", "i8", "u2", "u4", "u8", "f2", "f4", "f8")
_NAMES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
_DTYPES: dict[str, np.dtype] = {
    **{order + code: np.dtype(order + code) for code in _NUMERIC for order in ("<", ">", "|", "=", "")},
    **{name: np.dtype(name) for name in (*_NAMES, "float16", "float32", "float64")},
}
_STRING_DTYPE = re.compile(r"([<>|=]?)([US])([1-9][0-9]{0,4})")


def _dtype(raw: Any) -> np.dtype:
    try:  # what openpi-client sends: a str in the table (every key is <= MAX_DTYPE_CHARS)
        return _DTYPES[raw]
    except (KeyError, TypeError):  # TypeError: an unhashable value, refused below
        pass
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("ascii")
        except UnicodeDecodeError:
            raise CodecError(ErrorCode.UNSUPPORTED_DTYPE, "dtype must be an ASCII string") from None
    if not isinstance(raw, str):
        raise CodecError(ErrorCode.INVALID_ARRAY, f"dtype must be a string, got {type(raw).__name__}")
    if len(raw) > MAX_DTYPE_CHARS:
        raise CodecError(
            ErrorCode.UNSUPPORTED_DTYPE, f"dtype string of {len(raw)} characters (at most {MAX_DTYPE_CHARS})"
        )
    dtype = _DTYPES.get(raw)
    if dtype is not None:
        return dtype
    match = _STRING_DTYPE.fullmatch(raw)
    if match is not None and int(match.group(3)) <= MAX_STRING_DTYPE_CHARS:
        return np.dtype(raw)
    raise CodecError(ErrorCode.UNSUPPORTED_DTYPE, f"unsupported dtype {raw!r}")


def _ndarray(data: Any, dtype_raw: Any, shape_raw: Any) -> np.ndarray:
    dtype = _dtype(dtype_raw)
    if type(data) is not bytes:
        raise CodecError(ErrorCode.INVALID_ARRAY, "array data must be msgpack bin")
    if not isinstance(shape_raw, list | tuple) or len(shape_raw) > _MAX_NDIM:
        raise CodecError(ErrorCode.INVALID_ARRAY, f"array shape must be a list of at most {_MAX_NDIM} ints")
    expected = dtype.itemsize
    for n in shape_raw:
        if type(n) is not int or n < 0:  # type(), not isinstance: bool is refused too
            raise CodecError(ErrorCode.INVALID_ARRAY, "array shape entries must be ints >= 0")
        expected *= n
    if expected != len(data):
        raise CodecError(
            ErrorCode.INVALID_ARRAY,
            f"array of shape {list(shape_raw)} and dtype {dtype.str} needs {expected} bytes, got {len(data)}",
        )
    if dtype.kind == "U":
        _check_code_points(data, dtype)
    return np.ndarray(buffer=data, dtype=dtype, shape=shape_raw)


def _check_code_points(data: bytes, dtype: np.dtype) -> None:
    """Refuse text arrays holding what no ``str`` can: code points above U+10FFFF or surrogates."""
    points = np.frombuffer(data, dtype=np.dtype("u4").newbyteorder(dtype.byteorder))
    if bool(((points > 0x10FFFF) | ((points >= 0xD800) & (points <= 0xDFFF))).any()):
        raise CodecError(
            ErrorCode.INVALID_ARRAY, "text array holds invalid code points (surrogates or > U+10FFFF)"
        )


def _npgeneric(data: Any, dtype_raw: Any) -> np.generic:
    dtype = _dtype(dtype_raw)
    try:
        return dtype.type(data)
    except (TypeError, ValueError, OverflowError):
        raise CodecError(ErrorCode.INVALID_ARRAY, f"bad {dtype.str} scalar value") from None


def _legacy(obj: dict, key: str) -> Any:
    return obj[key.encode()] if key.encode() in obj else obj[key]


def _object_hook(obj: dict) -> Any:
    try:
        if b"__ndarray__" in obj:
            return _ndarray(obj[b"data"], obj[b"dtype"], obj[b"shape"])
        if b"__npgeneric__" in obj:
            return _npgeneric(obj[b"data"], obj[b"dtype"])
        if _is_legacy(obj):
            return _legacy_numpy(obj)
    except KeyError as exc:
        raise CodecError(ErrorCode.INVALID_ARRAY, f"numpy marker without key {exc.args[0]!r}") from None
    return obj


def _is_legacy(obj: dict) -> bool:
    return (
        (b"nd" in obj or "nd" in obj)
        and (b"type" in obj or "type" in obj)
        and (b"data" in obj or "data" in obj)
    )


def _legacy_numpy(obj: dict) -> Any:
    """vllm-omni's (lebedov msgpack-numpy) markers; ``kind`` O would mean pickle: refused."""
    kind = obj.get(b"kind", obj.get("kind", b""))
    if kind not in (b"", ""):
        raise CodecError(ErrorCode.UNSUPPORTED_DTYPE, f"legacy array kind {kind!r} is not supported")
    if _legacy(obj, "nd") is True:
        return _ndarray(_legacy(obj, "data"), _legacy(obj, "type"), _legacy(obj, "shape"))
    dtype = _dtype(_legacy(obj, "type"))
    data = _legacy(obj, "data")
    if not isinstance(data, bytes) or len(data) != dtype.itemsize:
        raise CodecError(ErrorCode.INVALID_ARRAY, f"legacy scalar needs {dtype.itemsize} bytes of data")
    if dtype.kind == "U":
        _check_code_points(data, dtype)
    return np.frombuffer(data, dtype=dtype)[0]


def _header_table() -> tuple[tuple[int, int, int, int], ...]:
    """msgpack header byte -> (fixed bytes to skip, width of a length field, bytes skipped per
    unit of that length (payloads) or 0, items per unit of it (containers) or fixed item count)."""
    table = []
    for head in range(256):
        if head <= 0x7F or head >= 0xE0 or head in (0xC0, 0xC2, 0xC3):
            entry = (0, 0, 0, 0)  # fixint, nil, bool
        elif head <= 0x8F:
            entry = (0, 0, 0, 2 * (head & 0x0F))  # fixmap
        elif head <= 0x9F:
            entry = (0, 0, 0, head & 0x0F)  # fixarray
        elif head <= 0xBF:
            entry = (head & 0x1F, 0, 0, 0)  # fixstr
        elif head in (0xC4, 0xC5, 0xC6, 0xD9, 0xDA, 0xDB):  # bin, str 8/16/32
            entry = (0, {0xC4: 1, 0xC5: 2, 0xC6: 4, 0xD9: 1, 0xDA: 2, 0xDB: 4}[head], 1, 0)
        elif head in (0xC7, 0xC8, 0xC9):  # ext 8/16/32: length, type byte, data
            entry = (1, {0xC7: 1, 0xC8: 2, 0xC9: 4}[head], 1, 0)
        elif 0xCA <= head <= 0xD8:  # float, uint, int, fixext (type byte + data)
            fixed = (4, 8, 1, 2, 4, 8, 1, 2, 4, 8, 2, 3, 5, 9, 17)
            entry = (fixed[head - 0xCA], 0, 0, 0)
        elif head in (0xDC, 0xDD):  # array 16/32
            entry = (0, 2 if head == 0xDC else 4, 0, -1)
        elif head in (0xDE, 0xDF):  # map 16/32
            entry = (0, 2 if head == 0xDE else 4, 0, -2)
        else:
            entry = (-1, 0, 0, 0)  # 0xC1: never used
        table.append(entry)
    return tuple(table)


_HEADERS = _header_table()


def scan(data: bytes, max_objects: int = MAX_OBJECTS, max_depth: int = MAX_DEPTH) -> int | None:
    """Walk the msgpack headers of ``data``: the number of objects, or ``None`` once there are
    more than ``max_objects``. Raises :class:`CodecError` for nesting deeper than ``max_depth``.
    Builds nothing; malformed or truncated input is left for msgpack to refuse (the walk stops)."""
    end, pos, objects, headers = len(data), 0, 0, _HEADERS
    open_items = [1]  # items still to read in each open container (the frame is one item)
    while open_items:
        if open_items[-1] == 0:
            open_items.pop()
            continue
        open_items[-1] -= 1
        if pos >= end or objects >= max_objects:
            return objects if pos >= end else None  # truncated: msgpack says so
        skip, width, unit, items = headers[data[pos]]
        pos += 1
        objects += 1
        if skip < 0:
            return objects  # 0xC1: msgpack refuses it
        if width:
            length = int.from_bytes(data[pos : pos + width], "big")
            pos += width
            if unit:
                skip += length
            else:
                items = -items * length
        pos += skip
        if items:
            if len(open_items) > max_depth:
                raise CodecError(ErrorCode.INVALID_PAYLOAD, f"msgpack nested deeper than {max_depth} levels")
            open_items.append(items)
    return objects


def decodes_inline(frame: bytes | str) -> bool:
    """Whether ``frame`` is small enough (bytes and objects) to decode on the event loop."""
    if isinstance(frame, str) or len(frame) > INLINE_BYTES:
        return isinstance(frame, str)
    try:
        return scan(frame, INLINE_OBJECTS) is not None
    except CodecError:
        return True  # refused at once by decode's own scan


def unpackb(data: bytes, max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> Any:
    """Deserialize an openpi (or legacy vllm-omni) msgpack-numpy message, refusing bad input.

    Raises :class:`CodecError` (never anything else) for oversize, too many objects or too deep
    (:func:`scan`, before anything is built), malformed msgpack, trailing bytes, bad markers and
    refused dtypes.
    """
    if len(data) > max_bytes:
        raise CodecError(
            ErrorCode.MESSAGE_TOO_LARGE,
            f"message of {len(data)} bytes exceeds the limit of {max_bytes} bytes",
        )
    if scan(data) is None:
        raise CodecError(ErrorCode.INVALID_PAYLOAD, f"more than {MAX_OBJECTS} msgpack objects")
    try:
        return msgpack.unpackb(
            data,
            object_hook=_object_hook,
            raw=False,
            max_array_len=MAX_OBJECTS,
            max_map_len=MAX_OBJECTS,
            max_str_len=max_bytes,
            max_bin_len=max_bytes,
            max_ext_len=max_bytes,
        )
    except CodecError:
        raise
    except (ValueError, TypeError, msgpack.UnpackException, RecursionError) as exc:
        raise CodecError(
            ErrorCode.INVALID_PAYLOAD, f"not a valid msgpack message ({type(exc).__name__})"
        ) from None


def decode(frame: bytes | str, max_bytes: int) -> Any:
    """One inbound frame -> the decoded message, or the :class:`CodecError` (returned, not raised).

    Pure and thread-safe: large frames may be decoded off the event loop.
    """
    if isinstance(frame, str):
        return CodecError(ErrorCode.TEXT_FRAME, "text frames are not accepted; send msgpack binary frames")
    try:
        return unpackb(frame, max_bytes)
    except CodecError as exc:
        return exc


# --------------------------------------------------------------------------- commands and events


@dataclass(frozen=True)
class Infer:
    """Run the policy on ``observation``; ``session_id`` is the client's optional episode id."""

    seq: int
    observation: Mapping[str, Any]
    session_id: str | None


@dataclass(frozen=True)
class Reset:
    """``{"endpoint": "reset"}``: clear the session's policy state."""

    seq: int


@dataclass(frozen=True)
class Rejected:
    """A request that could not be parsed; it is owed an :class:`Error` reply like any other."""

    seq: int
    code: str
    message: str


Command = Infer | Reset | Rejected


@dataclass(frozen=True)
class Actions:
    """The answer to an :class:`Infer`; timings feed openpi's latency harness keys."""

    seq: int
    actions: np.ndarray
    server_timing: Mapping[str, float]
    policy_timing: Mapping[str, float]


@dataclass(frozen=True)
class ResetDone:
    seq: int


@dataclass(frozen=True)
class Error:
    """An error reply; ``code`` is an :class:`ErrorCode` or a session runtime error code."""

    seq: int
    code: str
    message: str


Reply = Actions | ResetDone | Error


@dataclass(frozen=True)
class Outbound:
    """Frames to send, in order, then an optional close ``(code, reason)``."""

    frames: tuple[bytes | str, ...]
    close: tuple[int, str] | None = None


class State(enum.Enum):
    HANDSHAKE = "handshake"
    OPEN = "open"
    CLOSED = "closed"


@dataclass
class ServerConnection:
    """The server side of one OpenPI connection.

    ``start(metadata)`` must come first; then every ``receive(frame)`` yields one command that is
    owed exactly one reply, and ``reply(event)`` must answer the oldest owed command (strict
    request/response order). Bounding how many may be owed is the caller's job (it stops reading).
    """

    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    error_mode: ErrorMode = "text"
    max_prompt_chars: int = DEFAULT_MAX_PROMPT_CHARS
    check_prompt: PromptCheck | None = None  # the policy's prompt rule (module docstring)
    state: State = State.HANDSHAKE
    _next_seq: int = 0
    _owed: deque[int] = field(default_factory=deque)
    # One packer per connection, as openpi's server keeps one per handler: ``packb`` builds (and
    # allocates a buffer for) a new one per call. Same bytes either way.
    _packer: msgpack.Packer = field(
        default_factory=lambda: msgpack.Packer(default=_pack_numpy, buf_size=REPLY_BUFFER_BYTES), repr=False
    )

    def start(self, metadata: Mapping[str, Any]) -> bytes:
        if self.state is not State.HANDSHAKE:
            raise RuntimeError("metadata was already sent")
        self.state = State.OPEN
        return self._packer.pack(dict(metadata))

    @property
    def pending(self) -> int:
        return len(self._owed)

    def receive(self, frame: bytes | str) -> Command:
        """Decode ``frame`` and turn it into the next owed command."""
        return self.accept(decode(frame, self.max_message_bytes))

    def accept(self, decoded: Any) -> Command:
        """Turn an already :func:`decode`-d frame (a message or a :class:`CodecError`) into a command.

        Lets a caller decode large frames on another thread; only this step touches the state.
        """
        if self.state is not State.OPEN:
            raise RuntimeError(f"cannot receive in state {self.state.value}")
        seq = self._next_seq
        self._next_seq += 1
        self._owed.append(seq)
        if isinstance(decoded, CodecError):
            return Rejected(seq, decoded.code, decoded.message)
        return _command(seq, decoded, self.max_prompt_chars, self.check_prompt)

    def reply(self, event: Reply) -> Outbound:
        if self.state is not State.OPEN:
            raise RuntimeError(f"cannot reply in state {self.state.value}")
        if not self._owed or self._owed[0] != event.seq:
            raise RuntimeError(f"reply to request {event.seq} out of order (owed: {list(self._owed)})")
        self._owed.popleft()
        if isinstance(event, Actions):
            body = {
                "actions": event.actions,
                "server_timing": dict(event.server_timing),
                "policy_timing": dict(event.policy_timing),
            }
            return Outbound((self._packer.pack(body),))
        if isinstance(event, ResetDone):
            return Outbound((self._packer.pack(RESET_OK),))
        if self.error_mode == "openpi":
            return self.fatal(event.code, event.message, INTERNAL_ERROR)
        return Outbound((self._error_frame(event.code, event.message),))

    def fatal(self, code: str, message: str, close_code: int) -> Outbound:
        """Close the connection: an error frame in the configured form, then the close code."""
        self.state = State.CLOSED
        return Outbound((self._error_frame(code, message),), (close_code, _reason(message)))

    def _error_frame(self, code: str, message: str) -> bytes | str:
        """``"<code>: <message>"`` as a text frame (openpi-client raises it), or the msgpack dict."""
        if self.error_mode == "recoverable":
            return self._packer.pack({"type": "error", "code": str(code), "message": message})
        return f"{code}: {message}"


def _reason(message: str) -> str:
    """Close reasons are limited to 123 bytes by RFC 6455."""
    return message.encode()[:123].decode("utf-8", "ignore")


def _prompt_problem(prompt: Any, max_chars: int, check: PromptCheck | None) -> str | None:
    """Why an observation's text ``prompt`` is refused (too long, not encodable), else ``None``:
    the policy's own rule (``check``), applied before any session work.

    Other shapes (not text at all) are left to the policy's ``prepare``, which names the rule.
    """
    text = isinstance(prompt, str | bytes) or (
        isinstance(prompt, np.ndarray) and prompt.ndim == 0 and prompt.dtype.kind in "US"
    )
    if not text or check is None:
        return None
    try:
        check(prompt, max_chars)
    except ValueError as exc:
        return str(exc)
    return None


def _all_str(keys: Any) -> bool:
    return all(map(isinstance, keys, repeat(str)))


def _command(seq: int, message: Any, max_prompt_chars: int, check_prompt: PromptCheck | None) -> Command:
    if not isinstance(message, dict):
        return Rejected(
            seq, ErrorCode.INVALID_PAYLOAD, f"expected a msgpack map, got {type(message).__name__}"
        )
    if not _all_str(message):
        return Rejected(seq, ErrorCode.INVALID_PAYLOAD, "observation keys must be strings")
    if "endpoint" in message:
        endpoint = message["endpoint"]
        if endpoint == "reset":
            return Reset(seq)
        if endpoint != "infer":
            return Rejected(seq, ErrorCode.UNKNOWN_ENDPOINT, f"unknown endpoint {str(endpoint)[:40]!r}")
    problem = _prompt_problem(message.get("prompt"), max_prompt_chars, check_prompt)
    if problem is not None:
        return Rejected(seq, ErrorCode.INVALID_OBSERVATION, problem)
    session_id = message.get("session_id")
    if session_id is not None and (
        not isinstance(session_id, str | int) or len(str(session_id)) > MAX_SESSION_ID_CHARS
    ):
        return Rejected(
            seq,
            ErrorCode.INVALID_PAYLOAD,
            f"session_id must be a string of at most {MAX_SESSION_ID_CHARS} characters",
        )
    return Infer(seq, message, None if session_id is None else str(session_id))
