"""WebRTC calls for OpenAI Realtime clients (``docs/protocols/webrtc.md``), on aiortc.

- ``playout``: the call's output audio buffer, sans-I/O (``output_audio_buffer.*`` events);
- ``media``: the outgoing track that plays it and the microphone reader (Opus by aiortc, soxr);
- ``call``: one call as an ASGI websocket, so the connection skeleton and the voice kind's
  handler run on it unchanged;
- ``calls``: the registry that answers offers, runs each call as a task and hangs up.

The HTTP side (``POST /v1/realtime/calls``, the beta ``POST /v1/realtime``) is the voice kind's
route; the request body's codec is ``realtime.protocols.oai_realtime.calls``.
"""
