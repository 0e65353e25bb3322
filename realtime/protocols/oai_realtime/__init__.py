"""OpenAI Realtime protocol codec, sans-I/O, GA and beta dialects (docs/protocols/openai-realtime.md).

Modules, each with one job:

- ``dialect``: handshake negotiation (dialect, subprotocol answer, API key, model) -> ``Handshake``
- ``codec``: ``RealtimeCodec``, the per-connection state: text frame in -> typed command out
- ``session_config``: the session configuration, both wire shapes, deep merge of ``session.update``
- ``items``: conversation items (parse the client's, render the server's)
- ``responses``: ``response.create`` overrides and a response's effective settings
- ``client_events``: the typed commands
- ``server_events``: the typed server events and ``render(event, dialect)``
- ``errors``: ``Rejected`` and every error message; ``fields``: typed reads; ``wire``: strict JSON, ids
- ``limits``: every size limit
"""

from .codec import CodecOptions, RealtimeCodec
from .dialect import Dialect, Handshake, negotiate
from .errors import ErrorCode, Rejected
from .limits import Limits
from .session_config import SessionConfig

__all__ = [
    "CodecOptions",
    "Dialect",
    "ErrorCode",
    "Handshake",
    "Limits",
    "RealtimeCodec",
    "Rejected",
    "SessionConfig",
    "negotiate",
]
