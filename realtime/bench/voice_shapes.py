"""``realtime bench voice --shape real``: the voice cascade at real model shapes on one GPU (issue 30).

The voice kind as a GPU user runs it, every model at a published shape with random weights (no
hub; random weights at a real shape give real timings):

- **ASR**: Whisper-large-v3-turbo's shape (0.8B: 32 encoder layers, 4 decoder layers, 128 mel
  bins) on torch (``voice.asr_model`` a Hugging Face Whisper folder, ``voice.asr_device``), batched
  across sessions, the short encoder window;
- **LLM**: Qwen2.5-7B's shape on vLLM (``voice.llm_backend: vllm``), prefix caching across turns;
  ``text_only`` weights (``realtime/bench/random_chat_model.py``): greedy replies never end early,
  so every reply is ``voice.max_output_tokens`` long;
- **TTS**: the hibari voice (a Kokoro-82M distillation, ONNX on the host's cores: ~15 ms for a
  first clause on one core), batched per stage call.

The folders are written once under ``--models-dir`` (drawn on the GPU). Then one warm-up turn, and
the conversation load (``realtime/bench/voice_load.py``: openai SDK GA clients speaking at real-time
pace, listening to the whole reply, thinking, speaking again) at each ``--sessions`` count on one
server. A random-weight Whisper transcribes gibberish up to its length guard (16 + 12 tokens per
second of audio), about three times a real transcript's tokens: the ASR figure is pessimistic.

``--shape tiny --device cpu`` runs the same path at test sizes on the CPU (vLLM's CPU build).

Last line's headline: ``ttfa_ms_p50_32`` (the load's p50 TTFA at 32 sessions; issue 30's goal
<= 300 ms), with ``ttfa_ms_N`` / ``ttfa_ms_N_p95`` / ``stall_ms_N_p95`` / ``failed_turns_N`` for every
count and ``cycle_s``.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from realtime.bench.goals import goal_note

COMPLETE = ".complete"  # written last: a folder without it is rebuilt


@dataclass(frozen=True, slots=True)
class CascadeShape:
    """The models of one ``--shape`` (names of ``random_whisper`` / ``random_chat_model`` shapes)
    and the server's voice settings for them (``--set`` overrides any)."""

    whisper: str
    chat: str
    dtype: str  # the folders' saved dtype (and vLLM's)
    settings: dict[str, Any] = field(default_factory=dict)


SHAPES = {
    "real": CascadeShape(
        "large-v3-turbo",
        "qwen2.5-7b",
        "bfloat16",
        {
            "vllm_kv_cache_memory_bytes": 24 << 30,  # 430k tokens of Qwen2.5-7B's KV (56 KiB each)
            "max_output_tokens": 48,  # a spoken answer of two sentences (~15 s of audio)
        },
    ),
    # the same path at test sizes on the CPU (tests/voice/test_bench_voice_shapes.py)
    "tiny": CascadeShape(
        "tiny", "tiny", "float32", {"vllm_kv_cache_memory_bytes": 64 << 20, "max_output_tokens": 16}
    ),
}


def model_folders(shape: CascadeShape, models_dir: Path, device: str) -> tuple[Path, Path]:
    """The Whisper and chat-model folders of ``shape`` under ``models_dir``, each built once (the
    weights drawn on ``device``)."""
    import torch

    from realtime.bench import random_chat_model, random_whisper

    asr, llm = models_dir / f"whisper-{shape.whisper}-random", models_dir / f"chat-{shape.chat}-random"
    dtype = getattr(torch, shape.dtype)
    if not (asr / COMPLETE).exists():
        print(f"writing a random Whisper folder of shape {shape.whisper} to {asr}", flush=True)
        whisper = random_whisper.SHAPES[shape.whisper]
        random_whisper.build_random_whisper(asr, whisper, device=device, dtype=dtype)
        (asr / COMPLETE).touch()
    if not (llm / COMPLETE).exists():
        print(f"writing a random chat model of shape {shape.chat} to {llm}", flush=True)
        chat = random_chat_model.SHAPES[shape.chat]
        random_chat_model.build_random_chat_model(llm, chat, dtype=dtype, text_only=True, device=device)
        (llm / COMPLETE).touch()
    return asr, llm


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """The conversation load at every session count on one server of ``args.shape``."""
    from realtime.bench.voice import load_figures, spoken, ttfa, voice_server

    shape = SHAPES[args.shape]
    asr, llm = model_folders(shape, Path(args.models_dir), args.device)
    overrides = dict(args.set)  # voice_server applies --set, then these: leave out what it sets
    ours = {
        **shape.settings,
        "llm_backend": "vllm",
        "vllm_dtype": shape.dtype,
        "asr_model": str(asr),
        "asr_device": args.device,
        "vllm_model_dir": str(llm),
        "vllm_enforce_eager": args.vllm_eager,
    }
    ours = {k: v for k, v in ours.items() if k not in overrides}
    shown = ", ".join(f"{k}={v}" for k, v in sorted({**ours, **overrides}.items()))
    print(f"voice at real shapes: {shown}", flush=True)
    async with voice_server(args, **ours) as (url, service):
        tts = service.models_loaded["tts"]
        await ttfa(url, spoken(tts, args.question)[0], 1, 1)  # warm-up: every engine's first use
        figures = await load_figures(args, url, [spoken(tts, q)[0] for q in args.questions])
        served = service.models()[0].details  # what the server says it ran, beside the figures
        figures.update(asr=served["asr"], llm_backend=service.config.llm_backend)
    if "ttfa_ms_32" in figures:
        figures["ttfa_ms_p50_32"] = figures["ttfa_ms_32"]
        print(f"ttfa_ms_p50_32: {figures['ttfa_ms_p50_32']:.0f} ms{goal_note('voice', 'ttfa_ms_p50_32')}")
    return figures
