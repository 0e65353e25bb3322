"""Issue 26 defect 8: the resume grace must not lock new sessions out. A socket that drops keeps
its session for a resume, but a grace-held slot is the first one reclaimed when a new session
needs it; ``session.close`` (the protocol's clean close) ends the session at once."""

from __future__ import annotations

import asyncio

from tests.duplex.kind_server import connect, duplex_server


async def test_connect_and_drop_cycles_never_lock_new_sessions_out(monkeypatch) -> None:
    async with duplex_server(monkeypatch) as (base, service, _):
        capacity = service.manager.capacity
        created = []
        for _ in range(16):  # four times the capacity (4) of sockets that come and go
            async with connect(f"{base}/v1/duplex") as c:
                event = await c.next()
                assert event["type"] == "session.created", event  # never 1013 / session_limit_reached
                created.append(event)
        assert len(service.manager) == capacity  # the last ones wait for a resume, slots full
        async with connect(f"{base}/v1/duplex?autostart=0") as late:  # the oldest were reclaimed
            await late.send(
                type="session.resume",
                session_id=created[0]["session"]["id"],
                resume_token=created[0]["resume_token"],
            )
            expired = await late.next()
        assert expired["type"] == "session.expired" and expired["reason"] == "evicted"
        async with connect(f"{base}/v1/duplex?autostart=0") as recent:  # the newest still resumes
            await recent.send(
                type="session.resume",
                session_id=created[-1]["session"]["id"],
                resume_token=created[-1]["resume_token"],
            )
            assert (await recent.until("session.resumed"))[-1]["session_id"] == created[-1]["session"]["id"]


async def test_a_session_close_frees_its_slot_at_once(monkeypatch) -> None:
    async with duplex_server(monkeypatch) as (base, service, _):
        for _ in range(6):  # more than the capacity: each one's slot is free before the next
            async with connect(f"{base}/v1/duplex") as c:
                assert (await c.next())["type"] == "session.created"
                await c.send(type="session.close")
                await c.ws.wait_closed()
            for _ in range(50):
                if len(service.manager) == 0:
                    break
                await asyncio.sleep(0.02)
            assert len(service.manager) == 0, "a clean close keeps no grace"
