"""openai-agents against the voice kind over loopback: a ``RealtimeAgent`` run by a
``RealtimeRunner`` (its defaults: ``semantic_vad``, ``gpt-4o-mini-transcribe``, voice ``ash``),
a spoken question answered in audio with a transcript, and a ``@function_tool`` called (forced
with ``tool_choice``) whose output the agent feeds back and the model answers.

openai-agents validates every server event against the ``openai`` SDK's models and reports the
ones that fail as ``error`` session events: the test asserts there are none, and validates each
raw server event once more with the strict checker (no undeclared keys)."""

from __future__ import annotations

import asyncio
import json

import pytest

from realtime.protocols.oai_realtime import Dialect
from tests.protocols.oai_realtime.sdk_models import validate_server_frame
from tests.voice.realtime_client import API_KEY, APPEND_BYTES, voice_server

agents = pytest.importorskip("agents", reason="openai-agents is in the test extra")
from agents.realtime import RealtimeAgent, RealtimeRunner  # noqa: E402
from agents.realtime.model_inputs import RealtimeModelSendRawMessage  # noqa: E402

pytestmark = [pytest.mark.timeout(300), pytest.mark.asyncio(loop_scope="session")]


class _Session:
    """A running agent session's events: every raw server event validated and kept by type."""

    def __init__(self, session) -> None:
        self.session = session
        self.events: list = []
        self.server: list[dict] = []
        self._arrived = asyncio.Event()

    async def collect(self) -> None:
        async for event in self.session:
            self.events.append(event)
            if event.type == "raw_model_event" and event.data.type == "raw_server_event":
                validate_server_frame(json.dumps(event.data.data), Dialect.GA)
                self.server.append(event.data.data)
            self._arrived.set()

    async def until(self, kind: str, count: int = 1, timeout: float = 150) -> None:
        """Wait until ``count`` server events of type ``kind`` arrived."""
        async with asyncio.timeout(timeout):
            while sum(e["type"] == kind for e in self.server) < count:
                self._arrived.clear()
                await self._arrived.wait()

    def of(self, kind: str) -> list[dict]:
        return [e for e in self.server if e["type"] == kind]


async def test_realtime_agent_hears_answers_and_calls_a_function_tool(spoken_question):
    called: list[str] = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        called.append(city)
        return "sunny and 21 degrees"

    agent = RealtimeAgent(name="Assistant", tools=[get_weather])
    async with voice_server() as (url, _):
        runner = RealtimeRunner(agent)
        session = await runner.run(
            model_config={"url": f"{url}/realtime?model=gpt-realtime", "api_key": API_KEY}
        )
        async with session:
            s = _Session(session)
            collector = asyncio.create_task(s.collect())
            try:
                await s.until("session.updated")
                td = s.of("session.updated")[-1]["session"]["audio"]["input"]["turn_detection"]
                assert td["type"] == "semantic_vad"  # the agent's default, served as VAD
                pcm = spoken_question.pcm16_24k
                for start in range(0, len(pcm), APPEND_BYTES):
                    await session.send_audio(pcm[start : start + APPEND_BYTES])
                await s.until("response.done")
                transcript = s.of("conversation.item.input_audio_transcription.completed")[0]["transcript"]
                assert all(w in transcript.lower() for w in spoken_question.transcript_words)
                answer = "".join(e["delta"] for e in s.of("response.output_audio_transcript.delta"))
                assert any(w in answer.lower() for w in spoken_question.answer_words), answer
                assert [e for e in s.events if e.type == "audio"]  # the agent received answer audio

                await session.model.send_event(
                    RealtimeModelSendRawMessage(
                        {
                            "type": "conversation.item.create",
                            "other_data": {
                                "item": {
                                    "type": "message",
                                    "role": "user",
                                    "content": [
                                        {"type": "input_text", "text": "What is the weather in Paris?"}
                                    ],
                                }
                            },
                        }
                    )
                )
                forced = {"tool_choice": {"type": "function", "name": "get_weather"}}
                await session.model.send_event(
                    RealtimeModelSendRawMessage(
                        {"type": "response.create", "other_data": {"response": forced}}
                    )
                )
                await s.until("response.done", count=3)  # the call, then the answer to its output
            finally:
                collector.cancel()
        assert called and "paris" in called[0].lower(), called
        kinds = [e.type for e in s.events]
        assert "tool_start" in kinds and "tool_end" in kinds
        assert not [e for e in s.events if e.type == "error"], [e for e in s.events if e.type == "error"]
        call, answer = (e["response"] for e in s.of("response.done")[1:3])
        assert call["output"][0]["type"] == "function_call" and call["output"][0]["name"] == "get_weather"
        assert answer["status"] == "completed"
        outputs = [
            e["item"] for e in s.of("conversation.item.done") if e["item"]["type"] == "function_call_output"
        ]
        assert outputs and outputs[0]["call_id"] == call["output"][0]["call_id"]
        assert "sunny" in outputs[0]["output"]
