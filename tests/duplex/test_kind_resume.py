"""Resume, replacement and expiry of duplex sessions over real websockets; a stalled client."""

from __future__ import annotations

import asyncio
import io
import json

import av

from models.duplex.stage import FRAME_SAMPLES, SAMPLE_RATE
from realtime.kinds import duplex as duplex_kind
from tests.duplex.kind_server import always, audio_steps, connect, duplex_server


async def test_resume_replays_missed_events_exactly_once_and_rejects_a_wrong_token(monkeypatch) -> None:
    async with duplex_server(monkeypatch, speak=always) as (base, service, _):
        async with connect(f"{base}/v1/duplex") as c:
            created = await c.next()
            sid, token = created["session"]["id"], created["resume_token"]
            received = [created, *(await c.until("response.output_audio.delta")), await c.next()]
        last = received[-1]["server_event_seq"]
        await asyncio.sleep(0.5)  # the session goes on stepping while detached
        ds = service.sessions[sid]
        assert ds.attachment is None
        seq_detached, waiting = ds.journal.last_seq, len(ds.inbox)
        await asyncio.sleep(0.3)
        assert ds.journal.last_seq == seq_detached, (
            "nobody owns a detached session: the clock changes nothing"
        )
        assert len(ds.inbox) >= waiting + 2, "its outputs wait for the owner a resume makes"
        async with connect(f"{base}/v1/duplex?autostart=0") as r:
            await r.send(
                type="session.resume",
                session_id=sid,
                resume_token="wrong",
                last_received_server_event_seq=last,
            )
            assert (await r.next())["error"]["code"] == "invalid_resume_token"
            await r.send(
                type="session.resume", session_id=sid, resume_token=token, last_received_server_event_seq=last
            )
            replay = await r.until("session.resumed")
            resumed = replay[-1]
            live = [await r.next() for _ in range(6)]
        seqs = [e["server_event_seq"] for e in replay + live]
        assert seqs == list(range(last + 1, last + 1 + len(seqs))), "each event once, none missing"
        assert resumed["replayed"] == len(replay) - 1 >= 5 and resumed["resume_token"] != token
        steps = audio_steps(received + replay + live)
        assert steps == list(range(steps[0], steps[0] + len(steps))), "the audio continues where it stopped"
        async with connect(f"{base}/v1/duplex?autostart=0") as again:  # the old token is rotated away
            await again.send(type="session.resume", session_id=sid, resume_token=token)
            assert (await again.next())["error"]["code"] == "invalid_resume_token"


async def test_an_ogg_opus_resume_gets_the_detached_time_audio_once_as_a_new_stream(monkeypatch) -> None:
    """Audio sent live as binary is not journaled; the steps of the detached time were never sent,
    so the resumed socket gets them before ``session.resumed``: their JSON events with their seqs,
    their audio as a new Ogg/Opus stream (header pages first)."""
    async with duplex_server(monkeypatch, speak=always) as (base, service, _):
        url = f"{base}/v1/duplex?audio_format=ogg_opus"
        async with connect(url) as c:
            created = json.loads(await c.ws.recv())
            last, transcripts = created["server_event_seq"], 0
            while transcripts < 2:
                frame = await asyncio.wait_for(c.ws.recv(), 10)
                if isinstance(frame, str):
                    event = json.loads(frame)
                    last = event["server_event_seq"]
                    transcripts += event["type"] == "response.output_audio_transcript.delta"
        sid = created["session"]["id"]
        await asyncio.sleep(0.6)
        ds = service.sessions[sid]
        journaled_at_detach = ds.journal.last_seq
        async with connect(url + "&autostart=0") as r:
            await r.send(
                type="session.resume",
                session_id=sid,
                resume_token=created["resume_token"],
                last_received_server_event_seq=last,
            )
            stream, events = b"", []
            while not events or events[-1]["type"] != "session.resumed":
                frame = await asyncio.wait_for(r.ws.recv(), 10)
                if isinstance(frame, bytes):
                    stream += frame
                else:
                    events.append(json.loads(frame))
        seqs = [e["server_event_seq"] for e in events]
        assert seqs == list(range(last + 1, last + 1 + len(seqs))), "each JSON event once, none missing"
        assert not [e for e in events if e["type"] == "response.output_audio.delta"], "audio stays binary"
        detached = [e for e in events if e["server_event_seq"] > journaled_at_detach]
        frames = len(audio_steps(detached))  # one transcript piece per speaking step (the script)
        assert frames >= 5, "0.6 s of steps while detached"
        assert stream.startswith(b"OggS") and b"OpusHead" in stream[:100], "a new Ogg stream"
        with av.open(io.BytesIO(stream)) as container:
            rate = container.streams.audio[0].rate
            samples = sum(f.samples for f in container.decode(audio=0)) * SAMPLE_RATE // rate
        assert abs(samples - frames * FRAME_SAMPLES) <= FRAME_SAMPLES // 2, (samples, frames)


async def test_event_ack_frees_the_journal_up_to_the_acked_seq(monkeypatch) -> None:
    async with duplex_server(monkeypatch, speak=always) as (base, service, _):
        async with connect(f"{base}/v1/duplex") as c:
            created = await c.next()
            sid = created["session"]["id"]
            acked = (await c.until("response.output_audio_transcript.delta"))[-1]["server_event_seq"]
            await c.send(type="session.event_ack", server_event_seq=acked)
            await c.send(type="session.event_ack", server_event_seq=acked + 10_000)
            error = [e for e in await c.until("error") if e["type"] == "error"][-1]
            assert error["error"]["code"] == "invalid_value" and error["error"]["param"] == "server_event_seq"
            assert service.sessions[sid].journal.first_available() > acked
        async with connect(f"{base}/v1/duplex?autostart=0") as r:
            await r.send(
                type="session.resume",
                session_id=sid,
                resume_token=created["resume_token"],
                last_received_server_event_seq=acked - 1,
            )
            replay = await r.until("session.resumed")
        resync = [e for e in replay if e["type"] == "session.resync_required"]
        assert resync and resync[0]["reason"] == "journal_gap" and resync[0]["first_available_seq"] > acked


async def test_a_resume_replaces_the_socket_still_attached(monkeypatch) -> None:
    async with duplex_server(monkeypatch, speak=lambda step: False) as (base, service, _):
        async with connect(f"{base}/v1/duplex") as first:
            created = await first.next()
            sid = created["session"]["id"]
            async with connect(f"{base}/v1/duplex?autostart=0") as second:
                await second.send(type="session.resume", session_id=sid, resume_token=created["resume_token"])
                assert (await second.until("session.resumed"))[-1]["session_id"] == sid
                replaced = await first.until("session.replaced")
                assert replaced[-1]["session_id"] == sid
                await first.ws.wait_closed()
                assert first.ws.close_code == 1008
                await second.send(type="session.heartbeat")
                await second.until("session.heartbeat_ack")
                assert service.sessions[sid].attachment.conn is not None and len(service.manager) == 1


async def test_a_detached_session_expires_after_the_grace_period(monkeypatch) -> None:
    async with duplex_server(monkeypatch, resume_grace_s=0.3) as (base, service, _):
        async with connect(f"{base}/v1/duplex") as c:
            created = await c.next()
        sid = created["session"]["id"]
        await asyncio.sleep(1.0)
        assert len(service.manager) == 0 and service.engine.active_sessions == 0 and not service.sessions
        async with connect(f"{base}/v1/duplex?autostart=0") as r:
            await r.send(type="session.resume", session_id=sid, resume_token=created["resume_token"])
            expired = await r.next()
        assert expired["type"] == "session.expired" and expired["reason"] == "disconnect_grace_expired"


async def test_a_detached_session_whose_step_inbox_fills_is_released(monkeypatch) -> None:
    monkeypatch.setattr(duplex_kind.DuplexService, "max_unapplied_steps", lambda self: 4)
    async with duplex_server(monkeypatch, speak=always) as (base, service, _):
        async with connect(f"{base}/v1/duplex") as c:
            created = await c.next()
            await c.start_clock()  # stepping now, not after the probation
        await asyncio.sleep(1.0)  # 12 steps: over the inbox's 4 long before the 30 s grace
        assert len(service.manager) == 0 and not service.sessions
        async with connect(f"{base}/v1/duplex?autostart=0") as r:
            await r.send(
                type="session.resume",
                session_id=created["session"]["id"],
                resume_token=created["resume_token"],
            )
            expired = await r.next()
        assert expired["type"] == "session.expired" and expired["reason"] == "step_inbox_full"


async def test_a_client_close_ends_the_session_at_once(monkeypatch) -> None:
    async with duplex_server(monkeypatch) as (base, service, _), connect(f"{base}/v1/duplex") as c:
        await c.next()
        await c.send(type="session.close")
        await c.ws.wait_closed()
        assert c.ws.close_code == 1000
        await asyncio.sleep(0.1)
        assert len(service.manager) == 0 and service.engine.active_sessions == 0


async def test_a_stalled_client_does_not_delay_the_other_sessions_frames(monkeypatch) -> None:
    """The stalled socket's sends never complete (a client that stopped reading, once the kernel
    buffers are full); the clock goes on stepping all sessions and the readers get every frame."""
    async with duplex_server(monkeypatch, speak=always, server={"max_send_wait_s": 1.0}) as (
        base,
        service,
        stage,
    ):
        async with connect(f"{base}/v1/duplex") as s, connect(f"{base}/v1/duplex") as a:
            async with connect(f"{base}/v1/duplex") as b:
                stalled_id = (await s.next())["session"]["id"]
                await a.next()
                await b.next()
                for client in (s, a, b):
                    await client.start_clock()

                async def never(_frame: object) -> None:
                    await asyncio.Event().wait()

                service.sessions[stalled_id].attachment.conn.ws.send_text = never
                start = len(stage.batches)
                got = await asyncio.gather(a.during(2.5), b.during(2.5))
                during = stage.batches[start:]
                assert stalled_id not in service.sessions, "the stalled connection ended (send timeout)"
                assert len(service.manager) == 2
        with_stalled = [stalled_id in sessions for _, sessions, _ in during]
        assert with_stalled[0] and with_stalled == sorted(
            with_stalled, reverse=True
        )  # stepped until it ended
        assert sum(with_stalled) >= 10, "it stepped on (its queue filling) while its socket was stuck"
        assert all(len(sessions) >= 2 for _, sessions, _ in during)
        for events in got:  # every step's frame reached the readers, in order, through the stall
            steps = audio_steps(events)
            assert steps == list(range(steps[0], steps[0] + len(steps)))
            assert len(steps) >= len(during) - 2
