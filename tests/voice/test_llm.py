"""The transformers chat backend with resident KV (models/voice/llm.py), on SmolLM2-135M-Instruct."""

from __future__ import annotations

import itertools
import threading

import pytest
import torch

from models.voice.llm import (
    ChatError,
    ChatMessage,
    ContextTooLong,
    ConversationBusy,
    TooManyConversations,
    TransformersChat,
    UnknownConversation,
)


@pytest.fixture(scope="module")
def chat() -> TransformersChat:
    torch.set_num_threads(1)
    return TransformersChat(max_conversations=4)


@pytest.fixture
def conversation(chat):
    ids = (f"c{i}" for i in itertools.count())
    opened = []

    def open_one() -> str:
        opened.append(next(ids))
        chat.open(opened[-1])
        return opened[-1]

    yield open_one
    for conversation_id in opened:
        chat.release(conversation_id)


def user(text: str) -> ChatMessage:
    return ChatMessage("user", text)


def reply(chat, cid, messages, **kwargs) -> str:
    return "".join(chat.generate(cid, messages, max_new_tokens=kwargs.pop("max_new_tokens", 40), **kwargs))


@pytest.mark.parametrize(
    ("question", "expected"),
    [("What is the capital of France?", "paris"), ("How many legs does a spider have?", "8")],
)
def test_answers_simple_questions(chat, conversation, question, expected):
    answer = reply(chat, conversation(), [user(question)])
    assert expected in answer.lower(), answer


def test_second_turn_prefill_reuses_the_first_turns_kv(chat, conversation):
    cid = conversation()
    first = [user("What is the capital of France?")]
    answer = reply(chat, cid, first)
    assert chat.last_cached_tokens(cid) == 0
    covered = len(chat._render([ChatMessage("system", chat.system_prompt), *first])) + len(
        chat.tokenizer(answer, add_special_tokens=False)["input_ids"]
    )
    second = [*first, ChatMessage("assistant", answer), user("How many legs does a spider have?")]
    assert "8" in reply(chat, cid, second)
    # Everything the first turn ran (prompt and answer) is reused: all but the unfed last token.
    assert chat.last_cached_tokens(cid) >= covered - 1
    third = [*first, ChatMessage("assistant", answer[:5]), user("Say it again.")]
    reply(chat, cid, third, max_new_tokens=3)
    assert 0 < chat.last_cached_tokens(cid) < covered, "a truncated answer keeps the shared prefix only"


def test_identical_prompt_still_runs_one_token(chat, conversation):
    cid = conversation()
    messages = [user("Hello!")]
    reply(chat, cid, messages, max_new_tokens=1)
    prompt_len = len(chat._render([ChatMessage("system", chat.system_prompt), *messages]))
    reply(chat, cid, messages, max_new_tokens=1)
    assert chat.last_cached_tokens(cid) == prompt_len - 1


def test_should_stop_aborts_within_a_token(chat, conversation, monkeypatch):
    cid = conversation()
    forwards = []
    original = chat._forward
    monkeypatch.setattr(
        chat, "_forward", lambda c, tokens: forwards.append(len(tokens)) or original(c, tokens)
    )
    stop = threading.Event()
    pieces = []
    for piece in chat.generate(
        cid, [user("Tell me a long story about a dragon.")], max_new_tokens=100, should_stop=stop.is_set
    ):
        pieces.append(piece)
        if len(pieces) == 3:
            stop.set()
            ran = len(forwards)
    assert len(pieces) == 3 and len(forwards) == ran, "no forward and no piece after should_stop"
    assert reply(chat, cid, [user("Hi")], should_stop=lambda: True) == ""


def test_temperature_sampling_stays_on_topic(chat, conversation):
    torch.manual_seed(0)
    answer = reply(chat, conversation(), [user("What is the capital of France?")], temperature=0.3)
    assert "paris" in answer.lower(), answer


def test_limits_and_misuse_are_typed_errors(chat, conversation):
    with pytest.raises(UnknownConversation):
        chat.generate("nope", [user("hi")])
    cid = conversation()
    with pytest.raises(ChatError, match="already open"):
        chat.open(cid)
    running = chat.generate(cid, [user("Count to ten.")], max_new_tokens=20)
    next(running)
    with pytest.raises(ConversationBusy):
        next(chat.generate(cid, [user("hi")]))
    running.close()
    assert reply(chat, cid, [user("hi")], max_new_tokens=2)  # usable again after close
    for _ in range(chat.max_conversations - len(chat._conversations)):
        conversation()
    with pytest.raises(TooManyConversations):
        chat.open("one-too-many")
    with pytest.raises(ContextTooLong):
        chat.generate(cid, [user("word " * 3000)])


def test_old_messages_are_dropped_to_fit_the_context(chat):
    small = TransformersChat(chat.model_dir, max_context_tokens=120)
    small.open("c")
    history = [user("Tell me about the sea. " * 8), ChatMessage("assistant", "The sea is big. " * 8)]
    prompt = small._fit([*history, user("What is the capital of France?")], max_new_tokens=20)
    assert len(prompt) <= 100
    assert "France" in small.tokenizer.decode(prompt) and "sea" not in small.tokenizer.decode(prompt)


def test_kv_geometry_is_declared(chat):
    # SmolLM2-135M: 30 layers, 3 KV heads of 64, float32, keys and values.
    assert chat.kv_bytes_per_token == 2 * 30 * 3 * 64 * 4
    assert chat.kv_bytes_per_conversation == chat.kv_bytes_per_token * chat.max_context_tokens
