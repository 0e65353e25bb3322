"""A duplex session resumed on another replica keeps its model's context: the checkpoint holds the
token rows its KV was computed from, and the second in-process server (another replica tag, the
same store) rebuilds that KV before the session's first step there, over real websockets."""

from __future__ import annotations

import asyncio

import numpy as np
import torch

from models.duplex.context import TokenContext
from realtime.scale.resume import DuplexState, decode
from tests.duplex.kind_server import connect, duplex_server, loud
from tests.scale.test_resume import replica  # noqa: F401 - the fixture: replicas sharing one store


def stepping_slot(service: object) -> int:
    """The stage slot of the one session the server holds (the only one that stepped)."""
    (slot,) = np.flatnonzero(service.stage.steps)  # type: ignore[attr-defined]
    return int(slot)


async def test_a_duplex_session_resumed_on_another_replica_has_its_kv_rebuilt(monkeypatch, replica) -> None:  # noqa: F811
    store, tagged = replica
    tagged("aaa")
    async with duplex_server(monkeypatch) as (base, service, _):
        async with connect(f"{base}/v1/duplex") as c:
            created = await c.next()
            sid, token = created["session"]["id"], created["resume_token"]
            await c.start_clock()
            await c.append(loud(6))  # the user speaks: the user codes of those steps vary
            received = await c.during(0.6)
            for _ in range(10):  # a loaded box may step late: wait for the first frames (<= 5 s more)
                if received:
                    break
                received += await c.during(0.5)
            await asyncio.sleep(0.15)  # the last coalesced put lands
            lost = await store.get(sid)
            held = decode(lost)
            assert isinstance(held, DuplexState) and isinstance(held.model_context, TokenContext)
            steps = held.model_context.steps
            assert 6 < steps < service.stage.config.context, "unrolled: each column was written once"
            lived = service.stage.kv.kv[stepping_slot(service), ..., :steps, :].clone()
    await asyncio.sleep(0.2)  # the shutdown's own deletes land first
    store.table.put(lost)  # as if replica aaa had died instead of shutting down
    tagged("bbb")
    async with duplex_server(monkeypatch) as (base, service, _):
        async with connect(f"{base}/v1/duplex?autostart=0&session_id={sid}") as r:
            cursor = received[-1]["server_event_seq"]
            await r.send(
                type="session.resume",
                session_id=sid,
                resume_token=token,
                last_received_server_event_seq=cursor,
            )
            await r.until("session.resumed")
            await r.during(0.3)
            slot = stepping_slot(service)
            assert service.stage.steps[slot] > steps, "the stream went on from the restored position"
            rebuilt = service.stage.kv.kv[slot, ..., :steps, :]
            torch.testing.assert_close(rebuilt, lived, rtol=1e-4, atol=1e-5)
            await asyncio.sleep(0.15)
            again = decode(await store.get(sid)).model_context
    assert again.steps > steps, "the new replica's checkpoints go on from the restored context"
    np.testing.assert_array_equal(again.inputs[:steps], held.model_context.inputs)
