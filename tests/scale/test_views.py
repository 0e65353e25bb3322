"""The cluster views a replica serves, from the snapshots of real apps (two echo servers, no Ray),
and the two ASGI middlewares: the replica's session check and the proxy's replica-loss close."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client.parser import text_string_to_metric_families

from realtime.app import create_app
from realtime.config import DeployConfig, EchoConfig, RobotConfig
from realtime.scale import views
from realtime.scale.affinity import websocket_routes
from realtime.scale.proxy import LOST_CODE, ReplicaLossClose
from realtime.scale.session_check import SessionCheck

ECHO = DeployConfig(robot=RobotConfig(enabled=False), echo=EchoConfig(enabled=True, max_sessions=3))


@pytest.fixture
async def two_replicas():
    apps = [create_app(ECHO), create_app(ECHO)]
    for app in apps:
        await app.state.rt.load_all()
    yield [app.state.rt for app in apps]
    for app in apps:
        await app.state.rt.stop()


async def test_cluster_status_sums_the_replicas_and_lists_each(two_replicas):
    a, b = two_replicas
    manager = a.kinds[0].manager
    await manager.create()
    await manager.create()
    await b.kinds[0].manager.create()
    snaps = [
        views.snapshot(a, "aaaa", True),
        views.snapshot(b, "bbbb", True),
        {"replica": "cccc", "reachable": False},
    ]
    doc = views.cluster_status(snaps, ["echo"])
    (echo,) = doc["kinds"]
    assert (echo["capacity"], echo["occupied"], echo["free"], echo["created"]) == (6, 3, 3, 3)
    assert echo["sessions_by_state"] == {"active": 3}
    assert doc["ready"] is True and doc["draining"] is False
    assert [r["replica"] for r in doc["replicas"]] == ["aaaa", "bbbb", "cccc"]
    assert [r["reachable"] for r in doc["replicas"]] == [True, True, False]
    assert [r["kinds"][0]["occupied"] for r in doc["replicas"][:2]] == [2, 1]
    assert {s["stage"] for s in doc["stages"]} == {
        s["stage"] for s in views.snapshot(a, "aaaa", True)["status"]["stages"]
    }
    report = views.report(a, "aaaa", websocket_routes(a.kinds))
    assert report.ready and report.kinds["echo"].capacity == 3 and report.kinds["echo"].occupied == 2
    assert report.routes == (("/v1/realtime/echo", "echo"),)


async def test_metrics_carry_a_replica_label_and_an_up_series(two_replicas):
    a, b = two_replicas
    snaps = [
        views.snapshot(a, "aaaa", True),
        views.snapshot(b, "bbbb", True),
        {"replica": "cccc", "reachable": False},
    ]
    families = {f.name: f for f in text_string_to_metric_families(views.exposition(snaps).decode())}
    ready = {s.labels["replica"]: s.value for s in families["realtime_ready"].samples}
    assert ready == {"aaaa": 1.0, "bbbb": 1.0}
    up = {s.labels["replica"]: s.value for s in families["realtime_replica_up"].samples}
    assert up == {"aaaa": 1.0, "bbbb": 1.0, "cccc": 0.0}
    assert all("replica" in s.labels for f in families.values() for s in f.samples)


async def test_models_and_readiness_across_replicas(two_replicas):
    a, b = two_replicas
    snaps = [views.snapshot(a, "aaaa", False), views.snapshot(b, "bbbb", False)]
    models = views.cluster_models(snaps)
    assert [(m["id"], m["replicas"]) for m in models["data"]] == [("echo", ["aaaa", "bbbb"])]
    assert views.cluster_ready(snaps, ["echo"]) == (True, "ready")
    await a.drain()
    b.ready = False
    snaps = [views.snapshot(a, "aaaa", False), views.snapshot(b, "bbbb", False)]
    assert views.cluster_ready(snaps, ["echo"]) == (True, "ready")  # b still serves echo
    assert views.cluster_ready(snaps[:1], ["echo"]) == (False, "no replica serves echo yet")
    assert not views.report(a, "aaaa", ()).ready and not views.report(a, "aaaa", ()).kinds


def test_quantile_gauges_merge_to_the_worst_replica():
    texts = {
        "a": "# TYPE duplex_step_lateness_p99_seconds gauge\nduplex_step_lateness_p99_seconds 0.01\n"
        '# TYPE engine_queue_depth gauge\nengine_queue_depth{stage="x"} 2\n',
        "b": "# TYPE duplex_step_lateness_p99_seconds gauge\nduplex_step_lateness_p99_seconds 0.03\n"
        '# TYPE engine_queue_depth gauge\nengine_queue_depth{stage="x"} 5\n',
    }
    merged = views.summed_samples(views.merged_families(texts))
    assert [s.value for s in merged["duplex_step_lateness_p99_seconds"]] == [0.03]
    assert [(s.labels, s.value) for s in merged["engine_queue_depth"]] == [({"stage": "x"}, 7.0)]


class _Asgi:
    """Drives one ASGI call: what the app sent, given what the client sends."""

    def __init__(self, incoming: list[dict]) -> None:
        self.incoming = list(incoming)
        self.sent: list[dict] = []

    async def receive(self) -> dict:
        if self.incoming:
            return self.incoming.pop(0)
        await asyncio.sleep(3600)
        raise AssertionError

    async def send(self, message: dict) -> None:
        self.sent.append(message)


def _ws_scope(query: bytes = b"", headers: list | None = None) -> dict:
    return {"type": "websocket", "path": "/v1/duplex", "query_string": query, "headers": headers or []}


async def test_a_session_of_a_gone_replica_is_not_found_and_others_pass():
    reached = []

    async def app(scope, receive, send):
        reached.append(scope["type"])

    check = SessionCheck(app, tag="mine")
    io = _Asgi([{"type": "websocket.connect"}])
    await check(_ws_scope(b"session_id=duplex-gone.0123456789abcdef&autostart=0"), io.receive, io.send)
    assert [m["type"] for m in io.sent] == ["websocket.accept", "websocket.close"]
    assert io.sent[1]["code"] == 1008 and io.sent[1]["reason"].startswith("session_not_found: duplex-gone.")
    http = _Asgi([{"type": "http.request", "body": b""}])
    scope = {
        "type": "http",
        "method": "GET",
        "path": "/x",
        "query_string": b"",
        "headers": [(b"x-session-id", b"world-gone.0123456789abcdef")],
    }
    await check(scope, http.receive, http.send)
    assert http.sent[0]["status"] == 404 and b'"code":"session_not_found"' in http.sent[1]["body"]
    for query in (b"", b"session_id=duplex-mine.0123456789abcdef", b"session_id=an-episode-name"):
        await check(_ws_scope(query), _Asgi([]).receive, _Asgi([]).send)
    assert reached == ["websocket"] * 3


@pytest.mark.parametrize(
    "behaviour, closes",
    [("dies", [LOST_CODE]), ("closes", [1001]), ("client_leaves", []), ("refuses", [])],
)
async def test_the_proxy_closes_1012_only_when_the_replica_vanished(behaviour, closes):
    async def replica(scope, receive, send):
        await receive()
        if behaviour == "refuses":
            await send({"type": "websocket.http.response.start", "status": 403, "headers": []})
            return
        await send({"type": "websocket.accept"})
        if behaviour == "closes":
            await send({"type": "websocket.close", "code": 1001, "reason": "server shutting down"})
        elif behaviour == "client_leaves":
            await receive()
        elif behaviour == "dies":
            raise RuntimeError("ActorDiedError")

    io = _Asgi([{"type": "websocket.connect"}, {"type": "websocket.disconnect", "code": 1000}])
    try:
        await ReplicaLossClose(replica)(_ws_scope(), io.receive, io.send)
    except RuntimeError:
        assert behaviour == "dies"
    assert [m["code"] for m in io.sent if m["type"] == "websocket.close"] == closes
