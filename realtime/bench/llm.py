"""``realtime bench llm``: the transformers LLM stage at a real model shape: time to first token,
inter-token latency and tokens/s at 1, 8 and 32 concurrent conversations, and a second turn on
the first turn's resident KV vs the same turn re-prefilled from scratch.

The model is a random-weight Qwen2 at ``--shape`` (default ``qwen2.5-0.5b``: hidden 896, 24
layers, 14 heads / 2 KV heads, intermediate 4864, vocab 151936; random weights at a real shape
give real timings), drawn on ``--device``, with a BPE tokenizer trained locally
(``realtime/bench/random_chat_model.py``, ``text_only``: greedy replies never hit EOS and stream one
piece per token), or a real checkpoint (``--model-dir``; its replies may end early at EOS).
``--dtype auto`` is bfloat16 on CUDA and float32 on the CPU.

Everything runs through :class:`~models.voice.stages.TransformersLlmStage`, the stage the voice
kind runs, with one generation thread per conversation (unbatched) and ``--workers`` model steps
at once (``voice.llm_workers``; 0, the default: the number of conversations; several values
measure every count at each, in one process). Per setting (a conversation count ``n`` at one
``--workers`` value): one unmeasured turn-1 phase of 2-token replies (every worker thread's first forward:
CUDA context, cuBLAS handle), then rounds of three phases, all ``n`` conversations at once:

1. **turn 1**: a fresh conversation, a user message making a ``--turn1-tokens`` prompt;
2. **turn 2, resident**: turn 1's messages, its reply, a ``--turn2-tokens`` user message; the
   prefill reuses the KV the conversation kept (its cached prompt tokens are reported);
3. **turn 2, re-prefill**: the conversations are released and reopened (caches dropped) and the
   same turn 2 runs again from an empty cache: what a stateless server does every turn.

**Time budget** (``--seconds``, from the bench's start, imports and the model's build and load
included; 0: none): each setting gets an equal share of what is left when it starts (what a
setting leaves unused goes to the later ones), and each phase of a round an equal share of what
is left of its setting's. Replies still running at their phase's deadline are aborted
(``cut``): their TTFT (if their first chunk came) and gaps still count, and tokens/s counts their
tokens over the phase's wall time. Further rounds run while every phase has fewer than
``--replies`` replies and the last round's wall time still fits the setting's share. A setting
that starts with the budget spent is skipped (its figures null). Every figure says how many replies it
is from (``replies_N``, ``cut_replies_N``).

Greedy, ``--max-new-tokens`` per reply. **TTFT**: from handing the request to the stage to the
first text chunk it yields (on the event loop, as the kind sees it); **ITL**: the gaps between a
reply's consecutive text chunks as they reach the loop (p50, p95, and their mean: the decode pace,
which chunks queued behind a busy event loop and then read in a burst do not shrink as they do the
p50); **tokens/s**: a phase's generated tokens over its wall time.
The headline TTFT, ITL and tokens/s are turn 2 resident (the kind's steady state); the ratio is
resident / re-prefill turn-2 TTFT (p50) at the smallest ``n`` of the first ``--workers`` value,
and per setting beside it.

Last line, one JSON object: ``ttft_ms_N``, ``ttft_p95_ms_N``, ``itl_ms_N``, ``itl_p95_ms_N``,
``itl_mean_ms_N``, ``tokens_per_s_N`` for each setting, ``N`` its label: ``n`` at ``n`` steps at
once (``ttft_ms_1``, ``ttft_ms_8``, ``ttft_ms_32``, ...), ``n_wW`` at ``W`` (``tokens_per_s_32_w1``),
``ttft_reprefill_ms_N``, ``ttft_turn1_ms_N``, ``resident_vs_reprefill_ttft_ratio``, the token
counts, per setting the replies, cut replies, rounds, workers and wall seconds of each phase, the
build and load seconds, ``device``, ``dtype`` and the model shape. A figure with no reply behind
it is null.
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

    ttft_s: float | None  # None: cut before its first text chunk
    gaps_s: tuple[float, ...]  # between consecutive text chunks
    text: str
    prompt_tokens: int
    cached_tokens: int
    generated_tokens: int
    cut: bool  # aborted at its phase's deadline (the stage sent no final usage chunk)


def _ms(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(values, q)) * 1000 if values else None


@dataclass(frozen=True, slots=True)
class Phase:
    """One phase of every round at one conversation count: its replies and wall times. A
    statistic over no values (every reply cut before its first chunk) is None."""

    replies: tuple[Reply, ...]
    wall_s: float  # summed over the rounds

    def ttft_ms(self, q: float) -> float | None:
        return _ms([r.ttft_s for r in self.replies if r.ttft_s is not None], q)

    def itl_ms(self, q: float) -> float | None:
        return _ms([g for r in self.replies for g in r.gaps_s], q)

    def itl_mean_ms(self) -> float | None:
        """The decode pace: every gap's mean (robust to chunks arriving in bursts)."""
        gaps = [g for r in self.replies for g in r.gaps_s]
        return sum(gaps) / len(gaps) * 1000 if gaps else None

    def tokens_per_s(self) -> float:
        return sum(r.generated_tokens for r in self.replies) / self.wall_s

    def cut(self) -> int:
        return sum(r.cut for r in self.replies)

    def __add__(self, other: Phase) -> Phase:
        return Phase(self.replies + other.replies, self.wall_s + other.wall_s)


PHASES = ("turn1", "resident", "reprefill")


@dataclass(frozen=True, slots=True)
class Setting:
    """One measured configuration: ``conversations`` at once, ``workers`` model steps at once."""

    conversations: int
    workers: int

    @property
    def label(self) -> str:
        """The JSON keys' suffix: ``32`` (as many steps as conversations), ``32_w1`` otherwise."""
        n = self.conversations
        return str(n) if self.workers == n else f"{n}_w{self.workers}"

    @classmethod
    def of(cls, conversations: int, workers: int) -> Setting:
        """``workers`` as ``--workers`` gives it: 0 is the conversations, and so is more."""
        return cls(conversations, min(workers or conversations, conversations))


def settings_of(conversations: Sequence[int], workers: Sequence[int]) -> list[Setting]:
    """Every ``--workers`` value for every count, in that order, each distinct setting once."""
    return list(dict.fromkeys(Setting.of(n, w) for w in workers for n in conversations))


@dataclass(frozen=True, slots=True)
class Measured:
    """One conversation count's phases (summed over its rounds) and how its time was spent."""

    phases: dict[str, Phase]
    rounds: int
    workers: int
    warmup_s: float


def filler_text(tokenizer, tokens: int, tag: str) -> str:
    """About ``tokens`` tokens of plain text starting with ``tag`` (the ids sliced, decoded)."""
    text = tag + " " + FILLER * (1 + tokens // 20)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"][: max(1, tokens)]
    return tokenizer.decode(ids)


async def stream_reply(stage: Any, session_id: str, request: Any, request_id: str) -> Reply:
    """Run ``request`` through ``stage`` for the open conversation ``session_id``, timing it. A
    reply that ends without the final usage chunk was aborted: its counts come from the stage."""
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
    cut = usage is None
    if cut:
        usage = stage.last_usage(session_id)
    elif first is None:
        raise RuntimeError(f"{request_id}: the stage streamed no text")
    ttft = None if first is None else first - start
    return Reply(
        ttft,
        tuple(gaps),
        "".join(text),
        usage.prompt_tokens,
        usage.cached_tokens,
        usage.generated_tokens,
        cut,
    )


ABORT_RECHECK_S = 0.05  # a reply whose abort found no generation yet (still queued) is aborted again


async def run_phase(stage: Any, requests: dict[str, Any], tag: str, deadline: float) -> Phase:
    """Every conversation's request at once; the replies still running at ``deadline``
    (``time.perf_counter``; ``inf``: none) are aborted. The wall time is until the last ends."""
    start = time.perf_counter()
    tasks = {
        f"{sid}-{tag}": asyncio.ensure_future(stream_reply(stage, sid, r, f"{sid}-{tag}"))
        for sid, r in requests.items()
    }
    timeout = None if deadline == float("inf") else max(0.0, deadline - start)
    _, pending = await asyncio.wait(tasks.values(), timeout=timeout)
    while pending:
        for request_id, task in tasks.items():
            if not task.done():
                stage.abort(request_id)
        _, pending = await asyncio.wait(pending, timeout=ABORT_RECHECK_S)
    replies = [task.result() for task in tasks.values()]
    return Phase(tuple(replies), time.perf_counter() - start)


def _phase_deadline(end: float, phases_left: int) -> float:
    """An equal share of what is left until ``end`` for each of the ``phases_left`` phases."""
    now = time.perf_counter()
    return now + (end - now) / phases_left


def _open(stage: Any, ids: Sequence[str]) -> None:
    for slot, sid in enumerate(ids):
        stage.open_state(sid, slot)


def _release(stage: Any, ids: Sequence[str]) -> None:
    for slot, sid in enumerate(ids):
        stage.release_state(sid, slot, sid)


def _request(messages: Sequence[Any], max_new_tokens: int) -> Any:
    from models.voice.stages import ChatRequest

    return ChatRequest(tuple(messages), max_new_tokens=max_new_tokens, temperature=0.0)


def _first_messages(chat: Any, ids: Sequence[str], turn1_tokens: int) -> dict[str, Any]:
    """Each conversation's turn-1 user message: the whole prompt is about ``turn1_tokens``."""
    from models.voice.llm import ChatMessage, render_chat

    system = ChatMessage("system", chat.system_prompt)
    overhead = len(render_chat(chat.tokenizer, [system, ChatMessage("user", "")]))
    return {
        sid: ChatMessage("user", filler_text(chat.tokenizer, turn1_tokens - overhead, sid)) for sid in ids
    }


async def warm_up(stage: Any, chat: Any, n: int, args: argparse.Namespace, end: float) -> None:
    """Unmeasured 2-token replies on ``n`` fresh conversations: turn 1, then a turn 2 on the
    resident cache, so that the first measured prefill onto a cache pays no one-time set-up
    (on the H200 the first one took 807 ms against 75 ms for a whole re-prefill)."""
    from models.voice.llm import ChatMessage

    ids = [f"warm{i}" for i in range(n)]
    first = _first_messages(chat, ids, args.turn1_tokens)
    _open(stage, ids)
    try:
        turn1 = await run_phase(
            stage, {sid: _request([first[sid]], 2) for sid in ids}, "warm", _phase_deadline(end, 2)
        )
        more = ChatMessage("user", "And then?")
        turn2 = {
            sid: _request([first[sid], ChatMessage("assistant", reply.text), more], 2)
            for sid, reply in zip(ids, turn1.replies, strict=True)
        }
        await run_phase(stage, turn2, "warm2", end)
    finally:
        _release(stage, ids)


async def run_round(
    stage: Any, chat: Any, n: int, args: argparse.Namespace, round_index: int, end: float
) -> dict[str, Phase]:
    """The three phases for ``n`` conversations (opened here, released at the end), each phase
    ending by an equal share of the time left until ``end``."""
    from models.voice.llm import ChatMessage

    ids = [f"r{round_index}c{i}" for i in range(n)]
    first = _first_messages(chat, ids, args.turn1_tokens)
    second = ChatMessage("user", filler_text(chat.tokenizer, args.turn2_tokens, "And then?"))
    new = args.max_new_tokens
    _open(stage, ids)
    try:
        turn1 = await run_phase(
            stage, {sid: _request([first[sid]], new) for sid in ids}, "t1", _phase_deadline(end, 3)
        )
        answers = {sid: reply.text for sid, reply in zip(ids, turn1.replies, strict=True)}
        turn2 = {
            sid: _request([first[sid], ChatMessage("assistant", answers[sid]), second], new) for sid in ids
        }
        resident = await run_phase(stage, turn2, "t2", _phase_deadline(end, 2))
        _release(stage, ids)
        _open(stage, ids)
        reprefill = await run_phase(stage, turn2, "t2-again", _phase_deadline(end, 1))
    finally:
        _release(stage, ids)
    return {"turn1": turn1, "resident": resident, "reprefill": reprefill}


async def measure(chat: Any, setting: Setting, args: argparse.Namespace, end: float) -> Measured:
    """The warm-up, then rounds of ``setting``'s ``n`` conversations through a stage of ``n``
    threads and its workers' steps at once, until every phase has ``args.replies`` replies or the
    last round's wall time no longer fits before ``end`` (the first round always runs)."""
    from models.voice.stages import TransformersLlmStage

    n, workers = setting.conversations, setting.workers
    stage = TransformersLlmStage(chat, n, workers=workers)
    try:
        started = time.perf_counter()
        await warm_up(stage, chat, n, args, _phase_deadline(end, 4))
        warmup_s = time.perf_counter() - started
        phases: dict[str, Phase] | None = None
        rounds = 0
        while True:
            began = time.perf_counter()
            got = await run_round(stage, chat, n, args, rounds, end)
            phases = got if phases is None else {k: phases[k] + got[k] for k in PHASES}
            rounds += 1
            now = time.perf_counter()
            if len(phases["resident"].replies) >= args.replies or now + (now - began) > end:
                return Measured(phases, rounds, workers, warmup_s)
    finally:
        stage.close()


@contextlib.contextmanager
def model_dir(args: argparse.Namespace, dtype: Any) -> Iterator[Path]:
    """``--model-dir``, or the random model of ``--shape`` built (on ``--device``) in a temporary
    directory."""
    if args.model_dir:
        yield Path(args.model_dir)
        return
    from realtime.bench.random_chat_model import SHAPES, build_random_chat_model

    with tempfile.TemporaryDirectory(prefix="bench-llm-") as tmp:
        yield build_random_chat_model(
            Path(tmp), SHAPES[args.shape], dtype=dtype, text_only=True, device=args.device
        )


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


def _round(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)


def _ratio(resident: float | None, reprefill: float | None) -> float | None:
    return None if resident is None or reprefill is None else round(resident / reprefill, 3)


def _median(values: Sequence[int]) -> int | None:
    return int(np.median(values)) if values else None


def count_figures(n: str, m: Measured | None) -> dict[str, Any]:
    """The JSON figures of one setting, ``n`` its label (all null for one the budget skipped)."""
    if m is None:
        keys = ("ttft_ms", "ttft_p95_ms", "itl_ms", "itl_p95_ms", "itl_mean_ms", "tokens_per_s")
        keys += ("ttft_reprefill_ms",)
        keys += ("ttft_turn1_ms", "replies", "cut_replies", "rounds", "workers", "wall_s")
        return {f"{k}_{n}": None for k in keys}
    p = m.phases
    resident = p["resident"]
    return {
        f"ttft_ms_{n}": _round(resident.ttft_ms(50)),
        f"ttft_p95_ms_{n}": _round(resident.ttft_ms(95)),
        f"itl_ms_{n}": _round(resident.itl_ms(50)),
        f"itl_p95_ms_{n}": _round(resident.itl_ms(95)),
        f"itl_mean_ms_{n}": _round(resident.itl_mean_ms()),
        f"tokens_per_s_{n}": round(resident.tokens_per_s(), 1),
        f"ttft_reprefill_ms_{n}": _round(p["reprefill"].ttft_ms(50)),
        f"ttft_turn1_ms_{n}": _round(p["turn1"].ttft_ms(50)),
        f"replies_{n}": {k: len(p[k].replies) for k in PHASES},
        f"cut_replies_{n}": {k: p[k].cut() for k in PHASES},
        f"rounds_{n}": m.rounds,
        f"workers_{n}": m.workers,
        f"wall_s_{n}": {"warmup": round(m.warmup_s, 2)} | {k: round(p[k].wall_s, 2) for k in PHASES},
    }


def figures_of(results: dict[Setting, Measured | None], headline: Setting) -> dict[str, Any]:
    """The JSON figures: per setting, and the headline ratio: ``headline``'s."""
    out: dict[str, Any] = {}
    ratios: dict[str, float | None] = {}
    for setting, m in results.items():
        out |= count_figures(setting.label, m)
        ratios[setting.label] = (
            None if m is None else _ratio(m.phases["resident"].ttft_ms(50), m.phases["reprefill"].ttft_ms(50))
        )
    out["resident_vs_reprefill_ttft_ratio"] = ratios[headline.label]
    out["resident_vs_reprefill_ttft_ratio_by_conversations"] = ratios
    measured = [m.phases for m in results.values() if m is not None]
    every = [r for phases in measured for p in phases.values() for r in p.replies]
    turn1 = [r for phases in measured for r in phases["turn1"].replies]
    resident = [r for phases in measured for r in phases["resident"].replies]
    reprefill = [r for phases in measured for r in phases["reprefill"].replies]
    out |= {
        "prompt_tokens_turn1": _median([r.prompt_tokens for r in turn1]),
        "prompt_tokens_turn2": _median([r.prompt_tokens for r in resident]),
        "cached_tokens_resident": _median([r.cached_tokens for r in resident]),
        "cached_tokens_reprefill": max((r.cached_tokens for r in reprefill), default=None),
        "generated_tokens_min": min((r.generated_tokens for r in every), default=None),
        "generated_tokens_max": max((r.generated_tokens for r in every), default=None),
    }
    return out


def _f(value: float | None, width: int) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width}.1f}"


def _print_table(results: dict[Setting, Measured | None]) -> None:
    print(
        f"{'convs':>7} | {'TTFT p50/p95 ms: turn 1':>24} {'turn 2 resident':>17} {'re-prefill':>17} "
        f"{'ratio':>6} | {'ITL p50/p95/mean ms':>22} | {'tokens/s':>8} | replies t1/res/pre (cut)"
    )
    for setting, m in results.items():
        n = setting.label
        if m is None:
            print(f"{n:>7} | skipped: the --seconds budget was spent")
            continue
        t1, res, pre = (m.phases[k] for k in PHASES)
        ratio = _ratio(res.ttft_ms(50), pre.ttft_ms(50))
        counts = "/".join(str(len(m.phases[k].replies)) for k in PHASES)
        cuts = "/".join(str(m.phases[k].cut()) for k in PHASES)
        print(
            f"{n:>7} | {_f(t1.ttft_ms(50), 13)} / {_f(t1.ttft_ms(95), 8)} "
            f"{_f(res.ttft_ms(50), 8)} / {_f(res.ttft_ms(95), 6)} {_f(pre.ttft_ms(50), 8)} / "
            f"{_f(pre.ttft_ms(95), 6)} {'-' if ratio is None else f'{ratio:.2f}':>6} | "
            f"{_f(res.itl_ms(50), 6)} / {_f(res.itl_ms(95), 6)} / {_f(res.itl_mean_ms(), 6)} | "
            f"{res.tokens_per_s():>8.1f} | "
            f"{counts} ({cuts})"
        )


def _print_spent(setting: Setting, m: Measured, took_s: float) -> None:
    walls = ", ".join(f"{k} {m.phases[k].wall_s:.1f} s" for k in PHASES)
    print(
        f"  {setting.conversations} conversations ({m.workers} steps at once) in {took_s:.1f} s: "
        f"warm-up {m.warmup_s:.1f} s, {m.rounds} round(s): {walls}",
        flush=True,
    )


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="realtime bench llm", description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="qwen2.5-0.5b", choices=["qwen2.5-0.5b", "tiny"])
    p.add_argument("--model-dir", default="", help="a real chat checkpoint instead of the random model")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    p.add_argument("--conversations", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--replies", type=int, default=8, help="replies per phase and count wanted (rounds)")
    p.add_argument(
        "--seconds", type=float, default=120.0, help="the whole run's time budget, load included (0: none)"
    )
    p.add_argument(
        "--workers", type=int, nargs="+", default=[0], help="model steps at once, each (0: the conversations)"
    )
    p.add_argument("--turn1-tokens", type=int, default=200, help="turn 1's whole prompt, in tokens")
    p.add_argument("--turn2-tokens", type=int, default=40, help="turn 2's new user message, in tokens")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default)")
    args = p.parse_args(argv)
    if min(args.conversations + [args.replies, args.max_new_tokens, args.turn2_tokens]) < 1:
        p.error("--conversations, --replies, --max-new-tokens and --turn2-tokens must be at least 1")
    if args.seconds < 0 or min(args.workers) < 0:
        p.error("--seconds and --workers must be at least 0")
    started = time.perf_counter()
    end = started + args.seconds if args.seconds else float("inf")
    import torch
    from transformers.utils import logging as hf_logging

    from models.voice.llm import TransformersChat

    hf_logging.disable_progress_bar()  # weight loading and saving bars would bury the table
    if args.threads:
        torch.set_num_threads(args.threads)
    cuda = args.device.startswith("cuda")
    dtype = getattr(torch, args.dtype) if args.dtype != "auto" else torch.bfloat16 if cuda else torch.float32
    with model_dir(args, dtype) as directory:
        built = time.perf_counter()
        chat = TransformersChat(
            directory, max_conversations=max(args.conversations), dtype=dtype, device=args.device
        )
    loaded = time.perf_counter()
    name = args.model_dir or args.shape
    budget = f"{args.seconds:.0f} s budget" if args.seconds else "no time budget"
    print(
        f"llm stage (transformers) {name} on {args.device} {str(dtype).removeprefix('torch.')}: "
        f"imports and build {built - started:.1f} s, load {loaded - built:.1f} s; turn 1 prompt "
        f"~{args.turn1_tokens} tokens, turn 2 +{args.turn2_tokens}, {args.max_new_tokens} new tokens, "
        f"greedy, {args.replies} replies per phase wanted, {budget}"
    )
    settings = settings_of(args.conversations, args.workers)
    results: dict[Setting, Measured | None] = {}
    for i, setting in enumerate(settings):
        now = time.perf_counter()
        if now >= end:
            results[setting] = None
            continue
        share_end = now + (end - now) / (len(settings) - i)
        results[setting] = m = asyncio.run(measure(chat, setting, args, share_end))
        _print_spent(setting, m, time.perf_counter() - now)
    _print_table(results)
    headline = Setting.of(min(args.conversations), args.workers[0])
    figures = figures_of(results, headline) | {
        "device": args.device,
        "dtype": str(dtype).removeprefix("torch."),
        "model": name,
        "shape": shape_of(chat.model.config),
        "max_new_tokens": args.max_new_tokens,
        "replies_per_phase": {
            s.label: None if m is None else len(m.phases["resident"].replies) for s, m in results.items()
        },
        "seconds": args.seconds,
        "build_s": round(built - started, 2),
        "load_s": round(loaded - built, 2),
        "elapsed_s": round(time.perf_counter() - started, 2),
    }
    print(json.dumps(figures))
    return 0
