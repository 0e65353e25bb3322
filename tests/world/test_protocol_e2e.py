"""The world protocol end to end: a real uvicorn server over loopback, a real websockets client,
the real trained model, real PyAV decode of what arrives."""

from __future__ import annotations

import asyncio
import json
from importlib import resources

import httpx
import pytest
import websockets

from models.world.configs import WEIGHTS_DIR, read_config
from realtime.config import config_from_mapping
from realtime.media.video import Fmp4Decoder, decode_jpeg_batch
from tests.serving import serve_in_process

pytestmark = [pytest.mark.timeout(120), pytest.mark.asyncio(loop_scope="session")]
# frames in a session's first chunk and in every later one (world-tiny: 1 + 4(n - 1) and 4n for
# n latents per block)
_CFG = read_config(WEIGHTS_DIR / "world-tiny.safetensors")
FIRST, LATER = _CFG.frames_for_block(True), _CFG.frames_for_block(False)


def _config(**world):
    return config_from_mapping(
        {
            "robot": {"enabled": False},
            "runtime": {"max_pending_events": 2, "memory_available_bytes": 2**30},
            # admission by memory only: these tests open more sessions than a loaded 2-core box
            # keeps at 16 fps (compute admission: tests/world/test_compute_admission.py)
            "world": {"enabled": True, "torch_threads": 1, "compute_admission": False, **world},
        }
    )


@pytest.fixture(scope="module")
async def served():
    """(websocket URL of the world route, the running world service)."""
    async with serve_in_process(_config()) as (url, running):
        (world,) = running.rt_app.state.rt.kinds
        yield url.replace("http://", "ws://") + "/v1/realtime/world", world


@pytest.fixture(scope="module")
async def server(served):
    return served[0]


async def _recv_json(ws, kind: str, timeout: float = 30.0) -> dict:
    """The next text message of ``kind`` (skipping chunks and acks of other kinds)."""

    async def loop():
        while True:
            msg = await ws.recv()
            if isinstance(msg, str) and json.loads(msg)["type"] == kind:
                return json.loads(msg)

    return await asyncio.wait_for(loop(), timeout)


async def _next_chunk(ws, timeout: float = 30.0) -> tuple[dict, bytes]:
    meta = await _recv_json(ws, "chunk.metadata", timeout)
    data = await asyncio.wait_for(ws.recv(), timeout)
    assert isinstance(data, bytes) and len(data) == meta["byte_length"]
    return meta, data


async def test_wrong_protocol_version_gets_typed_error_and_close(server):
    async with websockets.connect(server + "?protocol_version=7") as ws:
        err = json.loads(await ws.recv())
        assert err["type"] == "error" and err["error"]["code"] == "unsupported_protocol_version"
        with pytest.raises(websockets.ConnectionClosed) as info:
            await ws.recv()
        assert info.value.rcvd.code == 1008


async def test_fmp4_chunks_parse_with_pyav_and_echo_applied_events(server):
    async with websockets.connect(server + "?protocol_version=1") as ws:
        await ws.send(
            json.dumps(
                {"type": "session.start", "prompt": "stone", "seed": 3, "format": "fmp4", "pacing": "fast"}
            )
        )
        created = await _recv_json(ws, "session.created")
        caps = created["capabilities"]
        assert caps["frames_per_chunk"] == {"first": FIRST, "later": LATER} and caps["format"] == "fmp4"
        decoder = Fmp4Decoder()  # one H.264 stream: init segment once, then bare fragments
        meta, data = await _next_chunk(ws)
        assert meta["chunk_index"] == 0 and meta["frame_count"] == FIRST
        assert data[4:8] == b"ftyp" and 0 < meta["init_segment_bytes"] < len(data)
        frames = decoder.decode(data)
        assert len(frames) == FIRST and frames[0].shape == (caps["height"], caps["width"], 3)
        keys = {"track": "keys", "schema": "world.keys.v1", "data": {"pressed": ["a"]}}
        await ws.send(
            json.dumps({"type": "session.event", "event_id": 1, "controls": [keys], "client_ts_ms": 123.5})
        )
        ack = await _recv_json(ws, "session.event.ack")
        assert ack == {"type": "session.event.ack", "event_id": 1, "status": "accepted"}
        for _ in range(20):
            meta, data = await _next_chunk(ws)
            assert data[4:8] == b"moof" and meta["init_segment_bytes"] == 0
            assert len(decoder.decode(data)) == meta["frame_count"] == LATER
            if meta["applied_event_ids"]:
                break
        assert meta["applied_event_ids"] == [1] and meta["client_ts_ms"] == 123.5
        assert set(meta["timing"]) >= {"generate_ms", "encode_ms", "queue_ms", "batch_size"}
        await ws.send(json.dumps({"type": "session.event", "event_id": 1, "controls": [keys]}))
        assert (await _recv_json(ws, "session.event.ack"))["status"] == "duplicate"
        await ws.send(json.dumps({"type": "session.event", "event_id": 0, "prompt": "ice"}))
        err = await _recv_json(ws, "error")
        assert err["error"]["code"] == "stale_event" and err["error"]["event_id"] == 0
        await ws.send(json.dumps({"type": "session.reset"}))
        await _recv_json(ws, "session.reset_done")
        meta, data = await _next_chunk(ws)
        assert meta["chunk_index"] == 0 and meta["frame_count"] == FIRST
        assert data[4:8] == b"ftyp" and meta["init_segment_bytes"] > 0  # a new stream after reset
        assert len(decoder.decode(data)) == FIRST
        await ws.send(json.dumps({"type": "session.close"}))
        closed = await _recv_json(ws, "session.closed")
        assert closed["reason"] == "client_close"


async def test_jpeg_frames_decode_and_bad_input_gets_typed_errors(server):
    async with websockets.connect(server + "?protocol_version=1") as ws:
        await ws.send(json.dumps({"type": "session.event", "event_id": 1}))
        assert (await _recv_json(ws, "error"))["error"]["code"] == "not_started"
        await ws.send(json.dumps({"type": "session.start", "seed": 1, "fps": 1, "pacing": "realtime"}))
        caps = (await _recv_json(ws, "session.created"))["capabilities"]
        meta, data = await _next_chunk(ws)
        frames = decode_jpeg_batch(data)
        assert len(frames) == meta["frame_count"] == FIRST and frames[0].shape == (
            caps["height"],
            caps["width"],
            3,
        )
        while meta["chunk_index"] < 2:  # at 1 fps: now 2 blocks (seconds) ahead, the runner waits
            meta, data = await _next_chunk(ws)
            assert len(decode_jpeg_batch(data)) == meta["frame_count"] == LATER
        with pytest.raises(TimeoutError):  # paced: block 3 waits seconds for the media clock
            await _recv_json(ws, "chunk.metadata", timeout=1.0)
        cases = [  # oversized frames close 1009: tests/realtime/test_message_limits.py
            ("{not json", "invalid_json"),
            (json.dumps({"type": "session.teleport"}), "unknown_type"),
            (json.dumps({"type": "session.event", "event_id": "x"}), "invalid_message"),
            (json.dumps({"type": "session.start"}), "already_started"),
            (
                json.dumps(
                    {
                        "type": "session.event",
                        "event_id": 6,
                        "controls": [{"track": "jetpack", "schema": "x", "data": {}}],
                    }
                ),
                "invalid_message",
            ),
        ]
        for text, code in cases:
            await ws.send(text)
            assert (await _recv_json(ws, "error"))["error"]["code"] == code, text
        await ws.send(b"\x00binary")
        assert (await _recv_json(ws, "error"))["error"]["code"] == "unexpected_binary"
        # the runner waits on the media clock for seconds: a burst overflows the 2-event queue
        for event_id in range(10, 15):
            await ws.send(json.dumps({"type": "session.event", "event_id": event_id, "prompt": "forest"}))
        replies = [json.loads(await ws.recv()) for _ in range(5)]
        replies = [r for r in replies if r["type"] in ("session.event.ack", "error")]
        assert [r.get("status") for r in replies[:2]] == ["accepted", "accepted"]
        assert any(r["type"] == "error" and r["error"]["code"] == "event_queue_full" for r in replies)
        await ws.send(json.dumps({"type": "session.ping", "data": 7}))
        assert (await _recv_json(ws, "session.pong"))["data"] == 7


async def test_python_client_iterates_decoded_frames_and_sends_controls(server):
    from clients.world_client import WorldClient

    base = server.removesuffix("/v1/realtime/world")
    async with WorldClient.connect(base, seed=2, pacing="fast", format="fmp4") as world:
        sent = await world.send_keys(["arrowleft"])
        chunks = []
        async for chunk in world.frames():
            chunks.append(chunk)
            if chunk.metadata["applied_event_ids"] == [sent] or len(chunks) > 20:
                break
        assert chunks[0].metadata["frame_count"] == len(chunks[0].frames) == FIRST
        assert chunks[-1].metadata["applied_event_ids"] == [sent]
        assert chunks[-1].frames[0].shape == (128, 128, 3)  # world-tiny: 128x128 frames
        assert [c.metadata["init_segment_bytes"] > 0 for c in chunks] == [True] + [False] * (len(chunks) - 1)
        assert all(len(c.frames) == c.metadata["frame_count"] for c in chunks)


async def test_browser_page_is_served_from_the_package(server):
    base = server.replace("ws://", "http://").removesuffix("/v1/realtime/world")
    async with httpx.AsyncClient() as client:
        page = await client.get(base + "/demo/world")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert page.text == resources.files("clients").joinpath("web", "world.html").read_text()
    assert "/v1/realtime/world?protocol_version=1" in page.text and "MediaSource" in page.text


async def test_failed_tick_is_a_typed_error_then_nothing_until_reset(served):
    url, world = served
    dit = world.model.dit
    async with websockets.connect(url + "?protocol_version=1") as ws:
        await ws.send(json.dumps({"type": "session.start", "seed": 4, "pacing": "fast"}))
        await _recv_json(ws, "session.created")
        await _next_chunk(ws)

        def exploding(*args, **kwargs):
            raise RuntimeError("injected model failure")

        dit.forward = exploding  # the engine's worker thread calls it for the next block
        try:
            err = (await _recv_json(ws, "error"))["error"]
        finally:
            del dit.forward
        assert err["code"] == "tick_failed" and "session.reset" in err["message"]
        assert "Traceback" not in err["message"]
        with pytest.raises(TimeoutError):  # FAILED: no chunk until the client resets
            await _recv_json(ws, "chunk.metadata", timeout=1.0)
        await ws.send(json.dumps({"type": "session.ping", "data": "alive"}))
        assert (await _recv_json(ws, "session.pong"))["data"] == "alive"
        await ws.send(json.dumps({"type": "session.reset"}))
        await _recv_json(ws, "session.reset_done")
        meta, data = await _next_chunk(ws)
        assert meta["chunk_index"] == 0 and len(decode_jpeg_batch(data)) == meta["frame_count"] == FIRST


async def test_sessions_and_slots_return_to_zero_after_every_kind_of_ending(served):
    url, world = served

    async def started(**start) -> websockets.ClientConnection:
        ws = await websockets.connect(url + "?protocol_version=1")
        await ws.send(json.dumps({"type": "session.start", "pacing": "fast", **start}))
        await _recv_json(ws, "session.created")
        return ws

    endings = []
    for i in range(6):
        ws = await started(seed=i, format="fmp4" if i % 2 else "jpeg")
        await _recv_json(ws, "chunk.metadata")  # mid-chunk: its media is still to come
        endings.append(ws)
    assert len(world.manager) == 6 and len(world.model.pool) == 6
    endings[0].transport.abort()  # vanish without a close frame
    await endings[1].close()  # close frame, no session.close
    await endings[2].send(json.dumps({"type": "session.close"}))
    await endings[3].send(json.dumps({"type": "session.reset"}))
    endings[3].transport.abort()  # reset then gone
    await endings[4].send(json.dumps({"type": "session.event", "event_id": 1, "prompt": "ice"}))
    await endings[4].close()
    # the sixth stops reading (slow reader) and disconnects later
    await asyncio.sleep(0.5)
    endings[5].transport.abort()
    await _recv_json(endings[2], "session.closed")
    for _ in range(200):
        if len(world.manager) == len(world.model.pool) == world.engine.active_sessions == 0:
            break
        await asyncio.sleep(0.05)
    assert (len(world.manager), len(world.model.pool), world.engine.active_sessions) == (0, 0, 0)
    assert not world.manager.tombstones()


async def test_admission_beyond_capacity_is_a_typed_error_and_1013_and_a_freed_slot_is_reused():
    config = config_from_mapping(
        {
            "robot": {"enabled": False},
            "runtime": {"max_sessions": 2, "memory_available_bytes": 2**30},
            # the session limit, not the compute measure of a loaded box (test_compute_admission.py)
            "world": {"enabled": True, "torch_threads": 1, "max_batch": 2, "compute_admission": False},
        }
    )
    async with serve_in_process(config) as (base, _):
        url = base.replace("http://", "ws://") + "/v1/realtime/world?protocol_version=1"
        start = json.dumps({"type": "session.start", "pacing": "fast"})
        first, second = websockets.connect(url), websockets.connect(url)
        async with first as a, second as b:
            for ws in (a, b):
                await ws.send(start)
                await _recv_json(ws, "session.created")
            async with websockets.connect(url) as c:
                await c.send(start)
                err = (await _recv_json(c, "error"))["error"]
                assert err["code"] == "session_limit_reached"
                with pytest.raises(websockets.ConnectionClosed) as info:
                    await _recv_json(c, "never")
                assert info.value.rcvd.code == 1013
            await a.send(json.dumps({"type": "session.close"}))
            await _recv_json(a, "session.closed")
            async with websockets.connect(url) as d:
                await d.send(start)
                await _recv_json(d, "session.created")
                await _next_chunk(d)


async def test_resets_mid_generation_restart_the_stream_cleanly(server):
    async with websockets.connect(server + "?protocol_version=1") as ws:
        await ws.send(json.dumps({"type": "session.start", "format": "fmp4", "pacing": "fast"}))
        await _recv_json(ws, "session.created")
        for round_ in range(4):
            for _ in range(round_ % 3):  # reset after 0, 1 or 2 chunks, while the next one generates
                await _next_chunk(ws)
            await ws.send(json.dumps({"type": "session.reset"}))
            await _recv_json(ws, "session.reset_done")
            decoder, expected_first = Fmp4Decoder(), 0
            for chunk_index in range(2):  # after reset_done only the new world's chunks arrive
                meta, data = await _next_chunk(ws)
                assert (meta["chunk_index"], meta["first_frame_index"]) == (chunk_index, expected_first)
                assert (meta["init_segment_bytes"] > 0) == (chunk_index == 0)
                assert len(decoder.decode(data)) == meta["frame_count"]
                expected_first += meta["frame_count"]


async def test_realtime_pacing_generates_only_the_measured_lead_ahead_and_keys_apply_at_the_next_block(
    server,
):
    """Each block starts when the client's media (the pacer's model, echoed as ``timing.ahead_ms``)
    has fallen to the lead (``timing.lead_ms``: slowest recent tick-to-send + margin), far below
    the old two blocks (1000 ms at 16 fps); a key lands in the next block that starts after it."""
    async with websockets.connect(server + "?protocol_version=1") as ws:
        await ws.send(json.dumps({"type": "session.start", "seed": 5, "pacing": "realtime"}))
        caps = (await _recv_json(ws, "session.created"))["capabilities"]
        block_ms = 1000 * caps["frames_per_chunk"]["later"] / caps["fps"]
        metas = [(await _next_chunk(ws))[0] for _ in range(4)]
        keys = {"track": "keys", "schema": "world.keys.v1", "data": {"pressed": ["d"]}}
        await ws.send(json.dumps({"type": "session.event", "event_id": 1, "controls": [keys]}))
        last_seen = metas[-1]["chunk_index"]
        while not metas[-1]["applied_event_ids"]:
            metas.append((await _next_chunk(ws))[0])
    assert metas[0]["timing"]["lead_ms"] is None  # nothing measured before the first chunk
    for meta in metas[1:]:
        timing = meta["timing"]
        assert 0 < timing["lead_ms"] <= caps["limits"]["max_ahead_blocks"] * block_ms, timing
        assert timing["ahead_ms"] <= timing["lead_ms"] + 20, timing  # + timer slack
    applied = metas[-1]
    assert applied["applied_event_ids"] == [1]
    # blocks generated when the key arrived: at most the one running plus max_ahead_blocks unsent
    assert applied["chunk_index"] <= last_seen + 1 + caps["limits"]["max_ahead_blocks"], applied
