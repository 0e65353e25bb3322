"""Third-party clients and the other models through the duplex kind: the stock ``openai`` SDK on
``/v1/realtime?mode=duplex``, Ogg/Opus binary audio decoded by PyAV's own demuxer, Moshi."""

from __future__ import annotations

import asyncio
import base64
import io

import av
import numpy as np
import pytest
from openai import AsyncOpenAI

from models.duplex.stage import FRAME_SAMPLES
from realtime.protocols.duplex.opus import OggOpusEncoder
from tests.duplex.kind_server import always, connect, duplex_server, loud


@pytest.mark.parametrize("beta", [False, True], ids=["ga", "beta"])
async def test_a_stock_openai_client_hears_the_duplex_model(monkeypatch, beta: bool) -> None:
    async with duplex_server(monkeypatch, speak=always) as (base, _, _):
        client = AsyncOpenAI(websocket_base_url=f"{base}/v1", api_key="unused")
        realtime = client.beta.realtime if beta else client.realtime
        async with realtime.connect(model="gpt-realtime", extra_query={"mode": "duplex"}) as conn:
            created = await asyncio.wait_for(conn.recv(), 10)
            assert created.type == "session.created"
            pcm = (loud(2) * 0.01 * 32767).astype("<i2").tobytes()  # quiet: no barge-in
            await conn.input_audio_buffer.append(audio=base64.b64encode(pcm).decode())
            delta_type = "response.audio.delta" if beta else "response.output_audio.delta"
            transcript_type = (
                "response.audio_transcript.delta" if beta else "response.output_audio_transcript.delta"
            )
            seen: dict[str, int] = {}
            while seen.get(delta_type, 0) < 3:
                event = await asyncio.wait_for(conn.recv(), 10)
                seen[event.type] = seen.get(event.type, 0) + 1
                if event.type == delta_type:
                    assert len(base64.b64decode(event.delta)) == 2 * FRAME_SAMPLES
            assert (
                seen["response.created"] == 1 and seen[transcript_type] >= 2
            )  # one per audio delta, after it


async def test_ogg_opus_audio_both_ways(monkeypatch) -> None:
    speak = lambda step: 3 <= step < 9  # noqa: E731  (one response of 6 frames)
    async with duplex_server(monkeypatch, speak=speak) as (base, service, _):
        async with connect(f"{base}/v1/duplex?audio_format=ogg_opus") as c:
            created = await c.next()
            assert created["session"]["capabilities"]["audio_format"] == "ogg_opus"
            encoder = OggOpusEncoder(24_000)
            tone = (0.05 * np.sin(np.arange(4 * FRAME_SAMPLES) / 7)).astype(np.float32)
            for i in range(4):
                await c.ws.send(encoder.encode(tone[i * FRAME_SAMPLES : (i + 1) * FRAME_SAMPLES]))
            stream, texts = b"", []
            while True:
                frame = await asyncio.wait_for(c.ws.recv(), 10)
                if isinstance(frame, bytes):
                    stream += frame
                    continue
                texts.append(frame)
                if '"response.output_audio.done"' in frame:
                    last_page = stream.rindex(b"OggS")
                    assert stream[last_page + 5] & 0x04, "the stream's last page (EOS) came before it"
                if '"response.done"' in frame:
                    break
            assert not [t for t in texts if "response.output_audio.delta" in t]  # audio is binary only
            sid = created["session"]["id"]
            assert service.sessions[sid].client_frames >= 3  # the Opus input reached the model
        with av.open(io.BytesIO(stream)) as container:  # one complete Ogg/Opus stream per response
            samples = sum(f.samples for f in container.decode(audio=0))
            rate = container.streams.audio[0].rate
        assert abs(samples * 24_000 / rate - 6 * FRAME_SAMPLES) <= 2 * 960


async def test_bad_opus_input_is_a_typed_error(monkeypatch) -> None:
    async with duplex_server(monkeypatch, speak=lambda step: False) as (base, _, _):
        async with connect(f"{base}/v1/duplex?audio_format=ogg_opus") as c:
            await c.next()
            await c.ws.send(b"definitely not an ogg page, but long enough to look at")
            assert (await c.until("error"))[-1]["error"]["code"] == "invalid_opus"
        async with connect(f"{base}/v1/duplex?audio_format=mp3") as c:
            assert (await c.next())["error"]["code"] == "unsupported_audio_format"


async def test_the_moshi_adapter_steps_through_the_server(monkeypatch) -> None:
    pytest.importorskip("moshi")
    # its step takes longer than the period on a shared 2-core CPU: admission by compute would
    # admit one session (as it should); the test wants two in one batch
    moshi = {"model": "moshi-test", "max_sessions": 2, "compute_admission": False}
    async with duplex_server(monkeypatch, **moshi) as (base, service, _):
        async with connect(f"{base}/v1/duplex") as a, connect(f"{base}/v1/duplex") as b:
            for c in (a, b):
                created = await c.next()
                assert created["session"]["capabilities"]["context_policy"] == "roll"
            steps_before = service.clock.steps
            await a.append(loud(3) * 0.05)
            await asyncio.sleep(1.0)
            assert service.clock.steps - steps_before >= 3
            for sid, ds in service.sessions.items():
                assert ds.step >= 3, sid
            assert sum(ds.client_frames for ds in service.sessions.values()) == 3
