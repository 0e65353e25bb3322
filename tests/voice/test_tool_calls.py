"""Tool-call extraction and forcing: the pure extractor, JSON completion and schema conformance,
the shared text path (``ReplyText``), the prompt with tools, and constrained choices on SmolLM2."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch
from transformers import AutoTokenizer

from models.voice.llm import ChatMessage, ChatUsage, TransformersChat, render_chat, smollm2_dir
from models.voice.stages import ChatRequest, ReplyText
from models.voice.tool_calls import (
    FORCED_PREFIX,
    CallArguments,
    CallDone,
    CallStarted,
    ToolCallExtractor,
    ToolSpec,
    close_json,
    conform_arguments,
    forced_choices,
    format_tool_call,
)

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}\n</tool_call>'
REPLY = f"Let me look that up. {CALL} It is sunny < warm."
WEATHER = ToolSpec(
    "get_weather",
    "Get the weather.",
    {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "array", "items": {"type": "integer"}}},
        "required": ["city"],
    },
)


def _run(text: str, size: int) -> tuple[str, list]:
    x = ToolCallExtractor()
    spoken, events = [], []
    for start in range(0, len(text), size):
        s, e = x.push(text[start : start + size])
        spoken.append(s)
        events += e
    s, e = x.finish()
    return "".join(spoken) + s, events + e


def _merged(events: list) -> list:
    """Events with consecutive argument deltas joined (chunking only changes how deltas split)."""
    out: list = []
    for e in events:
        if isinstance(e, CallArguments) and out and isinstance(out[-1], CallArguments):
            out[-1] = CallArguments(e.index, out[-1].delta + e.delta)
        else:
            out.append(e)
    return out


def test_markup_never_reaches_speech_whatever_the_chunking():
    expected_events = [
        CallStarted(0, "get_weather"),
        CallArguments(0, '{"city": "Paris", "days": [1, 2]}'),
        CallDone(0, "get_weather", '{"city": "Paris", "days": [1, 2]}'),
    ]
    for size in range(1, len(REPLY) + 1):
        spoken, events = _run(REPLY, size)
        assert spoken == "Let me look that up.  It is sunny < warm.", size
        assert _merged(events) == expected_events, size


def test_arguments_stream_before_the_call_closes():
    x = ToolCallExtractor()
    _, events = x.push('<tool_call>{"name": "f", "arguments": {"q": "long')
    assert events == [CallStarted(0, "f"), CallArguments(0, '{"q": "long')]
    _, events = x.push(' text"}}</tool_call>')
    assert events == [CallArguments(0, ' text"}'), CallDone(0, "f", '{"q": "long text"}')]


def test_other_key_orders_invalid_blocks_and_cut_replies():
    spoken, events = _run('<tool_call>{"arguments": {"a": 1}, "name": "f"}</tool_call>ok', 4)
    assert spoken == "ok" and events[-1] == CallDone(0, "f", '{"a": 1}')
    spoken, events = _run("<tool_call>not json</tool_call>fine", 3)
    assert (spoken, events) == ("fine", [])  # dropped, never spoken
    spoken, events = _run('<tool_call>{"name": "f", "arguments": {"a": "b', 5)  # the token cap hit
    assert spoken == "" and events[-1] == CallDone(0, "f", '{"a": "b')
    spoken, events = _run('<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>', 7)
    assert events[-1] == CallDone(0, "f", '{"a": 1}')  # arguments written as a JSON string
    spoken, events = _run(f"{CALL}{CALL}", 6)
    assert [e.index for e in events if isinstance(e, CallDone)] == [0, 1]
    assert _run("ends with <tool", 2) == ("ends with <tool", [])


@pytest.mark.parametrize(
    ("cut", "closed"),
    [
        ('{"city": "Par', {"city": "Par"}),
        ('{"city": "Paris", ', {"city": "Paris"}),
        ('{"city": ', {}),
        ('{"ci', {}),
        ('{"a": 1, "b', {"a": 1}),
        ('{"a": [1, ', {"a": [1]}),
        ('{"a": {"b": "x\\', {"a": {"b": "x"}}),
        ('{"a": 1}', {"a": 1}),
    ],
)
def test_close_json_completes_a_cut_object(cut, closed):
    assert json.loads(close_json(cut)) == closed


SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "default": 1},
        "hourly": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "where": {"type": "object", "properties": {"lat": {"type": "number"}}, "required": ["lat"]},
    },
    "required": ["city", "unit", "days", "where"],
    "additionalProperties": False,
}


@pytest.mark.parametrize(
    ("generated", "expected"),
    [
        (
            '{"city": "Paris", "unit": "celsius", "days": 3}',
            {"city": "Paris", "unit": "celsius", "days": 3, "where": {"lat": 0}},
        ),
        (
            '{"city": 7, "unit": "kelvin", "days": "2", "hourly": "true", "tags": [1], "made_up": {}}',
            {"city": "7", "unit": "celsius", "days": 2, "hourly": True, "tags": ["1"], "where": {"lat": 0}},
        ),
        ('{"city": "Par', {"city": "Par", "unit": "celsius", "days": 1, "where": {"lat": 0}}),
        ("not json at all", {"city": "", "unit": "celsius", "days": 1, "where": {"lat": 0}}),
        ('["a list"]', {"city": "", "unit": "celsius", "days": 1, "where": {"lat": 0}}),
    ],
)
def test_forced_arguments_conform_to_the_schema(generated, expected):
    conformed = json.loads(conform_arguments(generated, SCHEMA))
    assert conformed == expected
    jsonschema.validate(conformed, SCHEMA)


def test_reply_text_speaks_text_only_and_forced_calls_are_conformed():
    reply = ReplyText(ChatRequest((), tools=(WEATHER,)), chunked=True)
    chunks = [reply.push(REPLY[i : i + 5]) for i in range(0, len(REPLY), 5)]
    chunks.append(reply.finish(ChatUsage(1, 0, 1)))
    assert "".join(c.text for c in chunks) == "Let me look that up.  It is sunny < warm."
    assert all("tool" not in clause for c in chunks for clause in c.clauses)
    assert [e for c in chunks for e in c.calls if isinstance(e, CallDone)][0].name == "get_weather"
    unknown = ReplyText(ChatRequest((), tools=()), chunked=True)
    assert not unknown.push(CALL).calls  # a tool the request did not offer is never called
    forced = ReplyText(ChatRequest((), tools=(WEATHER,), forced_tools=(WEATHER,)), chunked=True)
    assert forced.request.prefill == FORCED_PREFIX
    assert forced.request.choices == ('get_weather", "arguments": {"city": "',)
    first = forced.push('get_weather", "arguments": {"city": "Paris", "invented": 1}')
    assert first.calls[0] == CallStarted(0, "get_weather") and forced.complete
    assert first.calls[1:] == (
        CallArguments(0, '{"city": "Paris"}'),
        CallDone(0, "get_weather", '{"city": "Paris"}'),
    )  # one delta, the conformed arguments, equal to the done event's


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(smollm2_dir())


def test_the_prompt_lists_tools_and_replays_calls_and_outputs(tokenizer):
    messages = [
        ChatMessage("system", "Be brief."),
        ChatMessage("user", "Weather in Paris?"),
        ChatMessage("assistant", format_tool_call("get_weather", '{"city": "Paris"}')),
        ChatMessage("tool", '{"forecast": "sunny"}'),
    ]
    text = tokenizer.decode(render_chat(tokenizer, messages, (WEATHER,), FORCED_PREFIX))
    system = text.split("<|im_end|>")[0]
    assert "Be brief." in system and "<tools>" in system and '"name": "get_weather"' in system
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    assert '<|im_start|>user\n<tool_response>\n{"forecast": "sunny"}\n</tool_response>' in text
    assert text.endswith("<|im_start|>assistant\n" + FORCED_PREFIX)
    assert "<tools>" not in tokenizer.decode(render_chat(tokenizer, messages))


def test_constrained_choices_pick_a_tool_deterministically():
    torch.set_num_threads(1)
    chat = TransformersChat(max_conversations=1)
    chat.open("c")
    time = ToolSpec("get_time", "Get the local time in a city.", {"type": "object", "properties": {}})
    tools = (WEATHER, time)
    messages = [ChatMessage("user", "What time is it in Tokyo?")]
    for _ in range(2):
        out = "".join(
            chat.generate(
                "c",
                messages,
                max_new_tokens=8,
                temperature=1.2,  # constrained tokens ignore sampling
                tools=tools,
                prefill=FORCED_PREFIX,
                choices=forced_choices(tools),
            )
        )
        assert out.startswith('get_time", "arguments": {'), out
