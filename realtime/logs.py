"""Structured logging: ``key=value`` text or one JSON object per line.

Every record carries ``session`` when emitted inside ``sessions.log_context.session_context``
(or when passed as ``extra={"session_id": ...}``). Extra fields passed through ``extra={...}``
are rendered as further keys. Tracebacks go to logs, never to the wire.
"""

from __future__ import annotations

import json
import logging
import time

from sessions.log_context import current_session_id

_STANDARD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "color_message",  # uvicorn's ANSI-coloured duplicate of msg
}


def _fields(record: logging.LogRecord) -> dict[str, object]:
    fields: dict[str, object] = {
        "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
        "level": record.levelname.lower(),
        "logger": record.name,
        "msg": record.getMessage(),
    }
    session_id = getattr(record, "session_id", None) or current_session_id.get()
    if session_id:
        fields["session"] = session_id
    for key, value in vars(record).items():
        if key not in _STANDARD_ATTRS and key != "session_id" and not key.startswith("_"):
            fields[key] = value
    if record.exc_info:
        fields["exc"] = logging.Formatter().formatException(record.exc_info)
    return fields


class KeyValueFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        parts = []
        for key, value in _fields(record).items():
            text = str(value)
            if key == "exc":
                continue
            if not text or any(c in text for c in ' "=\n'):
                text = json.dumps(text)
            parts.append(f"{key}={text}")
        line = " ".join(parts)
        if record.exc_info:
            line += "\n" + logging.Formatter().formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(_fields(record), default=str)


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
