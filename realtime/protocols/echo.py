"""The echo protocol, sans-I/O (docs/adding-a-session-kind.md): JSON text frames both ways.

Client -> server: ``{"type": "echo", "text": str}`` (at most ``max_text_chars``), ``{"type":
"cancel"}``. Server -> client: ``session.created {session_id}``, ``echo.delta {chunk_index, seq,
text}`` per word (upper-cased), ``echo.done {chunk_index, request_id, words}``, ``echo.cancelled
{chunk_index}``, ``error {code, message}``. Malformed frames are typed errors; the socket stays open.
"""

from __future__ import annotations

from dataclasses import dataclass

from realtime.protocols.strict_json import StrictJSONError, dumps, loads_strict


@dataclass(frozen=True)
class Echo:
    text: str


@dataclass(frozen=True)
class Cancel:
    pass


@dataclass(frozen=True)
class Rejected:
    code: str
    message: str


Command = Echo | Cancel | Rejected


def parse(message: str | bytes, max_text_chars: int) -> Command:
    """One websocket message -> one command; never raises."""
    if isinstance(message, bytes):
        return Rejected("unexpected_binary", "clients send JSON text frames only")
    try:
        raw = loads_strict(message)
    except StrictJSONError as exc:
        return Rejected("invalid_json", f"not valid JSON: {exc}")
    if not isinstance(raw, dict):
        return Rejected("invalid_message", "a message must be a JSON object")
    kind = raw.get("type")
    if kind == "cancel" and set(raw) == {"type"}:
        return Cancel()
    if kind == "echo" and set(raw) == {"type", "text"}:
        text = raw["text"]
        if not isinstance(text, str) or len(text) > max_text_chars:
            return Rejected(
                "invalid_message", f"text must be a string of at most {max_text_chars} characters"
            )
        return Echo(text)
    if kind in ("echo", "cancel"):
        return Rejected("invalid_message", f"unexpected fields in {kind!r}")
    return Rejected("unknown_type", "type must be 'echo' or 'cancel'")


def render(type_: str, **fields: object) -> str:
    return dumps({"type": type_, **fields})
