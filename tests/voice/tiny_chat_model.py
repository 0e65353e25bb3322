"""The tiny random-weight Qwen2 chat model the vLLM stage tests serve (built locally, no hub).

:func:`build_tiny_chat_model` is :func:`realtime.bench.random_chat_model.build_random_chat_model`
at the :data:`~realtime.bench.random_chat_model.TINY` shape (2 layers, hidden 128, 427k parameters,
float32, ~2 MB; a 1000-token BPE tokenizer trained on this repository's text, ChatML template,
EOS ``<|im_end|>``); its greedy replies are varied nonsense text (words, spaces, punctuation).
"""

from __future__ import annotations

from pathlib import Path

from realtime.bench.random_chat_model import TINY, build_random_chat_model


def build_tiny_chat_model(out: Path) -> Path:
    """Write the tokenizer and model into ``out`` (created) and return it."""
    return build_random_chat_model(out, TINY)
