"""The HTTP request that places a WebRTC call, sans-I/O: its body in, the SDP offer out.

OpenAI's WebRTC flow (``docs/protocols/webrtc.md``): the page creates an ``RTCPeerConnection``
with its microphone track and an ``oai-events`` data channel, and posts the SDP offer:

- **GA** ``POST /v1/realtime/calls``, either ``Content-Type: application/sdp`` with the offer as
  the body (what the Agents JS SDK sends), or ``multipart/form-data`` with the fields ``sdp``
  (the offer) and ``session`` (a GA session object, applied as the call's start, validated as
  ``session.update`` validates its ``session``).
- **beta** ``POST /v1/realtime?model=...`` with ``Content-Type: application/sdp``.

The answer (the server's) is ``201`` with the SDP answer as ``application/sdp`` and
``Location: /v1/realtime/calls/{call_id}``. :func:`parse_call` checks the body and raises
:class:`~.errors.ParamError` with OpenAI's error shape; the size bound
(:data:`MAX_BODY_BYTES`) is the server's to apply before reading.
"""

from __future__ import annotations

from dataclasses import dataclass
from email.parser import BytesParser
from email.policy import HTTP

from .dialect import Dialect
from .errors import ErrorCode, ParamError
from .limits import Limits
from .session_config import SessionConfig, apply_update
from .wire import StrictJSONError, loads_strict

MAX_BODY_BYTES = 256 * 1024  # an offer is a few KiB; larger bodies get 413 before they are read
SDP = "application/sdp"
MULTIPART = "multipart/form-data"


@dataclass(frozen=True)
class CallOffer:
    """A valid call request: the SDP offer and the session config the call starts with
    (``None``: the server's defaults, or the client secret's)."""

    sdp: str
    config: SessionConfig | None = None


def _invalid(message: str, param: str | None = None) -> ParamError:
    return ParamError(ErrorCode.INVALID_VALUE, message, param)


def _offer(text: str) -> str:
    sdp = text.strip()
    if not sdp.startswith("v=0"):
        raise _invalid("The SDP offer is not a session description (it must start with 'v=0').", "sdp")
    if "\nm=audio " not in sdp.replace("\r\n", "\n"):
        raise _invalid("The SDP offer has no audio media section.", "sdp")
    return sdp.replace("\r\n", "\n").replace("\n", "\r\n") + "\r\n"


def parse_call(
    content_type: str, body: bytes, dialect: Dialect, defaults: SessionConfig, limits: Limits
) -> CallOffer:
    """The call's offer (and its ``session``, multipart only), or :class:`ParamError`."""
    media_type = content_type.split(";", 1)[0].strip().lower()
    if media_type == SDP:
        return CallOffer(_offer(_text(body, "sdp")))
    if media_type != MULTIPART or dialect is not Dialect.GA:
        expected = f"'{SDP}' or '{MULTIPART}'" if dialect is Dialect.GA else f"'{SDP}'"
        raise _invalid(f"Unsupported Content-Type {media_type or 'none'!r}; expected {expected}.")
    fields = _form_fields(content_type, body)
    if "sdp" not in fields:
        raise ParamError(ErrorCode.MISSING_PARAMETER, "Missing required parameter: 'sdp'.", "sdp")
    config = None
    if "session" in fields:
        try:
            session = loads_strict(_text(fields["session"], "session"))
        except StrictJSONError as exc:
            raise _invalid(f"The 'session' field is not valid JSON ({str(exc)[:200]}).", "session") from None
        config = apply_update(defaults, session, dialect, defaults=defaults, limits=limits, semantic_vad=True)
    return CallOffer(_offer(_text(fields["sdp"], "sdp")), config)


def _text(data: bytes, param: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise _invalid(f"The '{param}' field is not UTF-8 text.", param) from None


def _form_fields(content_type: str, body: bytes) -> dict[str, bytes]:
    """The named parts of a ``multipart/form-data`` body (the first of each name)."""
    message = BytesParser(policy=HTTP).parsebytes(
        b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n" + body
    )
    if not message.is_multipart():
        raise _invalid("The multipart body could not be parsed (check its boundary).")
    fields: dict[str, bytes] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        payload = part.get_payload(decode=True)
        if isinstance(name, str) and isinstance(payload, bytes):
            fields.setdefault(name, payload)
    return fields
