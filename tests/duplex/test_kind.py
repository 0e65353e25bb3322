"""The duplex kind over real websockets on loopback: session start, lockstep cadence, silence
fill, malformed events (tests/duplex/kind_server.py runs the server)."""

from __future__ import annotations

import asyncio
import base64

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from models.duplex.stage import FRAME_SAMPLES
from tests.duplex.kind_server import always, audio_steps, connect, duplex_server, loud


def _metric(text: str, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    raise KeyError(name)


async def test_session_created_carries_capabilities_and_every_event_a_seq(monkeypatch) -> None:
    async with (
        duplex_server(monkeypatch, speak=always) as (base, service, _),
        connect(f"{base}/v1/duplex") as c,
    ):
        created = await c.next()
        assert created["type"] == "session.created"
        caps = created["session"]["capabilities"]
        assert caps["chunk_period_ms"] == 80 and caps["supports_resume"] and caps["supports_barge_in"]
        assert caps["audio_formats"] == ["pcm16", "ogg_opus"] and caps["audio_format"] == "pcm16"
        assert caps["context_policy"] == "roll" and caps["context_frames"] == 48
        assert created["resume_token"] and created["epoch"] == 0
        events = [created, *(await c.until("response.output_audio.delta"))]
        types = [e["type"] for e in events]
        assert types[2:8] == [
            "response.created",
            "response.output_item.added",
            "conversation.item.added",
            "response.content_part.added",
            "response.speak",
            "response.output_audio.delta",
        ]
        seqs = [e["server_event_seq"] for e in events]
        assert seqs == list(range(1, len(events) + 1))
        assert len(base64.b64decode(events[-1]["delta"])) == 2 * FRAME_SAMPLES  # 80 ms of pcm16


async def test_lockstep_steps_every_session_in_one_batch_each_period(monkeypatch) -> None:
    async with duplex_server(monkeypatch, speak=always) as (base, service, stage):
        async with connect(f"{base}/v1/duplex") as a, connect(f"{base}/v1/duplex") as b:
            async with connect(f"{base}/v1/realtime?mode=duplex") as c:
                ids = set()
                for client in (a, b, c):
                    ids.add((await client.next())["session"]["id"])
                    await client.start_clock()
                start = len(stage.batches)
                got = await asyncio.gather(*(client.during(1.2) for client in (a, b, c)))
        batches = stage.batches[start:-2]  # the last steps ran while the sockets closed
        assert len(batches) >= 8
        assert all(set(sessions) == ids for _, sessions, _ in batches), "every step batches all sessions"
        for events in got:  # each session's frames arrive in step order, none skipped
            steps = audio_steps(events)
            assert len(steps) >= 8 and steps == list(range(steps[0], steps[0] + len(steps)))
        gaps = np.diff([t for t, _, _ in batches])
        assert np.median(gaps) > 0.06, "the clock paces steps at the period, not back to back"


async def test_input_gaps_are_filled_with_silence_and_counted(monkeypatch) -> None:
    async with duplex_server(monkeypatch, speak=lambda step: False) as (base, service, stage):
        async with connect(f"{base}/v1/duplex") as c:
            sid = (await c.next())["session"]["id"]
            await c.append(0.01 * loud(5))  # five frames of (quiet) audio, then nothing
            await asyncio.sleep(1.0)
            ds = service.sessions[sid]
            assert ds.client_frames == 5 and ds.silent_frames >= 5
            silent = [flags[s.index(sid)] for _, s, flags in stage.batches if sid in s]
            first_client = silent.index(False)
            assert silent[first_client : first_client + 5] == [False] * 5 and all(silent[first_client + 5 :])
            silent_before_scrape = ds.silent_frames  # the clock keeps stepping on silence meanwhile
            async with httpx.AsyncClient() as http:
                text = (await http.get(base.replace("ws://", "http://") + "/metrics")).text
            assert _metric(text, "duplex_input_frames_total", source="client") == 5
            assert _metric(text, "duplex_input_frames_total", source="silence") >= silent_before_scrape
            assert _metric(text, "duplex_steps_total") >= len(silent)


async def test_malformed_events_get_typed_errors_and_the_socket_stays_open(monkeypatch) -> None:
    async with duplex_server(monkeypatch, speak=lambda step: False) as (base, _, _):
        async with connect(f"{base}/v1/duplex") as c:
            await c.next()
            cases = [
                ("{not json", "invalid_json"),
                ('{"type": "nope"}', "invalid_value"),
                ('{"type": "playback.ack", "response_id": "r", "played_ms": -1}', "integer_below_min_value"),
                ('{"type": "playback.ack", "response_id": "r", "played_ms": 1, "x": 1}', "unknown_parameter"),
                ('{"type": "playback.ack", "response_id": "resp_x", "played_ms": 80}', "unknown_response"),
                (
                    '{"type": "session.resume", "session_id": "s", "resume_token": "t"}',
                    "session_already_attached",
                ),
                ('{"type": "response.create"}', "unsupported_feature"),
                ('{"type": "response.cancel"}', "response_cancel_not_active"),
                ('{"type": "input_audio_buffer.append", "audio": "%%%"}', "invalid_audio_base64"),
            ]
            for frame, code in cases:
                await c.ws.send(frame)
                (error,) = [e for e in await c.until("error") if e["type"] == "error"]
                assert error["error"]["code"] == code, (frame, error)
            await c.ws.send(b"\x00binary")
            assert (await c.until("error"))[-1]["error"]["code"] == "unexpected_binary"
            await c.send(type="session.heartbeat")
            assert (await c.until("session.heartbeat_ack"))[-1]["type"] == "session.heartbeat_ack"


async def test_realtime_without_duplex_mode_is_not_the_duplex_kind(monkeypatch) -> None:
    async with duplex_server(monkeypatch) as (base, _, _):
        async with connect(f"{base}/v1/realtime") as c:
            try:
                await c.ws.recv()
            except Exception as exc:  # closed: no kind serves /v1/realtime without mode=duplex here
                assert "no such endpoint" in str(exc)
            else:
                raise AssertionError("the duplex kind answered /v1/realtime without mode=duplex")
