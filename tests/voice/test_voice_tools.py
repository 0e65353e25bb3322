"""Function tools and ``semantic_vad`` end to end: the real ``openai`` SDK (GA and beta) over
loopback against the real server and the offline models (SmolLM2-135M calls the tools). Every
server event is validated against the SDK's pydantic model for its type in its dialect
(``tests/voice/realtime_client.py``)."""

from __future__ import annotations

import json

import pytest

from realtime.protocols.oai_realtime import Dialect
from tests.voice.realtime_client import connect, response_text, types, voice_server

pytestmark = [pytest.mark.timeout(240), pytest.mark.asyncio(loop_scope="session")]

GA, BETA = Dialect.GA, Dialect.BETA
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "description": "The city name."}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
TIME = {
    "type": "function",
    "name": "get_time",
    "description": "Get the current local time in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
FORECAST = '{"forecast": "sunny", "temperature_c": 21}'


@pytest.fixture(scope="module")
async def server():
    async with voice_server() as running:
        yield running


def _text_item(text: str) -> dict:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def _call_events(events: list[dict], dialect: Dialect) -> dict:
    """The one function call of a forced response: its events in order, and the call."""
    kinds = types(events)
    expected = [
        "response.created",
        "response.output_item.added",
        "conversation.item.added" if dialect is GA else "conversation.item.created",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        *(["conversation.item.done"] if dialect is GA else []),
        "response.done",
    ]
    assert [k for k in kinds if k in expected] == expected, kinds
    added = next(e for e in events if e["type"] == "response.output_item.added")["item"]
    assert added["type"] == "function_call" and added["status"] == "in_progress"
    done = next(e for e in events if e["type"] == "response.function_call_arguments.done")
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta")
    assert done["arguments"] == deltas and done["call_id"] == added["call_id"]
    assert done["item_id"] == added["id"] and done["output_index"] == 0
    assert ("name" in done) is (dialect is GA)
    response = events[-1]["response"]
    assert response["status"] == "completed" and len(response["output"]) == 1
    call = response["output"][0]
    assert call["type"] == "function_call" and call["status"] == "completed"
    assert call["arguments"] == done["arguments"] and call["call_id"] == added["call_id"]
    assert not [k for k in kinds if "audio" in k or "text" in k]  # a forced call says nothing
    return call


async def test_forced_function_call_then_its_output_is_answered_ga(server):
    url, _ = server
    async with connect(url, GA) as (conn, events):
        await conn.session.update(session={"type": "realtime", "tools": [WEATHER, TIME]})
        session = (await events.until("session.updated"))[-1]["session"]
        assert [t["name"] for t in session["tools"]] == ["get_weather", "get_time"]
        assert session["tool_choice"] == "auto"
        await conn.conversation.item.create(item=_text_item("What is the weather like in Paris today?"))
        await events.until("conversation.item.done")
        await conn.response.create(response={"tool_choice": {"type": "function", "name": "get_weather"}})
        got = await events.until("response.done", timeout=120)
        call = _call_events(got, GA)
        assert call["name"] == "get_weather"
        done = next(e for e in got if e["type"] == "response.function_call_arguments.done")
        assert done["name"] == "get_weather"
        arguments = json.loads(call["arguments"])
        assert set(arguments) == {"city"} and "paris" in arguments["city"].lower(), arguments
        # the tool's output goes back as an item; the next response answers with it, in speech
        await conn.conversation.item.create(
            item={"type": "function_call_output", "call_id": call["call_id"], "output": FORECAST}
        )
        added = (await events.until("conversation.item.done"))[-1]["item"]
        assert added["type"] == "function_call_output" and added["call_id"] == call["call_id"]
        await conn.response.create()
        got = await events.until("response.done", timeout=120)
        answer = response_text(got, GA)
        assert "response.output_audio.delta" in types(got)
        assert "<tool" not in answer and "sunny" in answer.lower(), answer
        assert got[-1]["response"]["status"] == "completed"


async def test_required_tool_choice_picks_a_tool_beta(server):
    url, _ = server
    async with connect(url, BETA) as (conn, events):
        await conn.session.update(session={"tools": [WEATHER, TIME], "tool_choice": "required"})
        session = (await events.until("session.updated"))[-1]["session"]
        assert session["tool_choice"] == "required"
        await conn.conversation.item.create(item=_text_item("What time is it in Tokyo right now?"))
        await events.until("conversation.item.created")
        await conn.response.create()
        got = await events.until("response.done", timeout=120)
        call = _call_events(got, BETA)
        assert call["name"] == "get_time"
        assert "tokyo" in json.loads(call["arguments"])["city"].lower()
        await conn.session.update(session={"tool_choice": "get_weather"})  # beta names a function directly
        assert (await events.until("session.updated"))[-1]["session"]["tool_choice"] == "get_weather"


async def test_tool_choice_must_name_an_offered_tool_and_errors_keep_the_socket_open(server):
    url, _ = server
    async with connect(url, GA) as (conn, events):
        await conn.session.update(
            session={"type": "realtime", "tool_choice": {"type": "function", "name": "get_weather"}}
        )
        error = (await events.until("error"))[-1]["error"]
        assert error["code"] == "invalid_value" and error["param"] == "session.tool_choice"
        assert (
            error["message"]
            == "Tool choice 'function' with name 'get_weather' not found in 'tools' parameter."
        )
        await conn.response.create(response={"tool_choice": "required"})
        error = (await events.until("error"))[-1]["error"]
        assert error["code"] == "invalid_value" and error["param"] == "response.tool_choice"
        await conn.session.update(session={"type": "realtime", "tools": [{**WEATHER, "name": "bad name"}]})
        error = (await events.until("error"))[-1]["error"]
        assert error["code"] == "invalid_value" and error["param"] == "session.tools[0].name"


@pytest.mark.parametrize("dialect", [GA, BETA])
async def test_semantic_vad_is_accepted_and_reported(server, dialect):
    url, _ = server
    vad = {"type": "semantic_vad", "eagerness": "high", "interrupt_response": True}
    async with connect(url, dialect) as (conn, events):
        if dialect is GA:
            await conn.session.update(
                session={"type": "realtime", "audio": {"input": {"turn_detection": vad}}}
            )
        else:
            await conn.session.update(session={"turn_detection": vad})
        session = (await events.until("session.updated"))[-1]["session"]
        td = session["audio"]["input"]["turn_detection"] if dialect is GA else session["turn_detection"]
        assert td == {**vad, "create_response": True}
