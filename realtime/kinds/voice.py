"""The voice session kind: OpenAI Realtime-compatible voice sessions on ``/v1/realtime``.

Stock OpenAI Realtime clients (the ``openai`` SDK's GA ``client.realtime.connect`` and beta
``client.beta.realtime.connect``, browser pages on the ``realtime`` subprotocol) talk to open models
through it. Three parts, one job each:

- this module, the service: the models (``models/voice/stages.py``), each behind its own engine
  so every stage batches across sessions (the batched **VAD** and **ASR** engines, and the
  ``Pipeline`` **LLM -> TTS** that answers), the one capacity plan, the routes;
- ``voice_connection.py``, one connection's command handler on the shared skeleton (the user's
  audio through the VAD in the reader, turns, transcription, responses as streaming ticks,
  barge-in as one ``Session.interrupt``);
- the sans-I/O codec ``realtime/protocols/oai_realtime/`` (the handshake picks the dialect; the
  conversation, a response's output events and the audio encoding are its state machines);
  ``voice_llm.py`` picks the LLM backend and makes the prompt.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from prometheus_client import Histogram
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route, WebSocketRoute
from starlette.websockets import WebSocket

from realtime.auth import BOUND_SESSION
from realtime.client_secrets import TooManySecretsError
from realtime.kinds.base import KindServiceBase, ProgressFn, ServedModel, ServerContext
from realtime.kinds.runtime import build_session_manager, capacity_plan, stage_declaration
from realtime.kinds.voice_connection import VoiceHandler
from realtime.kinds.voice_llm import llm_stage, load_chat
from realtime.protocols.oai_realtime import (
    Dialect,
    ErrorCode,
    Handshake,
    Limits,
    Rejected,
    SessionConfig,
    negotiate,
)
from realtime.protocols.oai_realtime import calls as calls_wire
from realtime.protocols.oai_realtime import client_secrets as secrets_wire
from realtime.protocols.oai_realtime.dialect import DEFAULT_BETA_MODEL, SERVED_MODEL_HEADER
from realtime.protocols.oai_realtime.errors import ParamError
from realtime.protocols.oai_realtime.session_config import Transcription
from realtime.protocols.oai_realtime.wire import StrictJSONError, loads_strict, new_id
from realtime.webrtc.calls import CallRegistry, TooManyCallsError, webrtc_available
from sessions.engine import Pipeline, StageEngine, StreamingStageEngine
from sessions.executor import StageExecutor
from sessions.lifecycle import RESTARTS, ReleaseReason

if TYPE_CHECKING:
    from realtime.webrtc.call import Call

PATH = "/v1/realtime"  # websockets; a POST here is the beta WebRTC call
CALLS_PATH = "/v1/realtime/calls"  # GA: place a WebRTC call
GA_SECRETS_PATH = "/v1/realtime/client_secrets"  # GA: mint an ephemeral key
BETA_SECRETS_PATH = "/v1/realtime/sessions"  # beta: the same, in the beta shape
TTFA_BUCKETS = (0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0)


def voice_input(snapshot: Any) -> Any:
    """The tick's input: the response's ``ChatRequest`` (the tick payload)."""
    return snapshot.payload


class _VoiceLifecycle:
    """The session's one release path over the response pipeline and the VAD and ASR engines.

    A reset or a failed tick releases only the pipeline (the LLM's KV); the audio engines keep
    the session until it ends, so input audio keeps flowing.
    """

    def __init__(self, pipeline: Pipeline, audio: Sequence[StageEngine]) -> None:
        self.pipeline = pipeline
        self.audio = audio

    async def release(self, session_id: str, reason: ReleaseReason) -> None:
        await self.pipeline.release(session_id, reason)
        if reason not in RESTARTS:
            for engine in self.audio:
                await engine.release(session_id, reason)


class VoiceService(KindServiceBase):
    """The ``voice`` session kind (``realtime.kinds.base.SessionKindService``)."""

    name = "voice"

    def __init__(self, ctx: ServerContext) -> None:
        super().__init__(ctx)
        self.config = ctx.config.voice
        self.models_loaded: dict[str, Any] = {}
        self.llm: Any = None  # the LlmStage (tests read its usage)
        self.vad_engine: StageEngine | None = None
        self.asr_engine: StageEngine | None = None
        self.pipeline: Pipeline | None = None
        self.default_instructions = ""
        self.asr_speculations = 0  # transcriptions started at a candidate end of speech (tests, bench)
        self.asr_speculations_used = 0  # ... and reused by the stop that followed
        self.calls: CallRegistry | None = None  # WebRTC calls (``webrtc`` extra installed and enabled)
        self.ttfa = Histogram(
            "voice_time_to_first_audio_seconds",
            "committed user turn (speech_stopped or input_audio_buffer.commit) -> its answer's first audio delta",
            buckets=TTFA_BUCKETS,
            registry=ctx.registry,
        )

    def routes(self) -> list[BaseRoute]:
        return [
            WebSocketRoute(PATH, self._endpoint),
            Route(GA_SECRETS_PATH, self._mint_ga, methods=["POST"]),
            Route(BETA_SECRETS_PATH, self._mint_beta, methods=["POST"]),
            Route(CALLS_PATH, self._call_ga, methods=["POST"]),
            Route(PATH, self._call_beta, methods=["POST"]),
            Route(CALLS_PATH + "/{call_id}/hangup", self._hangup, methods=["POST"]),
        ]

    def models(self) -> list[ServedModel]:
        c = self.config
        details = {"asr": c.asr_name, "tts": "hibari", "vad": "silero-vad", "chunked_tts": c.chunked_tts}
        return [ServedModel(c.served_model, self.name, (PATH,), details)]

    def load(self, progress: ProgressFn) -> None:
        import torch

        from models.voice.asr import build_asr
        from models.voice.llm import DEFAULT_SYSTEM_PROMPT
        from models.voice.tts import HibariTts
        from models.voice.vad import SileroVad

        c = self.config
        if c.torch_threads:
            torch.set_num_threads(c.torch_threads)
        steps = (  # the LLM first: its weights' package is the one a bare install lacks (WeightsMissing)
            ("llm", lambda: load_chat(c)),  # voice.llm_backend: transformers | vllm
            ("vad", SileroVad),
            ("asr", lambda: build_asr(c.asr_model, device=c.asr_device, dtype=c.asr_dtype)),
            ("tts", HibariTts),
        )
        for i, (name, build) in enumerate(steps):
            progress(name, i, len(steps))
            self.models_loaded[name] = build()
        progress("ready", len(steps), len(steps))
        self.default_instructions = c.instructions or DEFAULT_SYSTEM_PROMPT

    async def start(self) -> None:
        from models.voice.stages import AsrStage, TtsStage, VadStage

        c, registry, m = self.config, self.ctx.registry, self.models_loaded
        self.llm = llm_stage(c, m["llm"])
        vad = VadStage(m["vad"], c.max_sessions)
        plan = capacity_plan(
            self.ctx.config.runtime, stage_declaration(self.llm, vad, max_sessions=c.max_sessions)
        )
        common = {"registry": registry, "max_sessions": plan.capacity, "stall_timeout_s": c.stall_timeout_s}
        batched = {"max_batch": c.max_batch, **common}
        self.vad_engine = StageEngine(vad, coalesce_window_s=c.vad_coalesce_window_s, **batched)
        self.asr_engine = StageEngine(
            AsrStage(m["asr"]), coalesce_window_s=c.asr_coalesce_window_s, **batched
        )
        tts = StageEngine(TtsStage(m["tts"]), coalesce_window_s=c.tts_coalesce_window_s, **batched)
        self.runner = self.pipeline = Pipeline(
            [StreamingStageEngine(self.llm, **common), tts], registry=registry
        )
        self.manager = build_session_manager(
            self.name,
            ctx=self.ctx,
            kind_config=c,
            plan=plan,
            executor=StageExecutor(self.pipeline, voice_input),
            lifecycle=_VoiceLifecycle(self.pipeline, (self.vad_engine, self.asr_engine)),
        )
        await self.manager.start()
        if self.ctx.config.webrtc.enabled and webrtc_available():
            self.calls = CallRegistry(self.ctx.config.webrtc)

    async def stop(self) -> None:
        if self.calls is not None:
            await self.calls.close()
        await super().stop()  # the manager, then the response pipeline (``self.runner``)
        for engine in (self.vad_engine, self.asr_engine):
            if engine is not None:
                await engine.close()
        if self.llm is not None:
            self.llm.close()
        shutdown = getattr(self.models_loaded.get("llm"), "shutdown", None)
        if shutdown is not None:  # a vLLM engine (its process, weights and KV pool) ends with the kind
            await asyncio.to_thread(shutdown)

    def session_defaults(self, handshake: Handshake) -> SessionConfig:
        """A new session's config (also what an explicit ``null`` restores)."""
        return self.session_defaults_for(handshake.display_model(self.config.served_model))

    def session_defaults_for(self, model: str) -> SessionConfig:
        """The server's session defaults, showing ``model``."""
        c = self.config
        return SessionConfig(
            model=model,
            instructions=self.default_instructions,
            voice=c.voice,
            transcription=Transcription(model=c.asr_name) if c.transcription else None,
        )

    async def _endpoint(self, websocket: WebSocket) -> None:
        scope = websocket.scope
        handshake = negotiate(
            scope.get("query_string", b""), websocket.headers, scope.get("subprotocols", ())
        )
        handler = VoiceHandler(self, handshake, bound=scope.get("state", {}).get(BOUND_SESSION))
        headers = handshake.accept_headers(self.config.served_model)
        await self.serve(websocket, handler, subprotocol=handshake.subprotocol, headers=headers)

    async def _call_ga(self, request: Request) -> Response:
        return await self._call(request, beta=False)

    async def _call_beta(self, request: Request) -> Response:
        return await self._call(request, beta=True)

    async def _call(self, request: Request, beta: bool) -> Response:
        """A WebRTC call (``realtime.webrtc``): the SDP offer in, the answer out (201); the call
        then runs the same handler as a websocket, on the call's tracks and data channel."""
        if self.calls is None:
            why = (
                "disabled (webrtc.enabled: false)"
                if not self.ctx.config.webrtc.enabled
                else ("not installed (pip install -e '.[webrtc]')")
            )
            return _error(501, Rejected("unsupported_feature", f"WebRTC calls are {why} on this server."))
        body = await _read_body(request, calls_wire.MAX_BODY_BYTES)
        if body is None:
            limit = calls_wire.MAX_BODY_BYTES
            return _error(413, Rejected("request_too_large", f"The body is larger than {limit} bytes."))
        handshake = negotiate(request.scope.get("query_string", b""), request.headers, ())
        if beta:  # the beta form is beta whatever its headers say
            handshake = replace(handshake, dialect=Dialect.BETA)
        dialect = handshake.dialect
        defaults = request.scope.get("state", {}).get(BOUND_SESSION) or self.session_defaults(handshake)
        try:
            offer = calls_wire.parse_call(
                request.headers.get("content-type", ""), body, dialect, defaults, Limits()
            )
        except ParamError as exc:
            return _error(400, exc.rejected)
        bound = offer.config or request.scope.get("state", {}).get(BOUND_SESSION)

        async def serve(call: Call, websocket: WebSocket) -> None:
            handler = VoiceHandler(self, handshake, bound=bound, playout=call.playout)
            await self.serve(websocket, handler)

        scope = {
            k: request.scope[k]
            for k in ("path", "headers", "query_string", "client", "server")
            if k in request.scope
        }
        try:
            call_id, answer = await self.calls.answer(offer.sdp, dialect, scope, serve)
        except TooManyCallsError as exc:
            return _error(429, Rejected("rate_limit_exceeded", f"Too many calls: {exc}; try again later."))
        except ValueError as exc:  # aiortc refused the offer (no usable audio or ICE or DTLS)
            return _error(
                400, Rejected(ErrorCode.INVALID_VALUE, f"The SDP offer could not be answered: {exc}", "sdp")
            )
        headers = {"Location": f"{CALLS_PATH}/{call_id}", SERVED_MODEL_HEADER: self.config.served_model}
        return Response(answer, 201, headers=headers, media_type=calls_wire.SDP)

    async def _hangup(self, request: Request) -> Response:
        if self.calls is None or not self.calls.hangup(request.path_params["call_id"]):
            return _error(404, Rejected("not_found", "No such call."))
        return Response(status_code=200)

    async def _mint_ga(self, request: Request) -> Response:
        return await self._mint(request, Dialect.GA)

    async def _mint_beta(self, request: Request) -> Response:
        return await self._mint(request, Dialect.BETA)

    async def _mint(self, request: Request, dialect: Dialect) -> Response:
        """A client secret bound to the request's session config (``realtime.client_secrets``);
        the caller is authenticated by the app's guard like every other route."""
        body = await _read_body(request, secrets_wire.MAX_BODY_BYTES)
        if body is None:
            limit = secrets_wire.MAX_BODY_BYTES
            return _error(413, Rejected("request_too_large", f"The body is larger than {limit} bytes."))
        model = self.config.served_model if dialect is Dialect.GA else DEFAULT_BETA_MODEL
        defaults = self.session_defaults_for(model)
        try:
            minted = secrets_wire.parse_mint(loads_strict(body.decode("utf-8")), dialect, defaults, Limits())
        except (StrictJSONError, UnicodeDecodeError):
            return _error(
                400, Rejected(ErrorCode.INVALID_JSON, "We could not parse the JSON body of your request.")
            )
        except ParamError as exc:
            return _error(400, exc.rejected)
        try:
            secret = self.ctx.client_secrets.mint(minted.config, minted.expires_after_s)
        except TooManySecretsError:
            message = (
                "Too many client secrets are outstanding; try again when some have expired or been used."
            )
            return _error(429, Rejected("rate_limit_exceeded", message))
        answer = secrets_wire.render_minted(
            secret.value, secret.expires_at, minted.config, dialect, new_id("sess")
        )
        return JSONResponse(answer)


async def _read_body(request: Request, limit: int) -> bytes | None:
    """The request's body, or ``None`` once it is over ``limit`` bytes (declared or read so far)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        return None
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            return None
    return bytes(body)


def _error(status: int, rejected: Rejected) -> JSONResponse:
    """OpenAI's HTTP error body."""
    error = {
        "message": rejected.message,
        "type": rejected.type,
        "param": rejected.param,
        "code": rejected.code,
    }
    return JSONResponse({"error": error}, status)


def build_voice_service(ctx: ServerContext) -> VoiceService:
    return VoiceService(ctx)
