"""Barge-in and the playback ledger over real websockets (tests/duplex/kind_server.py)."""

from __future__ import annotations

from tests.duplex.kind_server import always, connect, duplex_server, loud


async def test_barge_in_advances_the_epoch_and_no_old_epoch_audio_follows(monkeypatch) -> None:
    async with (
        duplex_server(monkeypatch, speak=always) as (base, service, _),
        connect(f"{base}/v1/duplex") as c,
    ):
        await c.until("response.output_audio.delta")
        await c.until("response.output_audio.delta")  # the model is speaking, epoch 0
        await c.append(loud(3))  # 240 ms of speech: over barge_in_ms (160)
        before = await c.until("response.done")
        done = before[-1]
        assert done["response"]["status"] == "cancelled"
        assert done["response"]["status_details"]["reason"] == "turn_detected"
        assert done["epoch"] == 1
        assert "input_audio_buffer.speech_started" in [e["type"] for e in before]
        after = await c.during(0.8)
        assert after[0]["type"] == "response.listen"
        assert not [e for e in after if e["type"].startswith("response.output_audio") and e["epoch"] == 0]
        # the model never chose to listen: it stays muted (a new response needs listen -> speak)
        assert not [e for e in after if e["type"] == "response.output_audio.delta"]
        sid = next(iter(service.sessions))
        assert service.engine.epoch(sid) == 1 and service.sessions[sid].epoch == 1


async def test_response_cancel_is_a_client_barge_in(monkeypatch) -> None:
    async with duplex_server(monkeypatch, speak=always) as (base, _, _), connect(f"{base}/v1/duplex") as c:
        await c.until("response.output_audio.delta")
        await c.send(type="response.cancel")
        done = (await c.until("response.done"))[-1]
        assert done["response"]["status_details"]["reason"] == "client_cancelled" and done["epoch"] == 1
        assert not [e for e in await c.during(0.5) if e["type"] == "response.output_audio.delta"]


async def test_playback_ack_commits_history_only_up_to_what_was_played(monkeypatch) -> None:
    speak = lambda step: 2 <= step < 8  # noqa: E731  (one 480 ms response)
    async with duplex_server(monkeypatch, speak=speak) as (base, _, _), connect(f"{base}/v1/duplex") as c:
        events = await c.until("response.done")
        done = events[-1]
        item_id = done["response"]["output"][0]["id"]
        response_id = done["response"]["id"]
        assert done["response"]["output"][0]["content"][0]["transcript"] == "w2 w3 w4 w5 w6 w7 "
        await c.send(type="conversation.item.retrieve", item_id=item_id)
        retrieved = (await c.until("conversation.item.retrieved"))[-1]
        assert retrieved["item"]["content"][0]["transcript"] == ""  # nothing played yet (ack_only)
        await c.send(type="playback.ack", response_id=response_id, played_ms=200)
        ack = (await c.until("playback.acknowledged"))[-1]
        assert (ack["played_ms"], ack["generated_ms"], ack["committed_ms"]) == (200, 480, 200)
        assert ack["history_committed"] == "w2 w3 w4 "  # pieces at 0, 80 and 160 ms
        await c.send(type="conversation.item.retrieve", item_id=item_id)
        retrieved = (await c.until("conversation.item.retrieved"))[-1]
        assert retrieved["item"]["content"][0]["transcript"] == "w2 w3 w4 "
        await c.send(type="playback.ack", response_id=response_id, played_ms=10_000)  # capped
        assert (await c.until("playback.acknowledged"))[-1]["committed_ms"] == 480
