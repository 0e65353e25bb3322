"""Voice session limits over loopback with the real SDK: the lifetime warning, expiry and idle close."""

from __future__ import annotations

import asyncio
import base64

import pytest
import websockets

from realtime.protocols.oai_realtime import Dialect
from tests.voice.realtime_client import connect, voice_server

pytestmark = [pytest.mark.timeout(120), pytest.mark.asyncio(loop_scope="session")]


@pytest.fixture(scope="module")
async def server():
    async with voice_server(
        max_lifetime_s=3, idle_timeout_s=1.5, runtime={"lifetime_warning_s": 2}
    ) as running:
        yield running


async def test_lifetime_warns_then_expires_with_openais_error_and_closes_1008(server):
    url, _ = server
    async with connect(url, Dialect.GA) as (conn, events):
        expires_at = events.seen[0]["session"]["expires_at"]

        async def keep_active() -> None:  # silence appends: active, so only the lifetime ends it
            while True:
                await conn.input_audio_buffer.append(audio=base64.b64encode(bytes(4800)).decode())
                await asyncio.sleep(0.3)

        activity = asyncio.create_task(keep_active())
        try:
            warning = (await events.until("error", timeout=10))[-1]["error"]
            assert warning["code"] == "session_expiring" and "in " in warning["message"]
            expired = (await events.until("error", timeout=10))[-1]["error"]
            assert expired["code"] == "session_expired"
            assert expired["message"] == "Your session hit the maximum duration of 1 minutes."
            after: list[bytes] = []  # the goodbye is the last word: nothing may follow it but the close
            with pytest.raises(websockets.ConnectionClosed) as closed:
                while True:
                    after.append(await asyncio.wait_for(conn.recv_bytes(), 10))
        finally:
            activity.cancel()
        assert after == []
        assert (
            closed.value.rcvd.code == 1008 and closed.value.rcvd.reason == "maximum session lifetime reached"
        )
        assert expires_at > 0


async def test_an_idle_session_is_closed_1008_naming_its_timeout(server):
    url, _ = server
    async with connect(url, Dialect.GA) as (conn, events):
        with pytest.raises(websockets.ConnectionClosed) as closed:
            while True:  # the lifetime warning (at 1 s) may come first
                event = await events.next(10)
                assert event["type"] == "conversation.created" or event["error"]["code"] == "session_expiring"
        rcvd = closed.value.rcvd
        assert rcvd.code == 1008 and rcvd.reason == "idle timeout: no request for 1.5 s"
