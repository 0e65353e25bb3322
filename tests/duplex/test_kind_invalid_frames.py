"""The duplex kind's cost of hostile sockets over real websockets (issue 26, isolation): invalid
frames in a row close the socket 1008 after every typed error; a socket that sent nothing but
invalid frames is not kept for a resume; a session steps from its client's first valid event, or
once its probation is over, so garbage that comes and goes costs no model step at all."""

from __future__ import annotations

import asyncio
import contextlib
import time

from websockets.exceptions import ConnectionClosed

from tests.duplex.kind_server import Client, connect, duplex_server

INVALID = (  # (frame, the codec's error code)
    ("{not json", "invalid_json"),
    ('{"type": "nope"}', "invalid_value"),
    ('{"type": "session.heartbeat", "x": 1}', "unknown_parameter"),
    ("[1, 2]", "invalid_event"),
    ('{"type": "response.create"}', "unsupported_feature"),  # well-formed, but not a duplex event
)


async def _error_codes(c: Client, n: int) -> list[str]:
    return [(await c.until("error"))[-1]["error"]["code"] for _ in range(n)]


async def _released(service: object) -> bool:
    for _ in range(50):
        if len(service.manager) == 0 and service.engine.active_sessions == 0:
            return True
        await asyncio.sleep(0.02)
    return False


async def test_invalid_frames_in_a_row_close_1008_after_each_ones_typed_error(monkeypatch) -> None:
    async with duplex_server(monkeypatch, speak=lambda step: False) as (base, service, _):
        assert service.config.max_invalid_frames == 8  # the documented default
        async with connect(f"{base}/v1/duplex") as c:
            await c.next()
            for _ in range(3):  # seven invalid, then a valid event: the count starts again
                for frame, _code in INVALID[:4] + INVALID[2:]:
                    await c.ws.send(frame)
                assert len(await _error_codes(c, 7)) == 7
                await c.send(type="session.heartbeat")
                await c.until("session.heartbeat_ack")
            for _ in range(10):  # events the codec takes, answered with an error: not invalid
                await c.send(type="response.cancel")
            assert await _error_codes(c, 10) == ["response_cancel_not_active"] * 10
            frames = [INVALID[i % len(INVALID)] for i in range(8)]
            for frame, _code in frames:
                await c.ws.send(frame)
            codes = await _error_codes(c, 9)
            assert codes == [code for _, code in frames] + ["too_many_invalid_frames"]
            await c.ws.wait_closed()
            assert c.ws.close_code == 1008 and c.ws.close_reason == "8 invalid frames in a row"
        assert await _released(service), "the session ends with the socket, no resume grace"


async def test_a_socket_that_sent_only_invalid_frames_keeps_no_resume_grace(monkeypatch) -> None:
    """The grace stays for a client that sent a valid event, and for one that sent nothing."""
    async with duplex_server(monkeypatch, max_invalid_frames=0) as (base, service, _):
        async with connect(f"{base}/v1/duplex") as garbage:
            gone = await garbage.next()
            for frame, _code in INVALID * 2:  # no budget (0): only the drop is judged
                await garbage.ws.send(frame)
            assert len(await _error_codes(garbage, 10)) == 10
        assert await _released(service), "dropped after only invalid frames: released at once"
        async with connect(f"{base}/v1/duplex") as big:  # the transport refuses its first frame
            await big.next()
            with contextlib.suppress(ConnectionClosed):
                await big.ws.send(b"\0" * (service.config.max_message_bytes + 1))
            await big.ws.wait_closed()
            assert big.ws.close_code == 1009
        assert await _released(service), "a frame the transport refused is an invalid frame too"
        kept = []
        for valid in (True, False):
            async with connect(f"{base}/v1/duplex") as c:
                kept.append(await c.next())
                if valid:  # one valid event, then garbage: a client with a bug, kept for a resume
                    await c.send(type="session.heartbeat")
                    for frame, _code in INVALID:
                        await c.ws.send(frame)
                    await _error_codes(c, len(INVALID))
        await asyncio.sleep(0.3)
        assert len(service.manager) == 2, "both wait for a resume"
        async with connect(f"{base}/v1/duplex?autostart=0") as r:
            await r.send(
                type="session.resume", session_id=gone["session"]["id"], resume_token=gone["resume_token"]
            )
            expired = await r.next()
            assert expired["type"] == "session.expired" and expired["reason"] == "disconnect"
            for created in kept:
                session_id, token = created["session"]["id"], created["resume_token"]
                async with connect(f"{base}/v1/duplex?autostart=0") as again:
                    await again.send(type="session.resume", session_id=session_id, resume_token=token)
                    assert (await again.until("session.resumed"))[-1]["session_id"] == session_id


async def test_a_session_steps_from_its_first_valid_event_or_once_its_probation_is_over(monkeypatch) -> None:
    async with duplex_server(monkeypatch, speak=lambda step: False, probation_ms=400) as (
        base,
        service,
        stage,
    ):

        def steps(session_id: str) -> list[float]:
            return [t for t, sessions, _ in stage.batches if session_id in sessions]

        async with connect(f"{base}/v1/duplex") as garbage:
            gone = (await garbage.next())["session"]["id"]
            for frame, _code in INVALID[:3]:
                await garbage.ws.send(frame)
            await _error_codes(garbage, 3)
        assert await _released(service)
        async with connect(f"{base}/v1/duplex") as client:
            created = time.monotonic()
            proven = (await client.next())["session"]["id"]
            await client.start_clock()
            await asyncio.sleep(0.2)
            assert steps(proven) and steps(proven)[0] - created < 0.3, "a valid event starts the clock"
        opened = time.monotonic()
        async with connect(f"{base}/v1/duplex") as listener:  # sends nothing: the model speaks first
            quiet = (await listener.next())["session"]["id"]
            await asyncio.sleep(0.2)
            assert not steps(quiet), "still in its probation"
            for _ in range(100):
                if steps(quiet):
                    break
                await asyncio.sleep(0.02)
            assert steps(quiet) and steps(quiet)[0] - opened >= 0.4, "it steps once its probation is over"
        assert not steps(gone), "garbage that left within its probation cost no model step"
