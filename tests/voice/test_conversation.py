"""The voice conversation: its store (realtime/protocols/oai_realtime/conversation.py) and the
prompt it makes (realtime/kinds/voice_llm.py)."""

from __future__ import annotations

from models.voice.llm import ChatMessage
from realtime.kinds.voice_llm import chat_prompt
from realtime.protocols.oai_realtime.conversation import Conversation
from realtime.protocols.oai_realtime.items import (
    FunctionCallOutput,
    InputAudio,
    InputText,
    Message,
    OutputAudio,
)
from realtime.protocols.oai_realtime.responses import ItemReference


def _user(item_id: str, text: str) -> Message:
    return Message(item_id, "user", (InputText(text),))


def test_insert_after_root_or_an_item_and_report_the_previous_id():
    c = Conversation(max_items=8)
    assert c.insert(_user("a", "one"), None) is None
    assert c.insert(_user("c", "three"), None) == "a"
    assert c.insert(_user("b", "two"), "a") == "a"
    assert c.insert(_user("z", "zero"), "root") is None
    assert [m.content for m in chat_prompt(c, "sys", None)] == ["sys", "zero", "one", "two", "three"]
    assert c.previous_of("c") == "b" and c.delete("b") and not c.delete("b") and "b" not in c


def test_beyond_max_items_the_oldest_are_dropped():
    c = Conversation(max_items=2)
    for i in range(4):
        c.insert(_user(f"i{i}", f"t{i}"), None)
    assert "i0" not in c and "i1" not in c and c.get("i3") is not None


def test_prompt_uses_transcripts_skips_empty_items_and_follows_a_selection():
    c = Conversation(max_items=8)
    c.insert(Message("u", "user", (InputAudio(b"\0\0", "what is the capital"),)), None)
    c.insert(Message("pending", "user", (InputAudio(None, None),)), None)  # not transcribed: nothing to say
    c.insert(Message("a", "assistant", (OutputAudio("Paris."),)), None)
    assert chat_prompt(c, "sys", None) == (
        ChatMessage("system", "sys"),
        ChatMessage("user", "what is the capital"),
        ChatMessage("assistant", "Paris."),
    )
    selection = (ItemReference("a"), ItemReference("deleted"), FunctionCallOutput("f", "call_1", "42"))
    prompt = chat_prompt(c, "sys", selection)
    assert [m.content for m in prompt] == ["sys", "Paris.", "42"] and prompt[-1].role == "tool"
