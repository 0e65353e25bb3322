"""``realtime bench voice``: time to first audio (TTFA) of the voice kind, through the protocol.

Runs the real server in this process (voice kind only, the offline default models) and drives it
with plain websocket clients speaking the GA OpenAI Realtime protocol on loopback. Each client
streams a spoken question (synthesized offline by the hibari voice, with silence after it) in
200 ms appends at real-time pace, lets server VAD end the turn, and measures **TTFA**: from
``input_audio_buffer.speech_stopped`` to the first ``response.output_audio.delta`` it receives
(the response is then cancelled: the rest of the answer does not change TTFA).

1. **Model time**: the same turn's model work run directly, one call after another on the loaded
   models (ASR of the utterance as VAD cuts it, LLM until its first clause, TTS of that clause).
   At 1 session every served turn is paired with a direct run just before it (the same machine
   load); the median of TTFA minus model time is the **server overhead** (VAD, engines, queues,
   pipeline hops, protocol, loopback).
2. TTFA at 1, 4 and 8 concurrent sessions (every session speaks at the same moment), median over
   ``--rounds`` rounds and the sessions; beyond 1 session "- model" also holds the contention of
   the sessions' model work for the CPU.
3. **Chunked vs full handoff**, 1 session: TTS on the first clause the LLM streams (the default)
   vs TTS only after the full reply (the same server with the LLM stage's ``chunked`` off; the
   ``voice.chunked_tts: false`` setting), as a ratio.

4. **vLLM vs transformers** (``--llm-backends``; vllm by default when it is installed): a second
   server on ``voice.llm_backend: vllm`` (same SmolLM2 model, compiled unless ``--vllm-eager``),
   TTFA at each session count as ``ttfa_ms_N_vllm`` beside the transformers ``ttfa_ms_N``.

Last line: JSON with ``ttfa_ms_1``, ``ttfa_ms_4``, ``ttfa_ms_8``, ``model_ms``, ``overhead_ms_1``,
``ttfa_full_ms_1``, ``ttfa_chunked_vs_full_ratio``, ``ttfa_ms_4_transformers`` and, with vLLM,
``ttfa_ms_N_vllm`` (``ttfa_ms_4_vllm``).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import importlib.util
import json
import statistics
import time
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import soxr
import websockets

from realtime.config import config_from_mapping
from realtime.server import build_server

APPEND_MS = 200
QUESTION = "Tell me about the city of Paris."


def spoken(tts: Any, text: str) -> tuple[bytes, np.ndarray]:
    """``text`` spoken: what the client streams (0.5 s of silence before, 1.0 s after; pcm16
    24 kHz) and about what server VAD commits of it (0.3 s before, 0.5 s after: the default
    prefix padding and silence duration; float32 16 kHz), for the direct model run."""
    from models.voice.audio import float_to_pcm16

    speech = tts.synthesize(text, seed=0)
    streamed = np.concatenate([np.zeros(12_000, np.float32), speech, np.zeros(24_000, np.float32)])
    committed = np.concatenate([np.zeros(7_200, np.float32), speech, np.zeros(12_000, np.float32)])
    return float_to_pcm16(streamed), soxr.resample(committed, 24_000, 16_000).astype(np.float32)


def model_time_ms(
    models: dict[str, Any], audio_16k: np.ndarray, reps: int, first_clause_words: int
) -> dict[str, float]:
    """ASR + LLM to its first clause + TTS of that clause, sequentially (median of ``reps``)."""
    from models.voice.llm import DEFAULT_SYSTEM_PROMPT, ChatMessage
    from models.voice.tts import ClauseSplitter

    asr, chat, tts = models["asr"], models["llm"], models["tts"]
    parts: dict[str, list[float]] = {"asr": [], "llm_first_clause": [], "tts_first_clause": []}
    for i in range(reps):
        t0 = time.perf_counter()
        text = asr.transcribe(audio_16k).text
        t1 = time.perf_counter()
        conversation = f"bench-model-{i}"
        chat.open(conversation)
        try:
            splitter, clause = ClauseSplitter(first_clause_words=first_clause_words), None
            messages = [ChatMessage("system", DEFAULT_SYSTEM_PROMPT), ChatMessage("user", text)]
            for piece in chat.generate(conversation, messages, max_new_tokens=128):
                if clauses := splitter.push(piece):
                    clause = clauses[0]
                    break
            clause = clause or (splitter.flush() or ["."])[0]
        finally:
            chat.release(conversation)
        t2 = time.perf_counter()
        tts.synthesize(clause)
        t3 = time.perf_counter()
        for key, value in zip(parts, (t1 - t0, t2 - t1, t3 - t2), strict=True):
            parts[key].append(value * 1000)
    out = {k: statistics.median(v) for k, v in parts.items()}
    out["total"] = sum(out.values())
    return out


async def one_turn(url: str, pcm: bytes) -> float:
    """One client: stream the question at real-time pace; TTFA in ms (then cancel and close)."""
    step = 24_000 * 2 * APPEND_MS // 1000
    async with websockets.connect(url, max_size=1 << 20) as ws:
        stopped: float | None = None
        first_audio = asyncio.get_running_loop().create_future()

        async def read() -> None:
            nonlocal stopped
            async for frame in ws:
                event = json.loads(frame)
                kind = event["type"]
                if kind == "input_audio_buffer.speech_stopped":
                    stopped = time.perf_counter()
                elif kind == "response.output_audio.delta" and not first_audio.done():
                    first_audio.set_result(time.perf_counter())
                elif kind == "error":
                    raise RuntimeError(f"server error: {event['error']}")
                elif kind == "response.done" and event["response"]["status"] == "failed":
                    raise RuntimeError(f"response failed: {event['response'].get('status_details')}")
            raise RuntimeError(f"server closed the socket: {ws.close_code} {ws.close_reason!r}")

        reader = asyncio.create_task(read())
        start = time.perf_counter()
        for n, offset in enumerate(range(0, len(pcm), step)):
            chunk = base64.b64encode(pcm[offset : offset + step]).decode()
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": chunk}))
            await asyncio.sleep(max(0.0, start + (n + 1) * APPEND_MS / 1000 - time.perf_counter()))
        done, _ = await asyncio.wait({first_audio, reader}, timeout=120, return_when=asyncio.FIRST_COMPLETED)
        if first_audio not in done:
            reader.cancel()
            raise RuntimeError("no audio within 120 s" if not done else f"no audio: {reader.exception()}")
        await ws.send(json.dumps({"type": "response.cancel"}))
        reader.cancel()
        assert stopped is not None
        return (first_audio.result() - stopped) * 1000


async def ttfa(url: str, pcm: bytes, sessions: int, rounds: int) -> list[float]:
    out: list[float] = []
    for _ in range(rounds):
        out += await asyncio.gather(*(one_turn(url, pcm) for _ in range(sessions)))
        await asyncio.sleep(0.5)  # cancelled responses finish closing
    return out


@contextlib.asynccontextmanager
async def voice_server(args: argparse.Namespace, **voice: Any) -> AsyncIterator[tuple[str, Any]]:
    """``(ws url of /v1/realtime, the voice service)`` of a real server in this process, ready."""
    config = config_from_mapping(
        {
            "robot": {"enabled": False},
            "world": {"enabled": False},
            "server": {"log_level": "warning", "start_timeout_s": 600},
            "voice": {
                "enabled": True,
                "max_sessions": max(args.sessions),
                "torch_threads": args.threads,
                **voice,
            },
        }
    )
    server = build_server(config, host="127.0.0.1", port=0)
    task = asyncio.create_task(server.serve())
    try:
        state = server.rt_app.state.rt
        while not (server.started and state.ready):
            if task.done():
                task.result()
                raise RuntimeError("server exited during startup")
            await asyncio.sleep(0.1)
        service = next(k for k in state.kinds if k.name == "voice")
        yield state.url.replace("http://", "ws://") + "/v1/realtime", service
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, timeout=60)


async def run(args: argparse.Namespace) -> dict[str, float]:
    figures = await run_transformers(args)
    figures["ttfa_ms_4_transformers"] = figures.get("ttfa_ms_4", float("nan"))
    if "vllm" in args.llm_backends:
        figures.update(await run_vllm(args))
    return figures


async def run_vllm(args: argparse.Namespace) -> dict[str, float]:
    """The same TTFA measurement on the vLLM backend (``voice.llm_backend: vllm``, same model)."""
    figures: dict[str, float] = {}
    async with voice_server(args, llm_backend="vllm", vllm_enforce_eager=args.vllm_eager) as (url, service):
        pcm, _ = spoken(service.models_loaded["tts"], args.question)
        await ttfa(url, pcm, 1, 1)  # warm-up
        print(f"vLLM backend ({'eager' if args.vllm_eager else 'compiled'}):")
        print(f"{'sessions':>8} {'TTFA p50 ms':>12} {'max ms':>8}")
        for n in args.sessions:
            values = await ttfa(url, pcm, n, args.rounds)
            figures[f"ttfa_ms_{n}_vllm"] = round(statistics.median(values), 1)
            print(f"{n:>8} {figures[f'ttfa_ms_{n}_vllm']:>12.0f} {max(values):>8.0f}")
    return figures


async def run_transformers(args: argparse.Namespace) -> dict[str, float]:
    async with voice_server(args) as (url, service):
        pcm, audio_16k = spoken(service.models_loaded["tts"], args.question)
        await ttfa(url, pcm, 1, 1)  # warm-up: first-use costs of every engine
        # one session: each served turn paired with a direct model run just before it (same load)
        pairs = []
        for _ in range(args.rounds):
            direct = await asyncio.to_thread(
                model_time_ms, service.models_loaded, audio_16k, 1, service.config.first_clause_words
            )
            pairs.append((direct, (await ttfa(url, pcm, 1, 1))[0]))
        model = {k: statistics.median(d[k] for d, _ in pairs) for k in pairs[0][0]}
        print(f"model time, one turn run directly: ASR {model['asr']:.0f} ms + LLM to first clause "
              f"{model['llm_first_clause']:.0f} ms + TTS {model['tts_first_clause']:.0f} ms = {model['total']:.0f} ms")  # fmt: skip
        figures: dict[str, float] = {
            "model_ms": round(model["total"], 1),
            "ttfa_ms_1": round(statistics.median(t for _, t in pairs), 1),
            "overhead_ms_1": round(statistics.median(t - d["total"] for d, t in pairs), 1),
        }
        print(f"{'sessions':>8} {'TTFA p50 ms':>12} {'max ms':>8} {'- model ms':>11}")
        print(
            f"{1:>8} {figures['ttfa_ms_1']:>12.0f} {max(t for _, t in pairs):>8.0f} {figures['overhead_ms_1']:>11.0f}"
        )
        for n in (n for n in args.sessions if n != 1):
            values = await ttfa(url, pcm, n, args.rounds)
            p50 = statistics.median(values)
            figures[f"ttfa_ms_{n}"] = round(p50, 1)
            print(f"{n:>8} {p50:>12.0f} {max(values):>8.0f} {p50 - model['total']:>11.0f}")
        service.llm.chunked = False  # what voice.chunked_tts: false serves: TTS after the full reply
        full = statistics.median(await ttfa(url, pcm, 1, args.rounds))
        service.llm.chunked = True
        figures["ttfa_full_ms_1"] = round(full, 1)
        figures["ttfa_chunked_vs_full_ratio"] = round(figures["ttfa_ms_1"] / full, 3)
        print(f"1 session: chunked handoff {figures['ttfa_ms_1']:.0f} ms vs full reply first {full:.0f} ms "
              f"(ratio {figures['ttfa_chunked_vs_full_ratio']:.2f})")  # fmt: skip
        return figures


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="realtime bench voice", description=__doc__.splitlines()[0])
    p.add_argument("--sessions", type=int, nargs="+", default=[1, 4, 8])
    p.add_argument("--rounds", type=int, default=3, help="turns per session count (median over all)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (voice.torch_threads)")
    p.add_argument("--question", default=QUESTION)
    p.add_argument(
        "--llm-backends",
        nargs="+",
        choices=["transformers", "vllm"],
        default=["transformers", "vllm"] if importlib.util.find_spec("vllm") else ["transformers"],
        help="transformers always runs (model time, chunked vs full); vllm adds TTFA on that backend",
    )
    p.add_argument("--vllm-eager", action="store_true", help="voice.vllm_enforce_eager (faster start)")
    args = p.parse_args(argv)
    if 1 not in args.sessions:
        p.error("--sessions must include 1 (the chunked-vs-full comparison and the overhead use it)")
    figures = asyncio.run(run(args))
    print(json.dumps({**figures, "question": args.question, "rounds": args.rounds}))
    return 0
