"""``realtime serve --replicas 2`` on a local Ray instance over loopback (``conftest.cluster``):
unmodified clients of every kind spread across both replicas, a reconnect naming its session
reaches the replica that owns it, a full replica sends new sessions to the other, one view of
the cluster, and losing a replica fails only its sessions, with close 1012. The tests run in
this order on one cluster; the last one kills a replica."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from asyncio.subprocess import PIPE

import httpx
import pytest
import websockets
from openai import AsyncOpenAI
from openpi_client.websocket_client_policy import WebsocketClientPolicy

from clients.world_client import WorldClient
from models.world.configs import CONFIGS
from realtime.bench import examples
from realtime.scale.proxy import LOST_CODE, LOST_REASON
from sessions.identities import session_replica_tag
from tests.scale.conftest import CONFIG

pytestmark = pytest.mark.timeout(600)
KINDS = ("robot", "world", "voice", "duplex")


async def duplex(cluster, query: str = "") -> tuple[websockets.ClientConnection, dict]:
    ws = await websockets.connect(f"{cluster.ws}/v1/duplex{query}", max_size=None)
    return ws, json.loads(await ws.recv())


async def world_session(cluster, query: str = "") -> str:
    """A world session started and left (the project's protocol, as ``WorldClient`` speaks it)."""
    url = f"{cluster.ws}/v1/realtime/world?protocol_version=1{query}"
    async with websockets.connect(url) as ws:
        await ws.send(json.dumps({"type": "session.start", "prompt": "stone", "pacing": "fast"}))
        return (await until(ws, "session.created"))["session_id"]


async def until(ws, *types: str) -> dict:
    while True:
        event = json.loads(await asyncio.wait_for(ws.recv(), 30))
        if event["type"] in types:
            return event


def no_duplex_sessions(cluster) -> bool:
    return sum(cluster.occupied("duplex").values()) == 0


async def test_one_view_of_both_replicas(cluster):
    status = cluster.status()
    replicas = status["replicas"]
    assert len(replicas) == 2 and all(r["reachable"] and r["ready"] for r in replicas)
    assert status["ready"] is True and {k["kind"] for k in status["kinds"]} == set(KINDS)
    for kind in status["kinds"]:  # summed: each replica's capacity counts
        assert kind["capacity"] == sum(
            next(k["capacity"] for k in r["kinds"] if k["kind"] == kind["kind"]) for r in replicas
        )
    duplex_total = next(k for k in status["kinds"] if k["kind"] == "duplex")
    assert duplex_total["capacity"] == 4 and duplex_total["free"] == 4
    tags = sorted(r["replica"] for r in replicas)
    models = httpx.get(f"{cluster.url}/v1/models").json()
    assert all(sorted(m["replicas"]) == tags for m in models["data"])
    metrics = httpx.get(f"{cluster.url}/metrics").text
    for tag in tags:
        assert f'realtime_replica_up{{replica="{tag}"}} 1.0' in metrics
        assert f'realtime_ready{{replica="{tag}"}} 1.0' in metrics
    assert httpx.get(f"{cluster.url}/readyz").status_code == 200


async def test_unmodified_clients_of_every_kind_spread_across_both_replicas(cluster):
    async with contextlib.AsyncExitStack() as stack:
        robots = [await asyncio.to_thread(WebsocketClientPolicy, cluster.ws) for _ in range(2)]
        for robot in robots:
            stack.callback(robot._ws.close)  # openpi-client 0.1.2 has no close of its own
            actions = (await asyncio.to_thread(robot.infer, examples.libero()))["actions"]
            assert actions.ndim == 2 and actions.shape[0] == 50  # an action chunk
        worlds = [
            await stack.enter_async_context(
                WorldClient.connect(cluster.ws, prompt="stone", seed=i, pacing="fast")
            )
            for i in range(2)
        ]
        for world in worlds:
            assert session_replica_tag(world.session_id) is not None
            chunk = await asyncio.wait_for(anext(world.frames()), 60)
            assert chunk.frames and chunk.metadata["chunk_index"] == 0
        openai = AsyncOpenAI(websocket_base_url=f"{cluster.ws}/v1", api_key="unused")
        for _ in range(2):
            conn = await stack.enter_async_context(openai.realtime.connect(model="gpt-realtime"))
            event = await asyncio.wait_for(conn.recv(), 30)
            assert event.type == "session.created"
        for _ in range(2):
            ws, created = await duplex(cluster)
            stack.push_async_callback(ws.close)
            assert created["type"] == "session.created"
        occupied = {kind: cluster.occupied(kind) for kind in KINDS}
        assert all(sorted(per_replica.values()) == [1, 1] for per_replica in occupied.values()), occupied
        # each websocket went through the ingress to its replica's own server, not Serve's proxy
        replicas = cluster.status()["replicas"]
        assert all(r["address"] for r in replicas), replicas
        assert "relayed through Serve's proxy" not in cluster.log.read_text(errors="replace")
    cluster.wait_for(lambda: no_duplex_sessions(cluster), 30, "duplex sessions released after their grace")


async def test_a_reconnect_naming_its_session_reaches_the_replica_that_owns_it(cluster):
    sessions = []
    for _ in range(2):  # one per replica
        ws, created = await duplex(cluster)
        sessions.append((created["session"]["id"], created["resume_token"]))
        await ws.close()
    assert {session_replica_tag(sid) for sid, _ in sessions} == set(cluster.occupied("duplex"))
    for sid, token in sessions:
        ws = await websockets.connect(f"{cluster.ws}/v1/duplex?autostart=0&session_id={sid}")
        await ws.send(json.dumps({"type": "session.resume", "session_id": sid, "resume_token": token}))
        resumed = await until(ws, "session.resumed", "error")
        assert resumed["type"] == "session.resumed" and resumed["session_id"] == sid, resumed
        await ws.close()
    for _ in range(3):  # a world socket naming a world session is placed on that session's replica
        owned = await world_session(cluster)
        again = await world_session(cluster, f"&session_id={owned}")
        assert session_replica_tag(again) == session_replica_tag(owned)
    cluster.wait_for(lambda: no_duplex_sessions(cluster), 30, "duplex sessions released")


async def test_an_in_band_resume_on_the_wrong_replica_names_the_fix(cluster):
    ws, created = await duplex(cluster)
    sid, token = created["session"]["id"], created["resume_token"]
    await ws.close()
    for _ in range(6):  # an unnamed socket goes to the least loaded replica: the other one
        other = await websockets.connect(f"{cluster.ws}/v1/duplex?autostart=0")
        await other.send(json.dumps({"type": "session.resume", "session_id": sid, "resume_token": token}))
        answer = await until(other, "session.resumed", "error")
        await other.close()
        if answer["type"] == "error":
            break
        token = answer["resume_token"]  # it happened to reach the owner: try again
    assert answer["error"]["code"] == "session_not_found" and "?session_id=" in answer["error"]["message"]
    cluster.wait_for(lambda: no_duplex_sessions(cluster), 30, "duplex sessions released")


async def test_a_full_replica_sends_new_sessions_to_the_other_and_a_full_cluster_says_so(cluster):
    # /v1/status asks the replicas now; the routers' reports lag by up to two stats periods, and a
    # report still holding an earlier test's sessions would make a free replica look full
    await asyncio.sleep(2 * CONFIG["replicas"]["stats_period_s"])
    async with contextlib.AsyncExitStack() as stack:
        ws, first = await duplex(cluster)
        stack.push_async_callback(ws.close)
        full = session_replica_tag(first["session"]["id"])
        # a socket naming a session goes to that session's replica: it fills that one (2 of 2)
        ws, second = await duplex(cluster, f"?session_id={first['session']['id']}")
        stack.push_async_callback(ws.close)
        assert session_replica_tag(second["session"]["id"]) == full
        for _ in range(2):  # new sessions: the other replica, until it is full too
            ws, created = await duplex(cluster)
            stack.push_async_callback(ws.close)
            assert created["type"] == "session.created", created
            assert session_replica_tag(created["session"]["id"]) != full
        ws, refused = await duplex(cluster)
        stack.push_async_callback(ws.close)
        assert refused["type"] == "error" and refused["error"]["code"] == "session_limit_reached"
        assert sorted(cluster.occupied("duplex").values()) == [2, 2]
    cluster.wait_for(lambda: no_duplex_sessions(cluster), 30, "duplex sessions released")


async def watch(ws) -> tuple[int | None, str | None]:
    with contextlib.suppress(websockets.ConnectionClosed):
        while True:
            await ws.recv()
    return ws.close_code, ws.close_reason


async def events_after(ws, seconds: float) -> list[dict]:
    """The duplex events that arrive within ``seconds`` (the model never goes quiet)."""
    out = []
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            while True:
                out.append(json.loads(await ws.recv()))
    return out


async def resume_duplex(cluster, sid: str, token: str, cursor: int) -> tuple[dict, list[dict]]:
    """Reconnect naming ``sid`` and resume from ``cursor``: (``session.resumed``, the replay)."""
    ws = await websockets.connect(f"{cluster.ws}/v1/duplex?autostart=0&session_id={sid}")
    await ws.send(
        json.dumps(
            {
                "type": "session.resume",
                "session_id": sid,
                "resume_token": token,
                "last_received_server_event_seq": cursor,
            }
        )
    )
    replay = []
    while (event := json.loads(await asyncio.wait_for(ws.recv(), 30)))["type"] not in (
        "session.resumed",
        "error",
    ):
        replay.append(event)
    await ws.close()
    return event, replay


async def one_per_replica(open_one, name_of, close) -> list:
    """Open sessions until each replica holds one of them (a cold cluster's routers may not have
    both replicas' routing stats yet: a repeat lands on the same replica, is closed, retried)."""
    held: dict[str, object] = {}
    for _ in range(20):
        opened = await open_one()
        tag = session_replica_tag(name_of(opened))
        if tag in held:
            await close(opened)
            await asyncio.sleep(0.5)
        else:
            held[tag] = opened
        if len(held) == 2:
            return list(held.values())
    raise AssertionError("new sessions never reached both replicas")


async def duplex_per_replica(cluster) -> list[tuple[websockets.ClientConnection, str, str]]:
    async def open_one():  # noqa: ANN202
        ws, created = await duplex(cluster)
        return ws, created["session"]["id"], created["resume_token"]

    async def close(opened) -> None:  # noqa: ANN001 - released at once: no resume grace held
        await opened[0].send(json.dumps({"type": "session.close"}))
        await opened[0].close()

    return await one_per_replica(open_one, lambda o: o[1], close)


async def world_chunk(ws) -> dict:
    """The next chunk's metadata of a world socket (its media frames skipped)."""
    while True:
        message = await asyncio.wait_for(ws.recv(), 30)
        if isinstance(message, str) and json.loads(message)["type"] == "chunk.metadata":
            return json.loads(message)


async def world_per_replica(cluster) -> list[tuple[websockets.ClientConnection, str, int]]:
    """A playing world session on each replica: (its socket, its id, the last chunk index read)."""

    async def open_one():  # noqa: ANN202
        ws = await websockets.connect(f"{cluster.ws}/v1/realtime/world?protocol_version=1")
        await ws.send(
            json.dumps({"type": "session.start", "prompt": "stone", "seed": 4, "pacing": "realtime"})
        )
        return ws, (await until(ws, "session.created"))["session_id"]

    async def close(opened) -> None:  # noqa: ANN001
        await opened[0].close()

    worlds = await one_per_replica(open_one, lambda o: o[1], close)
    return [(ws, sid, [await world_chunk(ws) for _ in range(3)][-1]["chunk_index"]) for ws, sid in worlds]


async def voice_with_an_item(openai: AsyncOpenAI, stack: contextlib.AsyncExitStack, text: str) -> tuple:
    """A voice session (the unmodified OpenAI client) holding one user item saying ``text``:
    (its id, the connection, the connection's event iterator). The SDK reconnects by itself on
    1012 while it is iterated; its ``on_reconnecting`` hook names the session in the next
    attempt's query, which makes the reconnect a resume (docs/scaling.md)."""
    named: dict[str, str] = {}
    conn = await stack.enter_async_context(
        openai.realtime.connect(
            model="gpt-realtime",
            on_reconnecting=lambda event: {"extra_query": {**event.extra_query, "session_id": named["id"]}},
            initial_delay=0.05,
            max_delay=0.5,
        )
    )
    events = aiter(conn)
    created = await asyncio.wait_for(anext(events), 30)
    named["id"] = created.session.id
    await conn.conversation.item.create(
        item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    )
    while (await asyncio.wait_for(anext(events), 30)).type != "conversation.item.done":
        pass
    return created.session.id, conn, events


async def test_losing_a_replica_fails_only_its_sessions_with_1012_and_they_resume_on_the_other(cluster):
    sockets = await duplex_per_replica(cluster)  # each holds 2: the survivor has room for the lost one
    worlds = await world_per_replica(cluster)
    robots = [await asyncio.to_thread(WebsocketClientPolicy, cluster.ws) for _ in range(2)]
    openai = AsyncOpenAI(websocket_base_url=f"{cluster.ws}/v1", api_key="unused")
    async with contextlib.AsyncExitStack() as voices:

        async def open_voice():  # noqa: ANN202
            stack = await voices.enter_async_context(contextlib.AsyncExitStack())
            return stack, *await voice_with_an_item(openai, stack, "remember this")

        spoken = {
            sid: events
            for _, sid, _, events in await one_per_replica(
                open_voice, lambda o: o[1], lambda o: o[0].aclose()
            )
        }
        cursors = {}
        for ws, sid, _ in sockets:  # what each client holds when its replica dies
            cursors[sid] = max(e["server_event_seq"] for e in await events_after(ws, 0.3))
        await asyncio.sleep(0.5)  # > replicas.checkpoint_interval_s: the newest state is stored
        victim = cluster.status()["replicas"][0]
        watchers = {sid: asyncio.create_task(watch(ws)) for ws, sid, _ in [*sockets, *worlds]}
        os.kill(victim["pid"], signal.SIGKILL)
        lost = [(sid, token) for _, sid, token in sockets if session_replica_tag(sid) == victim["replica"]]
        kept = [sid for _, sid, _ in sockets if session_replica_tag(sid) != victim["replica"]]
        assert len(lost) == len(kept) == 1
        for sid, _ in lost:
            assert await asyncio.wait_for(watchers[sid], 30) == (LOST_CODE, LOST_REASON)
        # the lost voice session: the SDK's own reconnect, naming it, gets its id and conversation back
        lost_voice = next(sid for sid in spoken if session_replica_tag(sid) == victim["replica"])
        events = spoken[lost_voice]
        created = await asyncio.wait_for(anext(events), 30)
        assert created.type == "session.created" and created.session.id == lost_voice
        replayed = [await asyncio.wait_for(anext(events), 30) for _ in range(3)]
        items = [e.item for e in replayed if e.type == "conversation.item.done"]
        assert [i.content[0].text for i in items] == ["remember this"], replayed
    # the lost world session goes on on the other replica after the chunks it sent, its model state
    # rebuilt from the blocks it held (a later block's frames: the decoder's cache goes on too)
    (lost_world, read) = next(
        (sid, read) for _, sid, read in worlds if session_replica_tag(sid) == victim["replica"]
    )
    assert await asyncio.wait_for(watchers[lost_world], 30) == (LOST_CODE, LOST_REASON)
    url = f"{cluster.ws}/v1/realtime/world?protocol_version=1&session_id={lost_world}"
    async with websockets.connect(url) as ws:
        await ws.send(json.dumps({"type": "session.start", "prompt": "sand", "pacing": "fast"}))
        assert (await until(ws, "session.created"))["session_id"] == lost_world
        first = await world_chunk(ws)
        assert first["chunk_index"] > read and first["first_frame_index"] == 0
        assert first["frame_count"] == CONFIGS[CONFIG["world"]["model"]].frames_for_block(False)
    # each lost duplex session resumes on the other replica: same id, its journal replayed
    # from the client's cursor (what the client had read before the last checkpoint)
    for sid, token in lost:
        resumed, replay = await resume_duplex(cluster, sid, token, cursors[sid])
        assert resumed["type"] == "session.resumed" and resumed["session_id"] == sid, resumed
        seqs = [e["server_event_seq"] for e in replay]
        assert seqs == list(range(cursors[sid] + 1, cursors[sid] + 1 + len(seqs)))
    assert sorted(cluster.occupied("duplex").values())[-1] == 2, "the lost session lives on the other"
    kept_world = next(sid for _, sid, _ in worlds if sid != lost_world)
    assert not any(watchers[sid].done() for sid in [*kept, kept_world]), "the other replica's sessions go on"
    served = 0
    for robot in robots:  # one robot was on the lost replica; its socket is closed
        with contextlib.suppress(Exception):
            await asyncio.to_thread(robot.infer, examples.libero())
            served += 1
    assert served == 1
    # a session the lost replica never checkpointed fails fast and typed
    unknown = f"duplex-{victim['replica']}.0000000000000000"
    ws = await websockets.connect(f"{cluster.ws}/v1/duplex?autostart=0&session_id={unknown}")
    assert await asyncio.wait_for(watch(ws), 30) == (
        1008,
        f"session_not_found: {unknown} (its replica is gone)",
    )
    for ws, _, _ in [*sockets, *worlds]:
        await ws.close()
    for robot in robots:
        with contextlib.suppress(Exception):
            robot._ws.close()
    # Serve replaces the replica; the view shows two ready replicas again, one of them new
    cluster.wait_for(
        lambda: sum(1 for r in cluster.status()["replicas"] if r.get("ready")) == 2,
        300,
        "a replacement replica",
    )
    assert victim["replica"] not in {r["replica"] for r in cluster.status()["replicas"]}
    cluster.wait_for(lambda: no_duplex_sessions(cluster), 30, "duplex sessions released")


async def test_draining_a_replica_moves_its_sessions_to_the_other(cluster):
    sockets = await duplex_per_replica(cluster)
    cursors = {sid: max(e["server_event_seq"] for e in await events_after(ws, 0.3)) for ws, sid, _ in sockets}
    (ws, sid, token), (other_ws, other, _) = sockets
    tag = session_replica_tag(sid)
    watchers = {s: asyncio.create_task(watch(w)) for w, s, _ in sockets}
    drain = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "realtime.cli", "drain", tag, stdout=PIPE, stderr=PIPE
    )
    out, err = await asyncio.wait_for(drain.communicate(), 120)
    assert drain.returncode == 0, err.decode()[-2000:]
    counts = json.loads(out.decode().splitlines()[-1])
    assert (
        counts["replica"] == tag and counts["closed"] >= 1 and counts["aborted"] == counts["undrained"] == 0
    )
    code, reason = await asyncio.wait_for(watchers[sid], 30)
    assert code == 1012 and "reconnect to resume" in reason
    assert not watchers[other].done(), "the other replica's session goes on"
    resumed, replay = await resume_duplex(cluster, sid, token, cursors[sid])
    assert resumed["type"] == "session.resumed" and resumed["session_id"] == sid, resumed
    assert [e["server_event_seq"] for e in replay] == list(
        range(cursors[sid] + 1, cursors[sid] + 1 + len(replay))
    )
    drained = next(r for r in cluster.status()["replicas"] if r["replica"] == tag)
    assert drained["draining"] and not drained["ready"]
    assert cluster.occupied("duplex")[session_replica_tag(other)] == 2, "both live on the other replica"
    await other_ws.close()
