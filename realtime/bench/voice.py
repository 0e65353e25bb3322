"""``realtime bench voice``: time to first audio (TTFA) of the voice kind, through the protocol.

Runs the real server in this process (voice kind only, the offline default models) and drives it
with GA OpenAI Realtime clients on loopback; **TTFA** is from ``input_audio_buffer.speech_stopped``
to the first ``response.output_audio.delta`` the client receives. Two modes (``MODES``), then the
chunked-vs-full comparison and, with ``--llm-backends ... vllm``, both modes on the vLLM backend
(keys ending in ``_vllm``).

Last line: JSON with ``ttfa_ms_N`` / ``ttfa_ms_N_p95`` / ``stall_ms_N_p95`` / ``failed_turns_N``
(conversation load; a failed response is counted, not timed),
``ttfa_ms_N_burst``, ``ttfa_8_vs_1_ratio`` and ``ttfa_8_vs_1_burst_ratio``, ``model_ms``,
``overhead_ms_1``, ``ttfa_chunked_ms_1``, ``ttfa_full_ms_1``, ``ttfa_chunked_vs_full_ratio``,
``ttfa_ms_4_transformers``, ``cycle_s``.

``realtime bench voice --shape real`` runs the conversation load alone with every model at a real
shape on a GPU (``realtime/bench/voice_shapes.py``: issue 30's ``ttfa_ms_p50_32``).

``realtime bench voice --transport webrtc`` (``OMP_NUM_THREADS=1 realtime bench voice --transport
webrtc``) measures instead TTFA over WebRTC calls against the websocket, the same turns on one
server at 1 and 8 sessions (``realtime/bench/voice_webrtc.py``; issue 31's goal: WebRTC adds
<= 30 ms at p50).
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
import urllib.request
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import soxr
import websockets

from realtime.bench.goals import goal_note
from realtime.bench.voice_load import LoadPlan, conversation_load, percentile
from realtime.config import config_from_mapping
from realtime.server import build_server

MODES = """modes:
  conversation load (the headline ttfa_ms_N, p50 and p95): N sessions, each an openai SDK GA
    client in a conversation loop: speak a question at real-time pace (--questions, synthesized
    offline by the hibari voice; 0.5 s silence before, 1 s after; server VAD ends the turn),
    receive the whole response, play it (real time from its first delta; stall = waiting for
    late audio), think --think-s, speak the next. Sessions start at seeded random offsets spread
    over one cycle (the 1-session run's turn length). The first turn of each session is a
    warm-up; p50/p95 over all other turns (--turns per session).
  burst (ttfa_ms_N_burst, median): N plain websocket clients speak --question at the same instant,
    so every turn ends in the same millisecond (the worst case); the response is cancelled at
    its first audio; --rounds rounds. At 1 session each turn is paired with a direct run of the
    same model work just before it: model time (ASR, LLM to its first clause, TTS of it) and
    overhead = TTFA - model time.
  chunked vs full (1 session, burst-style turns): TTS on the first clause the LLM streams vs TTS
    after the whole reply (voice.chunked_tts: false), as ttfa_chunked_vs_full_ratio."""

APPEND_MS = 200
QUESTION = "Tell me about the city of Paris."
QUESTIONS = (
    "Tell me about the city of Paris.",
    "What is the capital of France?",
    "How many legs does a spider have?",
    "Why is the sky blue?",
    "What should I cook for dinner tonight?",
    "Can you name three colours?",
)


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
        await until_released(url)
        out += await asyncio.gather(*(one_turn(url, pcm) for _ in range(sessions)))
    return out


async def until_released(url: str, timeout_s: float = 60.0) -> None:
    """Wait until the server holds no voice session (``GET /v1/status``): a session is released a
    moment after its client closed, and each phase may need every slot (``max_sessions`` is the
    largest ``--sessions``), so every phase starts on an empty server."""
    status_url = url.replace("ws://", "http://").replace("/v1/realtime", "/v1/status")

    def occupied() -> int:
        with urllib.request.urlopen(status_url, timeout=5) as reply:
            kinds = json.load(reply)["kinds"]
        return sum(k["occupied"] or 0 for k in kinds if k["kind"] == "voice")

    deadline = time.monotonic() + timeout_s
    while await asyncio.to_thread(occupied):
        if time.monotonic() > deadline:
            raise RuntimeError(f"voice sessions still held {timeout_s:g} s after their clients closed")
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def voice_server(
    args: argparse.Namespace, webrtc: dict[str, Any] | None = None, **voice: Any
) -> AsyncIterator[tuple[str, Any]]:
    """``(ws url of /v1/realtime, the voice service)`` of a real server in this process, ready;
    ``webrtc``: the ``webrtc`` config section (WebRTC calls), where the mode uses them."""
    config = config_from_mapping(
        {
            "webrtc": webrtc or {},
            "robot": {"enabled": False},
            "world": {"enabled": False},
            "server": {"log_level": "warning", "start_timeout_s": 600},
            "voice": {
                "enabled": True,
                "max_sessions": max(args.sessions),
                "torch_threads": args.threads,
                **dict(args.set),
                **voice,
            },
        }
    )
    async with kind_server(config, "voice") as (url, service):
        yield url.replace("http://", "ws://") + "/v1/realtime", service


@contextlib.asynccontextmanager
async def kind_server(config: Any, kind: str) -> AsyncIterator[tuple[str, Any]]:
    """``(http base url, the ``kind`` service)`` of a real server of ``config`` in this process,
    once it is ready; shut down on the way out."""
    server = build_server(config, host="127.0.0.1", port=0)
    task = asyncio.create_task(server.serve())
    try:
        state = server.rt_app.state.rt
        while not (server.started and state.ready):
            if task.done():
                task.result()
                raise RuntimeError("server exited during startup")
            await asyncio.sleep(0.1)
        yield state.url, next(k for k in state.kinds if k.name == kind)
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, timeout=60)


async def run(args: argparse.Namespace) -> dict[str, float]:
    figures = await run_backend(args, "transformers")
    if "ttfa_ms_4" in figures:  # the side-by-side point (absent when --sessions skips 4)
        figures["ttfa_ms_4_transformers"] = figures["ttfa_ms_4"]
    if "vllm" in args.llm_backends:
        figures.update(await run_backend(args, "vllm"))
    return figures


async def run_backend(args: argparse.Namespace, backend: str) -> dict[str, float]:
    """Both modes on one server of ``backend``; the transformers run adds model time, overhead and
    chunked vs full. Keys of the vLLM run end in ``_vllm``."""
    voice = {"llm_backend": "vllm", "vllm_enforce_eager": args.vllm_eager} if backend == "vllm" else {}
    async with voice_server(args, **voice) as (url, service):
        tts = service.models_loaded["tts"]
        pcm, audio_16k = spoken(tts, args.question)
        await ttfa(url, pcm, 1, 1)  # warm-up: first-use costs of every engine
        if backend == "vllm":
            print(f"vLLM backend ({'eager' if args.vllm_eager else 'compiled'}):")
            figures = await burst_figures(args, url, pcm)
        else:
            figures = await paired_figures(args, url, service, pcm, audio_16k)
        questions = [spoken(tts, q)[0] for q in args.questions]
        figures.update(await load_figures(args, url, questions))
        figures.update(await chunked_vs_full(args, url, service, pcm) if backend == "transformers" else {})
    print_ratios(figures)
    return figures if backend == "transformers" else {f"{k}_vllm": v for k, v in figures.items()}


async def paired_figures(
    args: argparse.Namespace, url: str, service: Any, pcm: bytes, audio_16k: np.ndarray
) -> dict[str, float]:
    """Model time and overhead (1 session, each served turn paired with a direct model run just
    before it, the same load), then the burst TTFA beyond 1 session."""
    pairs = []
    for _ in range(args.rounds):
        direct = await asyncio.to_thread(
            model_time_ms, service.models_loaded, audio_16k, 1, service.config.first_clause_words
        )
        pairs.append((direct, (await ttfa(url, pcm, 1, 1))[0]))
    model = {k: statistics.median(d[k] for d, _ in pairs) for k in pairs[0][0]}
    print(f"model time, one turn run directly: ASR {model['asr']:.0f} ms + LLM to first clause "
          f"{model['llm_first_clause']:.0f} ms + TTS {model['tts_first_clause']:.0f} ms = {model['total']:.0f} ms")  # fmt: skip
    figures = {
        "model_ms": round(model["total"], 1),
        "ttfa_ms_1_burst": round(statistics.median(t for _, t in pairs), 1),
        "overhead_ms_1": round(statistics.median(t - d["total"] for d, t in pairs), 1),
    }
    print("burst (every session's turn ends in the same moment; one turn each, cancelled at first audio):")
    print(f"{'sessions':>8} {'TTFA p50 ms':>12} {'max ms':>8} {'- model ms':>11}")
    print(f"{1:>8} {figures['ttfa_ms_1_burst']:>12.0f} {max(t for _, t in pairs):>8.0f} {figures['overhead_ms_1']:>11.0f}")  # fmt: skip
    for n in (n for n in args.sessions if n != 1):
        values = await ttfa(url, pcm, n, args.rounds)
        p50 = statistics.median(values)
        figures[f"ttfa_ms_{n}_burst"] = round(p50, 1)
        print(f"{n:>8} {p50:>12.0f} {max(values):>8.0f} {p50 - model['total']:>11.0f}")
    return figures


async def burst_figures(args: argparse.Namespace, url: str, pcm: bytes) -> dict[str, float]:
    """The burst TTFA at each session count (no model-time pairing)."""
    figures: dict[str, float] = {}
    print("burst (every session's turn ends in the same moment; one turn each, cancelled at first audio):")
    print(f"{'sessions':>8} {'TTFA p50 ms':>12} {'max ms':>8}")
    for n in args.sessions:
        values = await ttfa(url, pcm, n, args.rounds)
        figures[f"ttfa_ms_{n}_burst"] = round(statistics.median(values), 1)
        print(f"{n:>8} {figures[f'ttfa_ms_{n}_burst']:>12.0f} {max(values):>8.0f}")
    return figures


async def load_figures(args: argparse.Namespace, url: str, questions: list[bytes]) -> dict[str, float]:
    """The conversation-load TTFA (the headline ``ttfa_ms_N``) at each session count; sessions
    start spread over one cycle as the 1-session run measured it (``realtime/bench/voice_load.py``)."""
    figures: dict[str, float] = {}
    print(f"conversation load ({args.turns} measured turns per session after a warm-up turn; "
          f"think {args.think_s[0]:g}-{args.think_s[1]:g} s; seed {args.seed}):")  # fmt: skip
    print(f"{'sessions':>8} {'turns':>6} {'failed':>6} {'TTFA p50 ms':>12} {'p95 ms':>8} "
          f"{'stall p95 ms':>13} {'reply s':>8}")  # fmt: skip
    cycle_s = 0.0
    for n in sorted(args.sessions):
        await until_released(url)
        plan = LoadPlan(n, args.turns + 1, cycle_s, tuple(args.think_s), args.seed)
        began = time.perf_counter()
        timings = await conversation_load(url, questions, plan)
        if n == 1:  # one cycle: what a session's speak-listen-think loop takes
            cycle_s = (time.perf_counter() - began) / plan.turns
        turns = [t for t in timings if not t.failed]
        figures[f"failed_turns_{n}"] = len(timings) - len(turns)
        if not turns:
            print(f"{n:>8} {len(timings):>6} {len(timings):>6}  (every turn failed)")
            continue
        values, stalls = [t.ttfa_ms for t in turns], [t.stall_ms for t in turns]
        figures[f"ttfa_ms_{n}"] = round(percentile(values, 0.5), 1)
        figures[f"ttfa_ms_{n}_p95"] = round(percentile(values, 0.95), 1)
        figures[f"stall_ms_{n}_p95"] = round(percentile(stalls, 0.95), 1)
        reply_s = statistics.mean(t.audio_s for t in turns)
        print(f"{n:>8} {len(timings):>6} {figures[f'failed_turns_{n}']:>6} {figures[f'ttfa_ms_{n}']:>12.0f} "
              f"{figures[f'ttfa_ms_{n}_p95']:>8.0f} {figures[f'stall_ms_{n}_p95']:>13.0f} {reply_s:>8.1f}")  # fmt: skip
    figures["cycle_s"] = round(cycle_s, 1)
    return figures


async def chunked_vs_full(args: argparse.Namespace, url: str, service: Any, pcm: bytes) -> dict[str, float]:
    """1 session, one turn cancelled at first audio: TTS on the first clause vs after the whole reply."""
    service.llm.chunked = False  # what voice.chunked_tts: false serves: TTS after the full reply
    try:
        full = statistics.median(await ttfa(url, pcm, 1, args.rounds))
    finally:
        service.llm.chunked = True
    chunked = statistics.median(await ttfa(url, pcm, 1, args.rounds))
    figures = {"ttfa_chunked_ms_1": round(chunked, 1), "ttfa_full_ms_1": round(full, 1)}
    figures["ttfa_chunked_vs_full_ratio"] = round(chunked / full, 3)
    print(f"1 session: chunked handoff {chunked:.0f} ms vs full reply first {full:.0f} ms "
          f"(ratio {figures['ttfa_chunked_vs_full_ratio']:.2f})")  # fmt: skip
    return figures


def print_ratios(figures: dict[str, float]) -> None:
    """The 8-vs-1 goal both ways (issue 13: TTFA at 8 sessions <= 2x TTFA at 1)."""
    for mode, suffix in (("conversation load", ""), ("burst", "_burst")):
        one, eight = figures.get(f"ttfa_ms_1{suffix}"), figures.get(f"ttfa_ms_8{suffix}")
        if one and eight:
            figures[f"ttfa_8_vs_1{suffix}_ratio"] = round(eight / one, 2)
            print(
                f"8 vs 1 session, {mode}: {eight:.0f} / {one:.0f} ms = {eight / one:.2f}x"
                f"{goal_note('voice', f'ttfa_8_vs_1{suffix}_ratio')}"
            )


def voice_setting(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` -> ``(KEY, VALUE)``, the value parsed as JSON when it is JSON."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="realtime bench voice",
        description=__doc__.split("\n\n")[0],
        epilog=MODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--transport",
        choices=["websocket", "webrtc"],
        default="websocket",
        help="webrtc: TTFA over WebRTC calls vs the websocket, side by side (only that; issue 31)",
    )
    p.add_argument("--sessions", type=int, nargs="+", help="session counts (default 1 4 8; webrtc: 1 8)")
    p.add_argument("--rounds", type=int,
                   help="burst: turns per session count, median over all (default 3); webrtc: rounds "
                   "per user, the first a warm-up (default 5)")  # fmt: skip
    p.add_argument("--turns", type=int, default=3, help="load: measured turns per session (after a warm-up)")
    p.add_argument("--think-s", type=float, nargs=2, default=[1.0, 3.0], metavar=("MIN", "MAX"),
                   help="load: a user's pause between hearing the answer and speaking again (uniform)")  # fmt: skip
    p.add_argument("--seed", type=int, default=0, help="load: start offsets and think times")
    p.add_argument("--threads", type=int, default=1, help="torch threads (voice.torch_threads)")
    p.add_argument("--question", default=QUESTION, help="burst: the question every session asks")
    p.add_argument("--questions", nargs="+", default=list(QUESTIONS), help="load: the questions, in order")
    p.add_argument(
        "--llm-backends",
        nargs="+",
        choices=["transformers", "vllm"],
        default=["transformers", "vllm"] if importlib.util.find_spec("vllm") else ["transformers"],
        help="transformers always runs (model time, chunked vs full); vllm adds both modes on that backend",
    )
    p.add_argument("--vllm-eager", action="store_true", help="voice.vllm_enforce_eager (faster start)")
    p.add_argument("--shape", choices=["default", "real", "tiny"], default="default",
                   help="real: the cascade at real model shapes on a GPU, the conversation load only "
                   "(realtime/bench/voice_shapes.py; issue 30's ttfa_ms_p50_32); tiny: the same at test "
                   "sizes (with --device cpu)")  # fmt: skip
    p.add_argument(
        "--device",
        default="cuda",
        help="--shape real/tiny: the ASR's device, where the weights are drawn (default cuda)",
    )
    p.add_argument("--models-dir", default="/tmp/voice-real-shapes",
                   help="--shape real/tiny: where the random-weight folders are written once (real: ~17 GB)")  # fmt: skip
    p.add_argument("--set", type=voice_setting, action="append", default=[], metavar="KEY=VALUE",
                   help="a voice.* setting for the bench's servers (VALUE as JSON, else a string); repeatable")  # fmt: skip
    args = p.parse_args(argv)
    webrtc = args.transport == "webrtc"
    args.sessions = args.sessions or ([1, 8] if webrtc else [1, 4, 8])
    args.rounds = args.rounds or (5 if webrtc else 3)
    if 1 not in args.sessions:
        p.error("--sessions must include 1 (the ratios, the overhead and the load's cycle use it)")
    if (
        min(args.sessions) < 1
        or args.turns < 1
        or args.rounds < 1
        or not 0 <= args.think_s[0] <= args.think_s[1]
    ):
        p.error("--sessions, --turns and --rounds must be >= 1 and --think-s MIN <= MAX, both >= 0")
    if webrtc and args.rounds < 2:
        p.error("--transport webrtc needs --rounds >= 2 (the first is a warm-up)")
    if webrtc and importlib.util.find_spec("aiortc") is None:
        p.error("--transport webrtc needs the webrtc extra: pip install -e '.[webrtc]'")
    if not webrtc and importlib.util.find_spec("openai") is None:
        p.error("the conversation-load clients are the openai SDK's: pip install 'realtime-sessions[test]'")
    if args.shape != "default":
        from realtime.bench import voice_shapes

        if webrtc or not importlib.util.find_spec("vllm"):
            p.error("--shape real runs over the websocket on vLLM: pip install -e '.[vllm]'")
        figures = asyncio.run(voice_shapes.run(args))
        print(json.dumps({**figures, "shape": args.shape, "turns": args.turns, "set": dict(args.set)}))
        return 0
    if webrtc:
        from realtime.bench import voice_webrtc

        figures = asyncio.run(voice_webrtc.run(args))
        print(
            json.dumps({**figures, "question": args.question, "rounds": args.rounds, "set": dict(args.set)})
        )
        return 0
    figures = asyncio.run(run(args))
    settings = dict(args.set)
    print(
        json.dumps(
            {
                **figures,
                "question": args.question,
                "rounds": args.rounds,
                "turns": args.turns,
                "set": settings,
            }
        )
    )
    return 0
