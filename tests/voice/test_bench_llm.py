"""``realtime bench llm`` (realtime/bench/llm.py) at the tiny shape, and the transformers chat
backend on CUDA (``TransformersChat(device="cuda")``; skipped without a GPU)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from models.voice.llm import ChatMessage, TransformersChat, render_chat
from realtime.bench import run_scenario
from realtime.bench.llm import Phase, Reply, settings_of
from realtime.bench.random_chat_model import TINY, build_random_chat_model
from tests.voice.tiny_chat_model import build_tiny_chat_model

SMALL_RUN = ["--shape", "tiny", "--conversations", "1", "2", "--replies", "2"]
SMALL_RUN += ["--turn1-tokens", "60", "--turn2-tokens", "16", "--max-new-tokens", "8"]


def bench_lines(capsys, *extra: str) -> list[str]:
    assert run_scenario("llm", [*SMALL_RUN, *extra]) == 0
    return capsys.readouterr().out.strip().splitlines()


def run_bench(capsys, *extra: str) -> dict:
    return json.loads(bench_lines(capsys, *extra)[-1])


def test_bench_llm_reports_ttft_itl_and_the_resident_kv_ratio(capsys):
    figures = run_bench(capsys)
    for n in (1, 2):
        assert figures[f"ttft_ms_{n}"] > 0 and figures[f"ttft_reprefill_ms_{n}"] > 0
        assert 0 < figures[f"itl_ms_{n}"] <= figures[f"itl_p95_ms_{n}"]
        assert figures[f"itl_mean_ms_{n}"] > 0
        assert figures[f"tokens_per_s_{n}"] > 0
    assert (
        figures["resident_vs_reprefill_ttft_ratio"]
        == figures["resident_vs_reprefill_ttft_ratio_by_conversations"]["1"]
    )
    # every reply has the same length (the text-only random model never emits EOS)
    assert figures["generated_tokens_min"] == figures["generated_tokens_max"] == 8
    assert abs(figures["prompt_tokens_turn1"] - 60) <= 3
    # turn 2 resident reuses at least turn 1's prompt; the re-prefilled turn 2 reuses nothing
    assert (
        figures["prompt_tokens_turn1"] <= figures["cached_tokens_resident"] < figures["prompt_tokens_turn2"]
    )
    assert figures["cached_tokens_reprefill"] == 0
    assert figures["device"] == "cpu" and figures["dtype"] == "float32"
    assert figures["shape"]["hidden_size"] == 128 and figures["shape"]["num_key_value_heads"] == 2
    # every figure says what it is from: 2 replies per phase (2 rounds of 1, 1 round of 2), none cut
    for n, rounds in ((1, 2), (2, 1)):
        assert figures[f"replies_{n}"] == {"turn1": 2, "resident": 2, "reprefill": 2}
        assert figures[f"cut_replies_{n}"] == {"turn1": 0, "resident": 0, "reprefill": 0}
        assert figures[f"rounds_{n}"] == rounds and figures[f"workers_{n}"] == n
        assert all(s > 0 for s in figures[f"wall_s_{n}"].values())
    assert figures["build_s"] > 0 and figures["elapsed_s"] < figures["seconds"]


def test_phase_figures_leave_out_what_a_cut_reply_lacks_and_the_mean_gap_is_the_pace():
    # a reply read in a burst (three chunks at once after a 30 ms stall), and one cut before its
    # first chunk: no TTFT, no gaps, its 2 generated tokens still count
    burst = Reply(0.010, (0.0, 0.0, 0.0, 0.030), "abcde", 20, 0, 5, cut=False)
    cut = Reply(None, (), "", 20, 0, 2, cut=True)
    phase = Phase((burst, cut), wall_s=0.5)
    assert phase.ttft_ms(50) == pytest.approx(10.0) and phase.cut() == 1
    assert phase.itl_ms(50) == 0.0 and phase.itl_mean_ms() == pytest.approx(7.5)
    assert phase.tokens_per_s() == pytest.approx(14.0)
    nothing = Phase((cut,), wall_s=0.5)
    assert nothing.ttft_ms(50) is None and nothing.itl_ms(95) is None and nothing.itl_mean_ms() is None


def test_a_spent_budget_cuts_the_running_replies_and_still_reports(capsys):
    # ~1500-token replies (seconds each) against a 4 s budget: every phase ends at its deadline
    figures = run_bench(capsys, "--seconds", "4", "--max-new-tokens", "1500", "--workers", "1")
    assert figures["elapsed_s"] < 4 + 2  # the cut replies' last forwards and the report
    measured = [(n, label) for n, label in ((1, "1"), (2, "2_w1")) if figures[f"replies_{label}"] is not None]
    assert measured and measured[0] == (1, "1")
    for n, label in measured:
        assert (
            figures[f"cut_replies_{label}"]
            == figures[f"replies_{label}"]
            == {k: n for k in ("turn1", "resident", "reprefill")}
        )
        assert figures[f"rounds_{label}"] == 1 and figures[f"workers_{label}"] == 1
    assert 0 <= figures["generated_tokens_min"] <= figures["generated_tokens_max"] < 1500


def test_each_workers_value_measures_every_count_once():
    settings = settings_of([1, 8, 32], [0, 1, 64])  # 64 steps at once is as many as there are
    assert [s.label for s in settings] == ["1", "8", "32", "8_w1", "32_w1"]
    assert [s.workers for s in settings] == [1, 8, 32, 1, 1]


def test_a_count_that_starts_with_the_budget_spent_is_skipped_with_null_figures(capsys):
    lines = bench_lines(capsys, "--seconds", "0.01")
    figures = json.loads(lines[-1])
    assert sum("skipped: the --seconds budget was spent" in line for line in lines) == 2
    for n in (1, 2):
        assert figures[f"ttft_ms_{n}"] is None and figures[f"replies_{n}"] is None
    assert figures["resident_vs_reprefill_ttft_ratio"] is None
    assert figures["generated_tokens_min"] is None and figures["replies_per_phase"] == {"1": None, "2": None}


def two_turns(chat: TransformersChat) -> tuple[list[str], int]:
    """Two greedy turns of one conversation: the replies and turn 2's cached prompt tokens."""
    chat.open("c")
    try:
        first = [ChatMessage("user", "Tell me about the session server.")]
        reply = "".join(chat.generate("c", first, max_new_tokens=12))
        second = [*first, ChatMessage("assistant", reply), ChatMessage("user", "And then?")]
        again = "".join(chat.generate("c", second, max_new_tokens=12))
        return [reply, again], chat.last_cached_tokens("c")
    finally:
        chat.release("c")


def reference_replies(chat: TransformersChat, replies: list[str]) -> list[str]:
    """The same two turns by ``model.generate`` (transformers' own cache path, no resident KV)."""
    system = ChatMessage("system", chat.system_prompt)
    first = [system, ChatMessage("user", "Tell me about the session server.")]
    second = [*first, ChatMessage("assistant", replies[0]), ChatMessage("user", "And then?")]
    out = []
    for messages in (first, second):
        prompt = torch.tensor([render_chat(chat.tokenizer, messages)], device=chat.device)
        ids = chat.model.generate(prompt, max_new_tokens=12, do_sample=False)[0, prompt.shape[1] :]
        out.append(chat.tokenizer.decode(ids, skip_special_tokens=True))
    return out


@pytest.fixture(scope="module")
def text_only_tiny(tmp_path_factory) -> Path:
    return build_random_chat_model(tmp_path_factory.mktemp("tiny-text"), TINY, text_only=True)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_resident_kv_decoding_matches_transformers_generate(text_only_tiny, device):
    chat = TransformersChat(text_only_tiny, device=device)
    replies, cached = two_turns(chat)
    assert cached > 0 and all(len(r) > 0 for r in replies)
    assert replies == reference_replies(chat, replies)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_transformers_chat_on_cuda_matches_the_cpu_with_resident_kv(tmp_path):
    directory = build_tiny_chat_model(tmp_path / "tiny")
    on_cpu = two_turns(TransformersChat(directory))
    gpu = TransformersChat(directory, device="cuda")
    assert gpu.model.device.type == "cuda"
    before = torch.cuda.memory_allocated()
    gpu.open("kept")
    list(gpu.generate("kept", [ChatMessage("user", "Hello there.")], max_new_tokens=4))
    assert torch.cuda.memory_allocated() > before  # the conversation's KV lives on the GPU
    gpu.release("kept")
    assert two_turns(gpu) == on_cpu  # float32 greedy: the same tokens as on the CPU
    half = TransformersChat(directory, device="cuda", dtype=torch.bfloat16)
    assert two_turns(half)[1] > 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_bench_llm_runs_on_cuda_in_bfloat16(capsys):
    figures = run_bench(capsys, "--device", "cuda")
    assert figures["device"] == "cuda" and figures["dtype"] == "bfloat16"
    assert figures["cached_tokens_resident"] > 0 and figures["tokens_per_s_2"] > 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_random_model_drawn_on_the_gpu_keeps_only_text_tokens_speakable(tmp_path):
    from realtime.bench.random_chat_model import text_token_ids

    directory = build_random_chat_model(tmp_path / "m", TINY, text_only=True, device="cuda")
    chat = TransformersChat(directory)  # loads on the CPU: what was saved, not what was drawn
    rows = chat.model.get_input_embeddings().weight.detach()
    text = torch.zeros(TINY.vocab_size, dtype=torch.bool)
    text[text_token_ids(chat.tokenizer)] = True
    assert bool((rows[~text] == 0).all()) and bool((rows[text].abs().sum(dim=1) > 0).all())
    replies, cached = two_turns(chat)
    assert cached > 0 and all(len(r) > 0 for r in replies)


def test_voice_llm_device_reaches_the_transformers_backend(monkeypatch):
    import models.voice.llm as llm
    from realtime.config import config_from_mapping
    from realtime.kinds.voice_llm import load_chat

    built: list[dict] = []
    monkeypatch.setattr(llm, "TransformersChat", lambda **kwargs: built.append(kwargs))
    load_chat(config_from_mapping({"voice": {"llm_device": "cuda:1"}}).voice)
    assert built[0]["device"] == "cuda:1"
