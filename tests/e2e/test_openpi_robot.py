"""Robot sessions end to end: the real openpi-client 0.1.2 against the real server over loopback."""

from __future__ import annotations

import asyncio
import functools
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import msgpack
import numpy as np
import pytest
import websockets.sync.client as ws_client
from openpi_client import msgpack_numpy
from openpi_client.websocket_client_policy import WebsocketClientPolicy
from websockets.exceptions import ConnectionClosed, InvalidStatus

from models.policy import presets
from models.policy.pi0_policy import Pi0Policy
from realtime.bench.examples import aloha, droid, libero
from realtime.config import RobotConfig, config_from_mapping
from realtime.kinds.robot import handshake_metadata
from sessions.engine import Coalescing
from tests.robot.test_pi0_policy import pi0_obs
from tests.serving import serve_in_process
from tests.sessions.engine.test_arrival_dispatch import Spy

pytestmark = pytest.mark.asyncio(loop_scope="session")  # the module-scoped servers live on that loop

LIMIT = 1 << 20  # robot.max_message_bytes: larger frames close 1009 (tests/realtime/test_message_limits.py)
# Blocking clients get their own threads: the loop's default executor belongs to the server.
CLIENTS = ThreadPoolExecutor(max_workers=16, thread_name_prefix="openpi-client")


def in_client_thread(fn, *args, **kwargs):
    return asyncio.get_running_loop().run_in_executor(CLIENTS, functools.partial(fn, *args, **kwargs))


@pytest.fixture(scope="module")
async def server():
    # device cpu: answers are compared with a CPU reference policy at 1e-4 (tests/robot/test_device.py
    # covers CUDA serving with a tolerance for TF32 convolutions)
    # error_mode recoverable: these tests read the structured error dicts (text mode: default_server)
    robot = {"enabled": True, "max_message_bytes": LIMIT, "device": "cpu", "error_mode": "recoverable"}
    config = config_from_mapping({"robot": robot})
    async with serve_in_process(config) as (url, srv):
        yield url.replace("http://", "ws://"), srv.rt_app.state.rt.kinds[0], config


@pytest.fixture(scope="module")
def local() -> Pi0Policy:
    return Pi0Policy()


def expected(policy: Pi0Policy, obs: dict) -> np.ndarray:
    return policy.infer([policy.prepare(obs)], [None])[0]


def raw(url: str, **kw):
    return ws_client.connect(url, compression=None, max_size=None, open_timeout=10, **kw)


async def test_metadata_frame_arrives_first_and_matches_the_policy(server, local):
    url, service, config = server
    for path in ("", "/v1/realtime/robot/openpi"):
        policy = await in_client_thread(WebsocketClientPolicy, url + path)
        assert policy.get_server_metadata() == handshake_metadata(local, config.robot)
        await in_client_thread(policy._ws.close)

    def metadata_without_sending() -> dict:
        with raw(url) as conn:
            return msgpack_numpy.unpackb(conn.recv(timeout=10))

    meta = await in_client_thread(metadata_without_sending)
    assert meta["action_horizon"] == 50 and meta["action_dim"] == 32 and meta["needs_session_id"] is False
    assert meta["protocol"] == "openpi" and meta["image_resolution"] == [224, 224]
    async with httpx.AsyncClient() as http:
        health = await http.get(url.replace("ws://", "http://") + "/healthz")
    assert health.status_code == 200 and health.text == "OK\n"


@pytest.mark.parametrize("make", [libero, droid, aloha, pi0_obs], ids=lambda f: f.__name__)
async def test_robot_shaped_observations_get_the_advertised_chunk(server, local, make):
    """Each robot gets the action dims its ``observation_presets`` entry advertises (issue 29:
    the auto preset used to return 32 for every robot)."""
    url, _, _ = server

    def go():
        policy = WebsocketClientPolicy(url)
        try:
            return policy.infer(make(7)), policy.infer(make(7))
        finally:
            policy._ws.close()

    first, second = await in_client_thread(go)
    meta = handshake_metadata(local, server[2].robot)
    dims = meta["observation_presets"][presets.detect(make(7)).name]["action_dim"]
    assert dims == {"libero": 7, "droid": 8, "aloha": 14, "pi0_obs": 32}[make.__name__]
    for reply in (first, second):
        assert reply["actions"].shape == (50, dims) and np.isfinite(reply["actions"]).all()
        np.testing.assert_allclose(reply["actions"], expected(local, make(7)), atol=1e-4)
        assert reply["server_timing"]["infer_ms"] > 0 and reply["policy_timing"]["infer_ms"] > 0
    assert "prev_total_ms" in second["server_timing"] and "prev_total_ms" not in first["server_timing"]


async def test_eight_concurrent_clients_get_their_own_answers_in_order(server, local):
    url, service, _ = server
    steps = 4
    wanted = {(c, s): expected(local, libero(100 * c + s)) for c in range(8) for s in range(steps)}
    got: dict = {}
    barrier = threading.Barrier(8)

    def robot(c: int) -> None:
        policy = WebsocketClientPolicy(url)
        barrier.wait(timeout=30)
        try:
            for s in range(steps):
                got[(c, s)] = policy.infer(libero(100 * c + s))
        finally:
            policy._ws.close()

    await asyncio.gather(*(in_client_thread(robot, c) for c in range(8)))
    for key, want in wanted.items():
        np.testing.assert_allclose(got[key]["actions"], want, atol=1e-4, err_msg=str(key))
    assert max(r["policy_timing"]["batch_size"] for r in got.values()) > 1  # batched across robots
    await _until(lambda: len(service.manager) == 0 and service.engine.active_sessions == 0)


async def _until(predicate, timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


def _marker(dtype: str, shape: list[int], data: bytes) -> dict:
    return {b"__ndarray__": True, b"data": data, b"dtype": dtype, b"shape": shape}


BAD = {
    "wrong_dtype": (
        msgpack_numpy.packb({**libero(), "observation/image": np.zeros((224, 224, 3), np.int32)}),
        "invalid_observation",
    ),
    "missing_camera": (
        msgpack_numpy.packb({k: v for k, v in libero().items() if k != "observation/wrist_image"}),
        "invalid_observation",
    ),
    "text_frame": ('{"observation/state": [1, 2]}', "text_frame_unsupported"),
    "garbage": (b"\xc1\x00garbage\xff", "invalid_payload"),
    "object_dtype": (
        msgpack.packb({"observation/state": _marker("|O", [1], b"\0" * 8)}),
        "unsupported_dtype",
    ),
    "bad_array": (msgpack.packb({"observation/state": _marker("<f4", [4], b"\0" * 3)}), "invalid_array"),
    "unknown_endpoint": (msgpack_numpy.packb({"endpoint": "fly"}), "unknown_endpoint"),
}


async def test_bad_input_gets_typed_errors_while_other_robots_keep_being_served(server, local):
    url, _, _ = server
    stop = threading.Event()
    served: list[np.ndarray] = []

    def healthy_robot() -> None:
        policy = WebsocketClientPolicy(url)
        try:
            while not stop.is_set():
                served.append(policy.infer(droid(3))["actions"])
        finally:
            policy._ws.close()

    def bad_robot() -> dict[str, dict]:
        replies = {}
        with raw(url) as conn:
            conn.recv(timeout=10)
            for name, (frame, _) in BAD.items():
                conn.send(frame)
                replies[name] = msgpack_numpy.unpackb(conn.recv(timeout=30))
                conn.send(msgpack_numpy.packb(libero(1)))  # the session goes on after every error
                replies[name + "/after"] = msgpack_numpy.unpackb(conn.recv(timeout=30))
        return replies

    healthy = in_client_thread(healthy_robot)
    try:
        replies = await in_client_thread(bad_robot)
    finally:
        stop.set()
        await healthy
    for name, (_, code) in BAD.items():
        assert replies[name]["type"] == "error" and replies[name]["code"] == code, (name, replies[name])
        assert "Traceback" not in replies[name]["message"]
        np.testing.assert_allclose(replies[name + "/after"]["actions"], expected(local, libero(1)), atol=1e-4)
    assert len(served) >= 2
    for actions in served:
        np.testing.assert_allclose(actions, expected(local, droid(3)), atol=1e-4)


async def test_reset_endpoint_and_session_id_semantics(server, local):
    url, _, _ = server
    rtc = {"executed_steps": 10, "inference_delay": 4}

    def go():
        policy = WebsocketClientPolicy(url)
        try:
            a1 = policy.infer(libero(1, session_id="ep-a"))["actions"]
            a2 = policy.infer(libero(2, session_id="ep-a", rtc=rtc))["actions"]  # follows a1
            b1 = policy.infer(libero(2, session_id="ep-b", rtc=rtc))["actions"]  # new id: fresh state
            reset = policy.infer({"endpoint": "reset"})
            b2 = policy.infer(libero(2, session_id="ep-b", rtc=rtc))["actions"]  # reset: fresh again
            return a1, a2, b1, reset, b2
        finally:
            policy._ws.close()

    a1, a2, b1, reset, b2 = await in_client_thread(go)
    assert reset == {"status": "reset successful"}
    np.testing.assert_array_equal(a2[:4], a1[10:14])  # frozen steps come from the previous chunk
    plain = expected(local, libero(2))
    assert not np.allclose(a2, plain, atol=1e-3)
    np.testing.assert_allclose(b1, plain, atol=1e-4)
    np.testing.assert_allclose(b2, plain, atol=1e-4)


@pytest.fixture(scope="module")
async def strict_server():
    """openpi error mode, API keys and a short idle timeout."""
    config = config_from_mapping(
        {
            "server": {"api_keys": ["k1"]},
            "robot": {"enabled": True, "error_mode": "openpi", "idle_timeout_s": 0.5},
        }
    )
    async with serve_in_process(config) as (url, _):
        yield url.replace("http://", "ws://")


async def test_api_key_is_enforced_when_configured(strict_server):
    with pytest.raises(InvalidStatus):
        await in_client_thread(WebsocketClientPolicy, strict_server)
    with pytest.raises(InvalidStatus):
        await in_client_thread(WebsocketClientPolicy, strict_server, api_key="wrong")
    policy = await in_client_thread(WebsocketClientPolicy, strict_server, api_key="k1")
    assert (await in_client_thread(policy.infer, aloha()))["actions"].shape == (50, 14)
    await in_client_thread(policy._ws.close)


async def test_openpi_error_mode_sends_text_then_closes_1011(strict_server):
    def go():
        policy = WebsocketClientPolicy(strict_server, api_key="k1")
        with pytest.raises(RuntimeError, match="invalid_observation") as info:
            policy.infer({"state": np.zeros(3)})
        assert "Traceback" not in str(info.value)
        with pytest.raises(ConnectionClosed) as closed:
            policy._ws.recv(timeout=10)
        return closed.value.rcvd.code

    assert await in_client_thread(go) == 1011


async def test_idle_session_is_closed_with_a_reason(strict_server):
    def go():
        with raw(strict_server, additional_headers={"Authorization": "Api-Key k1"}) as conn:
            conn.recv(timeout=10)
            with pytest.raises(ConnectionClosed) as closed:
                conn.recv(timeout=10)
            return closed.value.rcvd

    close = await in_client_thread(go)
    assert close.code == 1008 and "idle timeout" in close.reason


@pytest.fixture(scope="module")
async def aloha_server():
    """A fixed ALOHA preset on the trivial policy, one session at most."""
    config = config_from_mapping(
        {
            "runtime": {"max_sessions": 1},
            "robot": {
                "enabled": True,
                "policy": "zeros",
                "observation_preset": "aloha",
                "error_mode": "recoverable",
            },
        }
    )
    async with serve_in_process(config) as (url, _):
        yield url.replace("http://", "ws://")


async def test_fixed_preset_advertises_robot_dims_and_admission_is_bounded(aloha_server):
    def go():
        policy = WebsocketClientPolicy(aloha_server)
        meta = policy.get_server_metadata()
        reply = policy.infer(aloha())
        wrong = policy.infer(libero())
        with raw(aloha_server) as second:  # over the one-session capacity
            refused = msgpack_numpy.unpackb(second.recv(timeout=10))
            with pytest.raises(ConnectionClosed) as closed:
                second.recv(timeout=10)
        policy._ws.close()
        return meta, reply, wrong, refused, closed.value.rcvd.code

    meta, reply, wrong, refused, code = await in_client_thread(go)
    assert meta["action_dim"] == 14 and meta["reset_pose"] == [0.0, -1.5, 1.5, 0.0, 0.0, 0.0]
    assert meta["camera_keys"] == ["cam_high", "cam_left_wrist", "cam_right_wrist"]
    assert reply["actions"].shape == (50, 14)
    assert wrong["code"] == "invalid_observation"
    assert refused["type"] == "error" and refused["code"] == "session_limit_reached" and code == 1013


# --------------------------------------------------------------------------- the defaults (issue 12)

REAPER_S = 0.05


@pytest.fixture(scope="module")
async def default_server():
    """The robot defaults (text errors, arrival-aware dispatch, no idle timeout), a fast reaper."""
    config = config_from_mapping(
        {"runtime": {"reaper_interval_s": REAPER_S}, "robot": {"enabled": True, "device": "cpu"}}
    )
    assert config.robot == RobotConfig(device="cpu")
    async with serve_in_process(config) as (url, srv):
        yield url.replace("http://", "ws://"), srv.rt_app.state.rt.kinds[0]


def _image(value: float, dtype=np.float64, shape=(224, 224, 3)) -> np.ndarray:
    return np.full(shape, value, dtype)


# Each observation the server once accepted silently: (observation, key and rule in the message).
SILENT_ACCEPTS = {
    "float_image_above_1": (
        {**libero(), "observation/image": _image(200.0)},
        "'observation/image'",
        "[0, 1]",
    ),
    "nan_image": (
        {**libero(), "observation/wrist_image": _image(np.nan)},
        "'observation/wrist_image'",
        "finite",
    ),
    "state_rank_2": ({**libero(), "observation/state": np.zeros((8, 8))}, "'observation/state'", "shape [8]"),
    "state_size": ({**libero(), "observation/state": np.zeros(7)}, "'observation/state'", "shape [8]"),
    "ragged_state": (
        {**libero(), "observation/state": [[1.0] * 4, [1.0] * 3]},
        "'observation/state'",
        "numeric array",
    ),
    "long_prompt": ({**libero(), "prompt": "x" * 2001}, "prompt", "at most 2000 characters"),
}


async def test_text_mode_errors_raise_runtime_error_and_the_same_client_goes_on(default_server, local):
    url, _ = default_server

    def go() -> dict[str, str]:
        policy = WebsocketClientPolicy(url)
        assert policy.get_server_metadata()["error_mode"] == "text"
        raised = {}
        try:
            for name, (obs, _key, _rule) in SILENT_ACCEPTS.items():
                with pytest.raises(RuntimeError) as info:
                    policy.infer(obs)
                raised[name] = str(info.value)
                after = policy.infer(libero(1))  # the socket stays open: the next infer succeeds
                np.testing.assert_allclose(after["actions"], expected(local, libero(1)), atol=1e-4)
        finally:
            policy._ws.close()
        return raised

    raised = await in_client_thread(go)
    for name, (_obs, key, rule) in SILENT_ACCEPTS.items():
        text = raised[name]
        assert text.startswith("Error in inference server:\ninvalid_observation: "), (name, text)
        assert key in text and rule in text and "Traceback" not in text, (name, text)


async def test_one_active_robot_among_seven_paused_ones_is_served_at_once(default_server):
    url, service = default_server
    window = service.config.coalesce_window_s

    def paused_robots() -> list[WebsocketClientPolicy]:
        robots = [WebsocketClientPolicy(url) for _ in range(7)]
        for i, robot in enumerate(robots):
            robot.infer(libero(i))  # each sent a request, then went silent (still connected)
        return robots

    def active_robot() -> list[dict]:
        policy = WebsocketClientPolicy(url)
        try:
            return [policy.infer(libero(100 + i)) for i in range(10)]
        finally:
            policy._ws.close()

    paused = await in_client_thread(paused_robots)
    spy = Spy(service.engine.dispatch)
    service.engine.dispatch = spy
    try:
        await asyncio.sleep(0.3)  # silent for far more than idle_after_intervals x their interval
        replies = await in_client_thread(active_robot)
    finally:
        service.engine.dispatch = spy.policy
        for robot in paused:
            await in_client_thread(robot._ws.close)
    assert [r["policy_timing"]["batch_size"] for r in replies] == [1.0] * 10
    assert spy.at_submit == [True] * 10  # each request went to the worker inside its submit
    assert all(d is None for d in spy.decisions)  # no decision waited for a paused robot
    # The paused robots held open engine slots throughout, and the window rule would have waited
    # out coalesce_window_s for them at every request.
    assert len(spy.views) == 10 and all(v.idle_sessions == 7 for v in spy.views)
    assert not any(Coalescing(window).run_at_submit(v) for v in spy.views)
    await _until(lambda: service.engine.active_sessions == 0)


async def test_no_idle_close_by_default_even_after_a_long_pause(default_server, local):
    url, service = default_server
    assert service.config.idle_timeout_s == 0

    def connect() -> WebsocketClientPolicy:
        policy = WebsocketClientPolicy(url)
        policy.infer(libero(2))
        return policy

    policy = await in_client_thread(connect)
    try:
        sessions = service.manager.list_sessions()
        assert sessions
        for session in sessions:  # as if the robot had paused for 31 s (the old default closed at 30)
            session.last_active_at -= 31.0
        await asyncio.sleep(10 * REAPER_S)  # the reaper sweeps about ten times
        assert [s.session_id for s in service.manager.list_sessions()] == [s.session_id for s in sessions]
        reply = await in_client_thread(policy.infer, libero(2))
        np.testing.assert_allclose(reply["actions"], expected(local, libero(2)), atol=1e-4)
    finally:
        await in_client_thread(policy._ws.close)


# --------------------------------------------------------------------------- a real checkpoint folder


@pytest.fixture(scope="module")
async def checkpoint_server(tmp_path_factory):
    """``robot.policy: pi0.5`` + ``robot.checkpoint``: a random-weight pi0.5 LIBERO checkpoint in
    openpi's layout (``tests/robot/checkpoints.py``), served as a user's would be."""
    from tests.robot.checkpoints import openpi_checkpoint

    folder = openpi_checkpoint(tmp_path_factory.mktemp("ckpt") / "pi05_libero", pi05=True, horizon=10)
    robot = {"policy": "pi0.5", "checkpoint": str(folder), "device": "cpu"}
    config = config_from_mapping({"robot": robot})
    async with serve_in_process(config) as (url, srv):
        yield url.replace("http://", "ws://"), srv.rt_app.state.rt.kinds[0]


async def test_openpi_client_gets_libero_actions_from_a_served_checkpoint(checkpoint_server):
    """openpi's LIBERO example, unchanged: metadata, then 7-dim actions for LIBERO observations."""
    url, service = checkpoint_server

    def go():
        policy = WebsocketClientPolicy(url)
        try:
            return policy.get_server_metadata(), policy.infer(libero(3)), policy.infer(libero(3))
        finally:
            policy._ws.close()

    meta, first, second = await in_client_thread(go)
    assert meta["policy"] == "pi0.5" and meta["action_dim"] == 7 and meta["action_horizon"] == 10
    assert meta["observation_preset"] == "libero"
    assert first["actions"].shape == (10, 7) and first["actions"].dtype == np.float32
    np.testing.assert_array_equal(first["actions"], second["actions"])  # deterministic
    local = service.policy.infer([service.policy.prepare(libero(3))], [None])[0]
    np.testing.assert_allclose(first["actions"], local, atol=1e-5)
    with pytest.raises(RuntimeError, match="observation/image"):  # a DROID robot is refused, typed
        await in_client_thread(_infer_once, url, droid(1))


def _infer_once(url: str, obs: dict) -> dict:
    policy = WebsocketClientPolicy(url)
    try:
        return policy.infer(obs)
    finally:
        policy._ws.close()
