"""``realtime bench llm``: the transformers LLM stage at a real model shape: time to first token,
inter-token latency and tokens/s at 1, 8 and 32 concurrent conversations, and a second turn on
the first turn's resident KV vs the same turn re-prefilled from scratch.

The model is a random-weight Qwen2 at ``--shape`` (default ``qwen2.5-0.5b``: hidden 896, 24
layers, 14 heads / 2 KV heads, intermediate 4864, vocab 151936; random weights at a real shape
give real timings) with a BPE tokenizer trained locally (``models/voice/random_chat_model.py``,
``text_only``: greedy replies never hit EOS and stream one piece per token), or a real checkpoint
(``--model-dir``; its replies may end early at EOS). ``--dtype auto`` is bfloat16 on CUDA and
float32 on the CPU.

Everything runs through :class:`~models.voice.stages.TransformersLlmStage`, the stage the voice
kind runs, with ``voice.llm_workers`` = the number of conversations (each generates on its own
thread, unbatched). Per conversation count ``n``, rounds of three phases (``ceil(--replies / n)``
rounds, so every phase has at least ``--replies`` replies), all ``n`` conversations at once:

1. **turn 1**: a fresh conversation, a user message making a ``--turn1-tokens`` prompt;
2. **turn 2, resident**: turn 1's messages, its reply, a ``--turn2-tokens`` user message; the
   prefill reuses the KV the conversation kept (its cached prompt tokens are reported);
3. **turn 2, re-prefill**: the conversations are released and reopened (caches dropped) and the
   same turn 2 runs again from an empty cache: what a stateless server does every turn.

Greedy, ``--max-new-tokens`` per reply. **TTFT**: from handing the request to the stage to the
first text chunk it yields (on the event loop, as the kind sees it); **ITL**: the gaps between a
reply's consecutive text chunks; **tokens/s**: a phase's generated tokens over its wall time.
The headline TTFT, ITL and tokens/s are turn 2 resident (the kind's steady state); the ratio is
resident / re-prefill turn-2 TTFT (p50) at the smallest ``n``, and per ``n`` beside it.

Last line, one JSON object: ``ttft_ms_N``, ``ttft_p95_ms_N``, ``itl_ms_N``, ``itl_p95_ms_N``,
``tokens_per_s_N`` for each ``n`` (``ttft_ms_1``, ``ttft_ms_8``, ``ttft_ms_32``, ...),
``ttft_reprefill_ms_N``, ``ttft_turn1_ms_N``, ``resident_vs_reprefill_ttft_ratio``, the token
counts, ``device``, ``dtype`` and the model shape.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

FILLER = (
    "The session server keeps every conversation resident between turns, streams audio in and "
    "out, and batches the work of many sessions on one device. Each stage runs on its own worker "
    "thread, hands chunks to the next stage through bounded queues, and never blocks the loop. "
)


@dataclass(frozen=True, slots=True)
class Reply:
    """One generation as the stage streamed it."""

    ttft_s: float
    gaps_s: tuple[float, ...]  # between consecutive text chunks
    text: str
    prompt_tokens: int
    cached_tokens: int
    generated_tokens: int


@dataclass(frozen=True, slots=True)
class Phase:
    """One phase of every round at one conversation count: its replies and wall times."""

    replies: tuple[Reply, ...]
    wall_s: float  # summed over the rounds

    def ttft_ms(self, q: float) -> float:
        return float(np.percentile([r.ttft_s for r in self.replies], q)) * 1000

    def itl_ms(self, q: float) -> float:
        gaps = [g for r in self.replies for g in r.gaps_s]
        return float(np.percentile(gaps, q)) * 1000 if gaps else 0.0

    def tokens_per_s(self) -> float:
        return sum(r.generated_tokens for r in self.replies) / self.wall_s

    def __add__(self, other: Phase) -> Phase:
        return Phase(self.replies + other.replies, self.wall_s + other.wall_s)


PHASES = ("turn1", "resident", "reprefill")


def filler_text(tokenizer, tokens: int, tag: str) -> str:
    """About ``tokens`` tokens of plain text starting with ``tag`` (the ids sliced, decoded)."""
    text = tag + " " + FILLER * (1 + tokens // 20)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"][: max(1, tokens)]
    return tokenizer.decode(ids)


async def stream_reply(stage: Any, session_id: str, request: Any, request_id: str) -> Reply:
    """Run ``request`` through ``stage`` for the open conversation ``session_id``, timing it."""
    from models.stage import StageItem

    item = StageItem(session_id, 0, request, request_id=request_id, state=session_id)
    start = time.perf_counter()
    first = last = None
    gaps: list[float] = []
    text: list[str] = []
    usage = None
    async for chunk in stage.stream(item):
        now = time.perf_counter()
        if chunk.text:
            if first is None:
                first = now
            else:
                gaps.append(now - last)
            last = now
            text.append(chunk.text)
        usage = chunk.usage or usage
    if first is None or usage is None:
        raise RuntimeError(f"{request_id}: the stage streamed no text")
    return Reply(
        first - start,
        tuple(gaps),
        "".join(text),
        usage.prompt_tokens,
        usage.cached_tokens,
        usage.generated_tokens,
    )


async def run_phase(stage: Any, requests: dict[str, Any], tag: str) -> Phase:
    """Every conversation's request at once; the phase's wall time is until the last reply."""
    start = time.perf_counter()
    replies = await asyncio.gather(
        *(stream_reply(stage, sid, r, f"{sid}-{tag}") for sid, r in requests.items())
    )
    return Phase(tuple(replies), time.perf_counter() - start)


def _open(stage: Any, ids: Sequence[str]) -> None:
    for slot, sid in enumerate(ids):
        stage.open_state(sid, slot)


def _release(stage: Any, ids: Sequence[str]) -> None:
    for slot, sid in enumerate(ids):
        stage.release_state(sid, slot, sid)


async def run_round(
    stage: Any, chat: Any, n: int, args: argparse.Namespace, round_index: int
) -> dict[str, Phase]:
    """The three phases for ``n`` conversations (opened here, released at the end)."""
    from models.voice.llm import ChatMessage, render_chat
    from models.voice.stages import ChatRequest

    ids = [f"r{round_index}c{i}" for i in range(n)]
    system = ChatMessage("system", chat.system_prompt)
    overhead = len(render_chat(chat.tokenizer, [system, ChatMessage("user", "")]))
    first = {
        sid: ChatMessage("user", filler_text(chat.tokenizer, args.turn1_tokens - overhead, sid))
        for sid in ids
    }
    second = ChatMessage("user", filler_text(chat.tokenizer, args.turn2_tokens, "And then?"))

    def request(messages: Sequence[Any]) -> Any:
        return ChatRequest(tuple(messages), max_new_tokens=args.max_new_tokens, temperature=0.0)

    _open(stage, ids)
    try:
        turn1 = await run_phase(stage, {sid: request([first[sid]]) for sid in ids}, "t1")
        answers = {sid: reply.text for sid, reply in zip(ids, turn1.replies, strict=True)}
        turn2 = {sid: request([first[sid], ChatMessage("assistant", answers[sid]), second]) for sid in ids}
        resident = await run_phase(stage, turn2, "t2")
        _release(stage, ids)
        _open(stage, ids)
        reprefill = await run_phase(stage, turn2, "t2-again")
    finally:
        _release(stage, ids)
    return {"turn1": turn1, "resident": resident, "reprefill": reprefill}


async def measure(chat: Any, n: int, args: argparse.Namespace) -> dict[str, Phase]:
    """Rounds at ``n`` conversations through a stage of ``n`` workers, until every phase has at
    least ``args.replies`` replies (``ceil(replies / n)`` rounds), after one unmeasured round of
    2-token replies (every worker thread's first forward: CUDA context and cuBLAS handle)."""
    from models.voice.stages import TransformersLlmStage

    stage = TransformersLlmStage(chat, n, workers=n)
    try:
        await run_round(stage, chat, n, argparse.Namespace(**{**vars(args), "max_new_tokens": 2}), -1)
        phases: dict[str, Phase] | None = None
        for r in range(-(-args.replies // n)):
            got = await run_round(stage, chat, n, args, r)
            phases = got if phases is None else {k: phases[k] + got[k] for k in PHASES}
        assert phases is not None
        return phases
    finally:
        stage.close()


@contextlib.contextmanager
def model_dir(args: argparse.Namespace, dtype: Any) -> Iterator[Path]:
    """``--model-dir``, or the random model of ``--shape`` built in a temporary directory."""
    if args.model_dir:
        yield Path(args.model_dir)
        return
    from models.voice.random_chat_model import SHAPES, build_random_chat_model

    with tempfile.TemporaryDirectory(prefix="bench-llm-") as tmp:
        yield build_random_chat_model(Path(tmp), SHAPES[args.shape], dtype=dtype, text_only=True)


def shape_of(config: Any) -> dict[str, int]:
    """The decoder's geometry as the loaded config states it."""
    keys = (
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "intermediate_size",
        "vocab_size",
    )
    return {k: int(getattr(config, k)) for k in keys}


def figures_of(results: dict[int, dict[str, Phase]]) -> dict[str, Any]:
    """The JSON figures: per conversation count, and the headline ratio at the smallest."""
    out: dict[str, Any] = {}
    ratios: dict[int, float] = {}
    for n, phases in results.items():
        resident = phases["resident"]
        out |= {
            f"ttft_ms_{n}": round(resident.ttft_ms(50), 2),
            f"ttft_p95_ms_{n}": round(resident.ttft_ms(95), 2),
            f"itl_ms_{n}": round(resident.itl_ms(50), 2),
            f"itl_p95_ms_{n}": round(resident.itl_ms(95), 2),
            f"tokens_per_s_{n}": round(resident.tokens_per_s(), 1),
            f"ttft_reprefill_ms_{n}": round(phases["reprefill"].ttft_ms(50), 2),
            f"ttft_turn1_ms_{n}": round(phases["turn1"].ttft_ms(50), 2),
        }
        ratios[n] = round(resident.ttft_ms(50) / phases["reprefill"].ttft_ms(50), 3)
    out["resident_vs_reprefill_ttft_ratio"] = ratios[min(ratios)]
    out["resident_vs_reprefill_ttft_ratio_by_conversations"] = ratios
    every = [r for phases in results.values() for p in phases.values() for r in p.replies]
    resident = [r for phases in results.values() for r in phases["resident"].replies]
    reprefill = [r for phases in results.values() for r in phases["reprefill"].replies]
    out |= {
        "prompt_tokens_turn1": int(
            np.median([r.prompt_tokens for p in results.values() for r in p["turn1"].replies])
        ),
        "prompt_tokens_turn2": int(np.median([r.prompt_tokens for r in resident])),
        "cached_tokens_resident": int(np.median([r.cached_tokens for r in resident])),
        "cached_tokens_reprefill": max(r.cached_tokens for r in reprefill),
        "generated_tokens_min": min(r.generated_tokens for r in every),
        "generated_tokens_max": max(r.generated_tokens for r in every),
    }
    return out


def _print_table(results: dict[int, dict[str, Phase]]) -> None:
    print(
        f"{'convs':>5} | {'TTFT p50/p95 ms: turn 1':>24} {'turn 2 resident':>17} {'re-prefill':>17} "
        f"{'ratio':>6} | {'ITL p50/p95 ms':>15} | {'tokens/s':>8}"
    )
    for n, p in results.items():
        t1, res, pre = p["turn1"], p["resident"], p["reprefill"]
        print(
            f"{n:>5} | {t1.ttft_ms(50):>13.1f} / {t1.ttft_ms(95):>8.1f} "
            f"{res.ttft_ms(50):>8.1f} / {res.ttft_ms(95):>6.1f} {pre.ttft_ms(50):>8.1f} / {pre.ttft_ms(95):>6.1f} "
            f"{res.ttft_ms(50) / pre.ttft_ms(50):>6.2f} | {res.itl_ms(50):>6.1f} / {res.itl_ms(95):>6.1f} | "
            f"{res.tokens_per_s():>8.1f}"
        )


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="realtime bench llm", description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="qwen2.5-0.5b", choices=["qwen2.5-0.5b", "tiny"])
    p.add_argument("--model-dir", default="", help="a real chat checkpoint instead of the random model")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    p.add_argument("--conversations", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--replies", type=int, default=8, help="replies per phase and count at least (rounds)")
    p.add_argument("--turn1-tokens", type=int, default=200, help="turn 1's whole prompt, in tokens")
    p.add_argument("--turn2-tokens", type=int, default=40, help="turn 2's new user message, in tokens")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default)")
    args = p.parse_args(argv)
    if min(args.conversations + [args.replies, args.max_new_tokens, args.turn2_tokens]) < 1:
        p.error("--conversations, --replies, --max-new-tokens and --turn2-tokens must be at least 1")
    import torch
    from transformers.utils import logging as hf_logging

    from models.voice.llm import TransformersChat

    hf_logging.disable_progress_bar()  # weight loading and saving bars would bury the table
    if args.threads:
        torch.set_num_threads(args.threads)
    cuda = args.device.startswith("cuda")
    dtype = getattr(torch, args.dtype) if args.dtype != "auto" else torch.bfloat16 if cuda else torch.float32
    started = time.perf_counter()
    with model_dir(args, dtype) as directory:
        chat = TransformersChat(
            directory, max_conversations=max(args.conversations), dtype=dtype, device=args.device
        )
    load_s = time.perf_counter() - started
    name = args.model_dir or args.shape
    print(
        f"llm stage (transformers) {name} on {args.device} {str(dtype).removeprefix('torch.')}: "
        f"loaded in {load_s:.1f} s; turn 1 prompt ~{args.turn1_tokens} tokens, turn 2 +{args.turn2_tokens}, "
        f"{args.max_new_tokens} new tokens, greedy, >= {args.replies} replies per phase"
    )
    results: dict[int, dict[str, Phase]] = {}
    for n in args.conversations:
        t0 = time.perf_counter()
        results[n] = asyncio.run(measure(chat, n, args))
        print(f"  {n} conversations measured in {time.perf_counter() - t0:.1f} s", flush=True)
    _print_table(results)
    figures = figures_of(results) | {
        "device": args.device,
        "dtype": str(dtype).removeprefix("torch."),
        "model": name,
        "shape": shape_of(chat.model.config),
        "max_new_tokens": args.max_new_tokens,
        "replies_per_phase": {n: len(r["resident"].replies) for n, r in results.items()},
    }
    print(json.dumps(figures))
    return 0
