"""The echo kind end to end over a real websocket on loopback: the worked example of
docs/adding-a-session-kind.md (skeleton, streaming tick, streaming + batched pipeline, interrupt)."""

from __future__ import annotations

import asyncio
import json

import pytest
import websockets

from realtime.config import config_from_mapping
from tests.serving import serve_in_process

pytestmark = [pytest.mark.timeout(60), pytest.mark.asyncio(loop_scope="session")]


@pytest.fixture(scope="module")
async def echo():
    config = config_from_mapping(
        {
            "robot": {"enabled": False},
            "world": {"enabled": False},
            "echo": {"enabled": True, "word_delay_s": 0.02, "max_text_chars": 200},
            "server": {"start_timeout_s": 5},
        }
    )
    async with serve_in_process(config) as (base, server):
        service = next(k for k in server.rt_app.state.rt.kinds if k.name == "echo")
        yield base.replace("http://", "ws://") + "/v1/realtime/echo", service


async def _recv(ws, timeout: float = 10.0) -> dict:
    return json.loads(await asyncio.wait_for(ws.recv(), timeout))


async def test_words_stream_back_upper_cased_then_done(echo):
    url, _ = echo
    async with websockets.connect(url) as ws:
        created = await _recv(ws)
        assert created["type"] == "session.created" and created["session_id"].startswith("echo-")
        await ws.send(json.dumps({"type": "echo", "text": "hello streaming world"}))
        deltas = [await _recv(ws) for _ in range(3)]
        assert [d["text"] for d in deltas] == ["HELLO", "STREAMING", "WORLD"]
        assert [d["seq"] for d in deltas] == [0, 1, 2] and {d["chunk_index"] for d in deltas} == {0}
        done = await _recv(ws)
        assert done == {"type": "echo.done", "chunk_index": 0, "words": 3}
        await ws.send(json.dumps({"type": "echo", "text": "again"}))  # the tick committed: chunk 1
        assert (await _recv(ws))["chunk_index"] == 1


async def test_cancel_interrupts_the_stream_and_nothing_of_it_follows(echo):
    url, service = echo
    aborted = service.words.aborted
    async with websockets.connect(url) as ws:
        await _recv(ws)
        await ws.send(json.dumps({"type": "echo", "text": " ".join(f"w{i}" for i in range(40))}))
        first = await _recv(ws)
        assert first["type"] == "echo.delta"
        await ws.send(json.dumps({"type": "cancel"}))
        seen = []
        while (msg := await _recv(ws))["type"] == "echo.delta":
            seen.append(msg)
        assert msg == {"type": "echo.cancelled", "chunk_index": 0}
        assert len(seen) < 38  # cut short, not drained
        assert service.words.aborted == aborted + 1  # the streaming stage's request was aborted
        with pytest.raises(TimeoutError):  # no delta of the cancelled echo after echo.cancelled
            await _recv(ws, timeout=0.3)
        await ws.send(json.dumps({"type": "echo", "text": "next one"}))
        after = [await _recv(ws) for _ in range(3)]
        assert [m["type"] for m in after] == ["echo.delta", "echo.delta", "echo.done"]
        assert after[0]["chunk_index"] == 0  # the interrupted tick committed nothing
        await ws.send(json.dumps({"type": "cancel"}))
        assert (await _recv(ws))["code"] == "not_active"


async def test_bad_frames_are_typed_errors_and_the_socket_stays_open(echo):
    url, _ = echo
    async with websockets.connect(url) as ws:
        await _recv(ws)
        cases = {
            "not json": "invalid_json",
            '{"type": "echo", "text": NaN}': "invalid_json",
            '{"type": "echo", "text": 5}': "invalid_message",
            json.dumps({"type": "echo", "text": "x" * 201}): "invalid_message",
            '{"type": "echo", "text": "a", "extra": 1}': "invalid_message",
            '{"type": "dance"}': "unknown_type",
        }
        for frame, code in cases.items():
            await ws.send(frame)
            reply = await _recv(ws)
            assert reply["type"] == "error" and reply["code"] == code, (frame, reply)
        await ws.send(b"\x00binary")
        assert (await _recv(ws))["code"] == "unexpected_binary"
        await ws.send(json.dumps({"type": "echo", "text": "still here"}))
        assert (await _recv(ws))["text"] == "STILL"


async def test_sessions_are_released_after_every_ending_and_idle_sockets_time_out(echo):
    url, service = echo
    sockets = [await websockets.connect(url) for _ in range(3)]
    for ws in sockets:
        await _recv(ws)
    await sockets[0].send(json.dumps({"type": "echo", "text": "one two three four five six"}))
    await _recv(sockets[0])
    sockets[0].transport.abort()  # vanish mid-stream
    await sockets[1].close()
    await sockets[2].send(json.dumps({"type": "echo", "text": "bye"}))
    await sockets[2].close()
    for _ in range(200):
        if len(service.manager) == 0:
            break
        await asyncio.sleep(0.02)
    assert len(service.manager) == 0 and not service.manager.tombstones()
