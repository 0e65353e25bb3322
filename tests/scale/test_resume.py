"""Resume across replicas without Ray: each kind's state round trip, the checkpointer's coalescing
and release, the session check handing a gone replica's checkpoint to the app, and a duplex
session resumed on a second in-process server (another replica tag) from the first one's
checkpoints, over real websockets. The store is the real table (``CheckpointTable``) behind the
async API the Ray actor serves."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
import websockets
from starlette.middleware import Middleware

from models.world.model import resident_blocks
from realtime import server as server_module
from realtime.app import create_app
from realtime.config import config_from_mapping
from realtime.protocols import world as world_proto
from realtime.protocols.duplex.journal import Journal
from realtime.protocols.oai_realtime.conversation import Conversation
from realtime.protocols.oai_realtime.items import InputText, Message, OutputText
from realtime.protocols.oai_realtime.session_config import SessionConfig
from realtime.scale.resume import (
    CHECKPOINT_SCOPE_KEY,
    Checkpoint,
    Checkpointer,
    CheckpointTable,
    DuplexState,
    RobotState,
    VoiceState,
    WorldState,
    decode,
    encode,
)
from realtime.scale.session_check import SessionCheck
from sessions import identities
from sessions.events import ControlInput
from tests.duplex.kind_server import always, connect, duplex_server
from tests.serving import serve_in_process


class MemoryStore:
    """The checkpoint store's API over the real table, in this process; counts its calls."""

    def __init__(self) -> None:
        self.table = CheckpointTable(max_bytes=1 << 20, max_total_bytes=1 << 24, ttl_s=60)
        self.puts: list[Checkpoint] = []
        self.deletes: list[str] = []

    async def put(self, checkpoint: Checkpoint) -> bool:
        await asyncio.sleep(0.01)  # a network hop: a put is in flight for a while
        self.puts.append(checkpoint)
        return self.table.put(checkpoint)

    async def get(self, session_id: str) -> Checkpoint | None:
        return self.table.get(session_id)

    async def delete(self, session_id: str) -> None:
        self.deletes.append(session_id)
        self.table.delete(session_id)

    async def stats(self) -> dict[str, int]:
        return self.table.stats()


def round_trip(state: object) -> object:
    return decode(Checkpoint("s", "k", 1, encode(state)))


def test_each_kinds_state_round_trips():
    items = (
        (Message("item_1", "user", (InputText("hello"),)), 0),
        (Message("item_2", "assistant", (OutputText("hi there"),)), 640),
    )
    voice = VoiceState(SessionConfig(model="m", instructions="be brief"), items)
    assert round_trip(voice) == voice

    journal = Journal(max_events=100, max_bytes=1 << 16)
    for n in range(5):
        journal.record(f'{{"n": {n}}}', epoch=2, delta=n % 2 == 0)
    last_seq, trimmed, entries = journal.snapshot()
    duplex = DuplexState("tok", 2, "conv_1", last_seq, trimmed, entries)
    assert round_trip(duplex) == duplex

    start = world_proto.Start("stone", 7, 16, "jpeg", "fast")
    controls = (ControlInput("camera", "example.camera.v1", {"yaw": 0.5}),)
    world = WorldState(start, "moss", controls, 3, 12)
    assert round_trip(world) == world

    robot = RobotState(np.arange(12, dtype=np.float32).reshape(4, 3), 0.05, 1.0e9)
    back = round_trip(robot)
    assert isinstance(back, RobotState) and np.array_equal(back.actions, robot.actions)


def test_journal_and_conversation_restore_continue_where_the_snapshot_was():
    journal = Journal(max_events=3, max_bytes=1 << 16)
    for n in range(5):
        journal.record(f"e{n}", epoch=0, delta=False)
    again = Journal(max_events=2, max_bytes=1 << 16)  # a smaller bound on the new replica
    again.restore(*journal.snapshot())
    assert [e.seq for e in again.after(0)[0]] == [4, 5] and again.after(2)[1], "seq 3 is a gap now"
    assert again.record("e5", epoch=0, delta=False).seq == 6
    last_seq, trimmed_to, entries = journal.snapshot(max_bytes=4)  # two frames of 2 bytes fit
    assert (last_seq, trimmed_to, [e.seq for e in entries]) == (5, 3, [4, 5])

    conversation = Conversation(max_items=8)
    for n in range(3):
        conversation.insert(Message(f"item_{n}", "user", (InputText(str(n)),)), None)
    restored = Conversation(max_items=2)
    restored.restore(conversation.snapshot())
    assert [i.id for i in restored.items()] == ["item_1", "item_2"]


async def test_saves_are_coalesced_to_one_put_per_interval_with_the_newest_state():
    store = MemoryStore()
    checkpointer = Checkpointer(store, interval_s=0.2)
    state = {"n": 0}
    for n in range(20):  # 20 ticks in 0.1 s
        state["n"] = n
        checkpointer.save("duplex-a.0000000000000001", "duplex", lambda: dict(state))
        await asyncio.sleep(0.005)
    await asyncio.sleep(0.3)
    await checkpointer.flush()
    assert [(c.seq, decode(c)["n"]) for c in store.puts] == [(1, 0), (2, 19)]
    assert (await store.get("duplex-a.0000000000000001")).seq == 2


async def test_a_closed_session_loses_its_checkpoint_unless_the_replica_retains_them():
    store = MemoryStore()
    checkpointer = Checkpointer(store, interval_s=0.2)
    checkpointer.save("voice-a.0000000000000001", "voice", lambda: "one")
    checkpointer.discard("voice-a.0000000000000001")  # its put is still in flight: the delete waits
    checkpointer.save("robot-a.0000000000000002", "robot", lambda: "chunk", key="robot-episode:ep")
    await checkpointer.flush()
    assert await store.get("voice-a.0000000000000001") is None
    assert store.deletes == ["voice-a.0000000000000001"]

    checkpointer.retain()  # draining: the sessions resume elsewhere
    checkpointer.discard("robot-a.0000000000000002")
    await checkpointer.flush()
    assert decode(await store.get("robot-episode:ep")) == "chunk"


async def test_a_store_that_fails_never_reaches_the_session():
    class Down(MemoryStore):
        async def put(self, checkpoint: Checkpoint) -> bool:
            raise ConnectionError("the actor is gone")

    checkpointer = Checkpointer(Down(), interval_s=0.2)
    checkpointer.save("duplex-a.0000000000000001", "duplex", lambda: "state")
    await checkpointer.flush()  # logged, not raised


async def asgi(check: SessionCheck, scope: dict) -> tuple[list[dict], list[dict]]:
    """Run one websocket request through ``check``: (what was sent, the scopes the app saw)."""
    sent, seen = [], []

    async def app(scope, receive, send):  # noqa: ANN001, ANN202
        seen.append(scope)

    check.app = app
    messages = iter([{"type": "websocket.connect"}])

    async def receive():  # noqa: ANN202
        return next(messages)

    async def send(message):  # noqa: ANN001, ANN202
        sent.append(message)

    await check(scope, receive, send)
    return sent, seen


async def test_the_session_check_restores_a_gone_replicas_session_or_answers_not_found():
    store = MemoryStore()
    check = SessionCheck(None, tag="b", store=store)
    gone = "duplex-a.00000000000000ff"
    scope = {"type": "websocket", "path": "/v1/duplex", "query_string": f"session_id={gone}".encode()}
    sent, seen = await asgi(check, scope)
    assert not seen and sent[-1]["code"] == 1008 and "session_not_found" in sent[-1]["reason"]

    await store.put(Checkpoint(gone, "duplex", 4, encode("state")))
    sent, seen = await asgi(check, scope)
    assert not sent and seen[0][CHECKPOINT_SCOPE_KEY].seq == 4

    own = {**scope, "query_string": b"session_id=duplex-b.00000000000000ff"}
    sent, seen = await asgi(check, own)
    assert seen and CHECKPOINT_SCOPE_KEY not in seen[0]


@pytest.fixture
def replica(monkeypatch):
    """Servers built from here on are replicas sharing one in-memory store (tag set per server)."""
    store = MemoryStore()

    def tagged(tag: str) -> None:
        identities.set_replica_tag(tag)

        def build(config, routes_first=()):  # noqa: ANN001, ANN202 - the replica's own wiring
            app = create_app(config, routes_first, checkpointer=Checkpointer(store, 0.05))
            app.user_middleware.append(Middleware(SessionCheck, tag=tag, store=store))
            return app

        monkeypatch.setattr(server_module, "create_app", build)

    yield store, tagged
    identities._replica_tag = ""


async def test_a_duplex_session_resumes_on_another_replica_with_its_journal(monkeypatch, replica):
    store, tagged = replica
    tagged("aaa")
    async with duplex_server(monkeypatch, speak=always) as (base, _, _):
        async with connect(f"{base}/v1/duplex") as c:
            created = await c.next()
            sid, token = created["session"]["id"], created["resume_token"]
            received = [created, *(await c.during(0.6))]
            await asyncio.sleep(0.15)  # the last coalesced put lands
            lost = await store.get(sid)  # what the store holds when the replica "dies"
    # replica aaa is gone; its shutdown released the session, which a killed replica never does
    await asyncio.sleep(0.2)  # the shutdown's own deletes land first
    store.table.put(lost)
    held = decode(lost)
    cursor = received[2]["server_event_seq"]  # the client lost what came after this
    assert identities.session_replica_tag(sid) == "aaa" and held.last_seq > cursor
    tagged("bbb")
    async with duplex_server(monkeypatch, speak=always) as (base, service, _):
        async with connect(f"{base}/v1/duplex?autostart=0&session_id={sid}") as r:
            await r.send(type="session.resume", session_id=sid, resume_token="wrong")
            assert (await r.next())["error"]["code"] == "invalid_resume_token"
        async with connect(f"{base}/v1/duplex?autostart=0&session_id={sid}") as r:
            await r.send(
                type="session.resume",
                session_id=sid,
                resume_token=token,
                last_received_server_event_seq=cursor,
            )
            replay = await r.until("session.resumed")
            live = [await r.next() for _ in range(3)]
            assert service.sessions[sid].journal.last_seq >= live[-1]["server_event_seq"]
    seqs = [e["server_event_seq"] for e in replay + live]
    assert seqs == list(range(cursor + 1, cursor + 1 + len(seqs))), "each journaled event once, in order"
    seen = [e for e in received if e["server_event_seq"] > cursor]  # read before the loss, then lost
    assert replay[: len(seen)] == seen, "the replay is what the client missed, as first sent"
    resumed = replay[-1]
    assert resumed["type"] == "session.resumed" and resumed["replayed"] == held.last_seq - cursor
    assert resumed["resume_token"] != token and all(e["epoch"] >= held.epoch for e in live)


async def world_chunks(ws, n: int) -> None:
    """Read until ``n`` chunks (binary media) arrived."""
    seen = 0
    while seen < n:
        if isinstance(await asyncio.wait_for(ws.recv(), 60), bytes):
            seen += 1


async def until_type(ws, kind: str) -> dict:
    while True:
        message = await asyncio.wait_for(ws.recv(), 60)
        if isinstance(message, str) and json.loads(message)["type"] == kind:
            return json.loads(message)


async def test_a_world_session_goes_on_on_another_replica_from_its_last_sent_chunk(replica):
    """The checkpoint holds the blocks the session's KV held after the last chunk it sent (each
    with its action and prompt); the other replica rebuilds the model's state from them and the
    session goes on at the next chunk, a later block's frames (fMP4: a new stream, init segment
    first), its prompt and controls intact
    (the model's side is exact while nothing left the window: tests/world/test_restore.py)."""
    store, tagged = replica
    config = config_from_mapping(
        {
            "robot": {"enabled": False},
            "runtime": {"memory_available_bytes": 2**30},
            "world": {"enabled": True, "torch_threads": 1, "compute_admission": False},
        }
    )
    keys = {"track": "keys", "schema": "world.keys.v1", "data": {"pressed": ["a"]}}
    tagged("aaa")
    async with serve_in_process(config) as (url, _):
        async with websockets.connect(
            url.replace("http", "ws") + "/v1/realtime/world?protocol_version=1"
        ) as ws:
            start = {
                "type": "session.start",
                "prompt": "stone",
                "seed": 5,
                "pacing": "fast",
                "format": "fmp4",
            }
            await ws.send(json.dumps(start))
            sid = (await until_type(ws, "session.created"))["session_id"]
            event = {"type": "session.event", "event_id": 1, "prompt": "ice", "controls": [keys]}
            await ws.send(json.dumps(event))
            await world_chunks(ws, 3)  # the event is applied by now: sticky prompt and controls
            await asyncio.sleep(0.15)
            lost = await store.get(sid)
    await asyncio.sleep(0.2)  # the shutdown's own deletes land first
    store.table.put(lost)  # as if replica aaa had died instead of shutting down
    held = decode(lost)
    assert held.start.seed == 5 and held.prompt == "ice" and held.chunks >= 3
    tagged("bbb")
    async with serve_in_process(config) as (url, running):
        (world,) = running.rt_app.state.rt.kinds
        cfg = world.model.cfg
        assert tuple(h.block for h in held.held) == resident_blocks(cfg, held.chunks)
        assert held.held[-1].prompt == "ice" and held.held[-1].action.abs().sum() > 0  # key "a" held
        url = url.replace("http", "ws") + f"/v1/realtime/world?protocol_version=1&session_id={sid}"
        async with websockets.connect(url) as ws:
            await ws.send(json.dumps({"type": "session.start", "prompt": "sand", "pacing": "fast"}))
            assert (await until_type(ws, "session.created"))["session_id"] == sid
            session = world.manager.get(sid)
            assert session.prompt == "ice" and dict(session.controls)["keys"].data["pressed"] == ("a",)
            first = await until_type(ws, "chunk.metadata")
            assert first["chunk_index"] == held.chunks and f"-{held.chunks}-" in first["request_id"]
            assert first["frame_count"] == cfg.frames_for_block(False)  # the decoder's cache goes on
            assert first["format"] == "fmp4" and first["init_segment_bytes"] > 0  # a new media stream
            assert first["first_frame_index"] == 0
            await world_chunks(ws, 1)


async def test_a_robot_episode_goes_on_on_another_replica_guided_by_its_last_chunk(replica, monkeypatch):
    """openpi-client robots name no session: the episode (an observation's ``session_id``) keys
    the checkpoint, and the first observation naming it on another replica seeds RTC with it."""
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    from models.policy.stage import PolicyStage
    from realtime.bench import examples

    store, tagged = replica
    seeded = []
    real_seed = PolicyStage.seed_state

    def seed_state(stage, slot, chunk, latency_s, delivered_at):  # noqa: ANN001, ANN202 - a spy
        seeded.append(chunk)
        real_seed(stage, slot, chunk, latency_s, delivered_at)

    monkeypatch.setattr(PolicyStage, "seed_state", seed_state)
    robot_config = {"enabled": True, "policy": "zeros"}  # the plumbing; RTC's seed: the next test
    config = config_from_mapping({"robot": robot_config, "world": {"enabled": False}})
    obs = {**examples.libero(0), "session_id": "episode-7"}
    tagged("aaa")
    async with serve_in_process(config) as (url, _):
        robot = await asyncio.to_thread(WebsocketClientPolicy, url.replace("http", "ws"))
        actions = [(await asyncio.to_thread(robot.infer, obs))["actions"] for _ in range(2)]
        await asyncio.sleep(0.3)
        lost = await store.get("robot-episode:episode-7")
        await asyncio.to_thread(robot._ws.close)  # sync: off the loop the server runs on
    await asyncio.sleep(0.2)  # the shutdown's own deletes land first
    store.table.put(lost)  # as if replica aaa had died instead of shutting down
    assert np.array_equal(decode(lost).actions, actions[-1]) and not seeded
    tagged("bbb")
    async with serve_in_process(config) as (url, _):
        robot = await asyncio.to_thread(WebsocketClientPolicy, url.replace("http", "ws"))
        await asyncio.to_thread(robot.infer, obs)
        await asyncio.to_thread(robot._ws.close)  # sync: off the loop the server runs on
    assert len(seeded) == 1 and np.array_equal(seeded[0], actions[-1])


def test_a_seeded_rtc_state_holds_the_chunk_as_delivered_then():
    from models.policy.rtc import RTCState
    from models.policy.stage import PolicyStage

    class OneStatePolicy:  # what PolicyStage asks of a policy here: its per-session state
        device = "cpu"

        def new_state(self) -> RTCState:
            return RTCState(horizon=4, action_dim=2)

    stage = PolicyStage(OneStatePolicy(), slot_capacity=2)  # type: ignore[arg-type]
    stage.open_state("robot-b.0000000000000001", 1)
    chunk = np.ones((4, 2), np.float32)
    stage.seed_state(1, chunk, latency_s=0.05, delivered_at=123.0)
    state = stage._states[1]
    assert state.prev is chunk and state.delivered_at == 123.0 and list(state.latencies) == [0.05]
