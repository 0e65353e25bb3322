"""The voice kind's LLM side: the backend, chosen by ``voice.llm_backend`` (``transformers`` or
``vllm``), and the conversation as its prompt.

:func:`load_chat` builds the backend at load time (a worker thread; seconds to tens of seconds),
:func:`llm_stage` wraps it in its :class:`~models.voice.stages.LlmStage` at start. Both backends
serve the same default model (SmolLM2-135M-Instruct, converted once from the wheel's GGUF);
``voice.vllm_model_dir`` points vLLM at any other chat model directory. :func:`chat_prompt` turns
the conversation's items into the LLM's messages.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from models.voice.llm import ChatMessage
from models.voice.pacing import PacingPolicy
from models.voice.tool_calls import format_tool_call
from realtime.config import VoiceConfig
from realtime.protocols.oai_realtime.conversation import Conversation, item_text
from realtime.protocols.oai_realtime.items import FunctionCall, FunctionCallOutput, Item, Message
from realtime.protocols.oai_realtime.responses import ItemReference


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


def chat_prompt(
    conversation: Conversation, instructions: str, selection: Sequence[Item | ItemReference] | None
) -> tuple[ChatMessage, ...]:
    """The LLM's messages: ``instructions`` as the system message, then the items as text (the
    whole conversation, or ``selection``: a response's ``input``; a reference to an item deleted
    meanwhile is skipped). A function call enters as the assistant's call markup
    (``format_tool_call``), its output as a ``tool`` turn."""
    if selection is None:
        items = conversation.items()
    else:
        items = [
            entry.item if isinstance(i, ItemReference) else i
            for i in selection
            if not isinstance(i, ItemReference) or (entry := conversation.get(i.id)) is not None
        ]
    messages = [ChatMessage("system", instructions)]
    for item in items:
        if isinstance(item, FunctionCall):
            messages.append(ChatMessage("assistant", format_tool_call(item.name, item.arguments)))
        elif isinstance(item, FunctionCallOutput):
            messages.append(ChatMessage("tool", item.output))
        elif isinstance(item, Message) and (text := item_text(item)):
            messages.append(ChatMessage(item.role, text))  # type: ignore[arg-type]
    return tuple(messages)
