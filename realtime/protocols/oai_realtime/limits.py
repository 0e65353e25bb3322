"""Every size limit of the OpenAI Realtime codec, with its default (docs/protocols/openai-realtime.md)."""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1024 * 1024
MAX_APPEND_BYTES = 15 * MIB  # OpenAI's documented cap on one input_audio_buffer.append (decoded)


def _base64_len(n: int) -> int:
    return 4 * ((n + 2) // 3)


@dataclass(frozen=True)
class Limits:
    """Bounds on what one client event may carry. Each breach is a typed ``Rejected``."""

    max_append_bytes: int = MAX_APPEND_BYTES
    # a text frame must fit the largest append (base64) plus room for the event's other fields
    max_event_bytes: int = _base64_len(MAX_APPEND_BYTES) + 64 * 1024
    max_instructions_chars: int = 32_768
    max_text_chars: int = 32_768  # one input_text / output_text part, a transcript, a function output
    max_item_audio_bytes: int = MAX_APPEND_BYTES  # decoded input_audio of one conversation.item.create
    max_content_parts: int = 32
    max_tools: int = 128
    max_tool_name_chars: int = 64
    max_tool_description_chars: int = 1024  # OpenAI's limit (its error names it: livekit/agents #1183)
    max_id_chars: int = 64  # item, call and response ids a client supplies
    max_event_id_chars: int = 256
    max_name_chars: int = 256  # model, voice, transcription model and language names
    max_response_input_items: int = 128
    max_output_tokens: int = 4096  # OpenAI's range for max_output_tokens is 1..4096 or "inf"
    max_metadata_pairs: int = 16  # OpenAI: 16 pairs, keys <= 64 chars, values <= 512 chars
    max_metadata_key_chars: int = 64
    max_metadata_value_chars: int = 512
    max_vad_ms: int = 10_000  # prefix_padding_ms and silence_duration_ms
    max_idle_timeout_ms: int = 30 * 60 * 1000
