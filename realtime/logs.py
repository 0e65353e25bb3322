"""Structured logging: ``key=value`` text or one JSON object per line.

Every record carries ``session`` when emitted inside ``sessions.log_context.session_context``
(or when passed as ``extra={"session_id": ...}``). Extra fields passed through ``extra={...}``
are rendered as further keys. Tracebacks go to logs, never to the wire.

Secrets never reach a log line, at any level: both formatters pass the message, every extra
field and the traceback text through :func:`redact`, which hides ``Authorization`` header values
(``Api-Key``/``Bearer`` credentials, also as uvicorn's and websockets' debug lines print request
headers), the value of every query parameter whose *decoded* name is ``api_key`` (uvicorn logs
request paths with their raw query, and the server accepts ``?api%5Fkey=``) and
``openai-insecure-api-key.<key>`` subprotocols.

:func:`log_limited` logs a routine line that a client can trigger at will (a protocol error that
closes its own connection) at most once per :data:`INTERNAL_ERROR_WINDOW_S` per key, counting the
ones suppressed meanwhile.

:func:`log_internal_error` is the one way to log an unexpected server error of a session: one
ERROR line with the traceback, at most :data:`INTERNAL_ERRORS_PER_WINDOW` per session per
:data:`INTERNAL_ERROR_WINDOW_S` (the next logged line counts the ones suppressed meanwhile), so a
client that triggers a bug in a loop cannot flood the log.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from urllib.parse import unquote_plus

from sessions.log_context import current_session_id

_STANDARD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "color_message",  # uvicorn's ANSI-coloured duplicate of msg
}

REDACTED = "[redacted]"
_SECRETS = (
    # header lines and header tuples: "Authorization: Api-Key k", (b'authorization', b'Bearer k')
    re.compile(r"""(?i)(authorization['"]?\s*(?::|,|=)\s*b?['"]?)[^'"\r\n]+"""),
    # a credential anywhere else (reprs, messages): "Bearer k", "Api-Key k"
    re.compile(r"(?i)\b((?:bearer|api-key)\s+)[^\s'\",)]+"),
    # OpenAI's browser convention: Sec-WebSocket-Protocol: openai-insecure-api-key.<key>
    re.compile(r"(?i)(openai-insecure-api-key\.)[^\s,'\"]+"),
    # an ephemeral client secret wherever it appears (realtime.client_secrets)
    re.compile(r"\b(ek_)[A-Za-z0-9_-]{8,}"),
)
# a query parameter's "name=" (also with percent-encoded "?", "&", "="): its name is decoded before
# it is compared, since the server decodes it too (``?api%5Fkey=k`` is ``api_key``); only the
# name is consumed, so a parameter inside another's value (``path=/?api_key=k``) is seen too
_QUERY_NAME = re.compile(r"(?:^|[?&;\s\"'(]|%3[fF]|%26)(?P<name>[A-Za-z0-9%._+~-]{1,96}?)(?:=|%3[dD])")
_QUERY_VALUE = re.compile(r"[^&\s'\"]*")
_KEY_PARAM = "api_key"
_HINT = re.compile(r"(?i)authoriz|bearer|api.key|key|%")


def _is_key_param(name: str) -> bool:
    for _ in range(3):  # a name encoded more than once is redacted too: never a key in the clear
        decoded = unquote_plus(name)
        if decoded == name:
            break
        name = decoded
    return name.lower() == _KEY_PARAM


def _redact_query(text: str) -> str:
    parts, done = [], 0
    for match in _QUERY_NAME.finditer(text):
        if match.end() < done or not _is_key_param(match.group("name")):
            continue
        value = _QUERY_VALUE.match(text, match.end())
        parts += [text[done : match.end()], REDACTED]
        done = value.end() if value is not None else match.end()
    return "".join(parts) + text[done:] if parts else text


def redact(text: str) -> str:
    """``text`` with every API key credential replaced by ``[redacted]``: ``Authorization``
    values, ``Api-Key``/``Bearer`` credentials, the key subprotocol, and the value of every query
    parameter whose name decodes to ``api_key`` (any case, any percent-encoding)."""
    if not _HINT.search(text):
        return text  # fast path: the overwhelming majority of lines carry no credential
    for pattern in _SECRETS:
        text = pattern.sub(lambda m: m.group(1) + REDACTED, text)
    return _redact_query(text)


def _fields(record: logging.LogRecord) -> dict[str, object]:
    fields: dict[str, object] = {
        "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
        "level": record.levelname.lower(),
        "logger": record.name,
        "msg": redact(record.getMessage()),
    }
    session_id = getattr(record, "session_id", None) or current_session_id.get()
    if session_id:
        fields["session"] = session_id
    for key, value in vars(record).items():
        if key not in _STANDARD_ATTRS and key != "session_id" and not key.startswith("_"):
            fields[key] = redact(value) if isinstance(value, str) else value
    if record.exc_info:
        fields["exc"] = redact(logging.Formatter().formatException(record.exc_info))
    return fields


class KeyValueFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        parts = []
        fields = _fields(record)
        for key, value in fields.items():
            if key == "exc":
                continue
            text = redact(str(value))
            if not text or any(c in text for c in ' "=\n'):
                text = json.dumps(text)
            parts.append(f"{key}={text}")
        line = " ".join(parts)
        if "exc" in fields:
            line += "\n" + str(fields["exc"])
        return line


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return redact(json.dumps(_fields(record), default=str))


def configure_logging(level: str = "info", fmt: str = "text") -> None:
    """Route the root logger (and uvicorn's) through one structured handler on stderr."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else KeyValueFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        lg = logging.getLogger(name)
        lg.handlers[:] = []
        lg.propagate = True
    logging.getLogger("uvicorn.access").setLevel(max(logging.WARNING, root.level))


INTERNAL_ERROR_WINDOW_S = 60.0
INTERNAL_ERRORS_PER_WINDOW = 1
_TRACKED_SESSIONS = 4096  # sessions remembered by the rate limiter (least recently seen forgotten)


@dataclass
class _Window:
    started: float
    logged: int = 0
    suppressed: int = 0


class InternalErrorLimiter:
    """Per-key (a session id, a kind of client error) token window; bounded memory, thread-safe."""

    def __init__(
        self,
        per_window: int = INTERNAL_ERRORS_PER_WINDOW,
        window_s: float = INTERNAL_ERROR_WINDOW_S,
        max_sessions: int = _TRACKED_SESSIONS,
        clock=time.monotonic,
    ) -> None:
        self.per_window = per_window
        self.window_s = window_s
        self.max_sessions = max_sessions
        self.clock = clock
        self._windows: OrderedDict[str, _Window] = OrderedDict()
        self._lock = threading.Lock()

    def admit(self, session_id: str) -> int | None:
        """``None`` to suppress this error, else how many were suppressed since the last logged one."""
        now = self.clock()
        with self._lock:
            window = self._windows.get(session_id)
            if window is None or now - window.started >= self.window_s:
                suppressed = window.suppressed if window is not None else 0
                window = self._windows[session_id] = _Window(now, suppressed=suppressed)
            self._windows.move_to_end(session_id)
            while len(self._windows) > self.max_sessions:
                self._windows.popitem(last=False)
            if window.logged >= self.per_window:
                window.suppressed += 1
                return None
            window.logged += 1
            suppressed, window.suppressed = window.suppressed, 0
            return suppressed


_limiter = InternalErrorLimiter()
_notice_limiter = InternalErrorLimiter()


def log_limited(logger: logging.Logger, level: int, key: str, msg: str, **fields: object) -> bool:
    """Log ``msg`` with ``fields`` at most once per window for ``key``; returns whether it did."""
    suppressed = _notice_limiter.admit(key)
    if suppressed is None:
        return False
    if suppressed:
        fields["suppressed"] = suppressed
    logger.log(level, msg, extra=fields)
    return True


def log_internal_error(
    logger: logging.Logger,
    session_id: str | None,
    msg: str,
    exc: BaseException,
    limiter: InternalErrorLimiter | None = None,
) -> bool:
    """Log an unexpected error of ``session_id`` as one ERROR line with ``exc``'s traceback.

    Rate-limited per session (see the module docstring); returns whether a line was written.
    The client must get only a typed error or close code, never this text.
    """
    suppressed = (limiter or _limiter).admit(session_id or "-")
    if suppressed is None:
        return False
    extra: dict[str, object] = {"error": type(exc).__name__}
    if session_id:
        extra["session_id"] = session_id
    if suppressed:
        extra["suppressed"] = suppressed
    logger.error(msg, exc_info=(type(exc), exc, exc.__traceback__), extra=extra)
    return True
