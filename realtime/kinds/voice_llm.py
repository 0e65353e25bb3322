"""The voice kind's LLM backend, chosen by ``voice.llm_backend``: ``transformers`` or ``vllm``.

:func:`load_chat` builds the backend at load time (a worker thread; seconds to tens of seconds),
:func:`llm_stage` wraps it in its :class:`~models.voice.stages.LlmStage` at start. Both backends
serve the same default model (SmolLM2-135M-Instruct, converted once from the wheel's GGUF);
``voice.vllm_model_dir`` points vLLM at any other chat model directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from models.voice.pacing import PacingPolicy
from realtime.config import VoiceConfig


def vllm_settings(c: VoiceConfig) -> Any:
    """The ``VllmSettings`` of the ``voice.vllm_*`` fields (SmolLM2's directory when unset)."""
    from models.voice.llm import smollm2_dir
    from models.voice.llm_vllm import VllmSettings

    return VllmSettings(
        model_dir=Path(c.vllm_model_dir) if c.vllm_model_dir else smollm2_dir(),
        kv_cache_memory_bytes=c.vllm_kv_cache_memory_bytes,
        max_model_len=c.vllm_max_model_len,
        enforce_eager=c.vllm_enforce_eager,
        block_size=c.vllm_block_size,
        dtype=c.vllm_dtype,
        max_num_seqs=c.max_sessions,
    )


def vllm_chat(c: VoiceConfig) -> Any:
    """The ``VllmChat`` engine of the config (``VllmUnavailable`` without vLLM installed)."""
    from models.voice.llm_vllm import VllmChat

    return VllmChat(vllm_settings(c))


def load_chat(c: VoiceConfig) -> Any:
    """The configured backend, loaded: ``TransformersChat`` or ``VllmChat``."""
    if c.llm_backend == "vllm":
        return vllm_chat(c)
    from models.voice.llm import TransformersChat

    return TransformersChat(
        max_conversations=c.max_sessions, max_context_tokens=c.llm_context_tokens, device=c.llm_device
    )


def llm_stage(c: VoiceConfig, chat: Any) -> Any:
    """The LLM stage over the loaded backend (one slot per voice session)."""
    if c.llm_backend == "vllm":
        from models.voice.llm_vllm import VllmLlmStage

        return VllmLlmStage(
            chat,
            c.max_sessions,
            chunked=c.chunked_tts,
            first_clause_words=c.first_clause_words,
            pacing=PacingPolicy(c.llm_max_lead_s, c.llm_urgent_lead_s),
        )
    from models.voice.stages import TransformersLlmStage

    return TransformersLlmStage(
        chat,
        c.max_sessions,
        workers=c.llm_workers,
        chunked=c.chunked_tts,
        first_clause_words=c.first_clause_words,
        pacing=PacingPolicy(c.llm_max_lead_s, c.llm_urgent_lead_s),
    )
